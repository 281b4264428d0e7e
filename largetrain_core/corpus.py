"""A corpus read into Arrow batches: which files, which partition, which ids, which subset.

The files' formats and the readers are in largetrain_core.readers (one place decides a format). This
module lists a corpus (recursively, links to directories followed, files no reader knows counted and
listed), assigns its files to hash partitions (a corpus of one large file to pieces of it), gives
every document an id unique within the read, and writes the raw_corpus stage (:func:`ingest`):
documents in Parquet parts with the columns ``doc_id``, ``source``, ``text`` (``large_string``), plus
``label`` when ``ReaderConfig.label_field`` is set; rejected records in ``rejected.parquet``
(docs/ARCHITECTURE.md section Accounting).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from largetrain_core.readers import (DOC_SCHEMA, LABELLED_DOC_SCHEMA, REJECT_SCHEMA, RENAMED_SCHEMA, SUFFIXES,  # noqa: F401
                                     Batch, Collector, Source, utf8_error, read_source, reader_for, splittable)


def _describe(text: str) -> dict:
    return {"description": text}


@dataclass(frozen=True)
class ReaderConfig:
    """How to read one corpus (the raw_corpus settings). ``partition``/``partitions`` are set by the
    caller (the Dagster partition), not by users."""

    path: str = field(metadata=_describe(
        "Corpus directory (walked recursively, files in sorted order, links to directories followed) or one file; "
        "empty in a Dagster run config: <storage root>/<the role's default corpus>."))
    text_field: str = field(default="text", metadata=_describe("JSONL key / Parquet or Arrow column holding the text."))
    id_field: str | None = field(default="id", metadata=_describe(
        "JSONL key / column holding the document id, used where a record has one (not null, not empty); "
        "otherwise, and for text files, the id is <relative path>:<line or row> (<relative path> for a text file). "
        "null: always the file and position. A repeated id becomes <id>@<file>:<line or row> (counted: renamed_ids)."))
    label_field: str | None = field(default=None, metadata=_describe(
        "JSONL key / column holding a class label: adds a `label` column (null where a record lacks it; a "
        "non-string value as its JSON text), kept through cleaned_text and deduplicated_text; needed for balancing."))
    batch_size: int = field(default=1024, metadata=_describe("Documents per batch and per part file (bounds memory)."))
    sample_fraction: float = field(default=1.0, metadata=_describe(
        "Subset: keep a document when xxh64(doc_id, seed) / 2**64 < sample_fraction (deterministic, order-free)."))
    max_documents: int | None = field(default=None, metadata=_describe(
        "Subset: then keep at most this many documents (per partition), the first in corpus order."))
    seed: int = field(default=0, metadata=_describe("Seed of the sample_fraction hash."))
    max_rejected_fraction: float = field(default=0.05, metadata=_describe(
        "raw_corpus fails when more than this share of the records read (before subsetting) is rejected."))
    partition: int = 0
    partitions: int = 1

    def __post_init__(self):
        if not 0 <= self.partition < self.partitions:
            raise ValueError(f"partition must be in [0, {self.partitions}), got {self.partition}")
        if not 0.0 < self.sample_fraction <= 1.0:
            raise ValueError(f"sample_fraction must be in (0, 1], got {self.sample_fraction}")


# ------------------------------------------------------------------------------------------------ listing


def is_corpus_file(name: str) -> bool:
    """Whether a reader knows the file name's suffix (case-insensitive: ``A.TXT`` is text)."""
    return reader_for(name) is not None


def partition_of(relative_path: str, partitions: int) -> int:
    """The partition of a corpus file: xxh3-64 of its relative path's bytes (seed 0) modulo ``partitions``.

    Hash partitioning, not ranges of the sorted list: a file added to the corpus changes only the
    partition it falls into, so the other partitions keep their data versions and are not redone.
    A path that is not valid UTF-8 (a name Python decoded with surrogate escapes) hashes its raw bytes.
    """
    return xxhash.xxh3_64_intdigest(relative_path.encode("utf-8", "surrogateescape")) % partitions


def _walk(root: Path) -> list[Path]:
    """Every file under ``root``, sorted, following symbolic links to directories (each real
    directory visited once, so a link cycle ends)."""
    out, seen = [], set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:
            dirnames[:] = []
            continue
        seen.add(real)
        out += [Path(dirpath) / f for f in filenames]
    return sorted(f for f in out if f.is_file())


def _shown(relative_path: str) -> str:
    """A relative path as printable UTF-8: bytes that are not UTF-8 as ``\\x`` escapes."""
    return relative_path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


@dataclass
class Scan:
    """A corpus partition's files: ``sources`` to read (in corpus order) and ``skipped`` files that no
    reader knows; ``base`` is the directory their relative paths start from."""

    sources: list[Source]
    skipped: list[Path]
    base: Path

    @property
    def files(self) -> list[Path]:
        return [s.path for s in self.sources]


def scan(path: str | Path, partition: int = 0, partitions: int = 1) -> Scan:
    """The files of partition ``partition`` of ``partitions`` of the corpus at ``path``.

    A file belongs to partition :func:`partition_of` (its relative path). A corpus of exactly one
    corpus file whose reader can split it (uncompressed JSONL: byte ranges at line boundaries;
    Parquet: row groups; see largetrain_core.readers) is read in pieces instead, piece ``i`` in
    partition ``i``; a compressed file, a text file (one document) or an Arrow file stays whole.

    Raises FileNotFoundError when ``path`` does not exist, and ValueError when it is empty, a single
    file no reader knows, or a directory holding no corpus file (in any partition).
    """
    if not str(path):
        raise ValueError("corpus path is empty")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"corpus path does not exist: {path}")
    if path.is_file():
        if not is_corpus_file(path.name):
            raise ValueError(f"{path}: not a corpus file: the suffix is none of {', '.join(SUFFIXES)}")
        files, base = [path], path.parent
    else:
        files, base = _walk(path), path
    known = [f for f in files if is_corpus_file(f.name)]
    if not known:
        raise ValueError(f"no corpus file under {path}: no file has a suffix of {', '.join(SUFFIXES)}")
    rel = {f: f.relative_to(base).as_posix() for f in files}
    if partitions > 1 and len(known) == 1 and splittable(known[0]):
        sources = [Source(known[0], rel[known[0]], reader_for(known[0].name), (partition, partitions))]
    else:
        sources = [Source(f, rel[f], reader_for(f.name)) for f in known
                   if partitions == 1 or partition_of(rel[f], partitions) == partition]
    skipped = [f for f in files if not is_corpus_file(f.name)
               and (partitions == 1 or partition_of(rel[f], partitions) == partition)]
    return Scan(sources, skipped, base)


def list_files(path: str | Path, partition: int = 0, partitions: int = 1) -> list[Path]:
    """The corpus files of :func:`scan` (same arguments and errors)."""
    return scan(path, partition, partitions).files


# ------------------------------------------------------------------------------------------------ reading


def read_corpus(config: ReaderConfig, listed: Scan | None = None) -> Iterator[Batch]:
    """Stream a corpus (``config.partition`` of it) as :class:`Batch` es of at most ``config.batch_size``
    documents.

    Every document and every unreadable record appears exactly once, either in ``documents`` or in
    ``rejected``; document ids are unique within the read (see readers.Collector). ``listed``: the
    partition's :func:`scan` when the caller has it already, else scanned here, with its errors
    (FileNotFoundError, ValueError). A partition that no file falls into yields nothing.
    """
    if listed is None:
        listed = scan(config.path, config.partition, config.partitions)
    out = Collector(config.batch_size, labelled=config.label_field is not None)
    for src in listed.sources:
        if utf8_error(src.rel) is not None:  # document ids and sources must be UTF-8: the file becomes one rejected record
            out.reject(_shown(src.rel), -1, "file name is not valid UTF-8 (undecodable bytes shown as \\x escapes): rename the file")
        else:
            yield from read_source(src, config, out)
        if out.full():
            yield out.flush()
    last = out.flush()
    if last.documents.num_rows or last.rejected.num_rows or last.renamed.num_rows:
        yield last


def _in_sample(doc_ids: list[str], fraction: float, seed: int) -> list[bool]:
    """Seeded, order-independent Bernoulli sample: keep a document when xxh64(doc_id, seed) / 2**64 < fraction."""
    if fraction >= 1.0:
        return [True] * len(doc_ids)
    limit = int(fraction * 2**64)
    return [xxhash.xxh64_intdigest(d.encode(), seed) < limit for d in doc_ids]


def ingest(config: ReaderConfig, out_dir: Path, listed: Scan | None = None) -> dict:
    """Read a corpus (partition) into ``out_dir/part-NNNNN.parquet`` (DOC_SCHEMA, one file per batch),
    ``out_dir/rejected.parquet`` (REJECT_SCHEMA), ``out_dir/renamed_ids.parquet`` (RENAMED_SCHEMA:
    documents whose id repeated an earlier one's) and ``out_dir/skipped_files.txt`` (files no reader
    knows, one relative path per line: not read, counted).

    Subsetting for early experiments: ``sample_fraction`` keeps a seeded hash sample of documents,
    then ``max_documents`` keeps the first N of those in corpus order (per partition). Documents left
    out by the subset are counted (``not_sampled``), not stored.

    ``listed``: the files to read when the caller has them already (e.g. one Spark task's run of
    the partition's :func:`scan`), else the partition's :func:`scan` of ``config.path``.

    Returns counts ``documents``, ``rejected``, ``renamed_ids``, ``bytes`` (UTF-8 of the kept text),
    ``files``, ``skipped_files``, ``not_sampled``, ``parts``, and ``rejected_by_file`` (the ten files
    with the most rejected records: {relative path: count}).
    """
    out_dir = Path(out_dir)
    if listed is None:
        listed = scan(config.path, config.partition, config.partitions)
    stats = {"documents": 0, "rejected": 0, "renamed_ids": 0, "bytes": 0, "not_sampled": 0, "parts": 0,
             "files": len(listed.sources), "skipped_files": len(listed.skipped)}
    (out_dir / "skipped_files.txt").write_text(
        "".join(_shown(f.relative_to(listed.base).as_posix()) + "\n" for f in listed.skipped))
    rejected: list[pa.Table] = []
    renamed: list[pa.Table] = []
    for batch in read_corpus(config, listed):
        docs = batch.documents
        keep = _in_sample(docs.column("doc_id").to_pylist(), config.sample_fraction, config.seed)
        docs = docs.filter(pa.array(keep, pa.bool_()))
        if config.max_documents is not None:
            docs = docs.slice(0, max(0, config.max_documents - stats["documents"]))
        stats["not_sampled"] += batch.documents.num_rows - docs.num_rows
        rejected.append(batch.rejected)
        renamed.append(batch.renamed)
        stats["rejected"] += batch.rejected.num_rows
        stats["renamed_ids"] += batch.renamed.num_rows
        if docs.num_rows:
            pq.write_table(docs, out_dir / f"part-{stats['parts']:05d}.parquet")
            stats["parts"] += 1
            stats["documents"] += docs.num_rows
            stats["bytes"] += pc.sum(pc.binary_length(docs.column("text"))).as_py() or 0
    rejected_table = pa.concat_tables(rejected) if rejected else REJECT_SCHEMA.empty_table()
    pq.write_table(rejected_table, out_dir / "rejected.parquet")
    pq.write_table(pa.concat_tables(renamed) if renamed else RENAMED_SCHEMA.empty_table(), out_dir / "renamed_ids.parquet")
    by_file = pl.from_arrow(rejected_table.select(["source"])).group_by("source").len().sort(["len", "source"], descending=[True, False])
    stats["rejected_by_file"] = dict(by_file.head(10).iter_rows())
    return stats


_WHERE = r"^(line|row) (\d+): "  # the position prefix of a record's reason (readers.Collector.doc)
_NUMBERED = r"\b(at (?:byte|column|character)) \d+"  # positions inside a reason


def _reason_groups(rejected: Path) -> pl.DataFrame:
    """The rows of a ``rejected.parquet`` grouped by reason with the positions left out: columns
    records, text (the first occurrence without its position prefix), source, position, at, n (the
    first occurrence's place), whole (records rejected as whole files), most frequent first."""
    df = pl.read_parquet(rejected, columns=["source", "position", "reason"])
    df = df.with_columns(at=pl.col("reason").str.extract(_WHERE, 1), n=pl.col("reason").str.extract(_WHERE, 2),
                         text=pl.col("reason").str.replace(_WHERE, ""))
    return (df.with_columns(key=pl.col("text").str.replace_all(_NUMBERED, "$1 N")).with_row_index("order")
            .group_by("key")
            .agg(records=pl.len(), whole=(pl.col("position") == -1).sum(), order=pl.col("order").first(),
                 **{c: pl.col(c).first() for c in ("text", "source", "position", "at", "n")})
            .sort(["records", "order"], descending=[True, False]))


def rejection_reasons(rejected: Path, top: int = 3) -> list[dict]:
    """The ``top`` most frequent reasons in a ``rejected.parquet`` (REJECT_SCHEMA), most frequent
    first (ties: the reason met first): dicts ``reason`` (its first occurrence, without the position
    prefix), ``records`` (count) and ``first`` (where it first occurred: ``file:line`` for a JSONL
    line, ``file, row N`` for a columnar row, ``file (whole file)`` for a file rejected as a whole,
    ``file`` otherwise). Reasons are grouped with their positions (line, row, byte, column,
    character numbers) left out, so one fault on many lines is one reason."""
    out = []
    for g in _reason_groups(rejected).head(top).iter_rows(named=True):
        first = (f"{g['source']}:{g['n']}" if g["at"] == "line" else f"{g['source']}, row {g['n']}" if g["at"] == "row"
                 else f"{g['source']} (whole file)" if g["position"] == -1 else g["source"])
        out.append({"reason": g["text"], "records": g["records"], "first": first})
    return out


def describe_rejections(rejected: Path, top: int = 3) -> str:
    """The top reasons of a ``rejected.parquet`` in words for a message: ``N x <reason> (first:
    <where>)``, joined by ``; `` (:func:`rejection_reasons`), how many other reasons there are, and
    before them, how many files were rejected as a whole (each counts as one record, however many
    lines it has).
    Empty when nothing was rejected."""
    groups = _reason_groups(rejected)
    if not groups.height:
        return ""
    text = "; ".join(f"{r['records']:,} x {r['reason']} (first: {r['first']})" for r in rejection_reasons(rejected, top))
    more = f"; {groups.height - top} more reasons" if groups.height > top else ""
    whole = groups["whole"].sum()
    files = (f"{whole:,} {'files' if whole > 1 else 'file'} rejected as a whole, each counted as one record however "
             "many lines it has. " if whole else "")
    return f"{files}Top reasons: {text}{more}."


def rejection_error(stats: dict, config: ReaderConfig, rejected: Path | None = None) -> str | None:
    """None when the rejected records are at most ``config.max_rejected_fraction`` of every record
    read (documents + not sampled + rejected); else the failure message: the counts, the files that
    caused most rejections and, given ``rejected`` (the ``rejected.parquet``), the top reasons with
    the first place of each (:func:`describe_rejections`)."""
    total = stats["documents"] + stats["not_sampled"] + stats["rejected"]
    if not total or stats["rejected"] / total <= config.max_rejected_fraction:
        return None
    top = stats.get("rejected_by_file") or {}
    files = ", ".join(f"{f} ({n})" for f, n in top.items())
    more = stats["rejected"] - sum(top.values())
    message = (f"{stats['rejected']:,} of {total:,} records rejected, more than max_rejected_fraction="
               f"{config.max_rejected_fraction}; by file: {files}{f' and {more} more' if more else ''}")
    reasons = describe_rejections(rejected) if rejected is not None else ""
    return f"{message}. {reasons}" if reasons else message


def duplicate_ids(raw_dirs: list[Path], names: list[str]) -> pl.DataFrame:
    """Document ids held by more than one of the raw_corpus directories ``raw_dirs`` (the partitions,
    named ``names``): columns doc_id, sources (list of "<name>: <source file>"), sorted by doc_id.

    Ids are unique within one directory (readers.Collector); record ids that repeat across files of
    different partitions can only be found here, reading the ``doc_id`` and ``source`` columns of every
    part (memory: those columns of the whole corpus)."""
    frames = [pl.scan_parquet(files).select("doc_id", "source").with_columns(where=pl.lit(name))
              for d, name in zip(raw_dirs, names) if (files := sorted(Path(d).glob("part-*.parquet")))]
    if not frames:
        return pl.DataFrame(schema={"doc_id": pl.Utf8, "sources": pl.List(pl.Utf8)})
    df = pl.concat(frames).filter(pl.col("doc_id").is_duplicated()).collect()
    return (df.group_by("doc_id", maintain_order=True).agg(sources=pl.format("{}: {}", "where", "source"))
            .sort("doc_id"))


def fingerprint(path: str | Path, partition: int = 0, partitions: int = 1, cache_file: str | Path | None = None) -> str:
    """Content version of a corpus (or of one partition of it): largetrain_core.digest.files_digest
    of its corpus files, i.e. xxh3-128 over (path relative to the corpus, xxh3-128 of the bytes) of
    every file, 32 hex digits. Independent of where the corpus lies and of file times: a copy
    elsewhere has the same fingerprint. ``cache_file``: a DigestCache file (one per corpus partition)
    so that unchanged files are not re-read; None reads every file. The pieces of a split file share
    the file's digest (the partition is part of raw_corpus's version). Errors as :func:`list_files`."""
    from largetrain_core.digest import DigestCache, files_digest

    root = Path(path)
    cache = DigestCache(cache_file)
    digest = files_digest(root if root.is_dir() else root.parent, list_files(root, partition, partitions), cache)
    cache.save()
    return digest
