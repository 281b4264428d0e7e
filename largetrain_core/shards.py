"""Token shards: packing documents into fixed-length sequences, the shard files, the manifest, the
zero-copy reader and the distributed sampler (docs/ARCHITECTURE.md, Shard format).

Packing: each document is encoded with the EOS/BOS policy of largetrain_core.tokenizer. The unit of
packing is one part file of the input (a deduplicated_text part, ~1,024 documents): per split, the
token stream of a part's documents in corpus order is cut into consecutive, non-overlapping windows
of ``seq_len + 1`` tokens (a sequence's input is ``window[:-1]``, its target ``window[1:]``), and
what is left at the part's end, shorter than a window, is its tail. The tails of every part are
concatenated in part order and cut into windows the same way, after the parts' windows; the last
tail shorter than a window is dropped and counted in the manifest as ``dropped_remainder_tokens``.
No window is padded, ragged or empty. So the sequences and their order depend only on the part
files, not on how they are grouped into partitions or tasks: the parts are tokenized in parallel
(:func:`tokenize_partition`, a contiguous range of part files each, :func:`partition_parts`) and one
global step (:func:`assemble_token_shards`) packs the tails and writes ``manifest.json``, which lists
the partitions' shard files where they lie (paths relative to the manifest), so it copies no shard.

Split: a document goes to ``validation`` when ``xxh64(doc_id, seed) / 2**64 < validation_fraction``
(stable under reordering and re-batching); if that leaves validation empty while there are at least
two documents, the document with the smallest hash is moved there, so both splits exist (found by
the global step from each run's smallest hash; the corpus, a small one: the chance is
``(1 - validation_fraction) ** documents``, is then packed again there, in one process).

Intended repetition: a document whose ``copies`` column (largetrain_core.balance: up-sampling, or any
whole-copy data-mixing weight) is ``c > 1`` goes into the train split ``c`` times: once in corpus
order with every other document, then once more in each of the passes 2..c over the documents with
at least that many copies, so a document's copies lie far apart in the token stream rather than in
one window (per part and pass: the windows of pass 1 over every part, then of pass 2 over every part,
..., then the tails in the same order). The validation split holds each of its documents once (held-out perplexity measures the
corpus as it is). The manifest counts them apart from the documents: ``repeated_documents``,
``repeat_copies`` (the extra copies) and ``repeat_tokens`` per split.

Mixture (``mixture``: a weight per corpus, the documents' ``corpus`` column naming theirs): each
corpus's train documents are packed on their own (no window holds two corpora: per corpus its parts'
windows, then its parts' tails), then the train split is made of ``round(weight x N)`` windows of each
corpus, N the windows of every corpus together (the split keeps its size; weights normalized to sum
1). The weight applies in tokens (windows of ``seq_len + 1``), after dedup and balancing. A corpus
above its natural share is up-sampled: its windows whole ``floor(f)`` times, f = target / its
windows, then a systematic sample of the rest (every window i with ``floor((i + 1)r + u) > floor(ir +
u)``, r the remaining fraction, u a seeded offset in [0, 1): evenly spread, exactly the count); one
below is down-sampled to a systematic sample. The manifest says so without copying a window: a shard
listed again for each whole pass, and with ``select`` (start, fraction, offset of the systematic
sample) for a sample, which the reader applies. Repeated windows are intended repetition, counted
apart (``repeat_sequences``); left-out windows are counted (``downsampled_sequences``); the manifest's
``mixture`` gives each corpus's target and realised token share. A weight that would repeat a corpus's
sequences more than ``max_repeats`` times per pass is refused, naming the corpus and its repeat factor
(repeated tokens lose their worth: Muennighoff et al. 2023, "Scaling Data-Constrained Language
Models"; Megatron-LM#547). The validation split holds every corpus's validation documents once, unweighted.

Shard file: an uncompressed Arrow IPC file with one column
``input_ids: fixed_size_list<uint16|uint32>[seq_len + 1]`` and schema metadata ``seq_len``,
``dtype``, ``eos_id``, ``vocab_size``, ``tokenizer_sha256``. ``manifest.json`` lists every shard
with its sequence count, byte size and xxh3-128 checksum.

Exports for other loaders: Megatron-Core ``IndexedDataset`` of the documents (``export_megatron``) and HDF5
(``export_hdf5``); the CLI: ``python -m largetrain_core.shards {inspect,export-megatron,export-hdf5}``.
litdata and mosaicml-streaming: :mod:`largetrain_core.streaming_export`.
"""

from __future__ import annotations

import argparse
import bisect
import functools
import json
import logging
import math
import os
import posixpath
import shutil
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from largetrain_core import dataset_card, fs
from largetrain_core.digest import file_digest
from largetrain_core.storage import ArtifactError, loading, part_files, read_json, write_json_atomic
from largetrain_core.tokenizer import TokenizerInfo, document_encoder, load_tokenizer_info, read_tokenizer

FORMAT = "largetrain.token_shards/1"
SPLITS = ("train", "validation")


LOG = logging.getLogger("largetrain.shards")


class ShardError(ArtifactError):
    """A shard directory that does not match its manifest (the message names the file)."""


class _SplitWriter:
    """Packs token streams into windows and writes them into shard files ``<name>-NNNNN.arrow``."""

    def __init__(self, out_dir: Path, name: str, seq_len: int, info: TokenizerInfo, sequences_per_shard: int):
        self.out_dir, self.name, self.window = out_dir, name, seq_len + 1
        self.arrow_type = pa.uint16() if info.dtype == np.uint16 else pa.uint32()
        self.schema = pa.schema(
            [pa.field("input_ids", pa.list_(self.arrow_type, self.window))],
            metadata={
                "seq_len": str(seq_len),
                "dtype": info.dtype.name,
                "eos_id": str(info.eos_id),
                "vocab_size": str(info.vocab_size),
                "tokenizer_sha256": info.sha256,
            },
        )
        self.sequences_per_shard = sequences_per_shard
        self.pending: list[np.ndarray] = []
        self.pending_tokens = 0
        self.dtype = info.dtype
        self.rows = None  # the open shard's rows so far, a file: ``.<shard>.rows``
        self.filled = 0
        self.windows = 0  # full windows since the last end_unit
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
            rest = stream[n * self.window :]
            self.pending, self.pending_tokens = [rest], len(rest)

    def end_unit(self) -> tuple[int, np.ndarray]:
        """(full windows since the last call, the tokens left after them: fewer than a window), taken out
        of the stream: the next :meth:`add` starts a new unit."""
        tail = np.concatenate(self.pending) if self.pending else np.zeros(0, self.dtype)
        windows, self.windows = self.windows, 0
        self.pending, self.pending_tokens = [], 0
        return windows, tail.astype(self.dtype, copy=False)

    def _write(self, rows: np.ndarray) -> None:
        """Append full windows to the open shard; each shard is written as ONE record batch, so a reader
        sees one contiguous (sequences, seq_len + 1) array per shard. The rows wait in a file beside it
        (``.<shard>.rows``), not in memory: the writer's memory does not depend on ``sequences_per_shard``."""
        self.windows += len(rows)
        while len(rows):
            if self.rows is None:
                self.rows = open(self.out_dir / f".{self._shard_name()}.rows", "wb")  # noqa: SIM115 (closed in _flush)
                self.filled = 0
            take = min(len(rows), self.sequences_per_shard - self.filled)
            np.ascontiguousarray(rows[:take], dtype=self.dtype).tofile(self.rows)
            self.filled += take
            rows = rows[take:]
            if self.filled == self.sequences_per_shard:
                self._flush()

    def _shard_name(self) -> str:
        return f"{self.name}-{len(self.shards):05d}.arrow"

    def _flush(self) -> None:
        """Write the open shard: the Arrow IPC file of one record batch of ``filled`` rows, its values
        first zeros (an untouched calloc'd array: no resident memory), then overwritten in place by the
        rows' file, which is the last buffer of the batch's body (8-byte aligned, as Arrow's IPC writer
        pads each buffer); the same bytes as writing the rows' array at once."""
        if self.rows is None:
            return
        self.rows.close()
        raw, self.rows = Path(self.rows.name), None
        name = self._shard_name()
        path = self.out_dir / name
        values = self.filled * self.window
        zeros = np.zeros(values, dtype=self.dtype)
        flat = pa.Array.from_buffers(self.arrow_type, values, [None, pa.py_buffer(zeros)])
        col = pa.FixedSizeListArray.from_arrays(flat, self.window)
        with pa.OSFile(str(path), "wb") as sink:
            with pa.ipc.new_file(sink, self.schema) as writer:
                writer.write_batch(pa.record_batch([col], schema=self.schema))
                body_end = sink.tell()
        nbytes = values * zeros.itemsize
        if raw.stat().st_size != nbytes:
            raise ArtifactError(f"{raw}: {raw.stat().st_size} bytes of rows, expected {nbytes}")
        with open(raw, "rb") as src, open(path, "r+b") as dst:
            dst.seek(body_end - (nbytes + 7) // 8 * 8)
            shutil.copyfileobj(src, dst, 1 << 20)
        raw.unlink()
        self.shards.append(
            {"file": name, "sequences": self.filled, "bytes": path.stat().st_size, "xxh3_128": file_digest(path)}
        )
        self.filled = 0

    def discard(self) -> None:
        """Remove what this writer wrote (its shard files and the open shard's rows): its run failed."""
        if self.rows is not None:
            self.rows.close()
            Path(self.rows.name).unlink(missing_ok=True)
            self.rows = None
        for shard in self.shards:
            (self.out_dir / shard["file"]).unlink(missing_ok=True)
        self.shards = []

    def finish(self) -> dict:
        self._flush()
        sequences = sum(s["sequences"] for s in self.shards)
        return {
            "shards": self.shards,
            "sequences": sequences,
            "tokens": sequences * self.window,
            "documents": self.documents,
            "document_tokens": self.document_tokens,
            "repeated_documents": self.repeated_documents,
            "repeat_copies": self.repeat_copies,
            "repeat_tokens": self.repeat_tokens,
            "dropped_remainder_tokens": self.pending_tokens,
        }


CORPUS = "corpus"  # the column naming a document's corpus in a mixture


def mixture_weights(weights: dict[str, float]) -> dict[str, float]:
    """``weights`` normalized to sum 1. Raises ValueError for an empty mapping, a negative or non-finite
    weight, or weights that sum to 0."""
    if not weights:
        raise ValueError("mixture: name at least one corpus and its weight")
    bad = {k: v for k, v in weights.items() if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0)}
    if bad:
        raise ValueError(f"mixture weights must be finite numbers >= 0, not {bad}")
    total = float(sum(weights.values()))
    if total <= 0:
        raise ValueError(f"mixture weights sum to 0: {weights}")
    return {k: float(v) / total for k, v in sorted(weights.items())}


def mixture_targets(sequences: dict[str, int], weights: dict[str, float]) -> dict[str, int]:
    """Windows per corpus: ``weights`` (normalized) x the windows of every corpus together, rounded so that
    they sum to that total (largest remainders first, ties by name)."""
    total = sum(sequences.values())
    exact = {c: weights.get(c, 0.0) * total for c in sequences}
    out = {c: int(math.floor(v)) for c, v in exact.items()}
    short = total - sum(out.values())
    for c in sorted(exact, key=lambda c: (-(exact[c] - out[c]), c))[:short]:
        out[c] += 1
    return out


def systematic(start: int, count: int, fraction: float, offset: float) -> np.ndarray:
    """Boolean mask over window indices ``start .. start + count - 1``: selected when
    ``floor((i + 1) * fraction + offset) > floor(i * fraction + offset)`` (systematic sampling: the
    selected windows are evenly spread and number ``floor(n * fraction + offset)`` of the first n)."""
    i = np.arange(start, start + count, dtype=np.float64)
    return np.floor((i + 1) * fraction + offset) > np.floor(i * fraction + offset)


def split_hashes(doc_ids: list[str], seed: int) -> np.ndarray:
    """uint64 array: xxh64(doc_id, seed) of every document, the hash that decides its split (module doc)."""
    return np.fromiter((xxhash.xxh64_intdigest(d.encode(), seed) for d in doc_ids), dtype=np.uint64, count=len(doc_ids))


def split_of(doc_ids: list[str], validation_fraction: float, seed: int, hashes: np.ndarray | None = None) -> np.ndarray:
    """Boolean array: True where a document belongs to the validation split (see module doc);
    ``hashes``: its :func:`split_hashes` if already computed."""
    # h / 2**64 < fraction  <=>  h < ceil(fraction * 2**64) for an integer h: compared exactly in uint64
    limit = np.uint64(math.ceil(validation_fraction * 2**64))
    return (split_hashes(doc_ids, seed) if hashes is None else hashes) < limit


TOKENIZED = "tokenized.json"  # a tokenize_partition directory's summary
TOKENIZED_FORMAT = "largetrain.tokenized_parts/1"


@dataclass(frozen=True)
class Packing:
    """How documents become sequences (module doc): ``seq_len`` tokens per sequence (windows of
    ``seq_len + 1``), the share of documents in validation and the seed of its hash, sequences per
    shard file, documents tokenized per batch (memory). Raises ValueError on bad values."""

    seq_len: int = 1024
    validation_fraction: float = 0.05
    seed: int = 0
    sequences_per_shard: int = 8192
    batch_documents: int = 512
    mixture: dict | None = field(default=None, hash=False)  # a weight per corpus (module doc, Mixture)
    natural: bool = False  # a mixture without weights: packed per corpus, nothing re-sampled (mixture names them)
    # a mixture's corpus may be up-sampled to at most this many times its sequences per pass (None: no limit)
    max_repeats: float | None = field(default=None, hash=False)

    def __post_init__(self):
        if self.seq_len < 1 or not 0.0 <= self.validation_fraction < 1.0 or self.sequences_per_shard < 1:
            raise ValueError(
                f"need seq_len >= 1, 0 <= validation_fraction < 1 and sequences_per_shard >= 1, got "
                f"{self.seq_len}, {self.validation_fraction}, {self.sequences_per_shard}"
            )
        if self.mixture is not None:
            object.__setattr__(self, "mixture", mixture_weights(self.mixture))


def partition_parts(parts: list[Path], partition: int, partitions: int) -> tuple[int, list[Path]]:
    """(index of the first, the part files) of partition ``partition`` of ``partitions``: a contiguous
    range of ``parts`` (in order), the ranges cut where the files' cumulative bytes cross i/n of the
    total, so partitions get about equal bytes. Raises ValueError for a partition outside [0, n)."""
    if not 0 <= partition < partitions:
        raise ValueError(f"partition must be in [0, {partitions}), got {partition}")
    sizes = np.cumsum([0] + [Path(p).stat().st_size for p in parts], dtype=np.float64)
    cuts = np.searchsorted(sizes[1:], sizes[-1] * np.arange(partitions + 1) / partitions, side="left")
    cuts[0], cuts[-1] = 0, len(parts)
    lo, hi = int(cuts[partition]), int(max(cuts[partition], cuts[partition + 1]))
    return lo, list(parts[lo:hi])


def _key(split: str, k: int, corpus: str | None = None) -> str:
    """The summary key of a stream: ``split/pass``, or ``split/pass/corpus`` in a mixture's train split."""
    return f"{split}/{k}" if corpus is None else f"{split}/{k}/{corpus}"


def tokenize_parts(
    parts: list[Path],
    first_part: int,
    tokenizer_path: Path,
    out_dir: Path,
    packing: Packing = Packing(),
    forced: str | None = None,
) -> dict:
    """Tokenize and pack consecutive part files (``parts``, whose first is part ``first_part`` of the
    input) into ``out_dir``: per split and pass (and corpus, in a mixture's train split) the full
    windows of each part in shard files ``<split>[-r<pass>][-m<corpus number>]-<first_part>-NNNNN.arrow``,
    the parts' tails in ``tails-<first_part>.arrow`` (split, pass, corpus, part, tokens). ``forced``: a
    doc id put in validation whatever its hash. Returns the run's summary for
    :func:`assemble_token_shards` (shards, counts and per part windows and tail tokens of each stream;
    its smallest split hash). Memory: ``batch_documents`` documents; each stream's open shard waits on
    disk (_SplitWriter).
    Raises ValueError naming the part on a ``copies`` value that is null or below 1, and in a mixture
    on a missing ``corpus`` column or a corpus without a weight; ArtifactError naming a part that
    cannot be read. A run that raises leaves none of its files in ``out_dir``."""
    from largetrain_core.balance import COPIES  # polars: writing shards only

    info = load_tokenizer_info(tokenizer_path)
    encode = document_encoder(info)
    LOG.info(
        "tokenizing parts %d..%d with %s%s",
        first_part,
        first_part + len(parts) - 1,
        encode.engine,
        f" ({encode.reason})" if encode.reason else "",
    )
    out_dir = Path(out_dir)
    tag = f"{first_part:06d}"
    mixture = packing.mixture
    number = {c: i for i, c in enumerate(mixture or {})}
    writers: dict[str, _SplitWriter] = {}
    tails: list[tuple[str, int, str | None, int, np.ndarray]] = []
    units: dict[str, list[list[int]]] = {}  # per stream: [part, full windows, tail tokens] of each part
    smallest: tuple[int, str] | None = None
    validation_documents = documents = 0

    def writer(split: str, k: int, corpus: str | None = None) -> _SplitWriter:
        key = _key(split, k, corpus)
        if key not in writers:
            name = "-".join(
                [split, *([f"r{k}"] if k > 1 else []), *([f"m{number[corpus]:03d}"] if corpus else []), tag]
            )
            writers[key] = _SplitWriter(out_dir, name, packing.seq_len, info, packing.sequences_per_shard)
            writers[key].stream = (split, k, corpus)
        return writers[key]

    def end_part(k: int, part: int) -> None:
        for key, w in writers.items():
            split, pass_, corpus = w.stream
            if pass_ != k:
                continue
            windows, tail = w.end_unit()
            if windows or len(tail):
                units.setdefault(key, []).append([part, windows, len(tail)])
            if len(tail):
                tails.append((split, k, corpus, part, tail))

    def validation(doc_ids: list[str], hashes: np.ndarray | None = None) -> np.ndarray:
        is_val = split_of(doc_ids, packing.validation_fraction, packing.seed, hashes)
        if forced is not None:
            is_val |= np.array([d == forced for d in doc_ids], dtype=bool)
        return is_val

    def train(part: Path, k: int, docs: list[np.ndarray], corpora: list | None, copies=None) -> None:
        """Pack train documents of pass ``k``, each into its corpus's stream in a mixture."""
        if mixture is None:
            writer("train", k).add(docs, repeat=k > 1)
            return
        unknown = sorted({str(c) for c in corpora if c not in mixture})
        if unknown:
            raise ValueError(
                f"{part}: corpus {', '.join(map(repr, unknown))} has no mixture weight; weights are given "
                f"for {', '.join(map(repr, mixture))}"
            )
        for i, (doc, corpus) in enumerate(zip(docs, corpora)):
            w = writer("train", k, corpus)
            w.add([doc], repeat=k > 1)
            if copies is not None and copies[i] > 1:
                w.repeated_documents += 1

    try:
        most_copies = 1
        for j, part in enumerate(parts):
            schema = _part_schema(part)
            weighted = COPIES in schema
            if mixture is not None and CORPUS not in schema:
                raise ValueError(
                    f"{part}: no {CORPUS!r} column, so its documents cannot be weighted by corpus: a mixture "
                    "needs the corpus name of every document (raw_corpus reads it when corpora are named)"
                )
            for batch in _read_part(part).iter_slices(packing.batch_documents):
                ids = batch["doc_id"].to_list()
                hashes = split_hashes(ids, packing.seed)
                if len(ids) and (smallest is None or int(hashes.min()) < smallest[0]):
                    smallest = (int(hashes.min()), ids[int(hashes.argmin())])
                is_val = validation(ids, hashes)
                documents += len(ids)
                validation_documents += int(is_val.sum())
                train_copies = None
                if weighted:
                    c = batch[COPIES]
                    if c.null_count() or (c < 1).any():
                        raise ValueError(
                            f"{part}: column {COPIES!r} must be >= 1 in every row (how many times the "
                            f"train split holds the document)"
                        )
                    train_copies = c.to_numpy()[~is_val]
                    most_copies = max(most_copies, int(train_copies.max(initial=1)))
                    if mixture is None:
                        writer("train", 1).repeated_documents += int((train_copies > 1).sum())
                encoded = encode(batch["text"].to_list())
                corpora = [c for c, v in zip(batch[CORPUS].to_list(), is_val) if not v] if mixture is not None else None
                train(part, 1, [e for e, v in zip(encoded, is_val) if not v], corpora, train_copies)
                writer("validation", 1).add([e for e, v in zip(encoded, is_val) if v])
            end_part(1, first_part + j)
        for k in range(2, most_copies + 1):  # pass k: the train documents with at least k copies
            for j, part in enumerate(parts):
                if COPIES not in _part_schema(part):
                    continue
                columns = ["doc_id", "text", COPIES] + ([CORPUS] if mixture is not None else [])
                for batch in _read_part(part, columns).iter_slices(packing.batch_documents):
                    again = (batch[COPIES].to_numpy() >= k) & ~validation(batch["doc_id"].to_list())
                    if again.any():
                        texts = [t for t, a in zip(batch["text"].to_list(), again) if a]
                        corpora = (
                            [c for c, a in zip(batch[CORPUS].to_list(), again) if a] if mixture is not None else None
                        )
                        train(part, k, encode(texts), corpora)
                end_part(k, first_part + j)
        tail_file = None
        if tails:
            tail_file = f"tails-{tag}.arrow"
            list_type = pa.large_list(pa.uint16() if info.dtype == np.uint16 else pa.uint32())
            table = pa.table(
                {
                    "split": pa.array([t[0] for t in tails], pa.string()),
                    "pass": pa.array([t[1] for t in tails], pa.int32()),
                    "corpus": pa.array([t[2] for t in tails], pa.string()),
                    "part": pa.array([t[3] for t in tails], pa.int64()),
                    "tokens": pa.array([t[4] for t in tails], list_type),
                }
            )
            with pa.ipc.new_file(str(out_dir / tail_file), table.schema) as w:
                w.write_table(table)
        return {
            "first_part": first_part,
            "parts": len(parts),
            "documents": documents,
            "validation_documents": validation_documents,
            "smallest_split_hash": list(smallest) if smallest else None,
            "tails": tail_file,
            "tail_tokens": sum(len(t[4]) for t in tails),
            "encoder": {"engine": encode.engine, "reason": encode.reason},
            "units": units,
            "writers": {key: w.finish() for key, w in sorted(writers.items())},
        }
    except BaseException:  # nothing of a failed run stays behind
        for w in writers.values():
            w.discard()
        (out_dir / f"tails-{tag}.arrow").unlink(missing_ok=True)
        raise


def run_files(summary: dict) -> list[str]:
    """The files a :func:`tokenize_parts` run wrote (its ``summary``): its shards of every stream and its
    tails file, names relative to its directory."""
    return [e["file"] for w in summary["writers"].values() for e in w["shards"]] + (
        [summary["tails"]] if summary["tails"] else []
    )


def _header(info: TokenizerInfo, packing: Packing) -> dict:
    return {
        "seq_len": packing.seq_len,
        "dtype": info.dtype.name,
        "eos_id": info.eos_id,
        "bos_id": info.bos_id,
        "vocab_size": info.vocab_size,
        "tokenizer_sha256": info.sha256,
        "validation_fraction": packing.validation_fraction,
        "seed": packing.seed,
        **({"mixture_weights": packing.mixture} if packing.mixture is not None else {}),
    }


def tokenize_partition(
    in_dir: Path | list[Path],
    tokenizer_path: Path,
    out_dir: Path,
    partition: int = 0,
    partitions: int = 1,
    packing: Packing = Packing(),
    runs: list[dict] | None = None,
) -> dict:
    """Partition ``partition`` of ``partitions`` of the token shards of the ``part-*.parquet``
    documents of ``in_dir``: its part files (:func:`partition_parts`) tokenized and packed into
    ``out_dir`` (:func:`tokenize_parts`, one run; ``runs``: the summaries of runs an executor made
    itself, e.g. one Spark task per run of parts, in part order), and ``out_dir/tokenized.json``, the
    summary the global step reads. Returns it; its counts: ``parts``, ``documents``, ``sequences``
    (full windows of its parts), ``tail_tokens``."""
    parts = part_files(in_dir)
    first, mine = partition_parts(parts, partition, partitions)
    info = load_tokenizer_info(tokenizer_path)
    if runs is None:
        runs = [tokenize_parts(mine, first, tokenizer_path, out_dir, packing)] if mine else []
    summary = {
        "format": TOKENIZED_FORMAT,
        **_header(info, packing),
        "partition": partition,
        "partitions": partitions,
        "first_part": first,
        "parts": len(mine),
        "input_parts": len(parts),
        "runs": runs,
        "documents": sum(r["documents"] for r in runs),
        "sequences": sum(w["sequences"] for r in runs for w in r["writers"].values()),
        "tail_tokens": sum(r["tail_tokens"] for r in runs),
    }
    write_json_atomic(Path(out_dir) / TOKENIZED, summary)
    return summary


def _read_tokenized(d: Path) -> dict:
    summary = read_json(Path(d) / TOKENIZED, "summary of a tokenized partition (tokenized.json)")
    if not isinstance(summary, dict) or summary.get("format") != TOKENIZED_FORMAT:
        raise ArtifactError(f"{Path(d) / TOKENIZED}: not a {TOKENIZED_FORMAT} summary")
    return summary


def tokenizer_engines(partition_dirs: list[Path]) -> dict:
    """Which engine encoded the runs of the :func:`tokenize_partition` directories ``partition_dirs``
    (tokenizers.DocumentEncoder): ``{"tokenizer_engine": the engines, joined by "+" when they differ,
    "tokenizer_engine_reason": why not tiktoken ("" when tiktoken ran everywhere)}``."""
    seen = [r.get("encoder") or {} for d in partition_dirs for r in _read_tokenized(Path(d))["runs"]]
    engines = sorted({e.get("engine", "tokenizers") for e in seen})
    reasons = sorted({e.get("reason", "") for e in seen} - {""})
    return {"tokenizer_engine": "+".join(engines), "tokenizer_engine_reason": "; ".join(reasons)}


def assemble_token_shards(
    partition_dirs: list[Path],
    in_dir: Path | list[Path],
    tokenizer_path: Path,
    out_dir: Path,
    packing: Packing = Packing(),
    source_data_version: str = "",
    final_dir: Path | None = None,
    extra: dict | None = None,
) -> dict:
    """The global step: from the :func:`tokenize_partition` directories of every partition of the input
    ``in_dir``, in partition order, write the tails' windows (``<split>-tail-NNNNN.arrow``), the
    tokenizer and ``manifest.json`` into ``out_dir``; the manifest lists every shard, the partitions'
    by their path relative to ``out_dir``. When no document hashed into validation (module doc,
    Split), the whole input is tokenized again here with the smallest-hash document in validation.
    ``final_dir``: where ``out_dir`` will lie when complete (a temporary directory renamed into place),
    the directory the manifest's paths are relative to. ``extra``: more manifest entries (the
    documents' relevance score distribution). Returns the manifest. Raises ArtifactError when
    the partitions do not cover the input's part files exactly once, in order, with this tokenizer and
    these settings (naming the partition)."""
    out_dir = Path(out_dir)
    final_dir = Path(final_dir) if final_dir is not None else out_dir
    info = load_tokenizer_info(tokenizer_path)
    header = _header(info, packing)
    parts = part_files(in_dir)
    summaries = [(Path(d), _read_tokenized(Path(d))) for d in partition_dirs]
    expect = 0
    for d, s in summaries:
        differs = {k: (s.get(k), v) for k, v in header.items() if s.get(k) != v}
        if differs or s["input_parts"] != len(parts) or s["first_part"] != expect:
            raise ArtifactError(
                f"{d / TOKENIZED}: partition {s.get('partition')} of {s.get('partitions')} does not fit "
                f"the others: "
                + (
                    f"made with {differs} (the partition's, now)"
                    if differs
                    else f"parts {s['first_part']}.. of {s['input_parts']}, expected part {expect} of {len(parts)}"
                )
                + "; tokenize every partition again with the same tokenizer and settings"
            )
        expect += s["parts"]
    if expect != len(parts):
        raise ArtifactError(
            f"the partitions hold {expect} of the {len(parts)} part files of {in_dir}: tokenize every partition"
        )
    runs = [(d, r) for d, s in summaries for r in s["runs"]]
    documents = sum(r["documents"] for _, r in runs)
    if packing.validation_fraction > 0 and documents >= 2 and not sum(r["validation_documents"] for _, r in runs):
        forced = min((tuple(r["smallest_split_hash"]) for _, r in runs if r["smallest_split_hash"]))[1]
        for d, r in runs:  # a run written here is replaced (same file names); the partitions' stay theirs
            if d.resolve() == out_dir.resolve():
                for f in run_files(r):
                    (d / f).unlink()
        runs = [(out_dir, tokenize_parts(parts, 0, tokenizer_path, out_dir, packing, forced=forced))]
    # a run in out_dir is listed as one in final_dir (the directory it becomes)
    runs = [(final_dir if d.resolve() == out_dir.resolve() else d, r) for d, r in runs]
    passes = sorted({int(key.split("/")[1]) for _, r in runs for key in r["writers"]})
    splits = {}
    for split in SPLITS:
        if split == "train" and packing.mixture is not None:
            splits[split] = _mixed(runs, passes, out_dir, info, packing, final_dir)
            continue
        splits[split] = _stream(runs, passes, split, None, out_dir, info, packing, final_dir)
    mixture = splits["train"].pop("mixture", None)
    manifest = {
        "format": FORMAT,
        **header,
        "source_data_version": source_data_version,
        "splits": splits,
        "total_tokens": sum(s["tokens"] for s in splits.values()),
        **(extra or {}),
    }
    if mixture is not None:
        manifest["mixture"] = mixture
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the shards carry the tokenizer that made them
        if (info.path.parent / name).exists():
            shutil.copy(info.path.parent / name, out_dir / name)
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    files = {split: [s["file"] for s in splits[split]["shards"]] for split in SPLITS if splits[split]["shards"]}
    dataset_card.write(out_dir, "token_shards", files, dataset_card.SHARDS_DESCRIPTION)
    return manifest


_TOTALS = ("documents", "document_tokens", "repeated_documents", "repeat_copies", "repeat_tokens")


def _stream(
    runs: list[tuple[Path, dict]],
    passes: list[int],
    split: str,
    corpus: str | None,
    out_dir: Path,
    info: TokenizerInfo,
    packing: Packing,
    final_dir: Path,
) -> dict:
    """One stream of the manifest (a split, or a corpus of a mixture's train split): every pass's part
    windows from the runs (shards listed where they lie), then the runs' tails of the stream cut into
    windows written into ``out_dir`` (``<split>[-m<corpus number>]-tail-NNNNN.arrow``; paths in the
    manifest relative to ``final_dir``, the directory ``out_dir`` becomes). Returns the
    split record: shards, sequences, tokens, the counts, dropped_remainder_tokens, tail_sequences and
    units (per part: its windows and tail tokens, in the order of the windows)."""
    shards, units, totals = [], [], dict.fromkeys(_TOTALS, 0)
    for k in passes:
        for d, r in runs:
            w = r["writers"].get(_key(split, k, corpus))
            if w is None:
                continue
            shards += [{**e, "file": os.path.relpath(d / e["file"], final_dir)} for e in w["shards"]]
            units += [[windows, tail] for _, windows, tail in r["units"].get(_key(split, k, corpus), [])]
            for key in totals:
                totals[key] += w[key]
    number = list(packing.mixture or {}).index(corpus) if corpus is not None else None
    name = "-".join([split, *([f"m{number:03d}"] if number is not None else []), "tail"])
    tail = _SplitWriter(out_dir, name, packing.seq_len, info, packing.sequences_per_shard)
    for k in passes:
        for d, r in runs:
            if r["tails"]:
                t = pa.ipc.open_file(pa.memory_map(str((out_dir if d == final_dir else d) / r["tails"]))).read_all()
                rows = pc.and_(pc.equal(t["split"], split), pc.equal(t["pass"], k))
                rows = pc.and_(rows, pc.is_null(t["corpus"]) if corpus is None else pc.equal(t["corpus"], corpus))
                for tokens in t.filter(rows)["tokens"].to_numpy(zero_copy_only=False):
                    tail.add([tokens])
    done = tail.finish()
    shards += done["shards"]  # written into out_dir: their names are their paths from final_dir
    sequences = sum(e["sequences"] for e in shards)
    return {
        "shards": shards,
        "sequences": sequences,
        "tokens": sequences * (packing.seq_len + 1),
        **totals,
        "dropped_remainder_tokens": done["dropped_remainder_tokens"],
        "tail_sequences": done["sequences"],
        "units": units,
    }


def _mixed(
    runs: list[tuple[Path, dict]],
    passes: list[int],
    out_dir: Path,
    info: TokenizerInfo,
    packing: Packing,
    final_dir: Path,
) -> dict:
    """A mixture's train split (module doc, Mixture): each corpus's stream (:func:`_stream`), then per
    corpus its shards listed once per whole pass and, for the rest, with the ``select`` of a systematic
    sample; no window is copied. Returns the split record with its ``mixture`` record (popped by the
    caller into the manifest). Raises ValueError naming a corpus with a weight above 0 and no train
    window."""
    weights = packing.mixture
    corpora = sorted({key.split("/")[2] for _, r in runs for key in r["writers"] if key.startswith("train/")})
    streams = {c: _stream(runs, passes, "train", c, out_dir, info, packing, final_dir) for c in corpora}
    sequences = {c: s["sequences"] for c, s in streams.items()}
    empty = [c for c, w in weights.items() if w > 0 and not sequences.get(c)]
    if empty:
        raise ValueError(
            f"mixture: corpus {', '.join(map(repr, empty))} has weight > 0 but no train sequence of "
            f"{packing.seq_len + 1} tokens (no documents, or fewer tokens than one sequence), so it cannot "
            f"be sampled to its weight; set its weight to 0 or add documents"
        )
    natural = packing.natural
    targets = dict(sequences) if natural else mixture_targets(sequences, weights)
    over = {c: targets[c] / n for c, n in sequences.items() if n and packing.max_repeats is not None}
    over = {c: f for c, f in over.items() if f > packing.max_repeats}
    if over:
        raise ValueError(
            "mixture: "
            + "; ".join(
                f"corpus {c!r} (weight {weights[c]:.4g}) would repeat each of its {sequences[c]:,} train sequences "
                f"{f:.1f} times per pass ({targets[c]:,} sequences)"
                for c, f in sorted(over.items())
            )
            + f", above max_repeats {packing.max_repeats:g}; lower its weight, add documents to it, or raise max_repeats"
        )
    record = {
        "weights": None if natural else weights,
        "corpora": {},
        "applies_to": (
            "no weights: every corpus in its natural proportion, nothing re-sampled"
            if natural
            else "train split, in sequences of seq_len + 1 tokens, after dedup and balancing; the split "
            "keeps its size; validation unweighted"
        ),
    }
    shards, totals, dropped = [], dict.fromkeys(_TOTALS, 0), 0
    total = sum(targets.values())
    for corpus in corpora:
        f, n, want = streams[corpus], sequences[corpus], targets[corpus]
        passes_, rest = divmod(want, n) if n else (0, 0)
        offset = (xxhash.xxh64_intdigest(corpus.encode(), packing.seed) % 2**32) / 2**32
        shards += f["shards"] * passes_
        start = 0
        for e in f["shards"] if rest else []:
            picked = int(systematic(start, e["sequences"], rest / n, offset).sum())
            if picked:
                shards.append(
                    {**e, "sequences": picked, "select": {"start": start, "fraction": rest / n, "offset": offset}}
                )
            start += e["sequences"]
        for key in totals:
            totals[key] += f[key]
        dropped += f["dropped_remainder_tokens"]
        target = None if natural else weights.get(corpus, 0.0)
        record["corpora"][corpus] = {
            "weight": target,
            "documents": f["documents"],
            "document_tokens": f["document_tokens"],
            "sequences_packed": n,
            "sequences": want,
            "repeat_sequences": max(0, want - n),
            "downsampled_sequences": max(0, n - want),
            "natural_share": n / sum(sequences.values()),
            "target_share": target,
            "realised_share": want / total if total else 0.0,
        }
    for corpus in sorted(set(weights) - set(corpora)):  # weight 0 and no documents
        record["corpora"][corpus] = {
            "weight": 0.0,
            "documents": 0,
            "document_tokens": 0,
            "sequences_packed": 0,
            "sequences": 0,
            "repeat_sequences": 0,
            "downsampled_sequences": 0,
            "natural_share": 0.0,
            "target_share": 0.0,
            "realised_share": 0.0,
        }
    sequences_total = sum(e["sequences"] for e in shards)
    return {
        "shards": shards,
        "sequences": sequences_total,
        "tokens": sequences_total * (packing.seq_len + 1),
        **totals,
        "dropped_remainder_tokens": dropped,
        **{
            f"mixture_{k}": sum(r[k] for r in record["corpora"].values())
            for k in ("repeat_sequences", "downsampled_sequences")
        },
        "mixture": record,
    }


def build_token_shards(
    in_dir: Path,
    tokenizer_path: Path,
    out_dir: Path,
    *,
    seq_len: int = 1024,
    validation_fraction: float = 0.05,
    seed: int = 0,
    sequences_per_shard: int = 8192,
    batch_documents: int = 512,
    source_data_version: str = "",
    mixture: dict[str, float] | None = None,
    natural: bool = False,
    extra: dict | None = None,
    max_repeats: float | None = None,
) -> dict:
    """Tokenize the ``part-*.parquet`` documents of ``in_dir`` and write shards + manifest.json to ``out_dir``
    in one process: :func:`tokenize_partition` of the one partition into ``out_dir``, then
    :func:`assemble_token_shards`. The same sequences in the same order as any partitioning.

    Memory is bounded by ``batch_documents`` documents plus one shard's open record batch per stream. A
    ``copies`` column repeats documents in the train split (module docstring). ``mixture``: a weight
    per corpus (``corpus`` column), the train split sampled to it (module docstring); with ``natural``
    the weights are ignored: each corpus packed on its own in its natural proportion, its share reported.
    ``max_repeats``: the most times per pass a mixture may repeat a corpus's sequences (ValueError naming
    the corpus and its repeat factor above it; None: no limit). ``extra``: more manifest entries. Returns the
    manifest (dict). Raises ValueError on bad arguments and, naming the part file, on a ``copies``
    value that is null or below 1, a missing ``corpus`` column, or a corpus without a weight.
    """
    packing = Packing(
        seq_len, validation_fraction, seed, sequences_per_shard, batch_documents, mixture, natural, max_repeats
    )
    out_dir = Path(out_dir)
    tokenize_partition(in_dir, tokenizer_path, out_dir, 0, 1, packing)
    return assemble_token_shards([out_dir], in_dir, tokenizer_path, out_dir, packing, source_data_version, extra=extra)


def _part_schema(path: Path) -> dict:
    import polars as pl  # writing shards only: reading them (TokenShards) needs no polars

    with loading(path, "Parquet part file of a text stage (doc_id, text)"):
        return pl.read_parquet_schema(path)


def _read_part(path: Path, columns: list[str] | None = None) -> "pl.DataFrame":  # noqa: F821
    import polars as pl

    with loading(path, "Parquet part file of a text stage (doc_id, text)"):
        return pl.read_parquet(path, columns=columns)


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


@functools.lru_cache(maxsize=4)
def _permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    perm = np.random.Generator(np.random.PCG64([seed, epoch])).permutation(num_samples)
    perm.flags.writeable = False
    return perm


@functools.lru_cache(maxsize=4)
def _window_permutation(shard_sizes: tuple[int, ...], window: int, seed: int, epoch: int) -> np.ndarray:
    """The shards permuted (PCG64 of (seed, epoch)), taken ``window`` at a time in that order, and the
    sequences of each window ``k`` permuted together (PCG64 of (seed, epoch, k + 1))."""
    starts = np.cumsum((0,) + shard_sizes)
    order = np.random.Generator(np.random.PCG64([seed, epoch])).permutation(len(shard_sizes))
    parts = []
    for k, w in enumerate(range(0, len(shard_sizes), window)):
        idx = np.concatenate([np.arange(starts[i], starts[i + 1], dtype=np.int64) for i in order[w : w + window]])
        parts.append(np.random.Generator(np.random.PCG64([seed, epoch, k + 1])).permutation(idx))
    perm = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
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

    ``window_shards`` > 0 (with ``shard_sizes``: TokenShards.shard_sizes, the sequences per shard in
    order) shuffles by windows of shards instead, as streaming loaders do (MosaicML Streaming's
    shuffle blocks): each epoch the shards are permuted and taken ``window_shards`` at a time, the
    sequences of each window permuted together (:func:`_window_permutation`). The ranks then read from
    about ``window_shards`` shards at a time, so a shard cache holding twice as many fetches each shard
    once per epoch; with 0 (the default) any sequence may follow any other, and a cache smaller than
    the split fetches shards again and again. Either way the order is a pure function of the seed and
    the epoch.

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
    shard_sizes: tuple[int, ...] | None = None
    window_shards: int = 0

    def __post_init__(self):
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world size {self.world_size}")
        if self.window_shards < 0:
            raise ValueError(f"window_shards must be >= 0, got {self.window_shards}")
        if self.window_shards and (self.shard_sizes is None or sum(self.shard_sizes) != self.num_samples):
            raise ValueError(f"window_shards needs shard_sizes summing to num_samples={self.num_samples}")

    def permutation(self, epoch: int) -> np.ndarray:
        """The read-only order of epoch ``epoch``: int64 array of shape (num_samples,)."""
        if self.window_shards:
            return _window_permutation(tuple(int(n) for n in self.shard_sizes), self.window_shards, self.seed, epoch)
        return _permutation(self.num_samples, self.seed, epoch)

    def indices(self, consumed_samples: int, micro_batch: int) -> np.ndarray:
        """Sequence indices (int64, shape (micro_batch,), read-only) for this rank's micro-batch after ``consumed_samples``."""
        if self.num_samples <= 0:
            raise ValueError("cannot sample from an empty split")
        start = consumed_samples + self.rank * micro_batch
        epoch, offset = divmod(start, self.num_samples)
        if offset + micro_batch <= self.num_samples:  # the common case: inside one epoch, a slice
            return self.permutation(epoch)[offset : offset + micro_batch]
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
        return {
            "num_samples": self.num_samples,
            "seed": self.seed,
            "world_size": self.world_size,
            "micro_batch_size": self.micro_batch_size,
            "consumed_samples": self.consumed_samples,
            "epoch": self.epoch,
            "window_shards": self.window_shards,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the position. Raises ValueError when the state belongs to other data or another seed."""
        for key in ("num_samples", "seed", "window_shards"):
            if state.get(key, 0) != getattr(self, key):
                raise ValueError(
                    f"sampler state has {key}={state[key]}, this sampler {getattr(self, key)}: "
                    "resuming would read a different sample order"
                )
        self.consumed_samples = int(state["consumed_samples"])


def _document_pieces(data: TokenShards, chunk_sequences: int = 8192):
    """The split's token stream in packing order (module doc, Packing: per part and pass its windows,
    then its tail, which lies in the tail region at the split's end), as numpy arrays, with None where
    tokens are missing (the dropped remainder: the end of the last parts' tails). A manifest without
    ``units`` (one stream packed whole) is its row-major stream, then the dropped remainder."""
    split = data.manifest["splits"][data.split]
    n, width = len(data), data.seq_len + 1
    units = split.get("units")
    tail_rows = split.get("tail_sequences", 0)
    if units is None:
        units, tail_rows = [[n, split.get("dropped_remainder_tokens", 0)]], 0
    tail_first, tail_tokens = n - tail_rows, tail_rows * width
    row = pos = 0
    for windows, tail in units:
        for lo in range(row, row + windows, chunk_sequences):
            yield data.take(np.arange(lo, min(row + windows, lo + chunk_sequences))).reshape(-1)
        row += windows
        have = max(0, min(tail, tail_tokens - pos))
        if have:
            r0, r1 = tail_first + pos // width, tail_first + (pos + have - 1) // width + 1
            start = pos - (r0 - tail_first) * width
            yield data.take(np.arange(r0, r1)).reshape(-1)[start : start + have]
        if have < tail:
            yield None
        pos += tail


def split_documents(data: TokenShards, chunk_sequences: int = 8192):
    """Every document of a split that the shards hold tokens of, in packing order (corpus order, then
    the train split's repeat passes), each a numpy array of its tokens, EOS last, reassembled from the
    shards (:func:`_document_pieces`). A document the dropped remainder cut (its last tokens fell in
    the tail shorter than a window that packing dropped: at most one per part and pass, the end of the
    last parts' tails) is the tokens of it that the shards hold, then EOS, appended here as
    Megatron's own preprocessing (tools/preprocess_data.py, ``--append-eod``) ends every document, so
    a reader that concatenates documents never joins it to the next one. The documents that fell
    wholly into the remainder are not in the shards and not here. A generator whose return value
    (``StopIteration.value``) is the number of cut documents. Packing appends EOS to every document
    and encodes special-token text inside a document as plain text
    (largetrain_core.tokenizer.encode_documents), so EOS marks exactly the document ends. Raises
    ShardError when the split holds more EOS-delimited documents than it was packed from (EOS inside
    a document: its boundaries cannot be told)."""
    eos = data.manifest["eos_id"]
    split = data.manifest["splits"][data.split]
    packed = split["documents"] + split.get("repeat_copies", 0)
    eos_token = np.asarray([eos], dtype=data.dtype)
    partial: list[np.ndarray] = []  # the document in progress
    cut = found = 0

    def count() -> None:
        nonlocal found
        found += 1
        if found > packed:
            raise ShardError(
                f"{data.directory}: split {data.split!r} holds more EOS-delimited documents than "
                f"the {packed} it was packed from: EOS occurs inside documents, so their "
                "boundaries cannot be told"
            )

    for piece in _document_pieces(data, chunk_sequences):
        if piece is None:  # tokens missing up to the end of a part: the document in progress is cut
            if partial:
                count()
                cut += 1
                yield np.concatenate([*partial, eos_token])
            partial = []
            continue
        start = 0
        for end in np.flatnonzero(piece == eos) + 1:
            count()
            yield np.concatenate([*partial, piece[start:end]]) if partial else piece[start:end]
            partial, start = [], int(end)
        if start < len(piece):
            partial.append(piece[start:])
    if partial:  # tokens after the last EOS with nothing recorded as dropped: cut all the same
        count()
        cut += 1
        yield np.concatenate([*partial, eos_token])
    return cut


def document_offsets(data: TokenShards, chunk_sequences: int = 8192) -> np.ndarray:
    """Where each document of :func:`split_documents` starts in their concatenation, plus its
    length at the end: int64, shape (documents + 1,). Raises ShardError as :func:`split_documents`."""
    lengths = [len(d) for d in split_documents(data, chunk_sequences)]
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)


# Megatron-Core ``IndexedDataset`` layout (megatron/core/datasets/indexed_dataset.py, _IndexWriter):
# .idx = b"MMIDIDX\x00\x00", <Q version 1, <B dtype code, <Q sequence count, <Q document count,
#        int32 sequence lengths, int64 sequence byte offsets into .bin, int64 document indices
#        (the sequence index where each document starts, plus the total at the end);
# .bin = the token ids of every sequence, concatenated.
MEGATRON_INDEX_HEADER = b"MMIDIDX\x00\x00"
MEGATRON_DTYPE_CODES = {
    np.dtype(np.uint8): 1,
    np.dtype(np.int8): 2,
    np.dtype(np.int16): 3,
    np.dtype(np.int32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.float64): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.uint16): 8,
}


def megatron_paths(out_prefix: Path | str) -> tuple[Path, Path]:
    """The ``.bin`` and ``.idx`` files of a Megatron dataset prefix: the suffixes appended to the whole
    prefix, as Megatron does (``wiki.en_text_document`` -> ``wiki.en_text_document.bin``)."""
    return Path(f"{out_prefix}.bin"), Path(f"{out_prefix}.idx")


def _documents_with_cut(data: TokenShards, chunk_sequences: int = 8192):
    """:func:`split_documents` as (a generator of the documents, a list that receives the number of
    cut documents when it ends)."""
    box: list[int] = []

    def gen():
        box.append((yield from split_documents(data, chunk_sequences)))

    return gen(), box


def _exportable(data: TokenShards) -> None:
    """Raise ShardError when the split holds no tokens: an export of it would be empty (Megatron's
    IndexedDataset cannot memory-map an empty ``.bin``)."""
    if len(data):
        return
    s = data.manifest["splits"][data.split]
    raise ShardError(
        f"{data.directory}: split {data.split!r} holds no tokens, so there is nothing to export: its "
        f"{s['documents']} document(s) ({s['document_tokens']} tokens) are fewer than one window of "
        f"seq_len + 1 = {data.seq_len + 1} tokens, and packing dropped them as the remainder "
        f"({s['dropped_remainder_tokens']} tokens); pack with a smaller seq_len or give the split more text"
    )


def export_megatron(shards_dir: Path, split: str, out_prefix: Path) -> dict:
    """Write one split as a Megatron-Core ``IndexedDataset`` pair ``<out_prefix>.bin`` / ``<out_prefix>.idx``.

    The split's documents, as Megatron's own preprocessing (tools/preprocess_data.py) writes them:
    one sequence per document (its tokens, EOS last; BOS first where the tokenizer has one), in the
    order packing put them (corpus order, then the train split's intended repeats, each copy a
    document of its own), reassembled from the shards (:func:`split_documents`): every document the
    shards hold tokens of. A document the dropped remainder cut is the tokens of it the shards hold,
    then EOS (``truncated_documents`` counts them); the documents that fell wholly into the remainder
    are not in the shards. Megatron's GPTDataset then builds its samples from whole documents with its
    own defaults (``sequence_length`` tokens plus one, documents shuffled and concatenated across
    their EOS). Token dtype: uint16 as is; uint32 is written as int32 (Megatron has no uint32 code;
    ids < 2**31 always fit). Both files are written under temporary names and renamed.

    Returns ``{"documents", "tokens", "truncated_documents", "dtype", "bin", "idx"}`` (``tokens``: the
    tokens written, the shards' held tokens plus one EOS per truncated document). Raises ShardError
    as :class:`TokenShards` and :func:`split_documents`, and when the split holds no tokens (nothing
    is written then).
    """
    import struct

    data = TokenShards(Path(shards_dir), split)
    _exportable(data)
    dtype = np.dtype(np.uint16) if data.dtype == np.uint16 else np.dtype(np.int32)
    bin_path, idx_path = megatron_paths(out_prefix)
    bin_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_bin, tmp_idx = bin_path.with_name(f".{bin_path.name}.tmp"), idx_path.with_name(f".{idx_path.name}.tmp")
    lengths = []
    docs, cut = _documents_with_cut(data)
    with open(tmp_bin, "wb") as fh:
        for doc in docs:
            fh.write(doc.astype(dtype, copy=False).tobytes())
            lengths.append(len(doc))
    sizes = np.asarray(lengths, dtype=np.int64)
    n_docs, tokens = len(sizes), int(sizes.sum())
    with open(tmp_idx, "wb") as fh:
        fh.write(MEGATRON_INDEX_HEADER)
        fh.write(struct.pack("<Q", 1))
        fh.write(struct.pack("<B", MEGATRON_DTYPE_CODES[dtype]))
        fh.write(struct.pack("<Q", n_docs))
        fh.write(struct.pack("<Q", n_docs + 1))
        fh.write(sizes.astype(np.int32).tobytes(order="C"))
        fh.write(((np.cumsum(sizes) - sizes) * dtype.itemsize).astype(np.int64).tobytes(order="C"))
        fh.write(np.arange(n_docs + 1, dtype=np.int64).tobytes(order="C"))
    os.replace(tmp_bin, bin_path)
    os.replace(tmp_idx, idx_path)
    return {
        "documents": n_docs,
        "tokens": tokens,
        "truncated_documents": cut[0],
        "dtype": dtype.name,
        "bin": str(bin_path),
        "idx": str(idx_path),
    }


def export_hdf5(shards_dir: Path, split: str, out_path: Path, chunk_sequences: int = 1024) -> dict:
    """Write one split as an HDF5 file (h5py) for loaders that expect HDF5.

    Layout:

    * ``input_ids``: (sequences, seq_len + 1), the shards' dtype (uint16/uint32), chunked by
      ``chunk_sequences`` rows, uncompressed: the packed windows exactly as training reads them.
    * ``document_tokens``: (tokens,), the same dtype: the split's complete documents, each its
      tokens with EOS last, in packing order (corpus order, then the train split's repeat passes):
      every document the shards hold tokens of (:func:`split_documents`; a document the dropped
      remainder cut is its held tokens then EOS, counted in the attribute ``truncated_documents``).
    * ``document_offsets``: int64, (documents + 1,): where each document starts in
      ``document_tokens``, its length last: document ``k`` is ``document_tokens[offsets[k]:offsets[k + 1]]``.
    * attributes of the root: the manifest's scalars (``format``, ``seq_len``, ``dtype``, ``eos_id``,
      ``bos_id`` (-1 without BOS), ``vocab_size``, ``tokenizer_sha256``, ``source_data_version``,
      ``validation_fraction``, ``seed``), ``split``, the split's counts (``sequences``, ``tokens``,
      ``documents``, ``document_tokens``, ``dropped_remainder_tokens``), ``truncated_documents``
      and ``manifest_json`` (the whole manifest.json, with every shard's checksum).

    Written under a temporary name and renamed. Returns ``{"sequences", "tokens", "documents", "dtype"}``.
    Raises ShardError when the shard directory does not match its manifest, as :func:`split_documents`,
    and when the split holds no tokens (nothing is written then).
    """
    import h5py

    data = TokenShards(Path(shards_dir), split)
    _exportable(data)
    m = data.manifest
    n, width = len(data), data.seq_len + 1
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    with h5py.File(tmp, "w") as f:
        ids = f.create_dataset(
            "input_ids",
            shape=(n, width),
            dtype=data.dtype,
            chunks=(max(1, min(chunk_sequences, n)), width) if n else None,
        )
        for lo in range(0, n, chunk_sequences):
            rows = data.take(np.arange(lo, min(n, lo + chunk_sequences)))
            ids[lo : lo + len(rows)] = rows
        tokens = f.create_dataset(
            "document_tokens", shape=(0,), maxshape=(None,), dtype=data.dtype, chunks=(max(1, chunk_sequences * width),)
        )
        lengths, held = [], []

        def append(pieces: list[np.ndarray]) -> None:  # one resize per chunk_sequences windows of tokens
            block = np.concatenate(pieces)
            tokens.resize((tokens.shape[0] + len(block),))
            tokens[tokens.shape[0] - len(block) :] = block

        docs, cut = _documents_with_cut(data)
        for doc in docs:
            held.append(doc)
            lengths.append(len(doc))
            if sum(len(h) for h in held) >= chunk_sequences * width:
                append(held)
                held = []
        if held:
            append(held)
        f.create_dataset(
            "document_offsets", data=np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)
        )
        for key in (
            "format",
            "seq_len",
            "dtype",
            "eos_id",
            "vocab_size",
            "tokenizer_sha256",
            "source_data_version",
            "validation_fraction",
            "seed",
        ):
            f.attrs[key] = m[key]
        f.attrs["bos_id"] = -1 if m.get("bos_id") is None else m["bos_id"]
        f.attrs["split"] = split
        for key in ("sequences", "tokens", "documents", "document_tokens", "dropped_remainder_tokens"):
            f.attrs[key] = m["splits"][split][key]
        f.attrs["truncated_documents"] = cut[0]
        f.attrs["manifest_json"] = json.dumps(m)
    os.replace(tmp, out_path)
    return {"sequences": n, "tokens": n * width, "documents": len(lengths), "dtype": data.dtype.name}


def inspect(path: Path, split: str = "train") -> str:
    """Human-readable summary of a shard directory: sequences, tokens, dtype, tokenizer hash, one decoded sample."""
    shards = TokenShards(Path(path), split, verify_checksums=True)
    m = shards.manifest
    lines = [
        f"{path} ({m['format']})",
        f"seq_len={m['seq_len']} dtype={m['dtype']} eos_id={m['eos_id']} "
        f"vocab_size={m['vocab_size']} tokenizer_sha256={m['tokenizer_sha256'][:16]}...",
    ]
    for s, info in m["splits"].items():
        lines.append(
            f"{s}: {info['sequences']} sequences, {info['tokens']} tokens in {len(info['shards'])} shards, "
            f"{info['documents']} documents, {info['dropped_remainder_tokens']} remainder tokens dropped"
        )
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
    e = sub.add_parser(
        "export-megatron", help="write a split's documents as a Megatron-Core IndexedDataset PREFIX.bin/PREFIX.idx"
    )
    e.add_argument("path")
    e.add_argument("out_prefix")
    e.add_argument("--split", default="train", choices=SPLITS)
    h = sub.add_parser(
        "export-hdf5", help="write a split as HDF5: input_ids, document_tokens, document_offsets, manifest attributes"
    )
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
