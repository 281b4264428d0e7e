"""Corpus readers: text/markdown/rst directories, JSONL (plain, .gz or .zst) and Parquet, read in bounded
batches into Arrow tables with the columns ``doc_id``, ``source`` and ``text`` (all ``large_string``), plus
``label`` (``large_string``, null when a record lacks the field) when ``ReaderConfig.label_field`` is set.

Encoding policy (documented, tested in tests/test_corpus.py against tests/cases):

* Files are decoded as strict UTF-8; a leading byte-order mark is dropped.
* A text file that is not valid UTF-8 becomes one *rejected* record naming the file, the byte offset
  of the first invalid byte and the decoder's reason. It is never decoded with replacement, so no
  training text contains U+FFFD that the source did not hold.
* A JSONL line that is not valid JSON, is not an object, lacks the text field, or holds a string
  that cannot be encoded as UTF-8 (a lone surrogate such as ``"\\ud800"``) becomes a rejected
  record with file, 1-based line number and reason.
* A Parquet file that cannot be opened becomes a rejected record (file, position ``-1``); only the
  text and id columns are read, so files whose other columns differ in type are read together, and
  zero-row files yield nothing.

Nothing else is normalized here: line endings, NUL bytes and Unicode forms are the cleaning stage's
job (largetrain_core.clean), which counts what it changes.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

DOC_SCHEMA = pa.schema([("doc_id", pa.large_string()), ("source", pa.large_string()), ("text", pa.large_string())])
LABELLED_DOC_SCHEMA = DOC_SCHEMA.append(pa.field("label", pa.large_string()))
REJECT_SCHEMA = pa.schema([("source", pa.large_string()), ("position", pa.int64()), ("reason", pa.large_string())])

TEXT_SUFFIXES = (".txt", ".md", ".rst")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
CORPUS_SUFFIXES = TEXT_SUFFIXES + JSONL_SUFFIXES + PARQUET_SUFFIXES


def is_corpus_file(name: str) -> bool:
    """Whether a file name has a suffix the readers know (case-insensitive: ``A.TXT`` is text)."""
    return name.lower().endswith(CORPUS_SUFFIXES)


@dataclass(frozen=True)
class ReaderConfig:
    """How to read one corpus.

    ``path`` is a directory (walked recursively, files in sorted order) or a single file.
    ``text_field``/``id_field`` name the JSONL keys / Parquet columns; without an id field the
    document id is ``<relative path>:<line or row>``. ``batch_size`` is the number of documents per
    Arrow batch, which bounds memory. ``label_field`` (a JSONL key / Parquet column) adds a ``label``
    column (:data:`LABELLED_DOC_SCHEMA`): a string value as is, any other JSON value as its JSON text
    (``1`` -> ``"1"``, ``true`` -> ``"true"``), a Parquet column cast to string; null where the record
    lacks the field, holds null, or the file (a text file, a Parquet file without the column) has none.

    ``partition`` / ``partitions``: read only the files that :func:`partition_of` assigns to
    ``partition`` of ``partitions`` (hash partitioning of relative paths; a single-file corpus lives
    in one partition).
    """

    path: str
    text_field: str = "text"
    id_field: str | None = None
    batch_size: int = 1024
    label_field: str | None = None
    partition: int = 0
    partitions: int = 1

    def __post_init__(self):
        if not 0 <= self.partition < self.partitions:
            raise ValueError(f"partition must be in [0, {self.partitions}), got {self.partition}")


def _label_text(value) -> str | None:
    """A label value as a string: str as is, None as None, anything else as its JSON text."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


@dataclass
class Batch:
    documents: pa.Table  # DOC_SCHEMA
    rejected: pa.Table  # REJECT_SCHEMA


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


def scan(path: Path, partition: int = 0, partitions: int = 1) -> tuple[list[Path], list[Path]]:
    """(corpus files, other files) under ``path``, sorted; with ``partitions > 1`` only those that
    :func:`partition_of` assigns to ``partition``. A directory is walked recursively (links to
    directories followed); files whose suffix no reader knows are returned second, so that the
    caller counts them instead of dropping them silently.

    Raises FileNotFoundError when ``path`` does not exist, and ValueError when ``path`` is a single
    file whose suffix no reader knows or a directory holding no corpus file (in any partition).
    """
    if not path.exists():
        raise FileNotFoundError(f"corpus path does not exist: {path}")
    if path.is_file():
        if not is_corpus_file(path.name):
            raise ValueError(f"{path}: not a corpus file: the suffix is none of {', '.join(CORPUS_SUFFIXES)}")
        files, base = [path], path.parent
    else:
        files, base = _walk(path), path
        if not any(is_corpus_file(f.name) for f in files):
            raise ValueError(f"no corpus file under {path}: no file has a suffix of {', '.join(CORPUS_SUFFIXES)}")
    if partitions > 1:
        files = [f for f in files if partition_of(f.relative_to(base).as_posix(), partitions) == partition]
    return [f for f in files if is_corpus_file(f.name)], [f for f in files if not is_corpus_file(f.name)]


def list_files(path: Path, partition: int = 0, partitions: int = 1) -> list[Path]:
    """The corpus files of :func:`scan` (same arguments and errors)."""
    return scan(path, partition, partitions)[0]


def _valid_utf8(text: str) -> str | None:
    """None if ``text`` encodes as UTF-8, else the reason (lone surrogates do not)."""
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as e:
        return f"unencodable character {text[e.start]!r} at character {e.start}: {e.reason}"


class _Collector:
    def __init__(self, batch_size: int, labelled: bool = False):
        self.batch_size = batch_size
        self.schema = LABELLED_DOC_SCHEMA if labelled else DOC_SCHEMA
        self.docs: dict[str, list] = {name: [] for name in self.schema.names}
        self.rejects: dict[str, list] = {"source": [], "position": [], "reason": []}

    def doc(self, doc_id: str, source: str, text: str, label: str | None = None) -> None:
        self.docs["doc_id"].append(doc_id)
        self.docs["source"].append(source)
        self.docs["text"].append(text)
        if "label" in self.docs:
            self.docs["label"].append(label)

    def reject(self, source: str, position: int, reason: str) -> None:
        self.rejects["source"].append(source)
        self.rejects["position"].append(position)
        self.rejects["reason"].append(reason)

    def full(self) -> bool:
        return len(self.docs["doc_id"]) >= self.batch_size or len(self.rejects["source"]) >= self.batch_size

    def flush(self) -> Batch:
        batch = Batch(pa.table(self.docs, schema=self.schema), pa.table(self.rejects, schema=REJECT_SCHEMA))
        self.docs = {k: [] for k in self.docs}
        self.rejects = {k: [] for k in self.rejects}
        return batch


def _shown(relative_path: str) -> str:
    """A relative path as printable UTF-8: bytes that are not UTF-8 as ``\\x`` escapes."""
    return relative_path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def read_corpus(config: ReaderConfig, files: list[Path] | None = None) -> Iterator[Batch]:
    """Stream a corpus as :class:`Batch` es of at most ``config.batch_size`` documents.

    Every document and every unreadable record appears exactly once, either in ``documents`` or in
    ``rejected``. ``files``: the partition's corpus files when the caller has listed them already
    (:func:`list_files`), else listed here, with its errors (FileNotFoundError, ValueError). A
    partition that no file falls into yields nothing.
    """
    root = Path(config.path)
    if files is None:
        files = list_files(root, config.partition, config.partitions)
    base = root if root.is_dir() else root.parent
    out = _Collector(config.batch_size, labelled=config.label_field is not None)
    for f in files:
        rel = f.relative_to(base).as_posix()
        name = f.name.lower()
        if _valid_utf8(rel) is not None:  # document ids and sources must be UTF-8: the file becomes one rejected record
            out.reject(_shown(rel), -1, "file name is not valid UTF-8 (undecodable bytes shown as \\x escapes): rename the file")
        elif name.endswith(PARQUET_SUFFIXES):
            yield from _read_parquet(f, rel, config, out)
        elif name.endswith(JSONL_SUFFIXES):
            yield from _read_jsonl(f, rel, config, out)
        else:
            _read_text(f, rel, out)
        if out.full():
            yield out.flush()
    last = out.flush()
    if last.documents.num_rows or last.rejected.num_rows:
        yield last


def _read_text(f: Path, rel: str, out: _Collector) -> None:
    data = f.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        out.reject(rel, e.start, f"invalid UTF-8 at byte {e.start}: {e.reason}")
        return
    out.doc(rel, rel, text)


def _read_jsonl(f: Path, rel: str, config: ReaderConfig, out: _Collector) -> Iterator[Batch]:
    if f.name.endswith(".zst"):
        import io

        import zstandard

        def opener(path, mode):  # line iteration needs a buffered reader over the decompressing stream
            return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, mode), closefd=True))
    else:
        opener = gzip.open if f.name.endswith(".gz") else open
    try:
        with opener(f, "rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]
                if not raw.strip():
                    continue
                pos = lineno
                try:
                    record = json.loads(raw.decode("utf-8"))
                except UnicodeDecodeError as e:
                    out.reject(rel, pos, f"line {pos}: invalid UTF-8 at byte {e.start} of the line: {e.reason}")
                    continue
                except json.JSONDecodeError as e:
                    out.reject(rel, pos, f"line {pos}: invalid JSON: {e.msg} at column {e.colno}")
                    continue
                if not isinstance(record, dict) or not isinstance(record.get(config.text_field), str):
                    out.reject(rel, pos, f"line {pos}: no string field {config.text_field!r}")
                    continue
                text = record[config.text_field]
                doc_id = str(record[config.id_field]) if config.id_field and config.id_field in record else f"{rel}:{pos}"
                label = _label_text(record.get(config.label_field)) if config.label_field else None
                bad = _valid_utf8(text) or _valid_utf8(doc_id) or (label is not None and _valid_utf8(label))
                if bad:
                    out.reject(rel, pos, f"line {pos}: {bad}")
                    continue
                out.doc(doc_id, rel, text, label)
                if out.full():
                    yield out.flush()
    except Exception as e:  # noqa: BLE001 -- truncated gzip (EOFError), corrupt zstd (zstandard.ZstdError), unreadable file (OSError)
        out.reject(rel, -1, f"cannot read file: {e}")


def _read_parquet(f: Path, rel: str, config: ReaderConfig, out: _Collector) -> Iterator[Batch]:
    try:
        pf = pq.ParquetFile(f)
    except Exception as e:  # pyarrow raises ArrowInvalid/OSError for corrupt or non-Parquet files
        out.reject(rel, -1, f"cannot open Parquet file: {e}")
        return
    names = pf.schema_arrow.names
    if config.text_field not in names:
        out.reject(rel, -1, f"no column {config.text_field!r} (columns: {names})")
        return
    has_id = bool(config.id_field and config.id_field in names)
    has_label = bool(config.label_field and config.label_field in names)
    columns = list(dict.fromkeys([config.text_field] + ([config.id_field] if has_id else [])
                                 + ([config.label_field] if has_label else [])))
    row = 0
    for rb in pf.iter_batches(batch_size=config.batch_size, columns=columns):
        texts = rb.column(config.text_field).to_pylist()
        ids = rb.column(config.id_field).to_pylist() if has_id else None
        if has_label:
            col = rb.column(config.label_field)
            labels = (col.cast(pa.large_string()) if pa.types.is_primitive(col.type) or pa.types.is_string(col.type)
                      or pa.types.is_large_string(col.type) else col).to_pylist()
        else:
            labels = None
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                out.reject(rel, row + i, f"row {row + i}: text is {type(text).__name__}, not a string")
                continue
            out.doc(str(ids[i]) if ids is not None else f"{rel}:{row + i}", rel, text,
                    _label_text(labels[i]) if labels is not None else None)
            if out.full():  # per document: the collector may already hold documents of earlier files
                yield out.flush()
        row += rb.num_rows


def _in_sample(doc_ids: list[str], fraction: float, seed: int) -> list[bool]:
    """Seeded, order-independent Bernoulli sample: keep a document when xxh64(doc_id, seed) / 2**64 < fraction."""
    if fraction >= 1.0:
        return [True] * len(doc_ids)
    limit = int(fraction * 2**64)
    return [xxhash.xxh64_intdigest(d.encode(), seed) < limit for d in doc_ids]


def ingest(config: ReaderConfig, out_dir: Path, *, max_documents: int | None = None,
           sample_fraction: float = 1.0, seed: int = 0) -> dict:
    """Read a corpus into ``out_dir/part-NNNNN.parquet`` (DOC_SCHEMA, one file per batch) and
    ``out_dir/rejected.parquet`` (REJECT_SCHEMA).

    Subsetting for early experiments: ``sample_fraction`` keeps a seeded hash sample of documents
    (deterministic, independent of file order), then ``max_documents`` keeps the first N of those
    in corpus order (of ``config.partition`` alone when the corpus is partitioned: each partition
    keeps at most ``max_documents``). Documents left out by the subset are counted (``not_sampled``),
    not stored.
    Files whose suffix no reader knows are not read but counted (``skipped_files``) and listed in
    ``out_dir/skipped_files.txt`` (one relative path per line).
    Returns counts: ``documents``, ``rejected``, ``bytes``, ``files``, ``skipped_files``, ``not_sampled``, ``parts``.
    """
    if not 0.0 < sample_fraction <= 1.0:
        raise ValueError(f"sample_fraction must be in (0, 1], got {sample_fraction}")
    out_dir = Path(out_dir)
    root = Path(config.path)
    files, skipped = scan(root, config.partition, config.partitions)
    stats = {"documents": 0, "rejected": 0, "bytes": 0, "not_sampled": 0, "parts": 0,
             "files": len(files), "skipped_files": len(skipped)}
    (out_dir / "skipped_files.txt").write_text("".join(_shown(f.relative_to(root).as_posix()) + "\n" for f in skipped))
    rejected: list[pa.Table] = []
    for batch in read_corpus(config, files):
        docs = batch.documents
        keep = _in_sample(docs.column("doc_id").to_pylist(), sample_fraction, seed)
        docs = docs.filter(pa.array(keep, pa.bool_()))
        if max_documents is not None:
            docs = docs.slice(0, max(0, max_documents - stats["documents"]))
        stats["not_sampled"] += batch.documents.num_rows - docs.num_rows
        rejected.append(batch.rejected)
        stats["rejected"] += batch.rejected.num_rows
        if docs.num_rows:
            pq.write_table(docs, out_dir / f"part-{stats['parts']:05d}.parquet")
            stats["parts"] += 1
            stats["documents"] += docs.num_rows
            stats["bytes"] += pc.sum(pc.binary_length(docs.column("text"))).as_py() or 0
    pq.write_table(pa.concat_tables(rejected) if rejected else REJECT_SCHEMA.empty_table(), out_dir / "rejected.parquet")
    return stats


def fingerprint(path: str | Path, partition: int = 0, partitions: int = 1, cache_file: str | Path | None = None) -> str:
    """Content version of a corpus (or of one partition of it): largetrain_core.digest.files_digest
    of its corpus files, i.e. xxh3-128 over (path relative to the corpus, xxh3-128 of the bytes) of
    every file, 32 hex digits. Independent of where the corpus lies and of file times: a copy
    elsewhere has the same fingerprint. ``cache_file``: a DigestCache file (one per corpus partition)
    so that unchanged files are not re-read; None reads every file. Errors as :func:`list_files`."""
    from largetrain_core.digest import DigestCache, files_digest

    root = Path(path)
    cache = DigestCache(cache_file)
    digest = files_digest(root if root.is_dir() else root.parent, list_files(root, partition, partitions), cache)
    cache.save()
    return digest
