"""Token shards: packing documents into fixed-length sequences, the shard files, the manifest, the
zero-copy reader and the distributed sampler (docs/ARCHITECTURE.md, Shard format).

Packing: each document is encoded with the EOS/BOS policy of largetrain_core.tokenizer, the token
streams of one split are concatenated in corpus order and cut into consecutive, non-overlapping
windows of ``seq_len + 1`` tokens (a sequence's input is ``window[:-1]``, its target
``window[1:]``). No window is padded, ragged or empty. The tail of each split that is shorter than
one window is dropped and counted in the manifest as ``dropped_remainder_tokens``.

Split: a document goes to ``validation`` when ``xxh64(doc_id, seed) / 2**64 < validation_fraction``
(stable under reordering and re-batching); if that leaves validation empty while there are at least
two documents, the document with the smallest hash is moved there, so both splits exist.

Intended repetition: a document whose ``copies`` column (largetrain_core.balance: up-sampling, or any
whole-copy data-mixing weight) is ``c > 1`` goes into the train split ``c`` times: once in corpus
order with every other document, then once more in each of the passes 2..c over the documents with
at least that many copies, so a document's copies lie far apart in the token stream rather than in
one window. The validation split holds each of its documents once (held-out perplexity measures the
corpus as it is). The manifest counts them apart from the documents: ``repeated_documents``,
``repeat_copies`` (the extra copies) and ``repeat_tokens`` per split.

Shard file: an uncompressed Arrow IPC file with one column
``input_ids: fixed_size_list<uint16|uint32>[seq_len + 1]`` and schema metadata ``seq_len``,
``dtype``, ``eos_id``, ``vocab_size``, ``tokenizer_sha256``. ``manifest.json`` lists every shard
with its sequence count, byte size and xxh3-128 checksum.

Exports for other loaders: Megatron-LM ``IndexedDataset`` (``export_megatron``) and HDF5
(``export_hdf5``); the CLI: ``python -m largetrain_core.shards {inspect,export-megatron,export-hdf5}``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import xxhash

from largetrain_core.balance import COPIES
from largetrain_core.digest import file_digest
from largetrain_core.storage import ArtefactError, loading, part_files
from largetrain_core.tokenizer import TokenizerInfo, encode_documents, load_tokenizer_info, read_tokenizer

FORMAT = "largetrain.token_shards/1"
SPLITS = ("train", "validation")


class ShardError(ArtefactError):
    """A shard directory that does not match its manifest (the message names the file)."""



class _SplitWriter:
    """Packs one split's token stream into windows and writes them into shard files."""

    def __init__(self, out_dir: Path, split: str, seq_len: int, info: TokenizerInfo, sequences_per_shard: int):
        self.out_dir, self.split, self.window = out_dir, split, seq_len + 1
        self.arrow_type = pa.uint16() if info.dtype == np.uint16 else pa.uint32()
        self.schema = pa.schema(
            [pa.field("input_ids", pa.list_(self.arrow_type, self.window))],
            metadata={"seq_len": str(seq_len), "dtype": info.dtype.name, "eos_id": str(info.eos_id),
                      "vocab_size": str(info.vocab_size), "tokenizer_sha256": info.sha256},
        )
        self.sequences_per_shard = sequences_per_shard
        self.pending: list[np.ndarray] = []
        self.pending_tokens = 0
        self.dtype = info.dtype
        self.buffer: np.ndarray | None = None
        self.filled = 0
        self.shards: list[dict] = []
        self.documents = 0
        self.document_tokens = 0
        self.repeated_documents = 0
        self.repeat_copies = 0
        self.repeat_tokens = 0

    def add(self, docs: list[np.ndarray], repeat: bool = False) -> None:
        """Pack ``docs`` (token arrays); ``repeat``: they are extra copies of documents already added."""
        if repeat:
            self.repeat_copies += len(docs)
            self.repeat_tokens += sum(len(d) for d in docs)
        else:
            self.documents += len(docs)
        for d in docs:
            self.pending.append(d)
            self.pending_tokens += len(d)
            self.document_tokens += len(d)
        if self.pending_tokens >= self.window:
            stream = np.concatenate(self.pending)
            n = len(stream) // self.window
            self._write(stream[: n * self.window].reshape(n, self.window))
            rest = stream[n * self.window:]
            self.pending, self.pending_tokens = [rest], len(rest)

    def _write(self, rows: np.ndarray) -> None:
        """Buffer full windows; each shard is written as ONE record batch, so a reader sees one
        contiguous (sequences, seq_len + 1) array per shard. Memory: one shard's rows."""
        while len(rows):
            if self.buffer is None:
                self.buffer = np.empty((self.sequences_per_shard, self.window), dtype=self.dtype)
                self.filled = 0
            take = min(len(rows), self.sequences_per_shard - self.filled)
            self.buffer[self.filled: self.filled + take] = rows[:take]
            self.filled += take
            rows = rows[take:]
            if self.filled == self.sequences_per_shard:
                self._flush()

    def _flush(self) -> None:
        if self.buffer is None or self.filled == 0:
            return
        name = f"{self.split}-{len(self.shards):05d}.arrow"
        path = self.out_dir / name
        flat = pa.array(self.buffer[: self.filled].reshape(-1), type=self.arrow_type)
        col = pa.FixedSizeListArray.from_arrays(flat, self.window)
        with pa.ipc.new_file(str(path), self.schema) as writer:
            writer.write_batch(pa.record_batch([col], schema=self.schema))
        self.shards.append({"file": name, "sequences": self.filled, "bytes": path.stat().st_size,
                            "xxh3_128": file_digest(path)})
        self.buffer, self.filled = None, 0

    def finish(self) -> dict:
        self._flush()
        sequences = sum(s["sequences"] for s in self.shards)
        return {"shards": self.shards, "sequences": sequences, "tokens": sequences * self.window,
                "documents": self.documents, "document_tokens": self.document_tokens,
                "repeated_documents": self.repeated_documents, "repeat_copies": self.repeat_copies,
                "repeat_tokens": self.repeat_tokens, "dropped_remainder_tokens": self.pending_tokens}


def split_of(doc_ids: list[str], validation_fraction: float, seed: int) -> np.ndarray:
    """Boolean array: True where a document belongs to the validation split (see module doc)."""
    limit = validation_fraction * 2**64
    return np.array([xxhash.xxh64_intdigest(d.encode(), seed) < limit for d in doc_ids], dtype=bool)


def build_token_shards(in_dir: Path, tokenizer_path: Path, out_dir: Path, *, seq_len: int = 1024,
                       validation_fraction: float = 0.05, seed: int = 0, sequences_per_shard: int = 8192,
                       batch_documents: int = 512, source_data_version: str = "") -> dict:
    """Tokenize the ``part-*.parquet`` documents of ``in_dir`` and write shards + manifest.json to ``out_dir``.

    Memory is bounded by ``batch_documents`` documents plus one shard's open record batch. A
    ``copies`` column repeats documents in the train split (module docstring). Returns the manifest
    (dict). Raises ValueError on bad arguments and, naming the part file, on a ``copies`` value that is
    null or below 1.
    """
    if seq_len < 1 or not 0.0 <= validation_fraction < 1.0:
        raise ValueError(f"need seq_len >= 1 and 0 <= validation_fraction < 1, got {seq_len}, {validation_fraction}")
    info = load_tokenizer_info(tokenizer_path)
    tok = read_tokenizer(info.path)
    out_dir = Path(out_dir)
    parts = part_files(in_dir)
    # The split is decided on doc ids before tokenizing, so the fallback (smallest hash) needs one pass over ids.
    ids = pl.concat([_read_part(p, ["doc_id"]) for p in parts])["doc_id"].to_list() if parts else []
    forced = None
    if ids and len(ids) >= 2 and validation_fraction > 0 and not split_of(ids, validation_fraction, seed).any():
        forced = min(ids, key=lambda d: xxhash.xxh64_intdigest(d.encode(), seed))
    writers = {s: _SplitWriter(out_dir, s, seq_len, info, sequences_per_shard) for s in SPLITS}

    def validation(doc_ids: list[str]) -> np.ndarray:
        is_val = split_of(doc_ids, validation_fraction, seed)
        if forced is not None:
            is_val |= np.array([d == forced for d in doc_ids], dtype=bool)
        return is_val

    most_copies = 1
    for part in parts:
        weighted = COPIES in pl.read_parquet_schema(part)
        for batch in _read_part(part).iter_slices(batch_documents):
            is_val = validation(batch["doc_id"].to_list())
            if weighted:
                c = batch[COPIES]
                if c.null_count() or (c < 1).any():
                    raise ValueError(f"{part}: column {COPIES!r} must be >= 1 in every row (how many times the "
                                     f"train split holds the document)")
                train_copies = c.to_numpy()[~is_val]
                most_copies = max(most_copies, int(train_copies.max(initial=1)))
                writers["train"].repeated_documents += int((train_copies > 1).sum())
            encoded = encode_documents(tok, info, batch["text"].to_list())
            writers["train"].add([e for e, v in zip(encoded, is_val) if not v])
            writers["validation"].add([e for e, v in zip(encoded, is_val) if v])
    for k in range(1, most_copies):  # pass k + 1: the train documents with more than k copies
        for part in parts:
            if COPIES not in pl.read_parquet_schema(part):
                continue
            for batch in _read_part(part, ["doc_id", "text", COPIES]).iter_slices(batch_documents):
                again = (batch[COPIES].to_numpy() > k) & ~validation(batch["doc_id"].to_list())
                if again.any():
                    texts = [t for t, a in zip(batch["text"].to_list(), again) if a]
                    writers["train"].add(encode_documents(tok, info, texts), repeat=True)
    manifest = {
        "format": FORMAT, "seq_len": seq_len, "dtype": info.dtype.name, "eos_id": info.eos_id, "bos_id": info.bos_id,
        "vocab_size": info.vocab_size, "tokenizer_sha256": info.sha256, "source_data_version": source_data_version,
        "validation_fraction": validation_fraction, "seed": seed,
        "splits": {s: w.finish() for s, w in writers.items()},
    }
    manifest["total_tokens"] = sum(s["tokens"] for s in manifest["splits"].values())
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the shards carry the tokenizer that made them
        if (info.path.parent / name).exists():
            shutil.copy(info.path.parent / name, out_dir / name)
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def _read_part(path: Path, columns: list[str] | None = None) -> pl.DataFrame:
    with loading(path, "Parquet part file of a text stage (doc_id, text)"):
        return pl.read_parquet(path, columns=columns)


@dataclass
class TokenShards:
    """Memory-mapped, zero-copy view of one split of a shard directory.

    ``shards[i]`` is a numpy array of shape (seq_len + 1,) and dtype uint16/uint32; ``take(idx)``
    gathers an (len(idx), seq_len + 1) array. Nothing is read from disk until a row is touched.
    """

    directory: Path
    split: str = "train"
    verify_checksums: bool = False

    def __post_init__(self):
        self.directory = Path(self.directory)
        mf = self.directory / "manifest.json"
        if not mf.exists():
            raise ShardError(f"{mf}: missing (the shard directory is incomplete or not a shard directory)")
        try:
            self.manifest = json.loads(mf.read_text())
        except ValueError as e:  # cut short or garbled (JSONDecodeError, UnicodeDecodeError)
            raise ShardError(f"{mf}: not valid JSON ({e}); the shard directory is incomplete or corrupt") from e
        if not isinstance(self.manifest, dict) or self.manifest.get("format") != FORMAT:
            found = self.manifest.get("format") if isinstance(self.manifest, dict) else type(self.manifest).__name__
            raise ShardError(f"{mf}: format {found!r}, expected {FORMAT!r}")
        if self.split not in self.manifest["splits"]:
            raise ShardError(f"{mf}: no split {self.split!r}")
        self.seq_len = int(self.manifest["seq_len"])
        self.dtype = np.dtype(self.manifest["dtype"])
        self._arrays: list[np.ndarray] = []
        for entry in self.manifest["splits"][self.split]["shards"]:
            self._arrays.extend(self._open(entry))
        lengths = [len(a) for a in self._arrays]
        self._offsets = np.cumsum([0] + lengths)
        expected = self.manifest["splits"][self.split]["sequences"]
        if self._offsets[-1] != expected:
            raise ShardError(f"{mf}: split {self.split!r} has {self._offsets[-1]} sequences on disk, manifest says {expected}")

    def _open(self, entry: dict) -> list[np.ndarray]:
        path = self.directory / entry["file"]
        if not path.exists():
            raise ShardError(f"{path}: listed in manifest.json but missing")
        size = path.stat().st_size
        if size != entry["bytes"]:
            raise ShardError(f"{path}: {size} bytes on disk, manifest says {entry['bytes']} (truncated or rewritten)")
        if self.verify_checksums and file_digest(path) != entry["xxh3_128"]:
            raise ShardError(f"{path}: xxh3-128 checksum differs from manifest.json")
        try:
            reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
        except pa.ArrowInvalid as e:
            raise ShardError(f"{path}: not a readable Arrow IPC file: {e}") from e
        meta = {k.decode(): v.decode() for k, v in (reader.schema.metadata or {}).items()}
        if meta.get("seq_len") != str(self.seq_len) or meta.get("dtype") != self.dtype.name:
            raise ShardError(f"{path}: schema metadata {meta} does not match manifest seq_len={self.seq_len} dtype={self.dtype}")
        out = []
        try:
            for i in range(reader.num_record_batches):
                values = reader.get_batch(i).column(0).flatten()
                out.append(values.to_numpy(zero_copy_only=True).reshape(-1, self.seq_len + 1))
        except (pa.ArrowException, ValueError) as e:  # a same-size but corrupted file, without verify_checksums
            raise ShardError(f"{path}: record batch {i} is unreadable: {e}") from e
        total = sum(len(a) for a in out)
        if total != entry["sequences"]:
            raise ShardError(f"{path}: {total} sequences, manifest says {entry['sequences']}")
        return out

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < len(self):
            raise IndexError(f"sequence {i} out of range for {len(self)} sequences")
        chunk = int(np.searchsorted(self._offsets, i, side="right")) - 1
        return self._arrays[chunk][i - self._offsets[chunk]]

    def take(self, indices) -> np.ndarray:
        """Gather rows: (len(indices), seq_len + 1) array of the shard dtype."""
        idx = np.asarray(indices, dtype=np.int64)
        if len(self._arrays) == 1:
            return self._arrays[0][idx]
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"sequence index out of range for {len(self)} sequences")
        chunks = np.searchsorted(self._offsets, idx, side="right") - 1
        out = np.empty((len(idx), self.seq_len + 1), dtype=self.dtype)
        for c in np.unique(chunks):  # one fancy-index gather per record batch touched
            sel = chunks == c
            out[sel] = self._arrays[c][idx[sel] - self._offsets[c]]
        return out


@functools.lru_cache(maxsize=4)
def _permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    perm = np.random.Generator(np.random.PCG64([seed, epoch])).permutation(num_samples)
    perm.flags.writeable = False
    return perm


@dataclass
class DistributedSampler:
    """Which sequences a rank reads, as a pure function of (seed, epoch, consumed_samples, rank, world_size).

    The global sample stream is epoch after epoch of a seeded permutation of ``num_samples``
    (numpy PCG64 seeded with ``(seed, epoch)``). Global stream position ``p`` lies in epoch
    ``p // num_samples``. A micro-step with ``consumed_samples`` samples already consumed across
    all ranks gives rank ``r`` positions ``consumed + r * micro_batch + [0, micro_batch)``, so the
    ranks together read each epoch exactly once. Nothing is dropped: there is no drop_last
    remainder, since a micro-step that crosses an epoch boundary takes the end of one permutation
    and the start of the next. Resuming from any ``consumed_samples`` costs one permutation of
    ``num_samples`` (cached), however far into the epoch.

    Used as an iterator it yields this rank's micro-batches (int64 arrays of shape
    ``(micro_batch_size,)``) and advances ``consumed_samples`` by ``micro_batch_size * world_size``;
    ``state_dict``/``load_state_dict`` save and restore that position.
    """

    num_samples: int
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    micro_batch_size: int = 1
    consumed_samples: int = 0

    def __post_init__(self):
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world size {self.world_size}")

    def permutation(self, epoch: int) -> np.ndarray:
        """The read-only order of epoch ``epoch``: int64 array of shape (num_samples,)."""
        return _permutation(self.num_samples, self.seed, epoch)

    def indices(self, consumed_samples: int, micro_batch: int) -> np.ndarray:
        """Sequence indices (int64, shape (micro_batch,), read-only) for this rank's micro-batch after ``consumed_samples``."""
        if self.num_samples <= 0:
            raise ValueError("cannot sample from an empty split")
        start = consumed_samples + self.rank * micro_batch
        epoch, offset = divmod(start, self.num_samples)
        if offset + micro_batch <= self.num_samples:  # the common case: inside one epoch, a slice
            return self.permutation(epoch)[offset: offset + micro_batch]
        pos = start + np.arange(micro_batch, dtype=np.int64)
        epochs = pos // self.num_samples
        out = np.empty(micro_batch, dtype=np.int64)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = self.permutation(int(e))[pos[sel] % self.num_samples]
        return out

    @property
    def epoch(self) -> int:
        return self.consumed_samples // self.num_samples if self.num_samples else 0

    def __iter__(self):
        while True:
            idx = self.indices(self.consumed_samples, self.micro_batch_size)
            self.consumed_samples += self.micro_batch_size * self.world_size
            yield idx

    def state_dict(self) -> dict:
        return {"num_samples": self.num_samples, "seed": self.seed, "world_size": self.world_size,
                "micro_batch_size": self.micro_batch_size, "consumed_samples": self.consumed_samples,
                "epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        """Restore the position. Raises ValueError when the state belongs to other data or another seed."""
        for key in ("num_samples", "seed"):
            if state[key] != getattr(self, key):
                raise ValueError(f"sampler state has {key}={state[key]}, this sampler {getattr(self, key)}: "
                                 "resuming would read a different sample order")
        self.consumed_samples = int(state["consumed_samples"])


# Megatron-LM / Megatron-Core ``IndexedDataset`` layout (megatron/core/datasets/indexed_dataset.py):
# .idx = b"MMIDIDX\x00\x00", <Q version 1, <B dtype code, <Q sequence count, <Q document count,
#        int32 sequence lengths, int64 sequence byte offsets into .bin, int64 document indices
#        (the sequence index where each document starts, plus the total at the end);
# .bin = the token ids of every sequence, concatenated.
MEGATRON_INDEX_HEADER = b"MMIDIDX\x00\x00"
MEGATRON_DTYPE_CODES = {np.dtype(np.uint8): 1, np.dtype(np.int8): 2, np.dtype(np.int16): 3, np.dtype(np.int32): 4,
                        np.dtype(np.int64): 5, np.dtype(np.float64): 6, np.dtype(np.float32): 7, np.dtype(np.uint16): 8}


def export_megatron(shards_dir: Path, split: str, out_prefix: Path) -> dict:
    """Write one split as a Megatron ``IndexedDataset`` pair ``out_prefix.bin`` / ``out_prefix.idx``.

    Each packed sequence (seq_len + 1 tokens) becomes one Megatron sequence and one document, so
    Megatron's GPTDataset sees exactly our windows. Token dtype: uint16 as is; uint32 is written as
    int32 (Megatron has no uint32 code; ids < 2**31 always fit). Both files are written under
    temporary names and renamed. Returns ``{"sequences", "tokens", "dtype"}``.
    """
    import struct

    data = TokenShards(Path(shards_dir), split)
    dtype = np.dtype(np.uint16) if data.dtype == np.uint16 else np.dtype(np.int32)
    n, width = len(data), data.seq_len + 1
    out_prefix = Path(out_prefix)
    out_prefix.parent.mkdir(parents=True, exist_ok=True)
    bin_path, idx_path = out_prefix.with_suffix(".bin"), out_prefix.with_suffix(".idx")
    tmp_bin, tmp_idx = bin_path.with_name(f".{bin_path.name}.tmp"), idx_path.with_name(f".{idx_path.name}.tmp")
    with open(tmp_bin, "wb") as fh:
        for start in range(0, n, 8192):
            fh.write(data.take(np.arange(start, min(n, start + 8192))).astype(dtype, copy=False).tobytes())
    with open(tmp_idx, "wb") as fh:
        fh.write(MEGATRON_INDEX_HEADER)
        fh.write(struct.pack("<Q", 1))
        fh.write(struct.pack("<B", MEGATRON_DTYPE_CODES[dtype]))
        fh.write(struct.pack("<Q", n))
        fh.write(struct.pack("<Q", n + 1))
        fh.write(np.full(n, width, dtype=np.int32).tobytes(order="C"))
        fh.write((np.arange(n, dtype=np.int64) * width * dtype.itemsize).tobytes(order="C"))
        fh.write(np.arange(n + 1, dtype=np.int64).tobytes(order="C"))
    os.replace(tmp_bin, bin_path)
    os.replace(tmp_idx, idx_path)
    return {"sequences": n, "tokens": n * width, "dtype": dtype.name}


def export_hdf5(shards_dir: Path, split: str, out_path: Path, chunk_sequences: int = 1024) -> dict:
    """Write one split as an HDF5 file (h5py) for loaders that expect HDF5.

    Layout:

    * ``input_ids``: (sequences, seq_len + 1), the shards' dtype (uint16/uint32), chunked by
      ``chunk_sequences`` rows, uncompressed: the packed windows exactly as training reads them.
    * ``document_offsets``: int64, (documents + 1,): where each document starts in the row-major
      token stream ``input_ids[:].reshape(-1)``; the last entry is the stream's length. Document
      ``k`` is ``stream[offsets[k]:offsets[k + 1]]`` and ends with EOS (packing appends EOS to every
      document and encodes special-token text inside a document as plain text, so EOS marks exactly
      the document ends), except that the last document may be cut where the split's dropped
      remainder begins (attribute ``last_document_complete``). Documents that fell wholly into the
      dropped remainder have no entry: ``len(offsets) - 1`` can be below the split's ``documents``.
    * attributes of the root: the manifest's scalars (``format``, ``seq_len``, ``dtype``, ``eos_id``,
      ``bos_id`` (-1 without BOS), ``vocab_size``, ``tokenizer_sha256``, ``source_data_version``,
      ``validation_fraction``, ``seed``), ``split``, the split's counts (``sequences``, ``tokens``,
      ``documents``, ``document_tokens``, ``dropped_remainder_tokens``), and ``manifest_json`` (the
      whole manifest.json, with every shard's checksum).

    Written under a temporary name and renamed. Returns ``{"sequences", "tokens", "documents", "dtype"}``.
    Raises ShardError when the shard directory does not match its manifest.
    """
    import h5py

    data = TokenShards(Path(shards_dir), split)
    m = data.manifest
    n, width = len(data), data.seq_len + 1
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    starts = [np.zeros(1, dtype=np.int64)] if n else []
    with h5py.File(tmp, "w") as f:
        ids = f.create_dataset("input_ids", shape=(n, width), dtype=data.dtype,
                               chunks=(max(1, min(chunk_sequences, n)), width) if n else None)
        for lo in range(0, n, chunk_sequences):
            rows = data.take(np.arange(lo, min(n, lo + chunk_sequences)))
            ids[lo: lo + len(rows)] = rows
            ends = np.flatnonzero(rows.reshape(-1) == m["eos_id"]).astype(np.int64) + lo * width + 1
            starts.append(ends)
        offsets = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
        total = n * width
        offsets = np.append(offsets[offsets < total], total)
        f.create_dataset("document_offsets", data=offsets)
        for key in ("format", "seq_len", "dtype", "eos_id", "vocab_size", "tokenizer_sha256", "source_data_version",
                    "validation_fraction", "seed"):
            f.attrs[key] = m[key]
        f.attrs["bos_id"] = -1 if m.get("bos_id") is None else m["bos_id"]
        f.attrs["split"] = split
        for key in ("sequences", "tokens", "documents", "document_tokens", "dropped_remainder_tokens"):
            f.attrs[key] = m["splits"][split][key]
        f.attrs["last_document_complete"] = bool(n == 0 or data[n - 1][-1] == m["eos_id"])
        f.attrs["manifest_json"] = json.dumps(m)
    os.replace(tmp, out_path)
    return {"sequences": n, "tokens": total, "documents": len(offsets) - 1, "dtype": data.dtype.name}


def inspect(path: Path, split: str = "train") -> str:
    """Human-readable summary of a shard directory: sequences, tokens, dtype, tokenizer hash, one decoded sample."""
    shards = TokenShards(Path(path), split, verify_checksums=True)
    m = shards.manifest
    lines = [f"{path} ({m['format']})", f"seq_len={m['seq_len']} dtype={m['dtype']} eos_id={m['eos_id']} "
             f"vocab_size={m['vocab_size']} tokenizer_sha256={m['tokenizer_sha256'][:16]}..."]
    for s, info in m["splits"].items():
        lines.append(f"{s}: {info['sequences']} sequences, {info['tokens']} tokens in {len(info['shards'])} shards, "
                     f"{info['documents']} documents, {info['dropped_remainder_tokens']} remainder tokens dropped")
    tok_path = Path(path) / "tokenizer.json"
    if len(shards) and tok_path.exists():
        text = read_tokenizer(tok_path).decode(shards[0][:64].tolist(), skip_special_tokens=False)
        lines.append(f"{split}[0][:64] decoded: {text!r}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m largetrain_core.shards")
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("inspect", help="print a shard directory's summary and one decoded sample")
    i.add_argument("path")
    i.add_argument("--split", default="train", choices=SPLITS)
    e = sub.add_parser("export-megatron", help="write a split as Megatron-LM IndexedDataset .bin/.idx")
    e.add_argument("path")
    e.add_argument("out_prefix")
    e.add_argument("--split", default="train", choices=SPLITS)
    h = sub.add_parser("export-hdf5", help="write a split as HDF5: input_ids, document_offsets, manifest attributes")
    h.add_argument("path")
    h.add_argument("out", help="the .h5 file to write")
    h.add_argument("--split", default="train", choices=SPLITS)
    args = p.parse_args(argv)
    try:
        if args.cmd == "inspect":
            print(inspect(Path(args.path), args.split))
        elif args.cmd == "export-hdf5":
            print(json.dumps(export_hdf5(Path(args.path), args.split, Path(args.out))))
        else:
            print(json.dumps(export_megatron(Path(args.path), args.split, Path(args.out_prefix))))
    except ShardError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
