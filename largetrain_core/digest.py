"""Content digests of files and of sets of files: what a corpus's (or an imported model's) data
version is made of, so that it depends on the bytes and the relative names, never on where the
files lie or when they were written.

* A file's digest is xxh3-128 (xxhash) over its bytes, read in blocks of :data:`BLOCK` bytes.
* A set of files under a base directory has the digest :func:`files_digest`: xxh3-128 over, for
  every file in sorted order of its relative POSIX path, the relative path's bytes, a NUL, the
  file's digest and a newline. Copying or moving the directory, or re-extracting the same archive
  at another time, keeps it; renaming, adding, removing or editing a file changes it.
* :class:`DigestCache` keeps a file's digest while the file's size, mtime, ctime and inode are
  unchanged, so an unchanged corpus is not re-read. ctime and the inode join the (size, mtime) key
  because mtime can be set back (``touch -d``, ``cp -p``, ``tar``, ``rsync -t``) while ctime cannot;
  a file whose mtime or ctime is less than ``racy_seconds`` old is not cached (as git treats "racily
  clean" index entries: a write in the same timestamp tick as the stat would leave all four
  unchanged). The cache is one JSON file, read whole and replaced atomically
  (largetrain_core.fs.write_atomic); a cache file that cannot be read is ignored and rebuilt.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

import xxhash

from largetrain_core.fs import filesystem, is_url, object_stamp, open_input, write_atomic

BLOCK = 1 << 20  # 1 MiB reads: xxh3 runs at memory speed, the block size only bounds memory
# Objects are hashed OBJECT_THREADS at a time (their round trips overlap; s3fs and gcsfs serve all threads from
# one event loop), and one of at most WHOLE_BYTES is fetched with one GET. Our choices, no standard's: 16 objects
# of 8 MiB in flight bound the memory to 128 MiB.
OBJECT_THREADS = 16
WHOLE_BYTES = 8 << 20
RACY_SECONDS = 2.0  # the coarsest common mtime granularity (FAT, some network file systems) is 2 s


def file_digest(path: str | Path) -> str:
    """xxh3-128 of the file's bytes as 32 hex digits. Raises OSError when the file cannot be read."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as fh:
        while block := fh.read(BLOCK):
            h.update(block)
    return h.hexdigest()


class DigestCache:
    """File digests kept in ``path`` (a JSON file) and reused while a file's (size, mtime_ns,
    ctime_ns, inode) are unchanged; ``path=None`` keeps them in memory only.

    ``hits`` and ``misses`` count lookups since construction (a miss reads the file).
    Call :meth:`save` to write the cache back: only the files looked up since loading are kept, so a
    cache file follows one set of files (one corpus partition) and forgets files that left it.
    """

    def __init__(self, path: str | Path | None = None, racy_seconds: float = RACY_SECONDS):
        self.path = Path(path) if path is not None else None
        self.racy_ns = int(racy_seconds * 1e9)
        self.hits = self.misses = 0
        self._lock = threading.Lock()  # files_digest looks objects up from several threads
        self._old: dict[str, list] = {}
        self._new: dict[str, list] = {}
        if self.path is not None and self.path.exists():
            try:
                data = json.loads(self.path.read_text())
                if isinstance(data, dict) and data.get("version") == 1 and isinstance(data.get("files"), dict):
                    self._old = data["files"]
            except (OSError, ValueError):
                pass  # a damaged cache is not trusted: every file is read again and the file rewritten

    def digest(self, path: str | Path) -> str:
        """The digest of ``path`` (see :func:`file_digest`), from the cache when the file is unchanged.
        ``path`` may be an object's URL: it is then unchanged while its size and ETag (or generation)
        are, which the store changes on every write; its bytes are streamed once to hash them."""
        if is_url(path):
            return self._object_digest(str(path))
        key = os.path.abspath(path)
        st = os.stat(key)
        stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        entry = self._new.get(key) or self._old.get(key)
        if isinstance(entry, list) and len(entry) == 5 and entry[:4] == stamp:
            self.hits += 1
            self._new[key] = entry
            return entry[4]
        self.misses += 1
        digest = file_digest(key)
        after = os.stat(key)
        unchanged = [after.st_size, after.st_mtime_ns, after.st_ctime_ns, after.st_ino] == stamp
        if unchanged and time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) >= self.racy_ns:
            self._new[key] = stamp + [digest]
        return digest

    def _object_digest(self, url: str) -> str:
        fsys, inner = filesystem(url)
        info = fsys.info(inner)
        stamp = [int(info["size"]), object_stamp(info)]
        entry = self._new.get(url) or self._old.get(url)
        if stamp[1] is not None and isinstance(entry, list) and len(entry) == 3 and entry[:2] == stamp:
            with self._lock:
                self.hits += 1
                self._new[url] = entry
            return entry[2]
        h = xxhash.xxh3_128()
        if stamp[0] <= WHOLE_BYTES:  # one GET
            h.update(fsys.cat_file(inner))
        else:
            with open_input(url) as fh:
                while block := fh.read(BLOCK):
                    h.update(block)
        with self._lock:
            self.misses += 1
            if stamp[1] is not None:
                self._new[url] = stamp + [h.hexdigest()]
        return h.hexdigest()

    def save(self) -> None:
        """Write the entries looked up since loading to ``path`` (atomically); nothing when ``path`` is None."""
        if self.path is None:
            return
        write_atomic(self.path, json.dumps({"version": 1, "files": self._new}).encode())


def files_digest(base: str | Path, files: Iterable[str | Path], cache: DigestCache | None = None) -> str:
    """xxh3-128 (32 hex digits) over (relative path, content digest) of ``files``, each relative to
    ``base`` (see the module doc): local paths, or objects' URLs under a base URL (the same digest as
    the same files on local disk). Raises ValueError for a file outside ``base``, OSError when one
    cannot be read."""
    cache = cache or DigestCache()
    if is_url(base):  # objects: their URLs under the base URL
        prefix = str(base).rstrip("/") + "/"
        outside = [str(f) for f in files if not str(f).startswith(prefix)]
        if outside:
            raise ValueError(f"{outside[0]} is not under {base}")
        rel = sorted((str(f)[len(prefix) :], str(f)) for f in files)
    else:
        base = Path(base)
        rel = sorted((Path(f).relative_to(base).as_posix(), Path(f)) for f in files)
    if is_url(base) and len(rel) > 1:  # each object costs a round trip or two: OBJECT_THREADS at a time
        with ThreadPoolExecutor(OBJECT_THREADS, thread_name_prefix="digest") as pool:
            digests = list(pool.map(cache.digest, [f for _, f in rel]))
    else:
        digests = [cache.digest(f) for _, f in rel]
    h = xxhash.xxh3_128()
    for (name, _), digest in zip(rel, digests):
        h.update(name.encode("utf-8", "surrogateescape") + b"\0" + digest.encode() + b"\n")
    return h.hexdigest()


def tree_digest(root: str | Path, cache: DigestCache | None = None) -> str:
    """:func:`files_digest` of every regular file under the directory ``root`` (recursively, links to
    directories not followed), or of the single file ``root`` relative to its directory."""
    root = Path(root)
    if root.is_file():
        return files_digest(root.parent, [root], cache)
    files = [Path(d) / f for d, _, names in os.walk(root) for f in names if (Path(d) / f).is_file()]
    return files_digest(root, files, cache)
