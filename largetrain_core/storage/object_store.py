"""Versions on an object store (package doc, Commit): the upload with the commit marker last, the writers' lock, files other processes uploaded, publishing a local directory."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Iterable


from largetrain_core import fs
from largetrain_core.digest import file_digest
from largetrain_core.storage.files import log
from largetrain_core.storage.manifest import COMMIT, LOCK, MANIFEST, RESERVED, _marker, _stamp, _verify_remote, _within


# Our choice, no standard's: a writer's lock whose heartbeat (every LOCK_STALE_SECONDS / 6) has not moved for
# this long is taken over. Long enough for a paused process or a slow listing, short enough that a crashed
# writer on another node delays the next one by a couple of minutes at most. LARGETRAIN_LOCK_STALE_SECONDS sets it.
LOCK_STALE_SECONDS = 120.0


def _fault(point: str) -> None:
    """LARGETRAIN_FAULT=<point> (``mid_upload``: half of a version's files uploaded, no manifest, no
    marker): this process SIGKILLs itself, as a crash or a preempted node would."""
    if os.environ.get("LARGETRAIN_FAULT") == point:
        log.warning(f"LARGETRAIN_FAULT {point}: SIGKILL")
        os.kill(os.getpid(), signal.SIGKILL)


def _commit_remote(tmp: Path, final: str, held: _RemoteLock | None = None, uploaded: dict | None = None) -> bool:
    """Upload the finished directory ``tmp`` (with its manifest) as the version at the URL ``final``;
    False when a committed version that verifies is there already (before, or once the lock is ours).
    ``held``: the version's lock, already taken (atomic_dir.direct_url; left to its holder to release);
    ``uploaded``: files already there (atomic_dir.record_uploaded), not uploaded again when their
    object's ETag and their local xxh3-128 are those recorded. Every other object under the prefix
    (an uncommitted attempt's, a damaged version's, a direct writer's scratch files) is removed
    before the upload."""
    fsys, root = fs.filesystem(final)
    root = root.rstrip("/")
    lock = held or _lock_uncommitted(final)
    if lock is None:
        return False
    try:
        if held is not None and not _verify_remote(
            final
        ):  # committed since direct_url took the lock (a lock taken over)
            return False
        manifest_bytes = (tmp / MANIFEST).read_bytes()
        entries = json.loads(manifest_bytes)["files"]
        listing = {p[len(root) + 1 :]: info for p, info in fsys.find(root, detail=True).items()}
        there = {
            rel
            for rel, seen in (uploaded or {}).items()
            if rel in entries
            and rel in listing
            and _stamp(listing[rel]) is not None
            and seen == {"etag": _stamp(listing[rel]), "xxh3_128": entries[rel]["xxh3_128"]}
        }
        _remove_except(fsys, root, there, fs.redact(final), listing, quiet=held is not None)
        files = sorted(
            p for p in tmp.rglob("*") if p.is_file() and p.relative_to(tmp).as_posix() not in (*RESERVED, *there)
        )
        remote = [f"{root}/{p.relative_to(tmp).as_posix()}" for p in files]
        half = len(files) // 2
        for lo, hi in ((0, half), (half, len(files))):
            if hi > lo:
                fsys.put([str(p) for p in files[lo:hi]], remote[lo:hi])
            if lo == 0:
                _fault("mid_upload")
        fsys.pipe_file(f"{root}/{MANIFEST}", manifest_bytes)
        listing = fsys.find(root, detail=True)
        objects = {}
        for path, info in listing.items():
            rel = path[len(root) + 1 :]
            if rel not in (COMMIT, LOCK):
                objects[rel] = {"bytes": int(info["size"]), "etag": _stamp(info)}
        fsys.pipe_file(f"{root}/{COMMIT}", _marker(manifest_bytes, objects))
        return True
    finally:
        if held is None:
            lock.release()


def _lock_uncommitted(final: str) -> _RemoteLock | None:
    """The lock of the version at the URL ``final``, taken, when no committed version verifies there,
    neither before nor once the lock is held; None (no lock held) when one does."""
    fsys, root = fs.filesystem(final)
    lock = _RemoteLock(fsys, f"{root.rstrip('/')}/{LOCK}", fs.redact(final))
    if not _verify_remote(final) or not lock.acquire(lambda: not _verify_remote(final)):
        return None
    if not _verify_remote(final):
        lock.release()
        return None
    return lock


def _remove_except(
    fsys, root: str, keep: set[str], shown: str, listing: dict | None = None, quiet: bool = False
) -> None:
    """Remove every object under the prefix ``root`` but its lock and the relative paths ``keep``
    (``listing``: the prefix's, if just taken): what an uncommitted attempt or a damaged version left,
    never mixed with a new upload. ``quiet``: the objects are this writer's own scratch files."""
    if listing is None:
        listing = {p[len(root) + 1 :]: None for p in fsys.find(root)}
    leftovers = [f"{root}/{rel}" for rel in listing if rel != LOCK and rel not in keep]
    if leftovers:
        (log.info if quiet else log.warning)(
            f"{shown}: removing {len(leftovers)} objects "
            + (
                "that are not part of the version before the commit"
                if quiet
                else "of an uncommitted or damaged version before uploading"
            )
        )
        fsys.rm(leftovers)


def fetch_uploaded(url: str, local: Path, rels: Iterable[str]) -> dict[str, dict]:
    """Download the objects ``url/<rel>`` to ``local/<rel>`` (a writer's view of what other processes
    put under a version's prefix, atomic_dir.direct_url); returns ``{rel: {"etag", "xxh3_128"}}`` of
    each, for :func:`record_uploaded`. Raises FileNotFoundError naming a missing object."""
    rels = sorted(rels)
    if not rels:
        return {}
    fsys, root = fs.filesystem(url)
    root = root.rstrip("/")
    listing = {p[len(root) + 1 :]: info for p, info in fsys.find(root, detail=True).items()}
    missing = [r for r in rels if r not in listing]
    if missing:
        raise FileNotFoundError(f"{fs.redact(url)}/{missing[0]}: missing ({len(missing)} of {len(rels)} objects)")
    for r in rels:
        (Path(local) / r).parent.mkdir(parents=True, exist_ok=True)
    fsys.get([f"{root}/{r}" for r in rels], [str(Path(local) / r) for r in rels])
    return {r: {"etag": _stamp(listing[r]), "xxh3_128": file_digest(Path(local) / r)} for r in rels}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _RemoteLock:
    """The lock object of one version prefix (module docstring)."""

    def __init__(self, fsys, path: str, shown: str):
        self.fsys, self.path, self.shown = fsys, path, shown
        self.token = uuid.uuid4().hex
        self.stale = float(os.environ.get("LARGETRAIN_LOCK_STALE_SECONDS", LOCK_STALE_SECONDS))
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def _body(self, beat: int) -> bytes:
        return json.dumps(
            {"token": self.token, "host": socket.gethostname(), "pid": os.getpid(), "beat": beat}
        ).encode()

    def acquire(self, committed) -> bool:
        """Wait for the lock; True once held, False as soon as ``committed()`` says another writer
        finished the version."""
        seen, since, wait, said = None, time.monotonic(), 0.2, False
        while True:
            try:
                self.fsys.pipe_file(self.path, self._body(0), mode="create")
                self._beat = threading.Thread(target=self._heartbeat, daemon=True)
                self._beat.start()
                return True
            except FileExistsError:
                pass
            if committed():
                return False
            try:
                holder = json.loads(self.fsys.cat_file(self.path))
                stamp = _stamp(self.fsys.info(self.path)) or json.dumps(holder)
            except (FileNotFoundError, ValueError):
                continue  # released (or being written) just now: try again
            if not said:
                log.info(
                    f"{self.shown}: another writer (host {holder.get('host')}, pid {holder.get('pid')}) is "
                    "committing this version; waiting for it"
                )
                said = True
            gone = holder.get("host") == socket.gethostname() and not _pid_alive(int(holder.get("pid", -1)))
            if stamp != seen:
                seen, since = stamp, time.monotonic()
            if gone or time.monotonic() - since > self.stale:
                log.warning(
                    f"{self.shown}: taking over the lock of a writer that is gone (host {holder.get('host')}, "
                    f"pid {holder.get('pid')}, "
                    + ("process not running)" if gone else f"no heartbeat for {self.stale:.0f} s)")
                )
                with contextlib.suppress(FileNotFoundError):
                    self.fsys.rm_file(self.path)
                continue
            time.sleep(wait)
            wait = min(wait * 1.5, 5.0)

    def _heartbeat(self) -> None:
        beat = 0
        while not self._stop.wait(self.stale / 6):
            beat += 1
            with contextlib.suppress(Exception):  # a missed beat only makes the lock look older
                self.fsys.pipe_file(self.path, self._body(beat))

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        with contextlib.suppress(FileNotFoundError, ValueError):
            if json.loads(self.fsys.cat_file(self.path)).get("token") == self.token:
                self.fsys.rm_file(self.path)


def publish(local: Path, url: str, changed: Iterable[str] = ()) -> None:
    """Commit the local directory ``local``, sealed in place by :func:`write_manifest` (a training's
    output directory, whose files the trainer uploaded as it went), as the version at the URL ``url``:
    upload each file of the manifest that the bucket lacks, holds with another size, or that is in
    ``changed`` (relative paths rewritten since the trainer's upload, e.g. the model card), then the
    manifest, then the commit marker from one listing. Objects under ``url`` outside the manifest's
    ``paths`` (the checkpoints, the log) are left as they are."""
    local = Path(local)
    fsys, root = fs.filesystem(url)
    root = root.rstrip("/")
    manifest_bytes = (local / MANIFEST).read_bytes()
    manifest = json.loads(manifest_bytes)
    listing = {p[len(root) + 1 :]: info for p, info in fsys.find(root, detail=True).items()}
    changed = set(changed)
    todo = sorted(
        rel
        for rel, entry in manifest["files"].items()
        if rel in changed or rel not in listing or int(listing[rel]["size"]) != entry["bytes"]
    )
    if todo:
        fsys.put([str(local / r) for r in todo], [f"{root}/{r}" for r in todo])
    fsys.pipe_file(f"{root}/{MANIFEST}", manifest_bytes)
    objects = {
        p[len(root) + 1 :]: {"bytes": int(info["size"]), "etag": _stamp(info)}
        for p, info in fsys.find(root, detail=True).items()
        if _within(p[len(root) + 1 :], manifest["paths"]) or p[len(root) + 1 :] == MANIFEST
    }
    fsys.pipe_file(f"{root}/{COMMIT}", _marker(manifest_bytes, objects))
