"""What the columnar readers (Parquet, Arrow IPC) share: the text column found in the schema, its values as strict UTF-8, a record batch turned into documents and rejected records."""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from largetrain_core.readers.base import (
    Batch,
    Collector,
    LIST_SEPARATOR,
    ReaderConfig,
    Source,
    WHOLE_FILE,
    exception_text,
    missing_field_hint,
    value_text,
)


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
