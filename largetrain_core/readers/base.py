"""What every reader shares (package doc): the document and rejected-record schemas, :class:`ReaderConfig`, the :class:`Collector` of a batch, :class:`Reader` and :class:`Source`, and the reasons of rejected records."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import BinaryIO, Callable, Generator

import pyarrow as pa

from largetrain_core import fs
from largetrain_core.settings import described
from largetrain_core.readers.encoding import (
    SNIFF_BYTES,
    Utf16,
    _Utf8FromUtf16,
    _sniff,
    compression_of,
    control_error,
    detect_utf16,
)


DOC_SCHEMA = pa.schema([("doc_id", pa.large_string()), ("source", pa.large_string()), ("text", pa.large_string())])
LABELLED_DOC_SCHEMA = DOC_SCHEMA.append(pa.field("label", pa.large_string()))
MESSAGES = "messages"  # format chat: a conversation's messages, JSON ([{"role", "content", "weight"}])
FORMATS = ("text", "chat")
REJECT_SCHEMA = pa.schema([("source", pa.large_string()), ("position", pa.int64()), ("reason", pa.large_string())])
# a document whose id repeats one read before it: doc_id is "<id>@<fallback id>"
RENAMED_SCHEMA = pa.schema(
    [("doc_id", pa.large_string()), ("id", pa.large_string()), ("source", pa.large_string()), ("position", pa.int64())]
)

UNREADABLE_PREFIX = 100  # JSONL: a file whose first 100 non-empty lines are all unreadable is rejected as a whole
WHOLE_FILE = "the whole file is rejected"  # starts the reason of each record of a file rejected as a whole
LIST_SEPARATOR = "\n\n"  # between the strings of a list-of-strings text: a blank line, a paragraph break


@dataclass(frozen=True)
class ReaderConfig:
    """How to read one corpus (the raw_corpus settings). ``partition``/``partitions`` are set by the
    caller (the Dagster partition), not by users; so is ``id_prefix`` (a mixture's corpus name)."""

    path: str = field(
        metadata=described(
            "Corpus directory (walked recursively, files in sorted order, each once under its canonical name: links "
            "into the corpus and cycles not followed, links out of it followed, dangling links rejected; "
            "docs/guides/data-preparation.md) or one file; "
            "empty in a Dagster run config: <storage root>/<the role's default corpus>."
        )
    )
    text_field: str = field(
        default="text",
        metadata=described(
            "JSONL key / Parquet or Arrow column holding the text. A dotted name reaches into a record or a struct "
            "column (body.text: the field text of body) when no key or column has the dotted name itself. A list of "
            "strings (JSON array, Arrow list<string>) is one document, its non-null strings joined with a blank line "
            "(LIST_SEPARATOR); a null-typed column is null texts, each row rejected."
        ),
    )
    id_field: str | None = field(
        default="id",
        metadata=described(
            "JSONL key / column holding the document id, used where a record has one (not null, not empty); "
            "otherwise, and for text files, the id is <relative path>:<line or row> (<relative path> for a text file). "
            "null: always the file and position. A repeated id becomes <id>@<file>:<line or row> (counted: renamed_ids)."
        ),
    )
    format: str = field(
        default="text",
        metadata=described(
            "text: a document is the text of text_field. chat (JSONL): a document is one conversation, a record "
            'in the chat messages format ({"messages": [{"role", "content", "weight"}]}), or a '
            '{"prompt", "completion"} pair, or alpaca\'s instruction/input/output (largetrain_core.chat: '
            "malformed conversations rejected with line and reason); its messages are kept in a `messages` "
            "column, its text is the conversation's canonical text (chat.conversation_text: what cleaning's rules, "
            "deduplication and the token shards see). text_field is not used."
        ),
    )
    label_field: str | None = field(
        default=None,
        metadata=described(
            "JSONL key / column holding a class label: adds a `label` column (null where a record lacks it; a "
            "non-string value as its JSON text), kept through cleaned_text and deduplicated_text; needed for balancing "
            "and task classification."
        ),
    )
    labels: list[str] | None = field(
        default=None,
        metadata=described(
            "With label_field: the declared label set. A record without a label (missing, null or empty) or with "
            "one outside the set is rejected (file, line or row, reason; counted against max_rejected_fraction). "
            "null: any label is taken."
        ),
    )
    require_label: bool = field(
        default=False,
        metadata=described(
            "With label_field: a record without a label (missing, null or empty) is rejected (file, line or row, "
            "reason), whatever its label (for a classifier's records: true). false: it is kept with a null label. "
            "Implied by labels."
        ),
    )
    batch_size: int = field(default=1024, metadata=described("Documents per batch and per part file (bounds memory)."))
    sample_fraction: float = field(
        default=1.0,
        metadata=described(
            "Subset: keep a document when xxh64(doc_id, seed) / 2**64 < sample_fraction (deterministic, order-free)."
        ),
    )
    max_documents: int | None = field(
        default=None,
        metadata=described("Subset: then keep at most this many documents (per partition), the first in corpus order."),
    )
    seed: int = field(default=0, metadata=described("Seed of the sample_fraction hash."))
    max_rejected_fraction: float = field(
        default=0.05,
        metadata=described(
            "raw_corpus fails when more than this share of the records its data partition read (before subsetting) "
            "is rejected: counted per partition, so a small corpus meets it with fewer bad records."
        ),
    )
    partition: int = 0
    partitions: int = 1
    # set by the caller for one corpus of a mixture: "<corpus>:" before every document id, so ids stay
    # unique across the mixture's corpora (each corpus's ids are only unique within it)
    id_prefix: str = ""

    def __post_init__(self):
        if not 0 <= self.partition < self.partitions:
            raise ValueError(f"partition must be in [0, {self.partitions}), got {self.partition}")
        if not 0.0 < self.sample_fraction <= 1.0:
            raise ValueError(f"sample_fraction must be in (0, 1], got {self.sample_fraction}")
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if (self.labels is not None or self.require_label) and not self.label_field:
            raise ValueError("labels and require_label need label_field: the key or column holding the label")
        if self.labels is not None and (
            not self.labels
            or len(set(self.labels)) != len(self.labels)
            or not all(isinstance(x, str) and x.strip() for x in self.labels)
        ):
            raise ValueError(f"labels must be distinct non-empty strings or null, got {self.labels!r}")

    def label_error(self, label: str | None) -> str | None:
        """Why a record's ``label`` (the text of its label_field, None when missing or null) is rejected
        under ``labels`` / ``require_label``, else None."""
        if label is None or not label.strip():
            if self.require_label or self.labels is not None:
                what = "missing or null" if label is None else f"empty ({label!r})"
                return f"no label: field {self.label_field!r} is {what}"
            return None
        if self.labels is not None and label not in self.labels:
            return f"label {label!r} is not in the declared label set {self.labels}"
        return None


"""A document of at least this share of control characters (:data:`_CONTROL`) is rejected. UTF-16 of
any script in U+0000..U+1FFF (every alphabetic one) read as UTF-8 has a control character for each
code unit (its high byte, 0x00..0x1F), so it is at least half control characters; text has a few per
cent at most (a log with ANSI colour codes: one ESC per colour change)."""


@dataclass
class Batch:
    documents: pa.Table  # DOC_SCHEMA (LABELLED_DOC_SCHEMA with ReaderConfig.label_field)
    rejected: pa.Table  # REJECT_SCHEMA
    renamed: pa.Table  # RENAMED_SCHEMA
    blank_lines: int = 0  # blank JSONL lines passed over (not records) since the last batch
    utf16_files: int = 0  # files decoded from UTF-16 since the last batch


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

    def __init__(
        self,
        batch_size: int,
        labelled: bool = False,
        chat: bool = False,
        label_error: Callable[[str | None], str | None] | None = None,
    ):
        self.batch_size = batch_size
        self.label_error = label_error  # ReaderConfig.label_error: a record whose label it faults is rejected
        self.schema = LABELLED_DOC_SCHEMA if labelled else DOC_SCHEMA
        if chat:
            self.schema = self.schema.append(pa.field(MESSAGES, pa.large_string()))
        self.seen: set[str] = set()
        self.outcomes = 0  # documents + rejected records of the whole read (read_source checks the readers by it)
        self._clear()

    def _clear(self) -> None:
        self.blank_lines = self.utf16_files = 0
        self.docs: dict[str, list] = {name: [] for name in self.schema.names}
        self.rejects: dict[str, list] = {name: [] for name in REJECT_SCHEMA.names}
        self.renamed: dict[str, list] = {name: [] for name in RENAMED_SCHEMA.names}

    def doc(
        self,
        record_id: str | None,
        fallback: str,
        source: str,
        position: int,
        at: str,
        text: str,
        label: str | None = None,
        messages: str | None = None,
    ) -> None:
        """Add one document; ``at`` ("line 3", "row 2", "" for a whole file) prefixes a rejection's reason."""
        doc_id = record_id or fallback
        bad = (
            utf8_error(text)
            or control_error(text)
            or utf8_error(doc_id)
            or (label is not None and utf8_error(label))
            or (self.label_error(label) if self.label_error else None)
        )
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
        self.outcomes += 1
        self.docs["doc_id"].append(doc_id)
        self.docs["source"].append(source)
        self.docs["text"].append(text)
        if "label" in self.docs:
            self.docs["label"].append(label)
        if MESSAGES in self.docs:
            self.docs[MESSAGES].append(messages)

    def reject(self, source: str, position: int, reason: str) -> None:
        self.outcomes += 1
        self.rejects["source"].append(source)
        self.rejects["position"].append(position)
        self.rejects["reason"].append(reason)

    def full(self) -> bool:
        return len(self.docs["doc_id"]) >= self.batch_size or len(self.rejects["source"]) >= self.batch_size

    def flush(self) -> Batch:
        batch = Batch(
            pa.table(self.docs, schema=self.schema),
            pa.table(self.rejects, schema=REJECT_SCHEMA),
            pa.table(self.renamed, schema=RENAMED_SCHEMA),
            self.blank_lines,
            self.utf16_files,
        )
        self._clear()
        return batch


@dataclass(frozen=True)
class Reader:
    """A file format: the suffixes it owns (lower case; compound ones such as ``.json.gz`` allowed) and
    ``read(source, config, out)``, a generator that adds the file's documents and rejected records to
    ``out`` (a :class:`Collector`), yields ``out.flush()`` whenever ``out.full()`` and returns how many
    records it took from the file (each one document or rejected record: :func:`read_source` checks).
    A reader rejects a record it cannot take, whatever the exception, and goes on with the next.

    ``streams``: reads a byte stream, so it also owns its suffixes plus a compression suffix and reads
    compressed and UTF-16 files (``Source.open`` decompresses and decodes). ``splits``: can read piece
    ``i`` of ``n`` of an uncompressed UTF-8 file (``Source.piece``), so a corpus of one large file
    spreads over the partitions.
    """

    name: str
    suffixes: tuple[str, ...]
    read: Callable[["Source", "ReaderConfig", Collector], Generator[Batch, None, int]]
    streams: bool = False
    splits: bool = False


@dataclass(frozen=True)
class Source:
    """One corpus file to read: ``rel`` (its path relative to the corpus, POSIX) names its documents;
    ``piece`` ``(i, n)``: only the i-th of n pieces (see :func:`splittable`). ``path``: a local Path or
    an object's URL, read with range requests (largetrain_core.fs.open_input); a small object is
    fetched whole first (largetrain_core.corpus.read_corpus) and read as a local file."""

    path: Path | str
    rel: str
    reader: Reader
    piece: tuple[int, int] | None = None
    size: int | None = None  # bytes, from the corpus listing where it gave them

    def open_random(self):
        """For the columnar readers: the local path as it is (pyarrow opens and maps it), or for a URL a
        seekable fsspec file that fetches only the byte ranges read (footer, the wanted column chunks)."""
        if not fs.is_url(self.path):
            return self.path
        fsys, path = fs.filesystem(self.path)
        return fsys.open(path, "rb", block_size=fs.RANGE_BYTES)

    def open_bytes(self, raw: list | None = None) -> BinaryIO:
        """The file as a binary stream, decompressed when its first bytes are a compression's magic.
        ``raw``: a list the file's own (compressed) handle is appended to, for its position."""
        f = fs.open_input(self.path)
        if raw is not None:
            raw.append(f)
        codec = compression_of(f.read(8))
        f.seek(0)
        return codec.open(f) if codec else f

    @cached_property
    def utf16(self) -> Utf16 | None:
        """The UTF-16 encoding of the (decompressed) stream (:func:`detect_utf16`), None for UTF-8."""
        if fs.is_url(self.path) and _sniff(self.path) is None:  # a plain object: one small range request
            return detect_utf16(fs.read_head(self.path, SNIFF_BYTES))
        head = b""
        with self.open_bytes() as f:
            try:
                while len(head) < SNIFF_BYTES and (block := f.read(min(4096, SNIFF_BYTES - len(head)))):
                    head += block
            except Exception:  # noqa: BLE001 -- a stream damaged early: judged by what it gave; reading it says the rest
                pass
        return detect_utf16(head)

    def open(self, raw: list | None = None) -> BinaryIO:
        """:meth:`open_bytes` as UTF-8: a UTF-16 stream decoded (raising :class:`EncodingError` at an
        invalid sequence), any other as it is."""
        f = self.open_bytes(raw)
        return io.BufferedReader(_Utf8FromUtf16(f, self.utf16)) if self.utf16 else f


def exception_text(e: BaseException) -> str:
    """``Type: message`` of an exception for a rejection's reason, without Python's advice to raise
    the int-string limit (not a setting of ours)."""
    return f"{type(e).__name__}: {str(e).split('; use sys.set_int_max_str_digits()')[0]}"


def _json_type(value) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


MISSING_FIELD = "set raw_corpus text_field to the one holding the text"


def missing_field_hint(names: list[str], has: str, limit: int = 12) -> str:
    """What to do about a record or file without the text field, for a rejection's reason: what it
    ``has`` ("the record has fields", "the file has columns"): the first ``limit`` of ``names``, and
    the setting to change."""
    shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
    keys = set(names)
    if "messages" in keys or {"prompt", "completion"} <= keys or {"instruction", "output"} <= keys:
        return (
            f"{has} {shown}; {MISSING_FIELD}, or, for conversations (largetrain_core.chat), set raw_corpus format: chat"
        )
    return f"{has} {shown or '(none)'}; {MISSING_FIELD}"


def _stream_end(handle: list, e: BaseException, decoded: int | None = None) -> str:
    """Where and why a byte stream ended before its end: the byte of the file its reading had reached
    (``handle``: the file's own handle, from :meth:`Source.open`; for a bad UTF-16 sequence, its
    byte), the bytes of decompressed text read (``decoded``) and the exception."""
    where = getattr(e, "position", None)
    if where is None and handle:
        try:
            where = handle[0].tell()
        except Exception:  # noqa: BLE001 -- a closed or unseekable handle: the byte is not known
            where = None
    size = ""
    if handle:
        try:
            size = f" of {handle[0].seek(0, io.SEEK_END):,}"
        except Exception:  # noqa: BLE001
            size = ""
    at = f"the reading ended at byte {where:,}{size} of the file" if where is not None else "the reading ended"
    text = f", after {decoded:,} bytes of its text" if decoded is not None else ""
    return f"{at}{text}: {exception_text(e)}"
