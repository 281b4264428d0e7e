"""The Arrow IPC reader (file or stream format)."""

from __future__ import annotations

from pathlib import Path
from typing import Generator

import pyarrow as pa

from largetrain_core.readers.base import Batch, Collector, ReaderConfig, Source, exception_text
from largetrain_core.readers.columnar import _columnar_batch, _columnar_file_error, _read_columns, _reject_rows


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
