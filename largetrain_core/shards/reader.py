"""The shard reader: :class:`TokenShards`, a memory-mapped, zero-copy view of one split."""

from __future__ import annotations

import bisect
import json
import os
import posixpath
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from largetrain_core import fs
from largetrain_core.digest import file_digest
from largetrain_core.shards.mixture import systematic
from largetrain_core.shards.sampler import DistributedSampler
from largetrain_core.shards.writer import FORMAT, ShardError


def zero_copy(values: pa.Array, dtype: np.dtype) -> np.ndarray:
    """The values of a primitive Arrow array without nulls, shape (len(values),) and ``dtype``, as a
    read-only NumPy view of its data buffer: nothing is copied, and a memory-mapped shard stays on disk.
    pyarrow's ``Array.to_numpy(zero_copy_only=True)`` gives the same view but loads pandas on its first
    call (0.3 CPU s of every training rank's start). Raises ValueError for another type or any null."""
    if values.type != pa.from_numpy_dtype(dtype) or values.null_count:
        raise ValueError(f"expected {dtype} values without nulls, read {values.type} with {values.null_count} null(s)")
    if len(values) == 0:
        return np.empty(0, dtype)
    return np.frombuffer(values.buffers()[1], dtype=dtype, count=len(values), offset=values.offset * dtype.itemsize)


@dataclass
class TokenShards:
    """Memory-mapped, zero-copy view of one split of a shard directory.

    ``shards[i]`` is a numpy array of shape (seq_len + 1,) and dtype uint16/uint32; ``take(idx)``
    gathers an (len(idx), seq_len + 1) array. Nothing is read from disk until a row is touched. A
    manifest entry may list a shard file that lies outside the directory (a partition's, by a
    relative path), the same file more than once (a mixture's whole passes), or with ``select`` (the
    systematic sample of a mixture: the rows ``systematic(start, rows, fraction, offset)`` picks),
    read through an index of its rows.

    A directory at a URL (an object-store root) is streamed: each shard file is fetched whole into the
    node's :class:`largetrain_core.cache.ShardCache` (bounded in bytes, least recently used files
    evicted, each checked against the manifest's size and xxh3-128) when a row of it is first touched,
    and memory-mapped from there. This process keeps at most :attr:`max_open` files open (in use, so
    never evicted), closing the least recently used one beyond; :meth:`follow` prefetches the files a
    sampler reads next; :meth:`close` releases them.
    """

    directory: Path | str
    split: str = "train"
    verify_checksums: bool = False

    def __post_init__(self):
        self.location = str(self.directory)
        self.remote = fs.is_url(self.location)
        self.directory = None if self.remote else Path(self.directory)
        mf = fs.join(self.location, "manifest.json") if self.remote else self.directory / "manifest.json"
        try:
            self.manifest = json.loads(fs.read_bytes(mf))
        except FileNotFoundError:
            raise ShardError(
                f"{fs.redact(str(mf))}: missing (the shard directory is incomplete or not a shard directory)"
            ) from None
        except ValueError as e:  # cut short or garbled (JSONDecodeError, UnicodeDecodeError)
            raise ShardError(
                f"{fs.redact(str(mf))}: not valid JSON ({e}); the shard directory is incomplete or corrupt"
            ) from e
        if not isinstance(self.manifest, dict) or self.manifest.get("format") != FORMAT:
            found = self.manifest.get("format") if isinstance(self.manifest, dict) else type(self.manifest).__name__
            raise ShardError(f"{mf}: format {found!r}, expected {FORMAT!r}")
        if self.split not in self.manifest["splits"]:
            raise ShardError(f"{mf}: no split {self.split!r}")
        self.seq_len = int(self.manifest["seq_len"])
        self.dtype = np.dtype(self.manifest["dtype"])
        self._sequences = int(self.manifest["splits"][self.split]["sequences"])
        self._entries = self.manifest["splits"][self.split]["shards"]
        self._starts = np.cumsum([0] + [int(e["sequences"]) for e in self._entries])
        self.cache = None  # the ShardCache of a streamed directory, made when first needed
        self._urls: list[str] | None = None  # a streamed directory's file URL per entry, made when first needed
        self._held: dict = {}  # entry -> _entry's result, when this process holds every file open (max_open)
        self._pinned: OrderedDict = OrderedDict()  # file URL -> (Pinned, record batches), least recently used first
        self._lock = threading.Lock()
        self._cache_lock = threading.Lock()  # not self._lock: _shard_cache is called under it
        self._wake = threading.Event()
        self._follower: threading.Thread | None = None
        self._arrays: list[np.ndarray] | None = None
        self._flat: tuple | None = None  # a streamed directory's _flatten(), while every file is held
        if self.remote:
            if self._starts[-1] != self._sequences:
                raise ShardError(
                    f"{fs.redact(str(mf))}: split {self.split!r} lists {self._starts[-1]} sequences in its "
                    f"shards, manifest says {self._sequences}"
                )
        else:
            self._load()

    @property
    def shard_sizes(self) -> list[int]:
        """Sequences per manifest entry (shard file, or its selected rows) of the split, in order."""
        return [int(e["sequences"]) for e in self._entries]

    def _load(self) -> None:
        """Open (memory-map) every shard of a local directory, checking each against the manifest."""
        if self._arrays is not None:
            return
        mf = self.directory / "manifest.json"
        self._arrays = []
        self._rows: list[np.ndarray | None] = []  # per array: the rows it holds, None for all
        for entry in self.manifest["splits"][self.split]["shards"]:
            for array, rows in self._open(entry):
                self._arrays.append(array)
                self._rows.append(rows)
        lengths = [len(a) if r is None else len(r) for a, r in zip(self._arrays, self._rows)]
        self._offsets = np.cumsum([0] + lengths)
        self._starts_list = self._offsets.tolist()
        expected = self.manifest["splits"][self.split]["sequences"]
        if self._offsets[-1] != expected:
            raise ShardError(
                f"{mf}: split {self.split!r} has {self._offsets[-1]} sequences on disk, manifest says {expected}"
            )

    def _open(self, entry: dict) -> list[tuple[np.ndarray, np.ndarray | None]]:
        path = self.directory / entry["file"]
        if not path.exists():
            raise ShardError(f"{path}: listed in manifest.json but missing")
        return self._select(entry, self._batches(path, entry), str(path))

    def _batches(self, path: Path, entry: dict, shown: str | None = None) -> list[np.ndarray]:
        """The record batches of the shard file ``path``, memory-mapped, checked against ``entry``: size,
        schema (and the checksum with ``verify_checksums``). ``shown``: its name in errors."""
        shown = shown or str(path)
        size = path.stat().st_size
        if size != entry["bytes"]:
            raise ShardError(f"{shown}: {size} bytes on disk, manifest says {entry['bytes']} (truncated or rewritten)")
        if self.verify_checksums and file_digest(path) != entry["xxh3_128"]:
            raise ShardError(f"{shown}: xxh3-128 checksum differs from manifest.json")
        try:
            reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
        except pa.ArrowInvalid as e:
            raise ShardError(f"{shown}: not a readable Arrow IPC file: {e}") from e
        meta = {k.decode(): v.decode() for k, v in (reader.schema.metadata or {}).items()}
        if meta.get("seq_len") != str(self.seq_len) or meta.get("dtype") != self.dtype.name:
            raise ShardError(
                f"{shown}: schema metadata {meta} does not match manifest seq_len={self.seq_len} dtype={self.dtype}"
            )
        out = []
        try:
            for i in range(reader.num_record_batches):
                values = reader.get_batch(i).column(0).flatten()
                out.append(zero_copy(values, self.dtype).reshape(-1, self.seq_len + 1))
        except (pa.ArrowException, ValueError) as e:  # a same-size but corrupted file, without verify_checksums
            raise ShardError(f"{shown}: record batch {i} is unreadable: {e}") from e
        return out

    def _select(self, entry: dict, out: list[np.ndarray], path: str) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """(batch, the rows of it the entry takes, None for all) of one manifest entry, checked against its count."""
        pick = entry.get("select")
        if pick is None:
            pairs = [(a, None) for a in out]
        else:
            mask, first, pairs = (
                systematic(pick["start"], sum(len(a) for a in out), pick["fraction"], pick["offset"]),
                0,
                [],
            )
            for a in out:
                pairs.append((a, np.flatnonzero(mask[first : first + len(a)])))
                first += len(a)
        total = sum(len(a) if r is None else len(r) for a, r in pairs)
        if total != entry["sequences"]:
            raise ShardError(
                f"{path}: {total} sequences" + (" selected" if pick else "") + f", manifest says {entry['sequences']}"
            )
        return pairs

    # ---------------------------------------------------------------------------------- streamed directories

    def _shard_cache(self):
        """The cache (made once: the prefetch thread and the reading thread may both ask first, and two
        caches would split the byte counts and the bound)."""
        if self.cache is None:
            with self._cache_lock:
                if self.cache is None:
                    from largetrain_core.cache import ShardCache

                    self.cache = ShardCache()
        return self.cache

    def _url(self, e: int) -> str:
        """The URL of entry ``e``'s file (a path relative to the directory, possibly in another one)."""
        if self._urls is None:
            scheme, rest = self.location.rstrip("/").split("://", 1)
            self._urls = [f"{scheme}://{posixpath.normpath(posixpath.join(rest, x['file']))}" for x in self._entries]
        return self._urls[e]

    def _share(self) -> int:
        """This rank's share of the cache, in files: the cache's bound over the largest file, divided
        among the node's LOCAL_WORLD_SIZE ranks."""
        biggest = max((int(e["bytes"]) for e in self._entries), default=1) or 1
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        return max(1, self._shard_cache().max_bytes // biggest // ranks)

    @property
    def prefetch_depth(self) -> int:
        """How many files ahead :meth:`follow` fetches: all of them when this rank's share of the cache
        holds every file of the split, else a quarter of the share (1 to 8)."""
        share, files = self._share(), len({e["file"] for e in self._entries})
        return files if share >= files + 1 else max(1, min(8, share // 4))

    @property
    def max_open(self) -> int:
        """Files this process keeps open from the cache: its share, less what it prefetches; at least 1."""
        share, files = self._share(), len({e["file"] for e in self._entries})
        return files if share >= files + 1 else max(1, share - self.prefetch_depth)

    def _entry(self, e: int) -> tuple[list[tuple[np.ndarray, np.ndarray | None]], np.ndarray]:
        """Entry ``e`` of a streamed directory: (batch, rows) pairs from its file in the cache, held open,
        and the pairs' first rows within the entry (cumulative lengths, one more than the pairs)."""
        found = self._held.get(e)
        if found is not None:
            return found
        entry, url = self._entries[e], self._url(e)
        with self._lock:
            if url in self._pinned:
                self._pinned.move_to_end(url)
                _, batches, pairs = self._pinned[url]
            else:
                while len(self._pinned) >= self.max_open:
                    _, (old, _, _) = self._pinned.popitem(last=False)
                    old.close()
                pinned = self._shard_cache().pin(url, int(entry["bytes"]), entry["xxh3_128"])
                try:
                    batches = self._batches(pinned.path, entry, shown=fs.redact(url))
                except BaseException:
                    pinned.close()
                    raise
                pairs = {}  # entry index -> its (batch, rows) pairs and their start rows: a file may serve several entries
                self._pinned[url] = (pinned, batches, pairs)
                self._wake.set()  # a file newly in use: the files read next have moved, prefetch them
            if e not in pairs:
                chosen = self._select(entry, batches, fs.redact(url))
                pairs[e] = (chosen, np.cumsum([0] + [len(a) if r is None else len(r) for a, r in chosen]))
            found = pairs[e]
            if self.max_open >= len(
                {x["file"] for x in self._entries}
            ):  # every file stays open until close: no recency to keep
                self._held[e] = found
        return found

    def _gather(self, e: int, local: np.ndarray) -> np.ndarray:
        """The rows ``local`` (indices within entry ``e``) of a streamed directory, in that order."""
        pairs, lengths = self._entry(e)
        if len(pairs) == 1:
            a, rows = pairs[0]
            return a[local if rows is None else rows[local]]
        out = np.empty((len(local), self.seq_len + 1), dtype=self.dtype)
        part = np.searchsorted(lengths, local, side="right") - 1
        for c in np.unique(part):
            sel = part == c
            a, rows = pairs[c]
            at = local[sel] - lengths[c]
            out[sel] = a[at if rows is None else rows[at]]
        return out

    def missing_files(self) -> list[str]:
        """What is wrong with the files of a streamed directory, without reading them: every file the
        split lists must be there with its size (one size lookup per file); empty when all are. A local
        directory was checked when it was opened."""
        if not self.remote:
            return []
        problems, seen = [], set()
        for e, entry in enumerate(self._entries):
            url = self._url(e)
            if url in seen:
                continue
            seen.add(url)
            try:
                size = fs.size(url)
            except FileNotFoundError:
                problems.append(f"{fs.redact(url)}: listed in manifest.json but missing")
                continue
            if size != int(entry["bytes"]):
                problems.append(
                    f"{fs.redact(url)}: {size} bytes, manifest says {entry['bytes']} (truncated or rewritten)"
                )
        return problems

    def close(self) -> None:
        """Stop :meth:`follow` and release every file this process holds open from the cache."""
        self._follower, follower = None, self._follower
        self._wake.set()
        if follower is not None:
            follower.join(timeout=10)
        with self._lock:
            self._held.clear()
            self._flat = None
            while self._pinned:
                _, (pinned, _, _) = self._pinned.popitem(last=False)
                pinned.close()

    def follow(self, sampler: "DistributedSampler", micro_batch: int, position) -> None:
        """Prefetch, in a background thread, the files that ``sampler``'s rank reads next: from
        ``position()`` (the samples every rank consumed so far) this rank's next micro-batches of
        ``micro_batch`` sequences, their files in the order they are first read, :attr:`prefetch_depth`
        of them fetched into the cache before the reads need them. Nothing for a local directory. A
        prefetch that fails is left to the read that needs the file, which raises."""
        if not self.remote or self._follower is not None:
            return

        def ahead(me: threading.Thread) -> None:
            depth, step = self.prefetch_depth, micro_batch * sampler.world_size
            files = len({e["file"] for e in self._entries})
            upcoming: list[int] = []
            seen: set[str] = set()
            pos = position()
            for j in range(4096):
                for e in np.searchsorted(self._starts, sampler.indices(pos + j * step, micro_batch), side="right") - 1:
                    if self._entries[e]["file"] not in seen:
                        seen.add(self._entries[e]["file"])
                        upcoming.append(int(e))
                if len(upcoming) >= min(depth, files):
                    break
            for e in upcoming[:depth]:
                if self._follower is not me:
                    return
                self._shard_cache().fetch(self._url(e), int(self._entries[e]["bytes"]), self._entries[e]["xxh3_128"])

        def loop() -> None:
            me = threading.current_thread()
            while self._follower is me:
                self._wake.clear()
                try:
                    ahead(me)
                except Exception:  # noqa: BLE001 -- the read that needs the file fetches it again and raises
                    pass
                self._wake.wait(timeout=1.0)

        self._follower = threading.Thread(target=loop, name="shard-prefetch", daemon=True)
        self._follower.start()

    # ---------------------------------------------------------------------------------- reading

    def __len__(self) -> int:
        return self._sequences

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < len(self):
            raise IndexError(f"sequence {i} out of range for {len(self)} sequences")
        if self.remote:
            return self.take([i])[0]
        self._load()
        chunk = int(np.searchsorted(self._offsets, i, side="right")) - 1
        row, rows = i - self._offsets[chunk], self._rows[chunk]
        return self._arrays[chunk][row if rows is None else rows[row]]

    def take(self, indices) -> np.ndarray:
        """Gather rows: (len(indices), seq_len + 1) array of the shard dtype. Raises IndexError for an
        index out of range."""
        idx = np.asarray(indices, dtype=np.int64)
        if self._arrays is not None:  # a local directory
            return self._take_flat(idx, self._arrays, self._rows, self._offsets, self._starts_list)
        if self.remote:
            flat = self._flat or self._flatten()
            if flat is not None:  # every file held open: gather as from a local directory
                return self._take_flat(idx, *flat)
            if len(idx) and (idx.min() < 0 or idx.max() >= len(self)):
                raise IndexError(f"sequence index out of range for {len(self)} sequences")
            entry = np.searchsorted(self._starts, idx, side="right") - 1
            out = np.empty((len(idx), self.seq_len + 1), dtype=self.dtype)
            order = np.argsort(entry, kind="stable")  # the positions of idx grouped by entry: one gather per entry
            grouped = entry[order]
            bounds = [0, *(np.flatnonzero(grouped[1:] != grouped[:-1]) + 1).tolist(), len(idx)]
            for a, b in zip(bounds, bounds[1:]) if len(idx) else ():
                at, e = order[a:b], int(grouped[a])
                out[at] = self._gather(e, idx[at] - self._starts[e])
            return out
        self._load()
        return self._take_flat(idx, self._arrays, self._rows, self._offsets, self._starts_list)

    def _take_flat(
        self,
        idx: np.ndarray,
        arrays: list[np.ndarray],
        rows: list[np.ndarray | None],
        offsets: np.ndarray,
        starts: list[int],
    ) -> np.ndarray:
        """Rows ``idx`` of record batches ``arrays``, batch ``c`` holding the split's rows
        ``offsets[c]:offsets[c + 1]`` (its ``rows[c]``, None for all of them; ``starts`` is ``offsets``
        as a list). Raises IndexError for an index out of range.

        Indices that all lie in the record batch of the smallest (most random batches when a split is
        one large shard and its short tail) are one fancy-index gather, as from one ``np.memmap``, checked
        by that gather's own bounds check; else one gather per record batch touched, or one row copy
        each for a few rows spread over as many record batches."""
        if not len(idx):
            return np.empty((0, self.seq_len + 1), dtype=self.dtype)
        lo = idx.min()
        if lo < 0 or len(starts) == 1:
            raise IndexError(f"sequence index {lo} out of range for {starts[-1]} sequences")
        c = 0 if lo < starts[1] else bisect.bisect_right(starts, int(lo)) - 1
        if c < len(arrays):
            local = idx - starts[c] if c else idx
            try:  # raises IndexError when an index lies beyond record batch c
                return arrays[c][local if rows[c] is None else rows[c][local]]
            except IndexError:
                pass
        hi = int(idx.max())
        if hi >= starts[-1]:
            raise IndexError(f"sequence index {hi} out of range for {starts[-1]} sequences")
        chunks = offsets.searchsorted(idx, side="right") - 1
        local = idx - offsets[chunks]
        out = np.empty((len(idx), self.seq_len + 1), dtype=self.dtype)
        if len(idx) <= 2 * (bisect.bisect_right(starts, hi) - c):  # about one row per record batch
            for j, (k, r) in enumerate(zip(chunks.tolist(), local.tolist())):
                out[j] = arrays[k][r if rows[k] is None else rows[k][r]]
            return out
        order = np.argsort(chunks, kind="stable")  # positions grouped by record batch
        grouped = chunks[order]
        bounds = (np.flatnonzero(grouped[1:] != grouped[:-1]) + 1).tolist()
        for a, b in zip([0, *bounds], [*bounds, len(idx)]):
            at, k = order[a:b], int(grouped[a])
            out[at] = arrays[k][local[at] if rows[k] is None else rows[k][local[at]]]
        return out

    def _flatten(self) -> tuple[list[np.ndarray], list[np.ndarray | None], np.ndarray, list[int]] | None:
        """A streamed directory's (arrays, rows, offsets, offsets as a list), as :meth:`_load` makes for a local one, once
        every entry is held open (:attr:`max_open` covers the split and each entry was read); else None."""
        if len(self._held) < len(self._entries):
            return None
        with self._lock:
            arrays, rows = [], []
            for e in range(len(self._entries)):
                for a, r in self._held[e][0]:
                    arrays.append(a)
                    rows.append(r)
            offsets = np.cumsum([0] + [len(a) if r is None else len(r) for a, r in zip(arrays, rows)])
            self._flat = (arrays, rows, offsets, offsets.tolist())
        return self._flat
