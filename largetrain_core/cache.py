"""The local cache: where a process keeps what it fetched from an object-store root (working copies of
committed versions, token shards, downloaded models) and where it stages what it uploads; and the
node's bounded cache of streamed token shards (:class:`ShardCache`, LARGETRAIN_SHARD_CACHE_BYTES).

``LARGETRAIN_CACHE`` names the directory (on Kubernetes an ``emptyDir`` volume, largetrain_dagster.k8s);
unset, it is ``$XDG_CACHE_HOME/largetrain`` (``~/.cache/largetrain``). Everything in it can be
deleted at any time between runs: it is fetched again from the root when needed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import time
from pathlib import Path


def cache_dir() -> Path:
    """The local cache directory (created when missing): ``LARGETRAIN_CACHE``, else
    ``$XDG_CACHE_HOME/largetrain``, else ``~/.cache/largetrain``."""
    env = os.environ.get("LARGETRAIN_CACHE")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "largetrain"
    base = base.expanduser().resolve()
    base.mkdir(parents=True, exist_ok=True)
    return base


# ------------------------------------------------------------------------------------------------ shard cache

# Our default, no standard's: room for a few hundred shards of 8192 x 2049 uint16 tokens (32 MiB each) beside a
# node's checkpoints; LARGETRAIN_SHARD_CACHE_BYTES sets it (the Kubernetes profile: from the emptyDir's size).
SHARD_CACHE_BYTES = 16 << 30
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_bytes(text: str | int) -> int:
    """Bytes from ``1073741824``, ``64Gi``, ``500G``, ``1.5TiB`` (Kubernetes quantities: k, M, G, T are
    powers of 1000, Ki, Mi, Gi, Ti of 1024; a trailing B is ignored). Raises ValueError otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]i?)?[bB]?\s*", str(text))
    if not m:
        raise ValueError(f"not a size in bytes: {text!r} (e.g. 68719476736, 64Gi, 500G)")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


def shard_cache_bytes() -> int:
    """The shard cache's bound: LARGETRAIN_SHARD_CACHE_BYTES (parse_bytes), else SHARD_CACHE_BYTES (16 GiB)."""
    env = os.environ.get("LARGETRAIN_SHARD_CACHE_BYTES")
    try:
        return parse_bytes(env) if env else SHARD_CACHE_BYTES
    except ValueError as e:
        raise ValueError(f"LARGETRAIN_SHARD_CACHE_BYTES: {e}") from None


_SIZED = re.compile(r"[0-9a-f]{32}-([0-9]+)-")  # a cache file's name: ShardCache._entry


class CacheFullError(OSError):
    """The shard cache cannot make room within its bound: every shard in it is in use, or the bound is
    smaller than the shard; the message names the bound and what holds it."""


class Pinned:
    """A file of the :class:`ShardCache` held in use (a shared ``flock`` on it): not evicted until :meth:`close`."""

    def __init__(self, path: Path, fd: int):
        self.path, self._fd = path, fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "Pinned":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ShardCache:
    """Whole files (token shards) fetched from an object store into ``<cache>/shards/``, at most
    ``max_bytes`` on disk, shared by every process of a node (the ranks of a training).

    * :meth:`pin` gives a local file, fetched first when it is not there (by one process: the others
      wait on its download lock and find it), checked against its size and xxh3-128, and held in use
      until released. :meth:`fetch` only brings a file in (prefetching).
    * Room is made before a download, under one lock of the whole cache: the space of the files there
      plus the sizes of the downloads under way stays within ``max_bytes``; the files least recently
      used (by their modification time, touched at every pin) that no process holds are deleted first,
      whole. When every file is held the download waits (CacheFullError after ``wait_seconds``, or at
      once when one file is larger than the bound).
    * ``fetched_bytes`` counts what this process downloaded; ``peak_bytes()`` the most the node's cache
      ever held (files plus reservations), kept in the cache directory.
    """

    def __init__(self, directory: str | Path | None = None, max_bytes: int | None = None, wait_seconds: float = 600.0):
        self.dir = Path(directory) if directory is not None else cache_dir() / "shards"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = int(max_bytes) if max_bytes is not None else shard_cache_bytes()
        self.wait_seconds = wait_seconds
        self.fetched_bytes = 0
        self.fetches = 0

    def _entry(self, url: str, size: int) -> Path:
        """The cache file of the object ``url`` of ``size`` bytes: ``<sha256(url)[:32]>-<size>-<name>``.
        The size in the name lets :meth:`_usage` add up the cache with one directory listing and no
        ``stat`` per file (a prefetch thread's system calls each wait for the GIL when the training loop
        holds it)."""
        name = url.rsplit("/", 1)[-1]
        return self.dir / f"{hashlib.sha256(url.encode()).hexdigest()[:32]}-{int(size)}-{name}"

    @contextlib.contextmanager
    def _locked(self, path: Path, mode: int = fcntl.LOCK_EX):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, mode)
            yield fd
        finally:
            os.close(fd)

    def pin(self, url: str, size: int, xxh3_128: str | None = None) -> Pinned:
        """The local copy of the object ``url`` (``size`` bytes; ``xxh3_128``: its checksum, checked after
        the download), held in use: close the returned :class:`Pinned` when done with it."""
        path = self._entry(url, size)
        while True:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                self.fetch(url, size, xxh3_128)
                continue
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # evicted between the open and the lock: fetch it again
                os.close(fd)
                continue
            with contextlib.suppress(OSError):
                os.utime(path)
            return Pinned(path, fd)

    def fetch(self, url: str, size: int, xxh3_128: str | None = None) -> Path:
        """Bring the object ``url`` into the cache unless it is there (no pin); returns its path."""
        from largetrain_core import fs
        from largetrain_core.digest import file_digest

        path = self._entry(url, size)
        with self._locked(path.with_name(path.name + ".dl")):
            if path.exists():
                return path
            part = path.with_name(f"{path.name}.{int(size)}.part")
            with self._locked(part):  # held while downloading: its reservation is live
                self._reserve(int(size), part)
                fsys, inner = fs.filesystem(url)
                fsys.get_file(inner, str(part))
                got = part.stat().st_size
                if got != size or (xxh3_128 and file_digest(part) != xxh3_128):
                    part.unlink()
                    raise OSError(
                        f"{fs.redact(url)}: fetched {got} bytes"
                        + ("" if got != size else " whose xxh3-128 differs from the manifest")
                        + f", the manifest says {size} bytes: the object changed after its version was committed"
                    )
                os.rename(part, path)
            self.fetched_bytes += size
            self.fetches += 1
        return path

    def _usage(self, exclude: Path | None = None) -> tuple[int, list[tuple[Path, int]]]:
        """(bytes held: files plus live reservations, the files as (path, size)); stale reservations
        (their downloader gone) are removed. A file's size is read from its name (:meth:`_entry`); only
        a file named otherwise costs a ``stat``."""
        used, files = 0, []
        for entry in os.scandir(self.dir):
            name = entry.name
            if name.startswith(".") or name.endswith(".dl"):
                continue
            p = Path(entry.path)
            if name.endswith(".part"):
                if p == exclude:
                    continue
                try:
                    fd = os.open(p, os.O_RDWR)
                except FileNotFoundError:  # finished (renamed to its file) or discarded since the listing:
                    used += int(name.rsplit(".", 2)[-2])  # count its size, as the scan may miss the file too
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # a download under way: its declared size is reserved
                    used += int(name.rsplit(".", 2)[-2])
                else:
                    p.unlink(missing_ok=True)  # nobody downloads it any more
                finally:
                    os.close(fd)
                continue
            named = _SIZED.match(name)
            if named:
                size = int(named.group(1))
            else:
                try:
                    size = entry.stat().st_size
                except FileNotFoundError:
                    continue
            used += size
            files.append((p, size))
        return used, files

    @staticmethod
    def _least_recently_used(files: list[tuple[Path, int]]) -> list[tuple[Path, int]]:
        """``files`` (path, size) by modification time, oldest first; those gone since are left out."""
        dated = []
        for p, n in files:
            with contextlib.suppress(FileNotFoundError):
                dated.append((p.stat().st_mtime, p, n))
        return [(p, n) for _, p, n in sorted(dated)]

    def _reserve(self, size: int, part: Path) -> None:
        """Make room for ``size`` more bytes (``part`` is the reservation being made), evicting unused
        files least recently used first; record the peak."""
        if size > self.max_bytes:
            raise CacheFullError(
                f"a shard of {size:,} bytes is larger than the shard cache's bound of "
                f"{self.max_bytes:,} bytes (LARGETRAIN_SHARD_CACHE_BYTES): raise it"
            )
        deadline = time.monotonic() + self.wait_seconds
        while True:
            with self._locked(self.dir / ".lock"):
                used, files = self._usage(exclude=part)
                if used + size > self.max_bytes:  # make room: the files, least recently used first
                    files = self._least_recently_used(files)
                for p, n in files:
                    if used + size <= self.max_bytes:
                        break
                    try:
                        fd = os.open(p, os.O_RDONLY)
                    except FileNotFoundError:
                        continue
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:  # in use by a reader: kept
                        os.close(fd)
                        continue
                    p.unlink(missing_ok=True)
                    os.close(fd)
                    used -= n
                if used + size <= self.max_bytes:
                    part.touch()
                    self._record_peak(used + size)
                    return
            if time.monotonic() > deadline:
                raise CacheFullError(
                    f"the shard cache at {self.dir} holds {used:,} of its {self.max_bytes:,} bytes "
                    f"(LARGETRAIN_SHARD_CACHE_BYTES) in shards that are in use; a shard of {size:,} "
                    "bytes does not fit: raise the bound, or lower shuffle_window_shards"
                )
            time.sleep(0.2)

    def _record_peak(self, used: int) -> None:
        f = self.dir / ".peak"
        try:
            peak = int(f.read_text() or 0)
        except (FileNotFoundError, ValueError):
            peak = 0
        if used > peak:
            f.write_text(str(used))

    def peak_bytes(self) -> int:
        """The most bytes the node's cache held (files and reservations) since :meth:`reset_peak`."""
        try:
            return int((self.dir / ".peak").read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def reset_peak(self) -> None:
        with self._locked(self.dir / ".lock"):
            (self.dir / ".peak").write_text(str(self._usage()[0]))

    def used_bytes(self) -> int:
        """The bytes the cache holds now (files and live reservations)."""
        with self._locked(self.dir / ".lock"):
            return self._usage()[0]
