"""The commit of a version (:class:`atomic_dir`): built in a local temporary directory, committed to local disk or an object store."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


from largetrain_core import fs
from largetrain_core.storage.files import log
from largetrain_core.storage.local_store import _commit_local
from largetrain_core.storage.manifest import MANIFEST, _same_version, write_manifest
from largetrain_core.storage.object_store import _RemoteLock, _commit_remote, _lock_uncommitted, _remove_except
from largetrain_core.storage.working_copies import mirror_path


class atomic_dir:
    """``with atomic_dir(final) as tmp:`` yields a fresh local temporary directory; when the block exits
    without error, its files become the committed version at ``final`` (a local path or a URL).

    First :func:`write_manifest` records every file (and every local file is fsynced), then the
    commit (module docstring): a local rename, or the upload with the marker last. When ``final``
    already holds a committed version that verifies, nothing is replaced: the new files are
    discarded (``committed`` is then False; the content is the same by construction, since the data
    version names it). On error the temporary directory is removed and ``final`` is left as it was.
    For a URL, the temporary directory lies in the local working copy of the root
    (:func:`mirror_path`), and becomes the working copy of the version once committed.

    After the block, ``committed`` is True when these files are the version, False when an
    existing one was kept.
    """

    def __init__(self, final: str | Path):
        self.final = final
        self.committed: bool | None = None
        self.tmp: Path | None = None
        self.lock: _RemoteLock | None = None
        self.uploaded: dict[str, dict] = {}

    def _local_final(self) -> Path:
        return mirror_path(self.final) if fs.is_url(self.final) else fs.local_path(self.final)

    def __enter__(self) -> Path:
        final = self._local_final()
        final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-{os.getpid()}-", dir=final.parent))
        if fs.is_url(self.final):
            _OPEN[str(self.tmp)] = self
        return self.tmp

    def direct_url(self) -> str | None:
        """The URL of the version (``final``) under which other processes (Spark tasks) may put files
        of the version themselves while the block runs; None for a local ``final``, or when another
        writer committed the version meanwhile (then nothing may be written there). The first call
        takes the version's lock, held until the commit, and removes the objects of an uncommitted
        attempt; files put there count as the version's only when they are also in the temporary
        directory at the end (:func:`fetch_uploaded`, :meth:`record_uploaded`): the manifest and the
        marker are still written last, by the commit."""
        if not fs.is_url(self.final):
            return None
        if self.lock is None:
            final = str(self.final)
            lock = _lock_uncommitted(final)
            if lock is None:
                return None
            fsys, root = fs.filesystem(final)
            _remove_except(fsys, root.rstrip("/"), set(), fs.redact(final))
            self.lock = lock
        return str(self.final)

    def record_uploaded(self, objects: dict[str, dict]) -> None:
        """Files that are already under the version's prefix (put there by the writers of
        :meth:`direct_url`) and in the temporary directory with the same bytes: ``{relative path:
        {"etag", "xxh3_128"}}`` (:func:`fetch_uploaded`). The commit uploads each of them only when its
        object has changed since (another ETag) or its local file has other bytes."""
        self.uploaded.update(objects)

    def __exit__(self, exc_type, exc, tb) -> bool:
        tmp = self.tmp
        _OPEN.pop(str(tmp), None)
        if exc_type is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            if self.lock is not None:
                self.lock.release()
            return False
        try:
            write_manifest(tmp)
            for p in tmp.rglob("*"):
                if p.is_file():
                    with open(p, "rb+") as fh:
                        os.fsync(fh.fileno())
            if fs.is_url(self.final):
                self.committed = _commit_remote(tmp, str(self.final), self.lock, self.uploaded)
                if self.committed:  # our files are the version: they become its working copy
                    _commit_local(tmp, self._local_final(), _same_version((tmp / MANIFEST).read_bytes()))
            else:
                self.committed = _commit_local(tmp, self._local_final())
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            if self.lock is not None:
                self.lock.release()
        if not self.committed:
            log.info(
                f"{fs.redact(str(self.final))}: already committed by another writer; this writer's "
                "identical result was discarded"
            )
        return False


_OPEN: dict[str, atomic_dir] = {}  # the temporary directory of each atomic_dir of a URL, while its block runs


def direct_url(tmp: str | Path) -> str | None:
    """:meth:`atomic_dir.direct_url` of the atomic_dir whose temporary directory is ``tmp``: the URL
    where other processes may write the version's files themselves; None when ``tmp`` is no such
    directory (a local version, or a directory of someone else's)."""
    commit = _OPEN.get(str(Path(tmp)))
    return commit.direct_url() if commit is not None else None


def record_uploaded(tmp: str | Path, objects: dict[str, dict]) -> None:
    """:meth:`atomic_dir.record_uploaded` of the atomic_dir whose temporary directory is ``tmp``
    (nothing for any other directory: then every file is uploaded by the commit)."""
    commit = _OPEN.get(str(Path(tmp)))
    if commit is not None:
        commit.record_uploaded(objects)
