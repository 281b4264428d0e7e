"""Corpus file formats and their readers: the one place that decides how a file is read.

A file's format (docs/ARCHITECTURE.md section Extending) is decided here for listing, partitioning,
skipping and reading alike:

* the container, from the name: the reader in :data:`READERS` whose suffix the name ends with,
  case-insensitive, the longest registered suffix first (``A.JSONL.GZ`` is JSONL). A reader that
  reads a byte stream (``streams=True``: text, JSONL) also owns each of its suffixes followed by a
  compression suffix of :data:`COMPRESSIONS` (``x.txt.zst``); compound suffixes with a meaning of
  their own (``.json.gz`` is JSON Lines, ``.json`` is not) are registered as they are;
* the compression, from the first bytes (magic numbers), whatever the name says: a gzip stream named
  ``part.jsonl`` is read as gzip, a plain file named ``x.jsonl.gz`` as plain.

A file no reader claims is not read; the caller counts and lists it. Each reader is the only code
that knows its format; adding one is one entry in :data:`READERS` (plus its test).

Encoding policy (tested in tests/test_corpus.py against tests/cases):

* Strict UTF-8, a leading byte-order mark dropped; nothing is decoded with replacement, so no
  training text holds U+FFFD that the source did not.
* Every bad record becomes a *rejected* record (file, position, reason) and the rest of the file is
  kept: a text file that is not UTF-8 (position: byte offset of the first bad byte); a JSONL line
  that is not UTF-8, not JSON, not an object, lacks the text field or holds a lone surrogate
  (position: 1-based line); a columnar row whose text is null or not UTF-8 (position: 0-based row),
  for every physical layout (string, large_string, string_view, dictionary-encoded, binary).
* A whole file is one rejected record (position -1) when it cannot be opened or decompressed (the
  documents read before a truncation are kept), when a columnar file lacks the text column or holds
  it in a type that is not text, and when none of a JSONL file's first :data:`UNREADABLE_PREFIX`
  non-empty lines (or of all, if fewer) is readable: a binary or foreign file under a ``.jsonl`` name.

Line endings, NUL bytes and Unicode forms are the cleaning stage's job (largetrain_core.clean).
"""

from __future__ import annotations

import gzip
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

if TYPE_CHECKING:
    from largetrain_core.corpus import ReaderConfig

DOC_SCHEMA = pa.schema([("doc_id", pa.large_string()), ("source", pa.large_string()), ("text", pa.large_string())])
LABELLED_DOC_SCHEMA = DOC_SCHEMA.append(pa.field("label", pa.large_string()))
REJECT_SCHEMA = pa.schema([("source", pa.large_string()), ("position", pa.int64()), ("reason", pa.large_string())])
# a document whose id repeats one read before it: doc_id is "<id>@<fallback id>"
RENAMED_SCHEMA = pa.schema([("doc_id", pa.large_string()), ("id", pa.large_string()), ("source", pa.large_string()),
                            ("position", pa.int64())])

UNREADABLE_PREFIX = 100  # JSONL: a file whose first 100 non-empty lines are all unreadable is one rejected record
_UNREADABLE = (OSError, EOFError, ValueError, zstandard.ZstdError)  # a damaged, truncated or foreign file


# ------------------------------------------------------------------------------------------------ compression


@dataclass(frozen=True)
class Compression:
    """A compression of byte streams: detected by ``magic`` (the stream's first bytes); ``suffix`` is
    what file names use for it; ``open`` wraps a binary file into the decompressed stream."""

    name: str
    suffix: str
    magic: bytes
    open: Callable[[BinaryIO], BinaryIO]


def _zstd(f: BinaryIO) -> BinaryIO:  # line iteration needs a buffered reader over the decompressing stream
    return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(f, closefd=True))


COMPRESSIONS: tuple[Compression, ...] = (
    Compression("gzip", ".gz", b"\x1f\x8b", lambda f: gzip.GzipFile(fileobj=f)),  # RFC 1952
    Compression("zstd", ".zst", b"\x28\xb5\x2f\xfd", _zstd),  # RFC 8878 frame magic
)


def compression_of(head: bytes) -> Compression | None:
    """The compression whose magic number ``head`` (a file's first bytes) starts with, else None."""
    return next((c for c in COMPRESSIONS if head.startswith(c.magic)), None)


def _sniff(path: Path) -> Compression | None:
    with open(path, "rb") as f:
        return compression_of(f.read(8))


# ------------------------------------------------------------------------------------------------ records out


@dataclass
class Batch:
    documents: pa.Table  # DOC_SCHEMA (LABELLED_DOC_SCHEMA with ReaderConfig.label_field)
    rejected: pa.Table  # REJECT_SCHEMA
    renamed: pa.Table  # RENAMED_SCHEMA


def utf8_error(text: str) -> str | None:
    """None if ``text`` encodes as UTF-8, else the reason (lone surrogates do not)."""
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as e:
        return f"unencodable character {text[e.start]!r} at character {e.start}: {e.reason}"


def value_text(value) -> str | None:
    """A JSON/Arrow value as a string: str as is, None as None, anything else as its JSON text
    (``1`` -> ``"1"``, ``true`` -> ``"true"``)."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


class Collector:
    """Documents and rejected records of one read, in batches of at most ``batch_size`` rows.

    Document ids are unique within the read: a record's own id (null and empty count as missing)
    or else its fallback id (``<file>:<line or row>``, ``<file>`` for a text file); an id that an
    earlier document of the read already holds becomes ``<id>@<fallback id>`` and is listed in
    ``Batch.renamed``.
    """

    def __init__(self, batch_size: int, labelled: bool = False):
        self.batch_size = batch_size
        self.schema = LABELLED_DOC_SCHEMA if labelled else DOC_SCHEMA
        self.seen: set[str] = set()
        self._clear()

    def _clear(self) -> None:
        self.docs: dict[str, list] = {name: [] for name in self.schema.names}
        self.rejects: dict[str, list] = {name: [] for name in REJECT_SCHEMA.names}
        self.renamed: dict[str, list] = {name: [] for name in RENAMED_SCHEMA.names}

    def doc(self, record_id: str | None, fallback: str, source: str, position: int, at: str, text: str,
            label: str | None = None) -> None:
        """Add one document; ``at`` ("line 3", "row 2", "" for a whole file) prefixes a rejection's reason."""
        doc_id = record_id or fallback
        bad = utf8_error(text) or utf8_error(doc_id) or (label is not None and utf8_error(label))
        if not bad and doc_id in self.seen and f"{doc_id}@{fallback}" in self.seen:
            bad = f"duplicate id {doc_id!r}, and {doc_id + '@' + fallback!r} is taken too"
        if bad:
            self.reject(source, position, f"{at}: {bad}" if at else bad)
            return
        if doc_id in self.seen:
            renamed = f"{doc_id}@{fallback}"
            for k, v in zip(RENAMED_SCHEMA.names, (renamed, doc_id, source, position)):
                self.renamed[k].append(v)
            doc_id = renamed
        self.seen.add(doc_id)
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
        batch = Batch(pa.table(self.docs, schema=self.schema), pa.table(self.rejects, schema=REJECT_SCHEMA),
                      pa.table(self.renamed, schema=RENAMED_SCHEMA))
        self._clear()
        return batch


# ------------------------------------------------------------------------------------------------ readers


@dataclass(frozen=True)
class Reader:
    """A file format: the suffixes it owns (lower case; compound ones such as ``.json.gz`` allowed) and
    ``read(source, config, out)``, which adds the file's documents and rejected records to ``out``
    (a :class:`Collector`) and yields ``out.flush()`` whenever ``out.full()``.

    ``streams``: reads a byte stream, so it also owns its suffixes plus a compression suffix and reads
    compressed files (``Source.open`` decompresses). ``splits``: can read piece ``i`` of ``n`` of an
    uncompressed file (``Source.piece``), so a corpus of one large file spreads over the partitions.
    """

    name: str
    suffixes: tuple[str, ...]
    read: Callable[["Source", "ReaderConfig", Collector], Iterator[Batch]]
    streams: bool = False
    splits: bool = False


@dataclass(frozen=True)
class Source:
    """One corpus file to read: ``rel`` (its path relative to the corpus, POSIX) names its documents;
    ``piece`` ``(i, n)``: only the i-th of n pieces (see :func:`splittable`)."""

    path: Path
    rel: str
    reader: Reader
    piece: tuple[int, int] | None = None

    def open(self) -> BinaryIO:
        """The file as a binary stream, decompressed when its first bytes are a compression's magic."""
        f = open(self.path, "rb")
        codec = compression_of(f.read(8))
        f.seek(0)
        return codec.open(f) if codec else f


def _read_text(src: Source, config: ReaderConfig, out: Collector) -> Iterator[Batch]:
    """One document per file: the whole decoded file; doc_id and fallback id = the relative path."""
    with src.open() as f:
        data = f.read()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        out.reject(src.rel, e.start, f"invalid UTF-8 at byte {e.start}: {e.reason}")
        return
    out.doc(None, src.rel, src.rel, 0, "", text)
    yield from ()


def _count_newlines(f: BinaryIO, end: int, chunk: int = 1 << 24) -> int:
    f.seek(0)
    n, left = 0, end
    while left > 0:
        block = f.read(min(chunk, left))
        if not block:
            break
        n += block.count(b"\n")
        left -= len(block)
    return n


def _numbered_lines(src: Source, f: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line) of the whole stream, or of piece ``(i, n)`` of a plain file: the
    lines that start in bytes ``[i * size // n, (i + 1) * size // n)`` (each line in exactly one piece;
    the lines before the piece are counted, not parsed, for the line numbers)."""
    if src.piece is None:
        yield from enumerate(f, start=1)
        return
    i, n = src.piece
    size = os.fstat(f.fileno()).st_size
    start, end = size * i // n, size * (i + 1) // n
    if start > 0:
        f.seek(start - 1)
        start += len(f.readline()) - 1  # the first line that starts at or after `start`
    lineno = 1 + _count_newlines(f, start)
    f.seek(start)
    pos = start
    while pos < end:
        line = f.readline()
        if not line:
            return
        yield lineno, line
        pos += len(line)
        lineno += 1


def _parse_line(raw: bytes, config: ReaderConfig) -> tuple[dict | None, str | None]:
    """(record, None) for a JSON object with a string ``text_field``, else (None, the reason)."""
    try:
        record = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        return None, f"invalid UTF-8 at byte {e.start} of the line: {e.reason}"
    except json.JSONDecodeError as e:
        return None, f"invalid JSON: {e.msg.removesuffix(' at')} at column {e.colno}"  # "Invalid control character at"
    if not isinstance(record, dict):
        return None, f"no string field {config.text_field!r}: the line is a JSON {_json_type(record)}, not an object"
    if config.text_field not in record:
        return None, f"no string field {config.text_field!r}: {missing_field_hint(list(record), 'the record has fields')}"
    if not isinstance(record[config.text_field], str):
        return None, f"no string field {config.text_field!r}: it is a JSON {_json_type(record[config.text_field])}"
    return record, None


def _json_type(value) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


MISSING_FIELD = "set raw_corpus text_field to the one holding the text"


def missing_field_hint(names: list[str], has: str, limit: int = 12) -> str:
    """What to do about a record or file without the text field, for a rejection's reason: what it
    ``has`` ("the record has fields", "the file has columns"): the first ``limit`` of ``names``, and
    the setting to change."""
    shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
    return f"{has} {shown or '(none)'}; {MISSING_FIELD}"


def _unreadable_file(src: Source, config: ReaderConfig) -> str | None:
    """The reason to reject the whole file when none of its first UNREADABLE_PREFIX non-empty lines
    (or of all, when it has fewer) is readable, else None. Decided from the file's start, so every
    piece of a split file agrees."""
    bad: list[tuple[int, str]] = []
    with src.open() as f:
        for pos, raw in enumerate(f, start=1):
            if pos == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            if not raw.strip():
                continue
            reason = _parse_line(raw, config)[1]
            if reason is None:
                return None
            bad.append((pos, reason))
            if len(bad) >= UNREADABLE_PREFIX:
                break
    if not bad:
        return None
    more = "" if len(bad) < UNREADABLE_PREFIX else " (not read further)"
    if all(MISSING_FIELD in reason for _, reason in bad):  # JSON objects, all without the text field
        which = f"the first {len(bad)} non-empty lines lack it (the rest was not read)" if more else f"its {len(bad)} non-empty lines lack it"
        return f"no string field {config.text_field!r} on any line: {which}; line {bad[0][0]}: " + bad[0][1].split(": ", 1)[1]
    return f"no readable JSON line: {len(bad)} unreadable lines{more}, the first: line {bad[0][0]}: {bad[0][1]}; is it JSON Lines?"


def _read_jsonl(src: Source, config: ReaderConfig, out: Collector) -> Iterator[Batch]:
    """One document per line: a JSON object with a string ``text_field``; ids from ``id_field``."""
    verdict = _unreadable_file(src, config)
    if verdict:
        if src.piece is None or src.piece[0] == 0:  # the first piece speaks for the file
            out.reject(src.rel, -1, verdict)
        return
    with src.open() as f:
        for pos, raw in _numbered_lines(src, f):
            if pos == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            if not raw.strip():
                continue
            record, reason = _parse_line(raw, config)
            if reason:
                out.reject(src.rel, pos, f"line {pos}: {reason}")
            else:
                record_id = value_text(record.get(config.id_field)) if config.id_field else None
                label = value_text(record.get(config.label_field)) if config.label_field else None
                out.doc(record_id, f"{src.rel}:{pos}", src.rel, pos, f"line {pos}", record[config.text_field], label)
            if out.full():
                yield out.flush()


def _strings(arr: pa.Array) -> tuple[list[str | None], dict[int, str]]:
    """The values of a text-like Arrow array (string, large_string, string_view, binary, any of them
    dictionary-encoded) as Python strings, strictly UTF-8: (values, {row: reason} for the rows that
    are not UTF-8, whose value is None). Raises TypeError for other types."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    t = arr.type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t)):
        raise TypeError(f"{t}, not a string or binary column")
    raw = arr.cast(pa.large_binary())  # no UTF-8 check: a string column may hold invalid bytes
    try:
        return raw.cast(pa.large_string()).to_pylist(), {}  # validates UTF-8 for the whole batch
    except pa.ArrowInvalid:
        values: list[str | None] = []
        bad: dict[int, str] = {}
        for i, b in enumerate(raw.to_pylist()):
            try:
                values.append(None if b is None else b.decode("utf-8"))
            except UnicodeDecodeError as e:
                values.append(None)
                bad[i] = f"invalid UTF-8 at byte {e.start}: {e.reason}"
        return values, bad


def _values(arr: pa.Array) -> tuple[list[str | None], dict[int, str]]:
    """An id or label column as strings: text-like columns as :func:`_strings`, others by :func:`value_text`."""
    try:
        return _strings(arr)
    except TypeError:
        return [value_text(v) for v in arr.to_pylist()], {}


def _columnar(src: Source, config: ReaderConfig, out: Collector, schema: pa.Schema,
              batches: Iterator[tuple[int, pa.RecordBatch]]) -> Iterator[Batch]:
    """Documents of a columnar file from ``(first row, record batch)`` pairs: one per row; the row
    (0-based, from the file's start) is the position and the fallback id ``<file>:<row>``."""
    names = schema.names
    if config.text_field not in names:
        out.reject(src.rel, -1, f"no column {config.text_field!r}: {missing_field_hint(names, 'the file has columns')}")
        return
    has_id = bool(config.id_field and config.id_field in names)
    has_label = bool(config.label_field and config.label_field in names)
    for row0, rb in batches:
        try:
            texts, bad = _strings(rb.column(config.text_field))
        except TypeError as e:
            out.reject(src.rel, -1, f"column {config.text_field!r} is {e}")
            return
        ids, bad_ids = _values(rb.column(config.id_field)) if has_id else (None, {})
        labels, bad_labels = _values(rb.column(config.label_field)) if has_label else (None, {})
        for i, text in enumerate(texts):
            row = row0 + i
            why = (f"text: {bad[i]}" if i in bad else "text is null" if text is None
                   else f"{config.id_field}: {bad_ids[i]}" if i in bad_ids
                   else f"{config.label_field}: {bad_labels[i]}" if i in bad_labels else None)
            if why:
                out.reject(src.rel, row, f"row {row}: {why}")
            else:
                out.doc(ids[i] if ids else None, f"{src.rel}:{row}", src.rel, row, f"row {row}", text,
                        labels[i] if labels else None)
            if out.full():  # per document: the collector may already hold documents of earlier files
                yield out.flush()


def _read_parquet(src: Source, config: ReaderConfig, out: Collector) -> Iterator[Batch]:
    """Parquet: only the text, id and label columns are read (other columns may differ in type between
    files); a piece is a contiguous range of row groups."""
    try:
        pf = pq.ParquetFile(src.path)
    except Exception as e:  # noqa: BLE001 -- pyarrow raises ArrowInvalid/OSError for corrupt or non-Parquet files
        out.reject(src.rel, -1, f"cannot open Parquet file: {e}")
        return
    groups = list(range(pf.num_row_groups))
    if src.piece is not None:
        i, n = src.piece
        groups = groups[len(groups) * i // n:len(groups) * (i + 1) // n]
    names = pf.schema_arrow.names
    columns = list(dict.fromkeys(c for c in (config.text_field, config.id_field, config.label_field) if c and c in names))

    def batches():
        row = sum(pf.metadata.row_group(g).num_rows for g in range(groups[0])) if groups else 0
        for rb in pf.iter_batches(batch_size=config.batch_size, row_groups=groups, columns=columns):
            yield row, rb
            row += rb.num_rows

    if groups:
        yield from _columnar(src, config, out, pf.schema_arrow, batches())
    elif config.text_field not in names:
        out.reject(src.rel, -1, f"no column {config.text_field!r}: {missing_field_hint(names, 'the file has columns')}")


def _read_arrow(src: Source, config: ReaderConfig, out: Collector) -> Iterator[Batch]:
    """Arrow IPC, file format (``ARROW1`` magic) or stream format (as Hugging Face ``datasets`` writes
    its ``.arrow`` files), memory-mapped."""
    with pa.memory_map(str(src.path)) as mm:
        try:
            if mm.read(6) == b"ARROW1":
                r = pa.ipc.open_file(mm)
                schema, it = r.schema, (r.get_batch(i) for i in range(r.num_record_batches))
            else:
                mm.seek(0)
                r = pa.ipc.open_stream(mm)
                schema, it = r.schema, iter(r)
        except pa.ArrowInvalid as e:
            out.reject(src.rel, -1, f"cannot open Arrow IPC file: {e}")
            return

        def batches():
            row = 0
            for rb in it:
                yield row, rb
                row += rb.num_rows

        yield from _columnar(src, config, out, schema, batches())


READERS: tuple[Reader, ...] = (
    Reader("text", (".txt", ".md", ".rst"), _read_text, streams=True),
    Reader("jsonl", (".jsonl", ".ndjson", ".json.gz", ".json.zst"), _read_jsonl, streams=True, splits=True),
    Reader("parquet", (".parquet",), _read_parquet, splits=True),
    Reader("arrow", (".arrow",), _read_arrow),
)


def _suffix_table() -> list[tuple[str, Reader]]:
    table = []
    for r in READERS:
        for s in r.suffixes:
            table.append((s, r))
            if r.streams and not any(s.endswith(c.suffix) for c in COMPRESSIONS):
                table += [(s + c.suffix, r) for c in COMPRESSIONS]
    return sorted(table, key=lambda e: -len(e[0]))


_SUFFIXES = _suffix_table()
SUFFIXES: tuple[str, ...] = tuple(sorted(s for s, _ in _SUFFIXES))


def reader_for(name: str) -> Reader | None:
    """The reader of a file name (longest matching suffix, case-insensitive), or None: not a corpus file."""
    low = name.lower()
    return next((r for s, r in _SUFFIXES if low.endswith(s)), None)


def splittable(path: Path) -> bool:
    """Whether pieces of the file can be read apart: its reader splits and, for a byte stream, the
    file is not compressed (a compressed stream can only be read from its start)."""
    r = reader_for(path.name)
    return bool(r and r.splits and not (r.streams and _sniff(path)))


def read_source(src: Source, config: ReaderConfig, out: Collector) -> Iterator[Batch]:
    """``src.reader.read``; a file that cannot be read or decompressed to its end becomes one more
    rejected record (position -1) after whatever it yielded before the fault."""
    try:
        yield from src.reader.read(src, config, out)
    except _UNREADABLE as e:
        out.reject(src.rel, -1, f"cannot read file ({src.reader.name}): {type(e).__name__}: {e}")
