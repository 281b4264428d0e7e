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
that knows its format; adding one is its module here and one entry in :data:`READERS` (registry.py;
plus its test).

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

from largetrain_core.readers.base import (
    Batch,
    Collector,
    DOC_SCHEMA,
    FORMATS,
    LABELLED_DOC_SCHEMA,
    LIST_SEPARATOR,
    MESSAGES,
    MISSING_FIELD,
    REJECT_SCHEMA,
    RENAMED_SCHEMA,
    Reader,
    ReaderConfig,
    Source,
    UNREADABLE_PREFIX,
    WHOLE_FILE,
    _json_type,
    exception_text,
    missing_field_hint,
    utf8_error,
    value_text,
)
from largetrain_core.readers.encoding import (
    COMPRESSIONS,
    CONTROL_FRACTION,
    Compression,
    EncodingError,
    SNIFF_BYTES,
    Utf16,
    compression_of,
    control_error,
    detect_utf16,
)
from largetrain_core.readers.jsonl import _parse_line, field_value
from largetrain_core.readers.registry import READERS, SUFFIXES, dangling_link, read_source, reader_for, splittable

__all__ = [
    "Batch",
    "Collector",
    "DOC_SCHEMA",
    "FORMATS",
    "LABELLED_DOC_SCHEMA",
    "LIST_SEPARATOR",
    "MESSAGES",
    "MISSING_FIELD",
    "REJECT_SCHEMA",
    "RENAMED_SCHEMA",
    "Reader",
    "ReaderConfig",
    "Source",
    "UNREADABLE_PREFIX",
    "WHOLE_FILE",
    "_json_type",
    "exception_text",
    "missing_field_hint",
    "utf8_error",
    "value_text",
    "COMPRESSIONS",
    "CONTROL_FRACTION",
    "Compression",
    "EncodingError",
    "SNIFF_BYTES",
    "Utf16",
    "compression_of",
    "control_error",
    "detect_utf16",
    "_parse_line",
    "field_value",
    "READERS",
    "SUFFIXES",
    "dangling_link",
    "read_source",
    "reader_for",
    "splittable",
]
