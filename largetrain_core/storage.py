"""Where artifacts live, how a version is committed, and how a stored version is checked before it is trusted.

Layout (docs/ARCHITECTURE.md): ``<root>/<asset path>/<data_version>/``, where the root is a local
directory or an object-store URL (``s3://bucket/prefix``, any fsspec URL; largetrain_core.fs).

Commit. :class:`atomic_dir` builds a version in a local temporary directory and then commits it:

* on local disk by ``rename`` into place, so a killed run never leaves a directory at a final name;
* on an object store (no rename there) by uploading every file under the final prefix, then
  ``_manifest.json``, and last the commit marker ``_COMMITTED.json`` (the manifest's checksum and,
  from one listing after the upload, every object's size and ETag). A prefix without a marker that
  matches its manifest is uncommitted: it is never read, and the next writer removes what is there
  before it uploads. Writers of one prefix take turns through a lock object ``_LOCK.json`` created
  with a conditional PUT (``If-None-Match: *``), kept alive by a heartbeat while the upload runs and
  taken over when its holder's process is gone (same host) or its heartbeat stopped for
  :data:`LOCK_STALE_SECONDS`.

A committed version is immutable: the data version is a pure function of its inputs, so a second
writer of the same version (two runs of one partition, a sensor firing twice) discards its own
result and keeps the committed one; only a version that fails verification is replaced.

Manifests: ``_manifest.json`` (the leading underscore keeps Spark/Hadoop-style readers from taking it
for data, as with ``_SUCCESS``) records every file's size, modification time and xxh3-128 checksum.
:func:`verify_manifest` checks a version against it before it is reused or read, on local disk
(sizes, checksums; see its docstring for what is hashed) and on an object store (one listing: sizes,
and ETags against the marker's; an object whose ETag differs, e.g. edited after the commit or
copied from another store, is read and hashed).

Paths in handles and stats are stored relative to the root (:func:`relative_to_root`,
:func:`resolve_under`), so a root copied from local disk to a bucket, or back, reads its own files.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import posixpath
import shutil
import signal
import socket
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterable, Iterator

import xxhash

from largetrain_core import fs
from largetrain_core.cache import cache_dir
from largetrain_core.digest import BLOCK, file_digest

log = logging.getLogger("largetrain.storage")

MANIFEST = "_manifest.json"
MANIFEST_FORMAT = "largetrain.manifest/1"
COMMIT = "_COMMITTED.json"
COMMIT_FORMAT = "largetrain.commit/1"
LOCK = "_LOCK.json"
RESERVED = (MANIFEST, COMMIT, LOCK)  # a version's own bookkeeping, at its top level: never data
# verify_manifest hashes a file whole up to this size; a larger one by SAMPLE_BLOCKS blocks of SAMPLE_BLOCK bytes.
FULL_CHECKSUM_MAX_BYTES = 8 << 20
SAMPLE_BLOCK = 64 << 10
SAMPLE_BLOCKS = 16
# Our choice, no standard's: a writer's lock whose heartbeat (every LOCK_STALE_SECONDS / 6) has not moved for
# this long is taken over. Long enough for a paused process or a slow listing, short enough that a crashed
# writer on another node delays the next one by a couple of minutes at most. LARGETRAIN_LOCK_STALE_SECONDS sets it.
LOCK_STALE_SECONDS = 120.0


class ArtifactError(ValueError):
    """A stored artifact that is damaged or not what its reader expects; the message names the file."""


class MissingArtifactError(ArtifactError, FileNotFoundError):
    """A stored artifact that is not there; the message names the path and what was expected."""


class DiskFullError(OSError):
    """A write refused for lack of space (errno ENOSPC); the message names the file, where it was going
    and the free space. A retry fails the same way until space is freed."""


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


@contextlib.contextmanager
def loading(path: str | Path, what: str) -> Iterator[None]:
    """Run a third-party loader of ``path`` so that any failure names the file and what it should be.

    ``with loading(p, "a Hugging Face tokenizer.json"): Tokenizer.from_file(str(p))``: a missing
    ``p`` (a local path or a URL) raises MissingArtifactError, any exception of the loader (a
    truncated JSON, a safetensors header cut short, ...) ArtifactError ``"<path>: not a valid <what>
    (<type>: <message>)"``, chained to the original. KeyboardInterrupt and other BaseExceptions pass
    through unchanged.
    """
    shown = fs.redact(str(path))
    if not fs.exists(path):
        raise MissingArtifactError(f"{shown}: missing; expected {what}")
    try:
        yield
    except ArtifactError:
        raise
    except Exception as e:
        raise ArtifactError(
            f"{shown}: not a valid {what} ({type(e).__name__}: {fs.redact(str(e))}); damaged or "
            "incomplete: re-materialize the asset that wrote it"
        ) from e


def read_json(path: str | Path, what: str) -> Any:
    """Parse the JSON file (or object, at a URL) ``path``; a missing, truncated or non-UTF-8 file raises
    (Missing)ArtifactError naming it and ``what`` it should hold."""
    with loading(path, what):
        return json.loads(fs.read_bytes(path))


def data_version(*parts: Any) -> str:
    """A 16-hex-digit version: sha256 over the canonical JSON of ``parts`` (config, input versions, code version)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


# ------------------------------------------------------------------------------------------------ commit


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


def _same_version(manifest_bytes: bytes):
    """``keep`` for :func:`_commit_local` of a working copy: the copy there has this manifest and verifies."""

    def keep(final: Path) -> bool:
        mf = final / MANIFEST
        return mf.exists() and mf.read_bytes() == manifest_bytes and not verify_manifest(final)

    return keep


def _marker(manifest_bytes: bytes, objects: dict | None) -> bytes:
    return json.dumps(
        {"format": COMMIT_FORMAT, "manifest_xxh3_128": xxhash.xxh3_128_hexdigest(manifest_bytes), "objects": objects},
        indent=2,
        sort_keys=True,
    ).encode()


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


_stamp = fs.object_stamp


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


# ------------------------------------------------------------------------------------------------ working copies


def mirror_path(location: str) -> Path:
    """Where the local working copy of an object-store location lies: ``<cache>/mirror/<scheme>/<path>``
    (largetrain_core.cache), e.g. ``s3://bucket/root/x`` -> ``<cache>/mirror/s3/bucket/root/x``.
    Inverse: :func:`stored_location`."""
    scheme, rest = str(location).split("://", 1)
    rest = posixpath.normpath("/" + rest.split("@", 1)[-1] if "@" in rest.split("/", 1)[0] else "/" + rest)
    return cache_dir() / "mirror" / scheme.lower() / rest.lstrip("/")


def stored_location(path: str | Path) -> str:
    """Where the local path ``path`` is stored: for a working copy (:func:`mirror_path`) its URL, else
    the path itself (a string)."""
    p = Path(path)
    mirror = cache_dir() / "mirror"
    try:
        rel = p.resolve().relative_to(mirror)
    except ValueError:
        return str(path)
    scheme, *parts = rel.parts
    return f"{scheme}://{'/'.join(parts)}"


def committed_root(location: str) -> tuple[str, str]:
    """(the committed version holding ``location``, the path inside it): ``location`` itself when it has
    a commit marker, else its nearest ancestor that has one. Raises MissingArtifactError when none of
    them is committed."""
    url = str(location).rstrip("/")
    fsys, path = fs.filesystem(url)
    inside: list[str] = []
    while "/" in path.strip("/"):
        if fsys.exists(f"{path}/{COMMIT}"):
            return url, "/".join(reversed(inside))
        path, name = path.rsplit("/", 1)
        url = url.rsplit("/", 1)[0]
        inside.append(name)
    raise MissingArtifactError(
        f"{fs.redact(str(location))}: no committed version holds it (no {COMMIT} there or "
        "above): re-materialize the asset that wrote it"
    )


def _open_committed(location: str) -> tuple[str, str, object, str, bytes]:
    """(version URL, the path inside it, its filesystem, its root path, its manifest's bytes) of the
    committed version holding the URL ``location``. Raises ArtifactError naming the problems when the
    version does not verify, MissingArtifactError when no committed version holds it."""
    version, inside = committed_root(str(location))
    problems = _verify_remote(version)
    if problems:
        raise ArtifactError(f"{fs.redact(version)} cannot be read: " + "; ".join(problems))
    fsys, root = fs.filesystem(version)
    root = root.rstrip("/")
    return version, inside, fsys, root, fsys.cat_file(f"{root}/{MANIFEST}")


def local_copy(location: str | Path) -> Path:
    """A local path holding ``location``: the path itself on local disk; for a URL inside a committed
    version, the version's working copy (:func:`mirror_path`), downloaded when missing or when it does
    not match the version's manifest, every file checked against its xxh3-128 before it is used.

    Raises ArtifactError naming the problems when the version does not verify, MissingArtifactError
    when no committed version holds ``location``."""
    if not fs.is_url(location):
        return fs.local_path(location)
    version, inside, fsys, root, manifest_bytes = _open_committed(location)
    local = mirror_path(version)
    current = _same_version(manifest_bytes)
    if not (local.exists() and current(local)):
        manifest = json.loads(manifest_bytes)
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{local.name}-{os.getpid()}-", dir=local.parent))
        try:
            rels = sorted(manifest["files"])
            for rel in rels:
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            if rels:
                fsys.get([f"{root}/{r}" for r in rels], [str(tmp / r) for r in rels])
            for rel in rels:
                entry = manifest["files"][rel]
                if file_digest(tmp / rel) != entry["xxh3_128"]:
                    raise ArtifactError(
                        f"{fs.redact(version)}/{rel}: content differs from {MANIFEST} (xxh3-128 "
                        "checksum) while it was downloaded: re-materialize the asset that wrote it"
                    )
                os.utime(tmp / rel, ns=(entry["mtime_ns"], entry["mtime_ns"]))
            (tmp / MANIFEST).write_bytes(manifest_bytes)
            (tmp / COMMIT).write_bytes(_marker(manifest_bytes, None))
            _commit_local(tmp, local, current)  # a stale copy (of what was here before) is replaced
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return local / inside if inside else local


def local_files(location: str | Path, names: Iterable[str]) -> Path:
    """A local directory holding the files ``names`` (relative to ``location``) of a committed version:
    ``location`` itself on local disk; for a URL a directory in the local cache
    (``<cache>/files/<scheme>/<path>``) into which only those files are downloaded, each checked
    against the version's manifest. For what needs a few small files of a large version (the
    tokenizer beside the token shards, a model's config.json). Names the version does not hold are
    left out (as a local directory would lack them). Raises like :func:`local_copy`."""
    if not fs.is_url(location):
        return fs.local_path(location)
    version, inside, fsys, root, manifest_bytes = _open_committed(location)
    manifest = json.loads(manifest_bytes)
    out = cache_dir() / "files" / mirror_path(str(location)).relative_to(cache_dir() / "mirror")
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        rel = f"{inside}/{name}" if inside else name
        entry = manifest["files"].get(rel)
        target = out / name
        if entry is None or (target.exists() and file_digest(target) == entry["xxh3_128"]):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        fsys.get_file(f"{root}/{rel}", str(tmp))
        if file_digest(tmp) != entry["xxh3_128"]:
            tmp.unlink()
            raise ArtifactError(
                f"{fs.redact(version)}/{rel}: content differs from {MANIFEST} (xxh3-128 checksum) while it "
                "was downloaded: re-materialize the asset that wrote it"
            )
        os.replace(tmp, target)
    return out


def fetch_tree(location: str | Path) -> Path:
    """A local directory holding the files at ``location`` (a local path: itself). At a URL inside a
    committed version: :func:`local_copy`. Any other URL prefix (a model directory someone uploaded):
    downloaded into ``<cache>/downloads/<scheme>/<path>/``, and downloaded again only when one listing
    shows another file set, size or ETag than the copy was made from (recorded in the copy's
    ``.largetrain-listing.json``). For inputs such as ``pretrained_model``. Raises
    MissingArtifactError when nothing is there."""
    if not fs.is_url(location):
        return fs.local_path(location)
    try:
        return local_copy(location)
    except MissingArtifactError:
        pass
    fsys, root = fs.filesystem(str(location))
    root = root.rstrip("/")
    listing = {
        p[len(root) + 1 :]: [int(i["size"]), fs.object_stamp(i)]
        for p, i in fsys.find(root, detail=True).items()
        if not p.endswith("/")
    }
    if not listing:
        raise MissingArtifactError(f"{fs.redact(str(location))}: nothing there (no object under this prefix)")
    out = cache_dir() / "downloads" / mirror_path(str(location)).relative_to(cache_dir() / "mirror")
    stamp = out / ".largetrain-listing.json"
    if (
        stamp.exists()
        and json.loads(stamp.read_text()) == listing
        and all((out / r).is_file() and (out / r).stat().st_size == s for r, (s, _) in listing.items())
    ):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-{os.getpid()}-", dir=out.parent))
    try:
        rels = sorted(listing)
        for r in rels:
            (tmp / r).parent.mkdir(parents=True, exist_ok=True)
        fsys.get([f"{root}/{r}" for r in rels], [str(tmp / r) for r in rels])
        (tmp / stamp.name).write_text(json.dumps(listing))
        _commit_local(
            tmp, out, keep=lambda d: (d / stamp.name).exists() and json.loads((d / stamp.name).read_text()) == listing
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# ------------------------------------------------------------------------------------------------ manifests


def _xxh3_sample(path: Path, size: int) -> str:
    """xxh3-128 of SAMPLE_BLOCKS blocks of SAMPLE_BLOCK bytes at evenly spaced offsets, the first at 0 and
    the last ending at the end of the file (the file's size is hashed too)."""
    h = xxhash.xxh3_128(str(size).encode())
    last = max(0, size - SAMPLE_BLOCK)
    with open(path, "rb") as fh:
        for i in range(SAMPLE_BLOCKS):
            fh.seek(last * i // (SAMPLE_BLOCKS - 1))
            h.update(fh.read(SAMPLE_BLOCK))
    return h.hexdigest()


def sampled_digest(directory: str | Path, names: Iterable[str] | None = None) -> str:
    """xxh3-128 (32 hex digits) over every file under the local ``directory`` (or only its files ``names``
    that exist), in sorted order of relative path: the path, then the file's xxh3-128, or for a file over
    FULL_CHECKSUM_MAX_BYTES its sampled xxh3-128 (size and SAMPLE_BLOCKS blocks, as the manifests keep them).
    The identity of a directory's content that costs at most ~1 MiB of reads per large file (a model's
    weights), unchanged when the directory is copied elsewhere."""
    directory = Path(directory)
    files = [directory / n for n in names if (directory / n).is_file()] if names is not None else None
    files = sorted(files if files is not None else (p for p in directory.rglob("*") if p.is_file()))
    h = xxhash.xxh3_128()
    for p in files:
        size = p.stat().st_size
        digest = file_digest(p) if size <= FULL_CHECKSUM_MAX_BYTES else _xxh3_sample(p, size)
        h.update(p.relative_to(directory).as_posix().encode("utf-8", "surrogateescape") + b"\0" + digest.encode())
    return h.hexdigest()


def _within(rel: str, paths: Iterable[str] | None) -> bool:
    """Whether the relative path ``rel`` is a version's data file within the manifest's ``paths``."""
    if rel in RESERVED:
        return False
    return paths is None or any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in paths)


def _files(directory: Path, paths: Iterable[str] | None) -> list[Path]:
    """The regular files under ``directory`` (or under its entries ``paths``), without its bookkeeping
    (manifest, commit marker, lock)."""
    roots = [directory] if paths is None else [directory / p for p in paths]
    out = []
    for root in roots:
        if root.is_file():
            out.append(root)
        elif root.is_dir():
            out.extend(p for p in root.rglob("*") if p.is_file())
    return sorted(p for p in out if p.relative_to(directory).as_posix() not in RESERVED)


def write_manifest(directory: str | Path, paths: Iterable[str] | None = None) -> dict:
    """Record every file under the local ``directory`` (or only under its entries ``paths``, relative
    names: for a directory some of whose files keep changing, such as a training's checkpoints and
    log) in ``directory/_manifest.json``: ``{"format", "paths", "files": {relative path: {"bytes",
    "mtime_ns", "xxh3_128", and for files over FULL_CHECKSUM_MAX_BYTES "sample_xxh3_128"}}}``; then the
    commit marker ``_COMMITTED.json`` (the manifest's checksum), so that the directory, copied to an
    object store as it is, counts as committed there too. Hashing reads every byte once (xxh3 runs
    at memory speed; the files were just written, so mostly from the page cache). Returns the manifest."""
    directory = Path(directory)
    paths = None if paths is None else sorted(paths)
    files = {}
    for p in _files(directory, paths):
        st = p.stat()
        entry = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "xxh3_128": file_digest(p)}
        if st.st_size > FULL_CHECKSUM_MAX_BYTES:
            entry["sample_xxh3_128"] = _xxh3_sample(p, st.st_size)
        files[p.relative_to(directory).as_posix()] = entry
    manifest = {"format": MANIFEST_FORMAT, "paths": paths, "files": files}
    write_json_atomic(directory / MANIFEST, manifest)
    fs.write_atomic(directory / COMMIT, _marker((directory / MANIFEST).read_bytes(), None))
    return manifest


def _read_manifest(manifest_bytes: bytes, shown: str) -> tuple[dict | None, list[str]]:
    try:
        manifest = json.loads(manifest_bytes)
        manifest["files"], manifest["paths"]  # noqa: B018 (both keys must be there)
        return manifest, []
    except (ValueError, KeyError, TypeError) as e:
        return None, [f"{shown}: unreadable ({type(e).__name__}: {e})"]


def _marker_problems(
    marker_bytes: bytes | None, manifest_bytes: bytes, shown: str, required: bool
) -> tuple[dict, list[str]]:
    """(the commit marker, problems): the marker must parse and carry the manifest's checksum."""
    if marker_bytes is None:
        if not required:
            return {}, []
        return {}, [
            f"{shown}: missing: the version was never committed (its writer stopped before the end, or is "
            "still uploading); it is not read, and the next run rebuilds it"
        ]
    try:
        marker = json.loads(marker_bytes)
        digest = marker["manifest_xxh3_128"]
    except (ValueError, KeyError, TypeError) as e:
        return {}, [f"{shown}: unreadable ({type(e).__name__}: {e})"]
    if digest != xxhash.xxh3_128_hexdigest(manifest_bytes):
        return {}, [
            f"{shown}: records another {MANIFEST} than the one there (the manifest was rewritten after the commit)"
        ]
    return marker, []


def verify_manifest(directory: str | Path, full: bool = False) -> list[str]:
    """Check a version (a local directory or a URL prefix) against its ``_manifest.json`` and commit
    marker; returns the problems found, each naming a file (an empty list: the version is committed
    and as it was written).

    Always: the manifest exists and parses, the files present are exactly those listed (within the
    manifest's ``paths``), and every file has its recorded size.

    On local disk the rename was the commit; a ``_COMMITTED.json`` there must name the manifest.
    Content: the full xxh3-128 of every file up to FULL_CHECKSUM_MAX_BYTES (8 MiB: JSON, configs,
    tokenizers, small parts), of every file whose modification time differs from the recorded one
    (rewritten or copied), and of every file when ``full``; a larger file with its recorded
    modification time is checked by SAMPLE_BLOCKS (16) blocks of 64 KiB at evenly spaced offsets,
    so verifying reads at most 8 MiB + 1 MiB per file. What this misses: a same-size change to a
    large file, between the sampled blocks, by a writer that also restored the modification time
    (``full=True`` catches that too, at the cost of reading everything).

    On an object store: the marker ``_COMMITTED.json`` must be there and name the manifest; one
    listing of the prefix gives every object's size and ETag; an object whose ETag is the one the
    marker recorded is unchanged since the commit (S3 gives a rewritten object a new ETag), any other
    (edited, or copied from another store) is read and its xxh3-128 compared; ``full`` reads all.
    """
    if fs.is_url(directory):
        return _verify_remote(str(directory), full)
    directory = fs.local_path(directory)
    mf = directory / MANIFEST
    if not mf.exists():
        return [f"{mf}: missing (the directory was not finished by this version of largetrain, or it was deleted)"]
    manifest_bytes = mf.read_bytes()
    manifest, problems = _read_manifest(manifest_bytes, str(mf))
    if problems:
        return problems
    marker_file = directory / COMMIT
    _, problems = _marker_problems(
        marker_file.read_bytes() if marker_file.exists() else None, manifest_bytes, str(marker_file), required=False
    )
    listed, paths = manifest["files"], manifest["paths"]
    present = {p.relative_to(directory).as_posix() for p in _files(directory, paths)}
    problems += [f"{directory / rel}: listed in {MANIFEST} but missing" for rel in sorted(set(listed) - present)]
    problems += [
        f"{directory / rel}: not in {MANIFEST} (added after the directory was written)"
        for rel in sorted(present - set(listed))
    ]
    for rel in sorted(set(listed) & present):
        entry, path = listed[rel], directory / rel
        st = path.stat()
        if st.st_size != entry["bytes"]:
            problems.append(f"{path}: {st.st_size} bytes, {MANIFEST} says {entry['bytes']} (truncated or rewritten)")
        elif (
            full
            or st.st_size <= FULL_CHECKSUM_MAX_BYTES
            or st.st_mtime_ns != entry["mtime_ns"]
            or "sample_xxh3_128" not in entry
        ):
            if file_digest(path) != entry["xxh3_128"]:
                problems.append(f"{path}: content differs from {MANIFEST} (xxh3-128 checksum)")
        elif _xxh3_sample(path, st.st_size) != entry["sample_xxh3_128"]:
            problems.append(f"{path}: content differs from {MANIFEST} (xxh3-128 of sampled blocks)")
    return problems


def _object_digest(fsys, path: str) -> str:
    """xxh3-128 of an object's bytes, streamed in BLOCK reads."""
    h = xxhash.xxh3_128()
    with fsys.open(path, "rb", block_size=BLOCK) as fh:
        while block := fh.read(BLOCK):
            h.update(block)
    return h.hexdigest()


def _verify_remote(url: str, full: bool = False) -> list[str]:
    """:func:`verify_manifest` of a version at a URL (see there)."""
    fsys, root = fs.filesystem(url)
    root, shown = root.rstrip("/"), fs.redact(url.rstrip("/"))

    def cat(name: str) -> bytes | None:
        try:
            return fsys.cat_file(f"{root}/{name}")
        except FileNotFoundError:
            return None

    marker_bytes, manifest_bytes = cat(COMMIT), cat(MANIFEST)
    if marker_bytes is None:
        _, problems = _marker_problems(None, b"", f"{shown}/{COMMIT}", required=True)
        return problems
    if manifest_bytes is None:
        return [f"{shown}/{MANIFEST}: missing although {COMMIT} is there (deleted after the commit)"]
    manifest, problems = _read_manifest(manifest_bytes, f"{shown}/{MANIFEST}")
    if problems:
        return problems
    marker, problems = _marker_problems(marker_bytes, manifest_bytes, f"{shown}/{COMMIT}", required=True)
    if problems:
        return problems
    recorded = marker.get("objects") or {}
    listed, paths = manifest["files"], manifest["paths"]
    listing = {p[len(root) + 1 :]: info for p, info in fsys.find(root, detail=True).items()}
    present = {rel for rel in listing if _within(rel, paths)}
    problems += [f"{shown}/{rel}: listed in {MANIFEST} but missing" for rel in sorted(set(listed) - present)]
    problems += [
        f"{shown}/{rel}: not in {MANIFEST} (added after the version was committed)"
        for rel in sorted(present - set(listed))
    ]
    for rel in sorted(set(listed) & present):
        entry, info = listed[rel], listing[rel]
        size = int(info["size"])
        if size != entry["bytes"]:
            problems.append(f"{shown}/{rel}: {size} bytes, {MANIFEST} says {entry['bytes']} (truncated or rewritten)")
            continue
        stamp = _stamp(info)
        if full or stamp is None or stamp != (recorded.get(rel) or {}).get("etag"):
            if _object_digest(fsys, f"{root}/{rel}") != entry["xxh3_128"]:
                problems.append(
                    f"{shown}/{rel}: content differs from {MANIFEST} (xxh3-128 checksum; edited after "
                    "the version was committed)"
                )
    return problems


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


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` (a local path: via a temporary file and ``os.replace``;
    a URL: one PUT) so that no reader sees part of it."""
    fs.write_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str).encode())


RELATIVE_PATHS = "relative_paths"


def _pointer_token(key: str | int) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def _split(location: str) -> tuple[str, str]:
    """(scheme prefix such as ``s3://`` or "" for a local path, the normalized path)."""
    if fs.is_url(location):
        scheme, rest = location.split("://", 1)
        return f"{scheme.lower()}://", posixpath.normpath(rest)
    return "", os.path.normpath(location)


def relative_to_root(obj: dict, root: str | Path) -> dict:
    """A copy of the JSON object ``obj`` in which every string that is an absolute path or URL equal to
    or under ``root`` (a local path or a URL) is relative to it (``"."`` for the root itself), with the
    JSON Pointers (RFC 6901) of those strings listed under ``obj["relative_paths"]``;
    :func:`resolve_under` reverses it under any root, local or URL. So a handle or stats file stays
    true when the root is copied or moved, also between local disk and an object store."""
    scheme, base = _split(str(root))
    found: list[str] = list(obj.get(RELATIVE_PATHS, []))  # paths made relative by an earlier call stay listed

    def walk(value, pointer: str):
        if isinstance(value, dict):
            return {k: walk(v, f"{pointer}/{_pointer_token(k)}") for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, f"{pointer}/{i}") for i, v in enumerate(value)]
        if isinstance(value, str) and (value.startswith("/") or fs.is_url(value)):
            vscheme, norm = _split(value)
            if vscheme == scheme and (norm == base or norm.startswith(base.rstrip("/") + "/")):
                found.append(pointer)
                return (posixpath if scheme else os.path).relpath(norm, base)
        return value

    out = walk({k: v for k, v in obj.items() if k != RELATIVE_PATHS}, "")
    if found:
        out[RELATIVE_PATHS] = found
    return out


def resolve_under(obj: dict, root: str | Path) -> dict:
    """``obj`` (written by :func:`relative_to_root`) with every path listed under ``relative_paths``
    joined to ``root`` (a local path or a URL), and that list removed. An object without the list is
    returned as it is. Raises ValueError when a listed pointer does not name a string in ``obj``."""
    pointers = obj.get(RELATIVE_PATHS)
    if not pointers:
        return obj
    scheme, base = _split(str(root))
    out = json.loads(json.dumps({k: v for k, v in obj.items() if k != RELATIVE_PATHS}))
    for pointer in pointers:
        *parents, last = [t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:]]
        node = out
        try:
            for token in parents:
                node = node[int(token)] if isinstance(node, list) else node[token]
            key = int(last) if isinstance(node, list) else last
            if not isinstance(node[key], str):
                raise TypeError
            if scheme:
                node[key] = scheme + posixpath.normpath(posixpath.join(base, node[key]))
            else:
                node[key] = os.path.normpath(os.path.join(base, node[key]))
        except (KeyError, IndexError, ValueError, TypeError):
            raise ValueError(f"relative path {pointer!r} does not name a string") from None
    return out
