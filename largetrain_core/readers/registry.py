"""The reader registry: :data:`READERS`, a file name's reader by its longest suffix, and :func:`read_source`, which reads a file and checks its count of records."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator


from largetrain_core.readers.arrow import _read_arrow
from largetrain_core.readers.base import Batch, Collector, Reader, ReaderConfig, Source, exception_text
from largetrain_core.readers.encoding import COMPRESSIONS, _sniff
from largetrain_core.readers.jsonl import _read_jsonl
from largetrain_core.readers.parquet import _read_parquet
from largetrain_core.readers.text import _read_text


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
