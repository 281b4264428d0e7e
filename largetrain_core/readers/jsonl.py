"""The JSON Lines reader (formats text and chat): one record per line, a dotted text field, a file unreadable as a whole; pieces of a large plain file."""

from __future__ import annotations

import json
from typing import BinaryIO, Generator, Iterator


from largetrain_core import fs
from largetrain_core.readers.base import (
    Batch,
    Collector,
    LIST_SEPARATOR,
    MISSING_FIELD,
    ReaderConfig,
    Source,
    UNREADABLE_PREFIX,
    WHOLE_FILE,
    _json_type,
    _stream_end,
    exception_text,
    missing_field_hint,
    value_text,
)


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
