"""Packing (package doc, Packing and Split): the train/validation split by document hash, and the tokenization of a partition's part files into windows and tails."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import xxhash

from largetrain_core.storage import ArtifactError, loading, part_files, read_json, write_json_atomic
from largetrain_core.tokenizer import TokenizerInfo, document_encoder, load_tokenizer_info
from largetrain_core.shards.mixture import CORPUS, mixture_weights
from largetrain_core.shards.writer import LOG, _SplitWriter


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


class _PartPacker:
    """The streams of one :func:`tokenize_parts` run: its shard writers, tails, units and counts."""

    def __init__(self, first_part: int, info: TokenizerInfo, encode, out_dir: Path, packing: Packing, forced):
        self.first_part = first_part
        self.info = info
        self.encode = encode
        self.out_dir = out_dir
        self.packing = packing
        self.forced = forced
        self.tag = f"{first_part:06d}"
        self.mixture = packing.mixture
        self.number = {c: i for i, c in enumerate(self.mixture or {})}
        self.writers: dict[str, _SplitWriter] = {}
        self.tails: list[tuple[str, int, str | None, int, np.ndarray]] = []
        self.units: dict[str, list[list[int]]] = {}  # per stream: [part, full windows, tail tokens] of each part
        self.smallest: tuple[int, str] | None = None
        self.validation_documents = self.documents = 0
        self.most_copies = 1

    def writer(self, split: str, k: int, corpus: str | None = None) -> _SplitWriter:
        """The shard writer of a stream (split, pass, corpus), opened on first use."""
        key = _key(split, k, corpus)
        if key not in self.writers:
            name = "-".join(
                [split, *([f"r{k}"] if k > 1 else []), *([f"m{self.number[corpus]:03d}"] if corpus else []), self.tag]
            )
            packing = self.packing
            self.writers[key] = _SplitWriter(
                self.out_dir, name, packing.seq_len, self.info, packing.sequences_per_shard
            )
            self.writers[key].stream = (split, k, corpus)
        return self.writers[key]

    def end_part(self, k: int, part: int) -> None:
        """Close part ``part`` in every stream of pass ``k``: record its windows and keep its tail."""
        for key, w in self.writers.items():
            split, pass_, corpus = w.stream
            if pass_ != k:
                continue
            windows, tail = w.end_unit()
            if windows or len(tail):
                self.units.setdefault(key, []).append([part, windows, len(tail)])
            if len(tail):
                self.tails.append((split, k, corpus, part, tail))

    def validation(self, doc_ids: list[str], hashes: np.ndarray | None = None) -> np.ndarray:
        """Boolean array: True where a document goes to validation (its hash, or the forced doc id)."""
        is_val = split_of(doc_ids, self.packing.validation_fraction, self.packing.seed, hashes)
        if self.forced is not None:
            is_val |= np.array([d == self.forced for d in doc_ids], dtype=bool)
        return is_val

    def train(self, part: Path, k: int, docs: list[np.ndarray], corpora: list | None, copies=None) -> None:
        """Pack train documents of pass ``k``, each into its corpus's stream in a mixture."""
        mixture = self.mixture
        if mixture is None:
            self.writer("train", k).add(docs, repeat=k > 1)
            return
        unknown = sorted({str(c) for c in corpora if c not in mixture})
        if unknown:
            raise ValueError(
                f"{part}: corpus {', '.join(map(repr, unknown))} has no mixture weight; weights are given "
                f"for {', '.join(map(repr, mixture))}"
            )
        for i, (doc, corpus) in enumerate(zip(docs, corpora)):
            w = self.writer("train", k, corpus)
            w.add([doc], repeat=k > 1)
            if copies is not None and copies[i] > 1:
                w.repeated_documents += 1

    def first_pass(self, part: Path, index: int) -> None:
        """Pass 1 over a part: split, count and pack every document once."""
        from largetrain_core.balance import COPIES  # polars: writing shards only

        schema = _part_schema(part)
        weighted = COPIES in schema
        if self.mixture is not None and CORPUS not in schema:
            raise ValueError(
                f"{part}: no {CORPUS!r} column, so its documents cannot be weighted by corpus: a mixture "
                "needs the corpus name of every document (raw_corpus reads it when corpora are named)"
            )
        for batch in _read_part(part).iter_slices(self.packing.batch_documents):
            self._first_pass_batch(part, batch, weighted)
        self.end_part(1, index)

    def _first_pass_batch(self, part: Path, batch, weighted: bool) -> None:
        """Pass 1 over one batch of a part's documents."""
        from largetrain_core.balance import COPIES  # polars: writing shards only

        ids = batch["doc_id"].to_list()
        hashes = split_hashes(ids, self.packing.seed)
        if len(ids) and (self.smallest is None or int(hashes.min()) < self.smallest[0]):
            self.smallest = (int(hashes.min()), ids[int(hashes.argmin())])
        is_val = self.validation(ids, hashes)
        self.documents += len(ids)
        self.validation_documents += int(is_val.sum())
        train_copies = None
        if weighted:
            c = batch[COPIES]
            if c.null_count() or (c < 1).any():
                raise ValueError(
                    f"{part}: column {COPIES!r} must be >= 1 in every row (how many times the "
                    f"train split holds the document)"
                )
            train_copies = c.to_numpy()[~is_val]
            self.most_copies = max(self.most_copies, int(train_copies.max(initial=1)))
            if self.mixture is None:
                self.writer("train", 1).repeated_documents += int((train_copies > 1).sum())
        encoded = self.encode(batch["text"].to_list())
        mixture = self.mixture
        corpora = [c for c, v in zip(batch[CORPUS].to_list(), is_val) if not v] if mixture is not None else None
        self.train(part, 1, [e for e, v in zip(encoded, is_val) if not v], corpora, train_copies)
        self.writer("validation", 1).add([e for e, v in zip(encoded, is_val) if v])

    def repeat_pass(self, k: int, part: Path, index: int) -> None:
        """Pass ``k`` over a part: pack again the train documents with at least ``k`` copies."""
        from largetrain_core.balance import COPIES  # polars: writing shards only

        if COPIES not in _part_schema(part):
            return
        mixture = self.mixture
        columns = ["doc_id", "text", COPIES] + ([CORPUS] if mixture is not None else [])
        for batch in _read_part(part, columns).iter_slices(self.packing.batch_documents):
            again = (batch[COPIES].to_numpy() >= k) & ~self.validation(batch["doc_id"].to_list())
            if again.any():
                texts = [t for t, a in zip(batch["text"].to_list(), again) if a]
                corpora = [c for c, a in zip(batch[CORPUS].to_list(), again) if a] if mixture is not None else None
                self.train(part, k, self.encode(texts), corpora)
        self.end_part(k, index)

    def write_tails(self) -> str | None:
        """Write the parts' tails to ``tails-<first_part>.arrow``; its name, or None without tails."""
        if not self.tails:
            return None
        tails = self.tails
        tail_file = f"tails-{self.tag}.arrow"
        list_type = pa.large_list(pa.uint16() if self.info.dtype == np.uint16 else pa.uint32())
        table = pa.table(
            {
                "split": pa.array([t[0] for t in tails], pa.string()),
                "pass": pa.array([t[1] for t in tails], pa.int32()),
                "corpus": pa.array([t[2] for t in tails], pa.string()),
                "part": pa.array([t[3] for t in tails], pa.int64()),
                "tokens": pa.array([t[4] for t in tails], list_type),
            }
        )
        with pa.ipc.new_file(str(self.out_dir / tail_file), table.schema) as w:
            w.write_table(table)
        return tail_file

    def summary(self, parts: int, tail_file: str | None) -> dict:
        """The run's summary (see :func:`tokenize_parts`); finishes every writer."""
        return {
            "first_part": self.first_part,
            "parts": parts,
            "documents": self.documents,
            "validation_documents": self.validation_documents,
            "smallest_split_hash": list(self.smallest) if self.smallest else None,
            "tails": tail_file,
            "tail_tokens": sum(len(t[4]) for t in self.tails),
            "encoder": {"engine": self.encode.engine, "reason": self.encode.reason},
            "units": self.units,
            "writers": {key: w.finish() for key, w in sorted(self.writers.items())},
        }

    def discard(self) -> None:
        """Remove every file of the run (after a failure)."""
        for w in self.writers.values():
            w.discard()
        (self.out_dir / f"tails-{self.tag}.arrow").unlink(missing_ok=True)


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
    info = load_tokenizer_info(tokenizer_path)
    encode = document_encoder(info)
    LOG.info(
        "tokenizing parts %d..%d with %s%s",
        first_part,
        first_part + len(parts) - 1,
        encode.engine,
        f" ({encode.reason})" if encode.reason else "",
    )
    run = _PartPacker(first_part, info, encode, Path(out_dir), packing, forced)
    try:
        for j, part in enumerate(parts):
            run.first_pass(part, first_part + j)
        for k in range(2, run.most_copies + 1):  # pass k: the train documents with at least k copies
            for j, part in enumerate(parts):
                run.repeat_pass(k, part, first_part + j)
        return run.summary(len(parts), run.write_tails())
    except BaseException:  # nothing of a failed run stays behind
        run.discard()
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


def _part_schema(path: Path) -> dict:
    import polars as pl  # writing shards only: reading them (TokenShards) needs no polars

    with loading(path, "Parquet part file of a text stage (doc_id, text)"):
        return pl.read_parquet_schema(path)


def _read_part(path: Path, columns: list[str] | None = None) -> "pl.DataFrame":  # noqa: F821
    import polars as pl

    with loading(path, "Parquet part file of a text stage (doc_id, text)"):
        return pl.read_parquet(path, columns=columns)
