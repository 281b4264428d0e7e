"""Child processes on Linux: start a command in a process group of its own, wait for it, and stop its
whole tree (every descendant, also those that left the group), plus the ``/proc`` readings this
needs and the words for an exit status. Plain OS code: the Dagster runner
(largetrain_dagster.runner) and the core's own launchers (the ablation's ``run_ablation``) use it.

Why the tree and not only the group: torchrun starts each rank in a session of its own
(``start_new_session=True`` in torch.distributed.elastic's SubprocessHandler), and Spark's driver
starts executor JVMs and Python workers that signalling the group alone would miss.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, process group id) of ``pid`` from Linux ``/proc/<pid>/stat``; None once it
    has ended. State ``Z`` is a zombie: dead, not yet reaped by its parent."""
    try:
        fields_ = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields_[0], int(fields_[1]), int(fields_[2])


def process_tree(root: int) -> list[int]:
    """``root`` and every descendant process (Linux ``/proc/<pid>/stat``), parents before children."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").glob("[0-9]*"):
        st = proc_stat(int(d.name))
        if st is not None:  # else the process ended while we looked
            children.setdefault(st[1], []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo.extend(sorted(children.get(pid, [])))
    return out


def alive(pids) -> bool:
    """Whether any of ``pids`` still runs (a zombie, dead but not yet reaped by its parent, does not count)."""
    return any((st := proc_stat(pid)) is not None and st[0] not in ("Z", "X") for pid in pids)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stop_process_group(proc: subprocess.Popen, grace_seconds: float) -> None:
    """SIGTERM the process group led by ``proc`` and every descendant, wait up to ``grace_seconds``,
    then SIGKILL what is left (and wait up to 5 s more). Returns once the leader is reaped. A
    process that has already ended is left as it is."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = proc.pid
    tree = set(process_tree(proc.pid))  # before any signal: orphaned children can no longer be found from the leader
    for sig, wait in ((signal.SIGTERM, grace_seconds), (signal.SIGKILL, 5.0)):
        tree |= set(process_tree(proc.pid)) if proc.poll() is None else set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        for pid in tree - {proc.pid}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.time() + wait
        while time.time() < deadline and (_group_alive(pgid) or alive(tree - {proc.pid})):
            proc.poll()  # reap the leader, or a zombie keeps the group "alive"
            time.sleep(0.1)
        proc.poll()
        if not _group_alive(pgid) and not alive(tree - {proc.pid}):
            break
    if proc.poll() is None:
        proc.wait(timeout=5)


def run_in_group(
    cmd: list[str],
    env: dict[str, str],
    log_path: Path,
    grace_seconds: float,
    on_tick: Callable[[], None] | None = None,
    tick_seconds: float = 0.5,
    on_stop: Callable[[int], None] | None = None,
    cwd: str | Path | None = None,
) -> int:
    """Run ``cmd`` to its end in a new session (its own process group), stdout and stderr appended to
    ``log_path``; return its exit code (negative: killed by that signal, as Popen says).

    ``on_tick()`` is called every ``tick_seconds`` while it runs (progress reports). Whatever ends the
    wait early (an exception in ``on_tick``, KeyboardInterrupt, Dagster's interrupt of a cancelled
    run) stops the whole tree (:func:`stop_process_group`, SIGTERM then after ``grace_seconds``
    SIGKILL) before it propagates, calling ``on_stop(pid)`` first to say so."""
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd)
        try:
            while proc.poll() is None:
                time.sleep(tick_seconds)
                if on_tick is not None and proc.poll() is None:
                    on_tick()
        finally:
            if proc.poll() is None and on_stop is not None:
                on_stop(proc.pid)
            stop_process_group(proc, grace_seconds)  # also after a normal end: descendants that outlived the leader
    return proc.returncode


def exit_status(returncode: int | None) -> str:
    """``exit code N``, ``killed by SIGKILL`` (a negative Popen return code is the signal), or ``an unknown
    exit status`` (None: a pod whose status the launcher did not get)."""
    if returncode is None:
        return "an unknown exit status"
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"
