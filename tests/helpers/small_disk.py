"""A small file system of its own for the full-disk tests: a tmpfs mounted on a test's directory. The tests run
as root (here and in CI), where ``mount -t tmpfs`` is allowed; elsewhere the test runs again in a user and mount
namespace of its own (``unshare -rm``), where it is root of its mounts, so the disk still really fills (ENOSPC
from the kernel) with no loop device, image file or mock."""

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from helpers import REPO

INNER = "LARGETRAIN_TEST_IN_MOUNT_NAMESPACE"


def can_mount() -> bool:
    """Whether this process may mount a tmpfs (root, or already in a namespace of its own)."""
    return os.geteuid() == 0


def rerun_in_mount_namespace(nodeid: str) -> None:
    """Run the test ``nodeid`` again under ``unshare -rm`` (as root of a user and mount namespace of its own) and
    assert that it passed there; for a process that may not mount here."""
    assert not os.environ.get(INNER), "already in a namespace of its own and still not allowed to mount a tmpfs"
    assert shutil.which("unshare"), "the full-disk tests need root or util-linux's unshare to mount a tmpfs"
    proc = subprocess.run(
        ["unshare", "-rm", sys.executable, "-m", "pytest", nodeid, "-q", "-n", "0", "-p", "no:cacheprovider"],
        cwd=REPO,
        env={**os.environ, INNER: "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{nodeid} under unshare -rm:\n" + proc.stdout[-5000:] + proc.stderr[-3000:]


@contextlib.contextmanager
def tmpfs(directory: Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes mounted on ``directory`` (made if missing) for the block's time, unmounted
    after it whatever happens."""
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(directory)],
        check=True,
        capture_output=True,
    )
    try:
        yield directory
    finally:
        subprocess.run(["umount", "--lazy", str(directory)], check=True, capture_output=True)


def fill(directory: Path, leave: int) -> Path:
    """A filler file in ``directory`` that leaves ``leave`` bytes free on its file system (rounded to its
    4 KiB pages); returns its path (delete it to free the space)."""
    filler = directory / "filler"
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, shutil.disk_usage(directory).free - leave))
    return filler
