"""Versions and files on local disk: the commit by rename, free space and a full disk, atomic JSON writes, part files."""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from pathlib import Path


from largetrain_core import fs
from largetrain_core.storage.manifest import verify_manifest


# Our own margin, no standard's: a file system with less free space than this cannot hold a part file, a
# checkpoint's smallest file nor a process's error file with its traceback; a write error under it is the
# disk being full, whatever the writer called it (torch.save: "file write failed"; a Parquet file cut short
# and read back: "File out of specification").
NO_SPACE_MARGIN = 1 << 20


def free_bytes(path: str | Path) -> int:
    """Free bytes (for an unprivileged user) on the file system of local ``path`` or its nearest existing parent."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling (``__cause__``, else ``__context__``)."""
    chain, e = [], exc
    while e is not None and not any(e is c for c in chain):
        chain.append(e)
        e = e.__cause__ or e.__context__
    return chain


def is_disk_full(exc: BaseException, path: str | Path) -> bool:
    """Whether ``exc``, raised while writing under local ``path``, is its file system running out of space:
    an ENOSPC OSError in :func:`exception_chain`, or fewer than :data:`NO_SPACE_MARGIN` bytes free."""
    if any(isinstance(c, OSError) and c.errno == errno.ENOSPC for c in exception_chain(exc)):
        return True
    return free_bytes(path) < NO_SPACE_MARGIN


def newest_file(directory: Path) -> Path | None:
    """The most recently modified file under ``directory`` (the one a failed writer was writing), or None."""
    files = [p for p in Path(directory).rglob("*") if p.is_file()]
    return max(files, key=lambda p: p.stat().st_mtime_ns) if files else None


def _intact(final: Path) -> bool:
    return not verify_manifest(final)


def _commit_local(tmp: Path, final: Path, keep=_intact) -> bool:
    """Rename ``tmp`` to ``final``; True when it was renamed. An existing ``final`` for which ``keep(final)``
    holds (default: it verifies) is kept: False, ``tmp`` left for the caller to remove; any other is
    moved aside and removed. ``rename`` onto a non-empty directory fails, so of two writers racing
    here exactly one wins and the other sees its version."""
    for _ in range(5):
        if final.exists():
            if keep(final):
                return False
            trash = final.with_name(f".trash-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            try:
                os.rename(final, trash)
            except FileNotFoundError:
                pass  # another writer moved it first
            else:
                shutil.rmtree(trash, ignore_errors=True)
        try:
            os.rename(tmp, final)
            return True
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
    raise OSError(f"{final}: could not commit: other writers kept replacing it")


def as_dirs(dirs: str | Path | list) -> list:
    """One stage directory, or several (one per partition, in the order given), as a list: Paths for
    local directories, URL strings for object-store prefixes."""
    items = [dirs] if isinstance(dirs, (str, Path)) else list(dirs)
    return [str(d) if fs.is_url(d) else Path(d) for d in items]


def part_files(dirs: str | Path | list) -> list:
    """The ``part-*.parquet`` files of a stage directory (or of several, in the order given), sorted
    within each: the document order of a stage's output. Paths for local directories; for a URL, the
    objects' URLs (one listing), to read with largetrain_core.fs.open_input."""
    out: list = []
    for d in as_dirs(dirs):
        if isinstance(d, Path):
            out += sorted(d.glob("part-*.parquet"))
            continue
        fsys, root = fs.filesystem(d)
        names = sorted(p.rsplit("/", 1)[1] for p in fsys.glob(f"{root.rstrip('/')}/part-*.parquet"))
        out += [fs.join(d, n) for n in names]
    return out
