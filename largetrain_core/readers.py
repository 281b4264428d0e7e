"""Corpus file formats and their readers: the one place that decides how a file is read, and the
settings of reading (:class:`ReaderConfig`, the raw_corpus settings).

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

Encoding policy (tested in tests/unit/test_corpus.py and tests/unit/test_reader_faults.py against tests/cases):

* UTF-8, strictly, a leading byte-order mark dropped; nothing is decoded with replacement, so no
  training text holds U+FFFD that the source did not.
* UTF-16 is decoded, for the byte-stream readers (text, JSONL, compressed or not), when the stream
  (after decompression) starts with a UTF-16 byte-order mark, or without one when its first
  :data:`SNIFF_BYTES` show UTF-16's byte pattern (:func:`detect_utf16`). Such a file is counted
  (``utf16_files``); its positions are those of the UTF-8 it is decoded to, except an invalid UTF-16
  sequence, whose position is the byte offset in the file. Columnar text is UTF-8 by the formats'
  definition and is never re-interpreted.
* A document that is mostly control characters is not text (UTF-16 read as UTF-8, binary data): it
  is rejected (:func:`control_error`), whatever the reader.
* Every bad record becomes a *rejected* record (file, position, reason) and the rest of the file is
  kept: a text file that is not UTF-8 (position: byte offset of the first bad byte); a JSONL line
  that is not UTF-8, not JSON (any exception of the parser: too deeply nested, an integer past
  Python's int-string limit, ...), not an object, lacks the text field or holds a lone surrogate
  (position: 1-based line); a columnar row whose text is null or not UTF-8 (position: 0-based row),
  for every physical layout (string, large_string, string_view, dictionary-encoded, binary), or that
  lies in a Parquet row group that cannot be decoded (each of its rows rejected).
* A labelled record (``label_field``) is rejected when ``labels`` (a declared label set) or
  ``require_label`` is set and it has no label (missing, null or empty), or, with ``labels``, a label
  outside the set (:meth:`ReaderConfig.label_error`, applied by :class:`Collector` for every reader).
* A file rejected as a whole counts as the records it holds, so that ``max_rejected_fraction`` weighs
  it by its size: each of its records is one rejected record at its own position, the reason
  starting with :data:`WHOLE_FILE`. That is the case when a columnar file lacks the text column or
  holds it in a type that is not text (each row, counted from the Parquet footer or the Arrow
  record batches), and when none of a JSONL file's first :data:`UNREADABLE_PREFIX` non-empty lines
  (or of all, if fewer) is readable: a binary or foreign file under a ``.jsonl`` name (each non-empty
  line). A file whose records cannot be counted is one rejected record at position -1: a file that
  cannot be opened (a Parquet or Arrow file without a readable footer or schema).
* A file that cannot be read or decompressed to its end (a cut gzip, a damaged zstd frame, a bad
  UTF-16 sequence) keeps the records read before the fault; the rest is one rejected record at the
  position where the reading stopped (the next line; for a text file the byte of the decoded stream)
  whose reason says how many records were read before it and at which byte of the file (and of the
  decompressed stream) it ended.
* Text shapes: a dotted ``text_field`` reaches into a JSON object or an Arrow struct column; a list
  of strings is one document, its non-null strings joined by :data:`LIST_SEPARATOR` (a blank line:
  the paragraphs of a page stay paragraphs for the cleaning rules); an Arrow column of null type is
  null texts, each row rejected as such.
* Every record a reader takes from a file ends as exactly one document or rejected record (blank
  JSONL lines are counted apart, ``blank_lines``): :func:`read_source` checks the reader's own count
  against them and raises when they differ, so no record is lost unseen.

Line endings, NUL bytes and Unicode forms are the cleaning stage's job (largetrain_core.clean).
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import os
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import BinaryIO, Callable, Generator, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import zstandard

from largetrain_core import fs
from largetrain_core.settings import described

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


# ------------------------------------------------------------------------------------------------ settings


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
            "raw_corpus fails when more than this share of the records read (before subsetting) is rejected."
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


def _sniff(path: Path | str) -> Compression | None:
    return compression_of(fs.read_head(path, 8))


# ------------------------------------------------------------------------------------------------ encodings


# Control characters that text does not hold in quantity: C0 but tab, line feed, vertical tab, form
# feed and carriage return; DEL; C1.
_CONTROL = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f]")
CONTROL_FRACTION = 0.5
"""A document of at least this share of control characters (:data:`_CONTROL`) is rejected. UTF-16 of
any script in U+0000..U+1FFF (every alphabetic one) read as UTF-8 has a control character for each
code unit (its high byte, 0x00..0x1F), so it is at least half control characters; text has a few per
cent at most (a log with ANSI colour codes: one ESC per colour change)."""

SNIFF_BYTES = 1 << 16  # UTF-16 is recognised from a stream's first 64 KiB
_UTF16_MIN_UNITS = 8  # fewer code units than this are too few to tell a byte pattern
_UTF16_IMPLAUSIBLE = 0.01
_UTF16_COHERENT = 0.9
_CONTROL_NAMES = "U+0000-U+001F, U+007F-U+009F other than tab and line breaks"


def control_error(text: str) -> str | None:
    """None unless at least :data:`CONTROL_FRACTION` of ``text``'s characters are control characters,
    else the reason to reject it (the same words for every such document, so they group as one reason)."""
    if not _CONTROL.search(text):
        return None
    controls = len(text) - len(_CONTROL.sub("", text))
    if controls < CONTROL_FRACTION * len(text):
        return None
    return (
        f"mostly control characters: at least {CONTROL_FRACTION:.0%} of its characters are control characters "
        f"({_CONTROL_NAMES}), so it is not text: UTF-16 without a byte-order mark, or binary data?"
    )


@dataclass(frozen=True)
class Utf16:
    """A UTF-16 stream: ``name`` (UTF-16LE, UTF-16BE), the Python ``codec``, the ``bom`` bytes to skip
    and the ``evidence`` it was recognised by ("byte-order mark" or "byte pattern")."""

    name: str
    codec: str
    bom: int
    evidence: str


def detect_utf16(head: bytes) -> Utf16 | None:
    """Whether a byte stream whose first bytes are ``head`` (up to :data:`SNIFF_BYTES`) is UTF-16.

    * By its byte-order mark: ``FF FE`` (UTF-16LE) or ``FE FF`` (UTF-16BE).
    * Else by its byte pattern, only when ``head`` does not read as UTF-8 text (invalid UTF-8, or at
      least :data:`CONTROL_FRACTION` control characters), so UTF-8 text is never re-read: exactly one
      byte order must decode ``head`` to text, that is, strictly (no lone surrogate), with at most
      1 % of the characters control, unassigned, private-use or surrogate, and with at least 90 % of
      the code units sharing the two most common high bytes (an alphabetic script's 256-code-point
      block and ASCII's spaces, digits and punctuation; the wrong byte order, Latin-1 and binary data
      spread them: the Ukrainian case of tests/cases/utf16_text reads 100 % as UTF-16BE, 25 % as
      UTF-16LE). Text in scripts spread over many blocks (Chinese, Japanese, Korean) is not
      recognised this way; it is then rejected as invalid UTF-8 or as mostly control characters.
      At least 8 code units are needed.
    """
    if head.startswith(b"\xff\xfe"):
        return Utf16("UTF-16LE", "utf-16-le", 2, "byte-order mark")
    if head.startswith(b"\xfe\xff"):
        return Utf16("UTF-16BE", "utf-16-be", 2, "byte-order mark")
    sample = head[: len(head) // 2 * 2]
    if len(sample) < 2 * _UTF16_MIN_UNITS or head.startswith(b"\xef\xbb\xbf") or not _garbled_as_utf8(head):
        return None
    found = [
        Utf16(name, codec, 0, "byte pattern")
        for name, codec, high in (("UTF-16BE", "utf-16-be", sample[0::2]), ("UTF-16LE", "utf-16-le", sample[1::2]))
        if _reads_as_utf16(sample, codec, high)
    ]
    return found[0] if len(found) == 1 else None


def _garbled_as_utf8(head: bytes) -> bool:
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=False)  # a character may be cut at the end
    except UnicodeDecodeError:
        return True
    return control_error(text) is not None


def _reads_as_utf16(sample: bytes, codec: str, high: bytes) -> bool:
    try:
        text = codecs.getincrementaldecoder(codec)().decode(
            sample, final=False
        )  # a surrogate pair may be cut at the end
    except UnicodeDecodeError:
        return False
    implausible = sum(1 for c in text if unicodedata.category(c) in ("Cc", "Cn", "Co", "Cs") and c not in "\t\n\v\f\r")
    if not text or implausible > _UTF16_IMPLAUSIBLE * len(text):
        return False
    return sum(n for _, n in Counter(high).most_common(2)) >= _UTF16_COHERENT * len(high)


class EncodingError(ValueError):
    """An invalid sequence in a stream decoded from UTF-16: ``position`` is its byte offset in the
    (decompressed) file."""

    def __init__(self, position: int, reason: str):
        super().__init__(reason)
        self.position = position
        self.reason = reason


class _Utf8FromUtf16(io.RawIOBase):
    """A UTF-16 byte stream read as UTF-8 bytes (its byte-order mark dropped). Raises
    :class:`EncodingError` at an invalid UTF-16 sequence (a lone surrogate, an odd last byte)."""

    def __init__(self, raw: BinaryIO, encoding: Utf16):
        self.raw, self.encoding = raw, encoding
        self.decoder = codecs.getincrementaldecoder(encoding.codec)()
        self.fed = len(raw.read(encoding.bom))  # bytes given to the decoder so far
        self.out, self.at, self.eof = b"", 0, False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self.at == len(self.out) and not self.eof:
            chunk = self.raw.read(1 << 16)
            start = self.fed - len(self.decoder.getstate()[0])  # where the decoder's pending bytes begin
            try:
                text = self.decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                raise EncodingError(
                    start + e.start, f"invalid {self.encoding.name} at byte {start + e.start}: {e.reason}"
                ) from None
            self.fed += len(chunk)
            self.eof = not chunk
            self.out, self.at = text.encode("utf-8"), 0  # strict UTF-16 decoding leaves no lone surrogate
        n = min(len(buffer), len(self.out) - self.at)
        buffer[:n] = self.out[self.at : self.at + n]
        self.at += n
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


# ------------------------------------------------------------------------------------------------ records out


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


# ------------------------------------------------------------------------------------------------ readers


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


def _read_text(src: Source, config: ReaderConfig, out: Collector) -> Generator[Batch, None, int]:
    """One document per file: the whole decoded file; doc_id and fallback id = the relative path."""
    raw: list = []
    chunks: list[bytes] = []
    with src.open(raw) as f:
        try:
            read = getattr(f, "read1", f.read)  # what the stream has: a cut stream's text up to the cut is counted
            while block := read(1 << 20):
                chunks.append(block)
        except EncodingError as e:
            out.reject(src.rel, e.position, f"{e.reason} (decoded as UTF-16, recognised by its {src.utf16.evidence})")
            return 1
        except Exception as e:  # noqa: BLE001 -- a cut or damaged compressed stream: the one record, saying where
            done = sum(map(len, chunks))
            out.reject(src.rel, done, f"cannot read the file past byte {done:,} of its text: {_stream_end(raw, e)}")
            return 1
    data = b"".join(chunks)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        out.reject(src.rel, e.start, f"invalid UTF-8 at byte {e.start}: {e.reason}")
        return 1
    out.doc(None, src.rel, src.rel, 0, "", text)
    return 1
    yield  # a generator, as every reader


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
    size = src.size if src.size is not None else fs.size(src.path)
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


def field_value(record: dict, name: str):
    """``record[name]``; else, for a dotted ``name`` (``body.text``), the value reached through nested
    objects, the longest key that exists first (``{"a.b": {"c": ..}}`` for ``a.b.c``). Raises KeyError
    (the missing part) when neither exists."""
    if name in record:
        return record[name]
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:i])
        if head in record:
            inner = record[head]
            if not isinstance(inner, dict):
                raise KeyError(f"{head!r} is a JSON {_json_type(inner)}, not an object holding {'.'.join(parts[i:])!r}")
            return field_value(inner, ".".join(parts[i:]))
    raise KeyError(name)


def _text_value(value) -> str | None:
    """A JSON text value as a document's text: a string as it is, an array of strings (nulls left out)
    joined by :data:`LIST_SEPARATOR`; None for any other value."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(v is None or isinstance(v, str) for v in value):
        return LIST_SEPARATOR.join(v for v in value if v is not None)
    return None


def _parse_line(raw: bytes, config: ReaderConfig) -> tuple[tuple[dict, str] | None, str | None]:
    """((record, text), None) for a JSON object whose ``text_field`` (:func:`field_value`) is a string or
    an array of strings (:func:`_text_value`), else (None, the reason). Every
    exception of the parser is a reason: besides invalid JSON, ``RecursionError`` (nesting deeper than
    the interpreter's recursion limit) and ``ValueError`` (an integer of more digits than Python's
    int-string conversion limit, ``sys.get_int_max_str_digits()``, 4300 by default)."""
    try:
        record = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        return None, f"invalid UTF-8 at byte {e.start} of the line: {e.reason}"
    except json.JSONDecodeError as e:
        return None, f"invalid JSON: {e.msg.removesuffix(' at')} at column {e.colno}"  # "Invalid control character at"
    except RecursionError:
        return None, "cannot parse the JSON: nested too deeply for the parser (RecursionError)"
    except Exception as e:  # noqa: BLE001 -- whatever the parser raises on one line rejects that line
        return None, f"cannot parse the JSON: {exception_text(e)}"
    if not isinstance(record, dict):
        return None, f"no string field {config.text_field!r}: the line is a JSON {_json_type(record)}, not an object"
    try:
        value = field_value(record, config.text_field)
    except KeyError as e:
        where = "" if e.args[0] == config.text_field else f"{e.args[0]}; "
        return (
            None,
            f"no string field {config.text_field!r}: {where}{missing_field_hint(list(record), 'the record has fields')}",
        )
    text = _text_value(value)
    if text is None:
        return None, f"no string field {config.text_field!r}: it is a JSON {_json_type(value)}"
    return (record, text), None


def exception_text(e: BaseException) -> str:
    """``Type: message`` of an exception for a rejection's reason, without Python's advice to raise
    the int-string limit (not a setting of ours)."""
    return f"{type(e).__name__}: {str(e).split('; use sys.set_int_max_str_digits()')[0]}"


def _jsonl_record(raw: bytes, config: ReaderConfig) -> tuple[tuple | None, str | None]:
    """((id, label, text, messages), None) for a line that makes a document, else (None, the reason);
    ``messages`` (format chat, largetrain_core.chat.to_messages) as JSON, else None."""
    try:
        if config.format == "chat":
            return _chat_record(raw, config)
        parsed, reason = _parse_line(raw, config)
        if reason:
            return None, reason
        record, text = parsed
        record_id = value_text(record.get(config.id_field)) if config.id_field else None
        label = value_text(record.get(config.label_field)) if config.label_field else None
        return (record_id, label, text, None), None
    except Exception as e:  # noqa: BLE001 -- one record's fault rejects that record
        return None, f"cannot read the record: {exception_text(e)}"


def _chat_record(raw: bytes, config: ReaderConfig) -> tuple[tuple | None, str | None]:
    """:func:`_jsonl_record` of format chat: the record's conversation (largetrain_core.chat.to_messages,
    its format found from its keys), its canonical text and its messages as JSON; or the reason it is
    no conversation (largetrain_core.chat's wording)."""
    from largetrain_core import chat

    try:
        record = json.loads(raw)
    except Exception as e:  # noqa: BLE001 -- whatever the parser raises on one line rejects that line
        return None, f"cannot parse the JSON: {exception_text(e)}"
    if not isinstance(record, dict):
        return None, f"the line is a JSON {_json_type(record)}, not an object"
    try:
        _, messages = chat.to_messages(record)
    except ValueError as e:
        return None, str(e)
    record_id = value_text(record.get(config.id_field)) if config.id_field else None
    label = value_text(record.get(config.label_field)) if config.label_field else None
    text = chat.conversation_text(messages)
    return (record_id, label, text, json.dumps(messages, ensure_ascii=False)), None


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


def _unreadable_file(src: Source, config: ReaderConfig) -> str | None:
    """The reason to reject the whole file when none of its first UNREADABLE_PREFIX non-empty lines
    (or of all, when it has fewer) is readable, else None. Decided from the file's start, so every
    piece of a split file agrees."""
    bad: list[tuple[int, str]] = []
    with src.open() as f:
        try:
            for pos, raw in enumerate(f, start=1):
                if pos == 1 and raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]
                if not raw.strip():
                    continue
                reason = _jsonl_record(raw, config)[1]
                if reason is None:
                    return None
                bad.append((pos, reason))
                if len(bad) >= UNREADABLE_PREFIX:
                    break
        except Exception:  # noqa: BLE001 -- a stream that ends early is judged by its lines before; the reading says the rest
            pass
    if not bad:
        return None
    more = "" if len(bad) < UNREADABLE_PREFIX else " (not parsed further)"
    wrong_type = f"no string field {config.text_field!r}: it is a JSON "  # _parse_line: present, not a string
    lacking = sum(MISSING_FIELD in reason for _, reason in bad)
    if lacking + sum(reason.startswith(wrong_type) for _, reason in bad) == len(bad):
        # JSON objects, none with a string text field: JSON Lines, the text is elsewhere
        what = (
            "lack it"
            if lacking == len(bad)
            else "lack it or hold another JSON type"
            if lacking
            else "hold another JSON type"
        )
        which = (
            f"the first {len(bad)} non-empty lines {what} (the rest was not parsed)"
            if more
            else f"its {len(bad)} non-empty lines {what}"
        )
        first = bad[0][1].split(": ", 1)[1]
        return f"no string field {config.text_field!r} on any line: {which}; line {bad[0][0]}: {first}" + (
            "" if MISSING_FIELD in first else f"; {MISSING_FIELD}"
        )
    return f"no readable JSON line: {len(bad)} unreadable lines{more}, the first: line {bad[0][0]}: {bad[0][1]}; is it JSON Lines?"


def _read_jsonl(src: Source, config: ReaderConfig, out: Collector) -> Generator[Batch, None, int]:
    """One document per line: a JSON object with a string ``text_field``; ids from ``id_field``.
    Blank lines are counted (``out.blank_lines``), not records."""
    verdict = _unreadable_file(src, config)  # decided from the file's start: every piece agrees
    records = decoded = 0
    handle: list = []
    with src.open(handle) as f:
        lines = _numbered_lines(src, f)
        pos = 0  # the last line read
        while True:
            try:
                pos, raw = next(lines)
            except StopIteration:
                return records
            except Exception as e:  # noqa: BLE001 -- the stream cannot be read on: the rest is one rejected record
                at = pos + 1
                out.reject(
                    src.rel,
                    at,
                    f"line {at}: cannot read the file past line {at - 1} ({records} records read before it): "
                    f"{_stream_end(handle, e, decoded)}",
                )
                return records + 1
            decoded += len(raw)
            if pos == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            if not raw.strip():
                out.blank_lines += 1
                continue
            records += 1
            fields, reason = (None, f"{WHOLE_FILE}: {verdict}") if verdict else _jsonl_record(raw, config)
            if reason:
                out.reject(src.rel, pos, f"line {pos}: {reason}")
            else:
                record_id, label, text, messages = fields
                out.doc(record_id, f"{src.rel}:{pos}", src.rel, pos, f"line {pos}", text, label, messages)
            if out.full():
                yield out.flush()


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


def _text_type_error(t: pa.DataType) -> str | None:
    """None for a text-like Arrow type (string, large_string, string_view, the binary types, any of
    them dictionary-encoded), else what it is instead."""
    v = t.value_type if pa.types.is_dictionary(t) else t
    if (
        pa.types.is_string(v)
        or pa.types.is_large_string(v)
        or pa.types.is_string_view(v)
        or pa.types.is_binary(v)
        or pa.types.is_large_binary(v)
        or pa.types.is_binary_view(v)
    ):
        return None
    return f"{t}, not a string or binary column"


def _strings(arr: pa.Array) -> tuple[list[str | None], dict[int, str]]:
    """The values of a text-like Arrow array (:func:`_text_type_error`) as Python strings, strictly
    UTF-8: (values, {row: reason} for the rows that are not UTF-8, whose value is None). Raises
    TypeError for other types."""
    why = _text_type_error(arr.type)
    if why:
        raise TypeError(why)
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
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
    if _text_type_error(arr.type) is None:
        return _strings(arr)
    return [value_text(v) for v in arr.to_pylist()], {}


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _text_column(schema: pa.Schema, name: str) -> tuple[str, list[str]] | str:
    """Where ``text_field`` ``name`` is in ``schema``: (its column, the struct fields leading to it: none
    for a column of that name, else the rest of a dotted name, the longest column name that exists
    first); or the reason it is not there."""
    if name in schema.names:
        return name, []
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:i])
        if head not in schema.names:
            continue
        t = schema.field(head).type
        for part in parts[i:]:
            if not pa.types.is_struct(t) or t.get_field_index(part) < 0:
                return (
                    f"no column {name!r}: column {head!r} is {schema.field(head).type}, "
                    f"not a struct holding {'.'.join(parts[i:])!r}"
                )
            t = t.field(part).type
        return head, parts[i:]
    return f"no column {name!r}: {missing_field_hint(schema.names, 'the file has columns')}"


def _columnar_file_error(schema: pa.Schema, config: ReaderConfig) -> str | None:
    """The reason to reject a whole columnar file: no text column (:func:`_text_column`), or one that is
    not text, null-typed or a list of text; else None."""
    found = _text_column(schema, config.text_field)
    if isinstance(found, str):
        return found
    column, path = found
    t = schema.field(column).type
    for part in path:
        t = t.field(part).type
    if pa.types.is_null(t) or (_is_list(t) and _text_type_error(t.value_type) is None):
        return None
    why = _text_type_error(t)
    if why is None:
        return None
    why = f"column {config.text_field!r} is {why}"
    if pa.types.is_struct(t):
        inner = [f"{config.text_field}.{f.name}" for f in t if _text_type_error(f.type) is None]
        if inner:
            why += f"; set raw_corpus text_field to one of its string fields: {', '.join(inner)}"
    return why


def _joined(arr: pa.Array) -> tuple[list[str | None], dict[int, str]]:
    """A list-of-text column as documents (:func:`_strings` of each list's items): a row's non-null
    items joined by :data:`LIST_SEPARATOR`, a null list None; a row with an item that is not UTF-8
    is None, with the reason."""
    flat, bad_items = _strings(arr.flatten())  # the items of the non-null lists, in order
    lengths = pc.list_value_length(arr).fill_null(0).to_pylist()
    valid = arr.is_valid().to_pylist()
    values: list[str | None] = []
    bad: dict[int, str] = {}
    start = 0
    for i, n in enumerate(lengths):
        end = start + n
        wrong = next((k for k in range(start, end) if k in bad_items), None) if bad_items else None
        if not valid[i]:
            values.append(None)
        elif wrong is not None:
            values.append(None)
            bad[i] = f"item {wrong - start}: {bad_items[wrong]}"
        else:
            values.append(LIST_SEPARATOR.join(v for v in flat[start:end] if v is not None))
        start = end
    return values, bad


def _texts(rb: pa.RecordBatch, config: ReaderConfig) -> tuple[list[str | None], dict[int, str]]:
    """The documents' texts of a record batch whose text column passed :func:`_columnar_file_error`,
    as :func:`_strings`: reached through struct fields, a null-typed column as nulls, a list of text
    joined (:func:`_joined`)."""
    column, path = _text_column(rb.schema, config.text_field)
    arr = rb.column(column)
    if path:
        arr = pc.struct_field(arr, path)  # a null struct gives a null text
    if pa.types.is_null(arr.type):
        return [None] * len(arr), {}
    return _joined(arr) if _is_list(arr.type) else _strings(arr)


def _read_columns(schema: pa.Schema, config: ReaderConfig) -> list[str]:
    """The columns a columnar reader reads: the text's (its top column for a dotted text_field), id, label."""
    found = _text_column(schema, config.text_field)
    text = [found[0]] if not isinstance(found, str) else []
    return list(dict.fromkeys(text + [c for c in (config.id_field, config.label_field) if c and c in schema.names]))


def _reject_rows(src: "Source", out: Collector, rows: range, why: str) -> Iterator[Batch]:
    """Each row of a file rejected as a whole, one rejected record per row."""
    for r in rows:
        out.reject(src.rel, r, f"row {r}: {WHOLE_FILE}: {why}")
        if out.full():
            yield out.flush()


def _columnar_batch(
    src: Source, config: ReaderConfig, out: Collector, rb: pa.RecordBatch, row0: int
) -> Iterator[Batch]:
    """Documents of one record batch of a columnar file whose text column is text-like: one per row;
    the row (0-based, from the file's start; ``row0`` is the batch's first) is the position and the
    fallback id ``<file>:<row>``. Every row of the batch ends as a document or a rejected record: when
    the batch's columns cannot be converted (any exception), each row is rejected with the reason."""
    names = rb.schema.names
    try:
        texts, bad = _texts(rb, config)
        ids, bad_ids = (
            _values(rb.column(config.id_field)) if config.id_field and config.id_field in names else (None, {})
        )
        labels, bad_labels = (
            _values(rb.column(config.label_field)) if config.label_field and config.label_field in names else (None, {})
        )
    except Exception as e:  # noqa: BLE001 -- the batch's rows are rejected, the file read on
        failure = f"cannot convert the record batch of rows {row0} to {row0 + rb.num_rows - 1}: {exception_text(e)}"
        for row in range(row0, row0 + rb.num_rows):
            out.reject(src.rel, row, f"row {row}: {failure}")
            if out.full():
                yield out.flush()
        return
    for i, text in enumerate(texts):
        row = row0 + i
        why = (
            f"text: {bad[i]}"
            if i in bad
            else "text is null"
            if text is None
            else f"{config.id_field}: {bad_ids[i]}"
            if i in bad_ids
            else f"{config.label_field}: {bad_labels[i]}"
            if i in bad_labels
            else None
        )
        if why:
            out.reject(src.rel, row, f"row {row}: {why}")
        else:
            out.doc(
                ids[i] if ids else None,
                f"{src.rel}:{row}",
                src.rel,
                row,
                f"row {row}",
                text,
                labels[i] if labels else None,
            )
        if out.full():  # per document: the collector may already hold documents of earlier files
            yield out.flush()


def _read_parquet(src: Source, config: ReaderConfig, out: Collector) -> Generator[Batch, None, int]:
    """Parquet: only the text, id and label columns are read (other columns may differ in type between
    files); a piece is a contiguous range of row groups. A row group that cannot be decoded (a damaged
    page, any exception) has each of its rows not yet read rejected, with the reason; the next row
    group is read on. Returns the rows read: the row groups' row counts from the footer."""
    try:
        pf = pq.ParquetFile(src.open_random())
    except Exception as e:  # noqa: BLE001 -- pyarrow raises ArrowInvalid/OSError for corrupt or non-Parquet files
        out.reject(src.rel, -1, f"cannot open Parquet file: {e}")
        return 1
    groups = list(range(pf.num_row_groups))
    if src.piece is not None:
        i, n = src.piece
        groups = groups[len(groups) * i // n : len(groups) * (i + 1) // n]
    row = sum(pf.metadata.row_group(g).num_rows for g in range(groups[0])) if groups else 0
    why = _columnar_file_error(pf.schema_arrow, config)
    if why:  # each row of the piece's row groups (the footer's counts) is a rejected record
        rows = sum(pf.metadata.row_group(g).num_rows for g in groups)
        yield from _reject_rows(src, out, range(row, row + rows), why)
        return rows
    columns = _read_columns(pf.schema_arrow, config)
    records = 0
    for g in groups:
        rows, done = pf.metadata.row_group(g).num_rows, 0
        batches = pf.iter_batches(batch_size=config.batch_size, row_groups=[g], columns=columns)
        while True:
            try:
                rb = next(batches, None)
            except Exception as e:  # noqa: BLE001 -- a row group that cannot be decoded: its rows are rejected
                failure = f"cannot decode row group {g} (rows {row} to {row + rows - 1}): {exception_text(e)}"
                for r in range(row + done, row + rows):
                    out.reject(src.rel, r, f"row {r}: {failure}")
                    if out.full():
                        yield out.flush()
                done = rows
                break
            if rb is None:
                break
            yield from _columnar_batch(src, config, out, rb, row + done)
            done += rb.num_rows
        if done < rows:  # the footer promised more rows than the data held
            failure = f"row group {g} ended after {done} of its {rows} rows"
            for r in range(row + done, row + rows):
                out.reject(src.rel, r, f"row {r}: {failure}")
            done = rows
        records += done
        row += rows
    return records


def _read_arrow(src: Source, config: ReaderConfig, out: Collector) -> Generator[Batch, None, int]:
    """Arrow IPC, file format (``ARROW1`` magic) or stream format (as Hugging Face ``datasets`` writes
    its ``.arrow`` files), memory-mapped. A record batch that cannot be read ends the reading: the
    rest of the file is one rejected record saying from which row (the format gives no row counts of
    unreadable batches). Returns the rows read (plus that record)."""
    opened = src.open_random()
    with pa.memory_map(str(opened)) if isinstance(opened, Path) else pa.PythonFile(opened, mode="r") as mm:
        try:
            if mm.read(6) == b"ARROW1":
                r = pa.ipc.open_file(mm)
                schema, total = r.schema, r.num_record_batches
                it = (r.get_batch(i) for i in range(total))
            else:
                mm.seek(0)
                r = pa.ipc.open_stream(mm)
                schema, total, it = r.schema, None, iter(r)
        except Exception as e:  # noqa: BLE001 -- ArrowInvalid and the like for a damaged or foreign file
            out.reject(src.rel, -1, f"cannot open Arrow IPC file: {exception_text(e)}")
            return 1
        why = _columnar_file_error(schema, config)
        columns = _read_columns(schema, config)
        row = i = 0
        while True:
            try:
                rb = next(it, None)
                if rb is not None and not why:  # memory-mapped: buffers too short must not reach the conversion
                    rb = rb.select(columns)
                    rb.validate()  # structure only: full validation would refuse the rows that are not UTF-8
            except Exception as e:  # noqa: BLE001
                of = f" of {total}" if total is not None else ""
                out.reject(
                    src.rel,
                    -1,
                    f"cannot read record batch {i}{of} (rows from {row} on were not read): {exception_text(e)}",
                )
                return row + 1
            if rb is None:
                return row
            if why:  # each row of the file is a rejected record
                yield from _reject_rows(src, out, range(row, row + rb.num_rows), why)
            else:
                yield from _columnar_batch(src, config, out, rb, row)
            row += rb.num_rows
            i += 1


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


def splittable(path: Path | str) -> bool:
    """Whether pieces of the file (a local path or an object's URL) can be read apart: its reader
    splits and, for a byte stream, the file is neither compressed (a compressed stream can only be
    read from its start) nor UTF-16 (its lines are found in the decoded stream)."""
    name = path.name if isinstance(path, Path) else str(path).rsplit("/", 1)[-1]
    r = reader_for(name)
    if not (r and r.splits):
        return False
    return not r.streams or not (_sniff(path) or Source(path, name, r).utf16)


def dangling_link(path: Path | str) -> str | None:
    """None unless ``path`` is a symbolic link whose target does not exist (or a loop of links), else the
    reason to reject it, naming the target."""
    if isinstance(path, str) or not path.is_symlink() or path.exists():
        return None
    try:
        target = os.readlink(path)
    except OSError as e:
        target = f"({e.strerror})"
    return f"dangling symbolic link: its target {target} does not exist (or is a loop of links)"


def read_source(src: Source, config: ReaderConfig, out: Collector) -> Iterator[Batch]:
    """``src.reader.read``, counting a UTF-16 file (``out.utf16_files``). A dangling link is one rejected
    record (:func:`dangling_link`), whatever its name (its ``src.reader`` may be None). A file that cannot be read
    or decompressed to its end (any exception the reader does not turn into a rejected record)
    becomes one more rejected record (position -1) after whatever it yielded before the fault, the
    reason saying how many records were read before it.

    Raises RuntimeError when the reader's count of the records it took differs from the documents and
    rejected records it added: a record lost unseen (a fault of the reader, never of the input)."""
    before = out.outcomes
    if why := dangling_link(src.path):
        out.reject(src.rel, -1, why)
        return
    try:
        if src.reader.streams and src.utf16:
            out.utf16_files += 1
        records = yield from src.reader.read(src, config, out)
    except Exception as e:  # noqa: BLE001 -- damaged, truncated or foreign: the file is one more rejected record
        read = out.outcomes - before
        after = f" after {read} records" if read else ""
        out.reject(src.rel, -1, f"cannot read file ({src.reader.name}){after}: {exception_text(e)}")
        return
    if out.outcomes - before != records:
        raise RuntimeError(
            f"{src.rel}: the {src.reader.name} reader took {records} records from the file but "
            f"gave {out.outcomes - before} documents and rejected records"
        )
