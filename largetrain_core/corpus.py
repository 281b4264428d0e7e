"""A corpus read into Arrow batches: which files, which partition, which ids, which subset.

The files' formats and the readers are in largetrain_core.readers (one place decides a format). This
module lists a corpus (recursively, in sorted order under canonical names, links followed once, see
:func:`_walk`; files no reader knows counted and listed; dangling links listed, to be rejected),
assigns its files to hash partitions (a corpus of one large file to pieces of it), gives every
document an id unique within the read, and writes the raw_corpus stage (:func:`ingest`):
documents in Parquet parts with the columns ``doc_id``, ``source``, ``text`` (``large_string``), plus
``label`` when ``ReaderConfig.label_field`` is set; rejected records in ``rejected.parquet``
(docs/ARCHITECTURE.md section Accounting).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterator

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from largetrain_core.readers import (
    DOC_SCHEMA,  # noqa: F401 -- re-exported: the schemas and suffixes of the documents this module reads
    LABELLED_DOC_SCHEMA,  # noqa: F401
    REJECT_SCHEMA,
    RENAMED_SCHEMA,
    SUFFIXES,
    Batch,
    Collector,
    ReaderConfig,
    Source,
    WHOLE_FILE,
    dangling_link,
    utf8_error,
    read_source,
    reader_for,
    splittable,
)
from largetrain_core import fs
from largetrain_core.cache import cache_dir
from largetrain_core.storage import part_files


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
    """Every file under ``root``, each once under its canonical name, in sorted order (by path
    component), whatever order the file system lists directories in; links followed.

    The canonical name of a file or directory: its own path when it lies in the corpus (its real path
    is under the real path of ``root``), so a link to something in the corpus is not followed (the
    target is read under its own name, once); else, for a link out of the corpus, the link's path,
    the first in the sorted walk when several lead to one target. A link to a directory being walked
    (a cycle) or already walked is not followed, so the walk ends. A dangling link (a link whose
    target does not exist, or a loop of links) is listed as a file: reading it rejects it, naming it
    (readers.read_source). Names are compared as Python strings (code points), so the
    order and the names do not depend on the file system's listing order or on the machine."""
    top = os.path.realpath(root)
    seen: set[str] = {top}  # real directories walked (or being walked)
    seen_files: set[str] = set()  # real files outside the corpus already listed under a link's name
    out: list[Path] = []

    def inside(real: str) -> bool:
        return real == top or real.startswith(top.rstrip(os.sep) + os.sep)

    def visit(directory: Path) -> None:
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            path = directory / e.name
            if not e.is_symlink():
                if e.is_dir(follow_symlinks=False):
                    visit(path)
                elif e.is_file(follow_symlinks=False):
                    out.append(path)
                continue
            real = os.path.realpath(path)
            if not os.path.exists(path):  # dangling, or a loop of links
                out.append(path)
            elif inside(real):  # read under its own name
                continue
            elif os.path.isdir(path):
                if real not in seen:
                    seen.add(real)
                    visit(path)
            elif os.path.isfile(path) and real not in seen_files:
                seen_files.add(real)
                out.append(path)

    visit(Path(root))
    return sorted(out, key=lambda f: f.relative_to(root).parts)


def _walk_remote(url: str) -> tuple[list[str], str, dict[str, int]]:
    """(every object under the URL ``url``, or ``url`` itself when it is one object; the URL their
    relative paths start from; each object's size in bytes), in the order of :func:`_walk` (by path
    component). One listing."""
    fsys, root = fs.filesystem(url)
    root = root.rstrip("/")
    base_url = url.rstrip("/")
    if fsys.isfile(root):
        return [base_url], base_url.rsplit("/", 1)[0], {base_url: int(fsys.info(root)["size"])}
    sizes = {
        p[len(root) + 1 :]: int(info.get("size") or 0)
        for p, info in fsys.find(root, detail=True).items()
        if info.get("type", "file") == "file" and not p.endswith("/")
    }
    rels = sorted(sizes, key=lambda r: PurePosixPath(r).parts)
    return [f"{base_url}/{r}" for r in rels], base_url, {f"{base_url}/{r}": sizes[r] for r in rels}


def _name(f: Path | str) -> str:
    return f.name if isinstance(f, Path) else f.rsplit("/", 1)[-1]


def _relative(f: Path | str, base: Path | str) -> str:
    """``f``'s path relative to ``base``, POSIX (a local path or an object's URL)."""
    return f.relative_to(base).as_posix() if isinstance(f, Path) else f[len(str(base)) + 1 :]


def _shown(relative_path: str) -> str:
    """A relative path as printable UTF-8: bytes that are not UTF-8 as ``\\x`` escapes."""
    return relative_path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


@dataclass
class Scan:
    """A corpus partition's files: ``sources`` to read (in corpus order) and ``skipped`` files that no
    reader knows; ``base`` is the directory their relative paths start from. For a corpus at a URL,
    the files and the base are URLs (strings)."""

    sources: list[Source]
    skipped: list[Path | str]
    base: Path | str

    @property
    def files(self) -> list[Path | str]:
        return [s.path for s in self.sources]


def scan(path: str | Path, partition: int = 0, partitions: int = 1) -> Scan:
    """The files of partition ``partition`` of ``partitions`` of the corpus at ``path``.

    A file belongs to partition :func:`partition_of` (its relative path). A corpus of exactly one
    corpus file whose reader can split it (uncompressed JSONL: byte ranges at line boundaries;
    Parquet: row groups; see largetrain_core.readers) is read in pieces instead, piece ``i`` in
    partition ``i``; a compressed file, a text file (one document) or an Arrow file stays whole.

    ``path`` may be a URL (``s3://bucket/corpus/``, largetrain_core.fs): its objects are listed once
    and read with range requests (readers.Source), partitioned by their paths relative to ``path``
    as local files are, so a corpus copied to a bucket keeps its partitions.

    Raises FileNotFoundError when ``path`` does not exist, and ValueError when it is empty, a single
    file no reader knows, or a directory holding no corpus file (in any partition).
    """
    if not str(path):
        raise ValueError("corpus path is empty")
    shown = fs.redact(str(path))
    sizes: dict = {}
    if fs.is_url(path):
        if not fs.exists(path):
            raise FileNotFoundError(f"corpus path does not exist: {shown}")
        files, base, sizes = _walk_remote(str(path))
        if len(files) == 1 and files[0] == str(path).rstrip("/") and not is_corpus_file(_name(files[0])):
            raise ValueError(f"{shown}: not a corpus file: the suffix is none of {', '.join(SUFFIXES)}")
    else:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"corpus path does not exist: {path}")
        if path.is_file():
            if not is_corpus_file(path.name):
                raise ValueError(f"{path}: not a corpus file: the suffix is none of {', '.join(SUFFIXES)}")
            files, base = [path], path.parent
        else:
            files, base = _walk(path), path
    known = [f for f in files if is_corpus_file(_name(f)) or dangling_link(f)]  # a dangling link is rejected
    read = set(known)
    if not known:
        raise ValueError(f"no corpus file under {shown}: no file has a suffix of {', '.join(SUFFIXES)}")
    rel = {f: _relative(f, base) for f in files}
    if partitions > 1 and len(known) == 1 and not dangling_link(known[0]) and splittable(known[0]):
        sources = [
            Source(known[0], rel[known[0]], reader_for(_name(known[0])), (partition, partitions), sizes.get(known[0]))
        ]
    else:
        sources = [
            Source(f, rel[f], reader_for(_name(f)), size=sizes.get(f))
            for f in known
            if partitions == 1 or partition_of(rel[f], partitions) == partition
        ]
    skipped = [f for f in files if f not in read and (partitions == 1 or partition_of(rel[f], partitions) == partition)]
    return Scan(sources, skipped, base)


def holds_records(path: str | Path) -> bool:
    """Whether the corpus at ``path`` (all its partitions) may hold a record: False only when every
    corpus file is empty, or holds whitespace only (a text or JSONL file, decompressed: read up to its
    first byte that is not whitespace), or is a Parquet file of zero rows. A file that cannot be probed
    (damaged, a dangling link: a rejected record) and an Arrow file count as holding one. Errors as
    :func:`scan`."""
    for src in scan(path).sources:
        if dangling_link(src.path) or src.reader is None:
            return True
        try:
            if src.reader.streams:
                with src.open_bytes() as f:
                    while block := f.read(1 << 16):
                        if block.strip():
                            return True
            elif src.reader.name == "parquet":
                if pq.ParquetFile(src.open_random()).metadata.num_rows:
                    return True
            else:
                return True
        except Exception:  # noqa: BLE001 -- a file that cannot be probed is read (and rejected) by the reader
            return True
    return False


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
    out = Collector(
        config.batch_size,
        labelled=config.label_field is not None,
        chat=config.format == "chat",
        label_error=config.label_error if config.labels is not None or config.require_label else None,
    )
    for src in _fetched_whole(listed.sources):
        if (
            utf8_error(src.rel) is not None
        ):  # document ids and sources must be UTF-8: the file becomes one rejected record
            out.reject(
                _shown(src.rel),
                -1,
                "file name is not valid UTF-8 (undecodable bytes shown as \\x escapes): rename the file",
            )
        else:
            yield from read_source(src, config, out)
        if out.full():
            yield out.flush()
    last = out.flush()
    if (
        last.documents.num_rows
        or last.rejected.num_rows
        or last.renamed.num_rows
        or last.blank_lines
        or last.utf16_files
    ):
        yield last


# Objects up to this size are fetched whole, concurrently, before they are read (a handful of requests each,
# sequential, would bound the reading by the store's latency); larger ones and pieces are read with range
# requests. A window holds at most WHOLE_WINDOW_BYTES or WHOLE_WINDOW_OBJECTS; the next window is fetched while
# one is read, so at most two are on local disk. Our choices, no standard's: a few times the latency-bandwidth
# product of a store (S3: tens of ms, hundreds of MB/s per node), a few hundred MiB of scratch.
WHOLE_OBJECT_BYTES = 8 << 20
WHOLE_WINDOW_BYTES = 128 << 20
WHOLE_WINDOW_OBJECTS = 256


def _fetched_whole(sources: list[Source]) -> Iterator[Source]:
    """``sources`` in order, the small whole objects among them (a URL, no piece, a listed size of at most
    :data:`WHOLE_OBJECT_BYTES`) fetched first, a window at a time in one concurrent ``get``
    (fsspec: s3fs and gcsfs fetch the objects of one call concurrently), into a scratch directory of
    the local cache (largetrain_core.cache), and read from there as local files under their own
    relative names. Scratch files are removed when their window is read, or when the reading ends
    early. Raises what the store raises for an object that cannot be fetched (FileNotFoundError,
    PermissionError, naming the object), failing the read rather than rejecting the object."""
    small = [
        s
        for s in sources
        if fs.is_url(s.path) and s.piece is None and s.size is not None and s.size <= WHOLE_OBJECT_BYTES
    ]
    if not small:
        yield from sources
        return
    windows, window, held = [], [], 0
    for s in small:
        if window and (held + s.size > WHOLE_WINDOW_BYTES or len(window) >= WHOLE_WINDOW_OBJECTS):
            windows.append(window)
            window, held = [], 0
        window.append(s)
        held += s.size
    windows.append(window)
    window_of = {id(s): k for k, w in enumerate(windows) for s in w}

    def fetch(k: int, scratch: Path) -> dict[int, Source]:
        directory = scratch / f"{k:06d}"
        directory.mkdir()
        fsys, _ = fs.filesystem(windows[k][0].path)
        local = [directory / f"{i:06d}" for i in range(len(windows[k]))]
        fsys.get([fs.filesystem(s.path)[1] for s in windows[k]], [str(p) for p in local])
        return {id(s): Source(p, s.rel, s.reader, None, s.size) for s, p in zip(windows[k], local)}

    with (
        tempfile.TemporaryDirectory(prefix="corpus-", dir=cache_dir()) as scratch,
        ThreadPoolExecutor(1, thread_name_prefix="corpus-fetch") as pool,
    ):
        pending = {0: pool.submit(fetch, 0, Path(scratch))}
        ready: dict[int, Source] = {}
        current = -1
        for s in sources:
            k = window_of.get(id(s))
            if k is None:
                yield s
                continue
            if k != current:
                if current >= 0:
                    shutil.rmtree(Path(scratch) / f"{current:06d}", ignore_errors=True)
                ready, current = pending.pop(k).result(), k
                if k + 1 < len(windows):
                    pending[k + 1] = pool.submit(fetch, k + 1, Path(scratch))
            yield ready[id(s)]
        for f in pending.values():  # a window fetched ahead and not read (the reading ended early)
            f.cancel()


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
    ``files``, ``skipped_files``, ``not_sampled``, ``parts``, ``blank_lines`` (blank JSONL lines: not
    records; every other line read is a document, not sampled or rejected), ``utf16_files`` (files
    decoded from UTF-16, readers.detect_utf16), and ``rejected_by_file`` (the ten files
    with the most rejected records: {relative path: count}).
    """
    out_dir = Path(out_dir)
    if listed is None:
        listed = scan(config.path, config.partition, config.partitions)
    stats = start_ingest(listed, out_dir)
    rejected: list[pa.Table] = []
    renamed: list[pa.Table] = []
    for batch in read_corpus(config, listed):
        docs = batch.documents
        keep = _in_sample(docs.column("doc_id").to_pylist(), config.sample_fraction, config.seed)
        docs = docs.filter(pa.array(keep, pa.bool_()))
        if config.max_documents is not None:
            docs = docs.slice(0, max(0, config.max_documents - stats["documents"]))
        stats["not_sampled"] += batch.documents.num_rows - docs.num_rows
        if config.id_prefix:  # after the sample, so a mixture's corpus keeps the documents it keeps alone
            i = docs.schema.get_field_index("doc_id")
            ids = docs.column(i)
            docs = docs.set_column(
                i,
                docs.schema.field(i),
                pc.binary_join_element_wise(pa.scalar(config.id_prefix, ids.type), ids, pa.scalar("", ids.type)),
            )
        rejected.append(batch.rejected)
        renamed.append(batch.renamed)
        stats["rejected"] += batch.rejected.num_rows
        stats["renamed_ids"] += batch.renamed.num_rows
        stats["blank_lines"] += batch.blank_lines
        stats["utf16_files"] += batch.utf16_files
        if docs.num_rows:
            pq.write_table(docs, out_dir / f"part-{stats['parts']:05d}.parquet")
            stats["parts"] += 1
            stats["documents"] += docs.num_rows
            stats["bytes"] += pc.sum(pc.binary_length(docs.column("text"))).as_py() or 0
    return finish_ingest(stats, rejected, renamed, out_dir)


def start_ingest(listed: Scan, out_dir: Path) -> dict:
    """The counts of an ingest at its start (every executor's), after writing ``skipped_files.txt``."""
    (Path(out_dir) / "skipped_files.txt").write_text(
        "".join(_shown(_relative(f, listed.base)) + "\n" for f in listed.skipped)
    )
    return {
        "documents": 0,
        "rejected": 0,
        "renamed_ids": 0,
        "bytes": 0,
        "not_sampled": 0,
        "parts": 0,
        "blank_lines": 0,
        "utf16_files": 0,
        "files": len(listed.sources),
        "skipped_files": len(listed.skipped),
    }


def finish_ingest(stats: dict, rejected: list[pa.Table], renamed: list[pa.Table], out_dir: Path) -> dict:
    """Write ``rejected.parquet`` and ``renamed_ids.parquet`` (the tables in corpus order); returns
    ``stats`` with ``rejected_by_file`` (the ten files with the most rejected records)."""
    rejected_table = pa.concat_tables(rejected) if rejected else REJECT_SCHEMA.empty_table()
    pq.write_table(rejected_table, Path(out_dir) / "rejected.parquet")
    pq.write_table(
        pa.concat_tables(renamed) if renamed else RENAMED_SCHEMA.empty_table(), Path(out_dir) / "renamed_ids.parquet"
    )
    by_file = (
        pl.from_arrow(rejected_table.select(["source"]))
        .group_by("source")
        .len()
        .sort(["len", "source"], descending=[True, False])
    )
    return {**stats, "rejected_by_file": dict(by_file.head(10).iter_rows())}


_WHERE = r"^(line|row) (\d+): "  # the position prefix of a record's reason (readers.Collector.doc)
_NUMBERED = r"\b(at (?:byte|column|character)) \d+"  # positions inside a reason


def _reason_groups(rejected: Path) -> pl.DataFrame:
    """The rows of a ``rejected.parquet`` grouped by reason with the positions left out: columns
    records, text (the first occurrence without its position prefix), source, position, at, n (the
    first occurrence's place), most frequent first."""
    df = _rejected_frame(rejected)
    return (
        df.with_columns(key=pl.col("text").str.replace_all(_NUMBERED, "$1 N"))
        .with_row_index("order")
        .group_by("key")
        .agg(
            records=pl.len(),
            order=pl.col("order").first(),
            **{c: pl.col(c).first() for c in ("text", "source", "position", "at", "n")},
        )
        .sort(["records", "order"], descending=[True, False])
    )


def _rejected_frame(rejected: Path) -> pl.DataFrame:
    df = pl.read_parquet(rejected, columns=["source", "position", "reason"])
    return df.with_columns(
        at=pl.col("reason").str.extract(_WHERE, 1),
        n=pl.col("reason").str.extract(_WHERE, 2),
        text=pl.col("reason").str.replace(_WHERE, ""),
    )


def whole_files(rejected: Path) -> tuple[int, int]:
    """(files rejected as a whole, the rejected records they account for) in a ``rejected.parquet``: a
    file whose records carry readers.WHOLE_FILE (one per row or line), or a file rejected at position
    -1 without a count of its records (it could not be opened)."""
    df = _rejected_frame(rejected).filter(pl.col("text").str.starts_with(WHOLE_FILE) | (pl.col("position") == -1))
    return df["source"].n_unique(), df.height


def rejection_reasons(rejected: Path, top: int = 3) -> list[dict]:
    """The ``top`` most frequent reasons in a ``rejected.parquet`` (REJECT_SCHEMA), most frequent
    first (ties: the reason met first): dicts ``reason`` (its first occurrence, without the position
    prefix), ``records`` (count) and ``first`` (where it first occurred: ``file:line`` for a JSONL
    line, ``file, row N`` for a columnar row, ``file (whole file)`` for a file rejected as a whole,
    ``file`` otherwise). Reasons are grouped with their positions (line, row, byte, column,
    character numbers) left out, so one fault on many lines is one reason."""
    out = []
    for g in _reason_groups(rejected).head(top).iter_rows(named=True):
        first = (
            f"{g['source']}:{g['n']}"
            if g["at"] == "line"
            else f"{g['source']}, row {g['n']}"
            if g["at"] == "row"
            else f"{g['source']} (whole file)"
            if g["position"] == -1
            else g["source"]
        )
        out.append({"reason": g["text"], "records": g["records"], "first": first})
    return out


def describe_rejections(rejected: Path, top: int = 3) -> str:
    """The top reasons of a ``rejected.parquet`` in words for a message: ``N x <reason> (first:
    <where>)``, joined by ``; `` (:func:`rejection_reasons`), how many other reasons there are, and
    before them, how many files were rejected as a whole and how many records they count as (each of
    their rows or lines, readers.WHOLE_FILE). Empty when nothing was rejected."""
    groups = _reason_groups(rejected)
    if not groups.height:
        return ""
    text = "; ".join(
        f"{r['records']:,} x {r['reason']} (first: {r['first']})" for r in rejection_reasons(rejected, top)
    )
    more = f"; {groups.height - top} more reasons" if groups.height > top else ""
    whole, records = whole_files(rejected)
    files = (
        f"{whole:,} {'files' if whole > 1 else 'file'} rejected as a whole, counted as {records:,} "
        f"{'records' if records > 1 else 'record'} (each row or line of such a file is one). "
        if whole
        else ""
    )
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
    message = (
        f"{stats['rejected']:,} of {total:,} records rejected, more than max_rejected_fraction="
        f"{config.max_rejected_fraction}; by file: {files}{f' and {more} more' if more else ''}"
    )
    reasons = describe_rejections(rejected) if rejected is not None else ""
    return f"{message}. {reasons}" if reasons else message


def duplicate_ids(
    raw_dirs: list[Path],
    names: list[str],
    *,
    examples: int = 5,
    rows_per_pass: int = 1 << 22,
    spill_dir: Path | None = None,
) -> tuple[int, pl.DataFrame]:
    """Document ids held by more than one of the raw_corpus directories ``raw_dirs`` (the partitions,
    named ``names``): (how many distinct ids repeat, the first ``examples`` of them in corpus order as
    a frame with columns doc_id, sources: list of "<name>: <source file>", one per occurrence).

    Ids are unique within one directory (readers.Collector); record ids that repeat across files of
    different partitions can only be found here. Each id is hashed twice (polars' 64-bit hash with two
    seeds: two ids are taken for one only when 128 bits agree) and the hashes are grouped by hash range
    (dedup.by_hash_range): memory is one range, about ``rows_per_pass`` ids of 24 bytes, not the ids of
    the corpus."""
    from largetrain_core.dedup import _file_rows, by_hash_range, gather_rows

    files = [f for d in raw_dirs for f in part_files(d)]
    where = [name for d, name in zip(raw_dirs, names) for _ in part_files(d)]
    offsets = _file_rows(files)

    def chunks():
        for f, first in zip(files, offsets[:-1]):
            ids = pl.read_parquet(f, columns=["doc_id"])["doc_id"]
            yield (
                ids.hash(seed=1).to_numpy(),
                ids.hash(seed=2).to_numpy(),
                np.arange(first, first + len(ids), dtype=np.int64),
            )

    repeated, shown = 0, []  # shown: (first row, every row) of the first ``examples`` repeated ids
    for h1, h2, rows in by_hash_range(
        chunks(),
        int(offsets[-1]),
        dtypes=(np.uint64, np.uint64, np.int64),
        rows_per_pass=rows_per_pass,
        spill_dir=spill_dir,
    ):
        order = np.lexsort((rows, h2, h1))
        h1, h2, rows = h1[order], h2[order], rows[order]
        start = np.r_[True, (h1[1:] != h1[:-1]) | (h2[1:] != h2[:-1])]
        bounds = np.r_[np.flatnonzero(start), len(rows)]
        many = np.flatnonzero(np.diff(bounds) > 1)
        repeated += len(many)
        groups = sorted(((int(rows[bounds[g]]), rows[bounds[g] : bounds[g + 1]]) for g in many), key=lambda e: e[0])
        shown = sorted(shown + groups[:examples], key=lambda e: e[0])[:examples]
    if not shown:
        return repeated, pl.DataFrame(schema={"doc_id": pl.Utf8, "sources": pl.List(pl.Utf8)})
    rows = np.unique(np.concatenate([r for _, r in shown]))
    t = pl.from_arrow(gather_rows(files, offsets, rows, ["doc_id", "source"]))
    file_of = np.searchsorted(offsets, rows, side="right") - 1
    t = t.with_columns(pl.col("doc_id", "source").cast(pl.Utf8), where=pl.Series([where[i] for i in file_of]))
    # rows ascending, so the groups come in the order of their first occurrence: corpus order
    return repeated, t.group_by("doc_id", maintain_order=True).agg(sources=pl.format("{}: {}", "where", "source"))


def fingerprint(
    path: str | Path,
    partition: int = 0,
    partitions: int = 1,
    cache_file: str | Path | None = None,
    listed: Scan | None = None,
) -> str:
    """Content version of a corpus (or of one partition of it): largetrain_core.digest.files_digest
    of its corpus files, i.e. xxh3-128 over (path relative to the corpus, xxh3-128 of the bytes) of
    every file, 32 hex digits (then, if there are dangling links, xxh3-128 of that and each link's
    relative path and target). Independent of where the corpus lies and of file times: a copy
    elsewhere has the same fingerprint. ``cache_file``: a DigestCache file (one per corpus partition)
    so that unchanged files are not re-read; None reads every file. The pieces of a split file share
    the file's digest (the partition is part of raw_corpus's version). ``listed``: the partition's
    :func:`scan` when the caller made it (raw_corpus: the same listing is then read). Errors as
    :func:`list_files`."""
    from largetrain_core.digest import DigestCache, files_digest

    if listed is None:
        listed = scan(path, partition, partitions)
    cache = DigestCache(cache_file)
    broken = [f for f in listed.files if dangling_link(f)]
    digest = files_digest(listed.base, [f for f in listed.files if f not in broken], cache)
    cache.save()
    if broken:  # a dangling link is a rejected record of raw_corpus: its name and target are part of the version
        h = xxhash.xxh3_128(digest.encode())
        for f in sorted(broken, key=lambda f: _relative(f, listed.base)):
            h.update(f"\n{_relative(f, listed.base)}\0{os.readlink(f)}".encode("utf-8", "surrogateescape"))
        digest = h.hexdigest()
    return digest
