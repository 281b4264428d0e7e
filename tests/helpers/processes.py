"""Ports and processes for the tests that start servers and process trees (loopback only)."""

import os
import socket
from pathlib import Path

from largetrain_core.processes import proc_stat


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def processes_mentioning(text: str) -> dict[int, str]:
    """Live, non-zombie processes (not this one) whose command line contains ``text``: pid -> command line."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        st = proc_stat(int(d.name))
        if text in cmd and st and st[0] != "Z":
            out[int(d.name)] = cmd
    return out


def group_members(pgid: int) -> list[int]:
    """Processes (not zombies) whose process group is ``pgid``."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            st = proc_stat(int(d.name))
            if st and st[2] == pgid and st[0] != "Z":
                out.append(int(d.name))
    return out
