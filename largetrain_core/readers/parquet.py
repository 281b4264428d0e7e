"""The Parquet reader: row group by row group, pieces of a file by row groups."""

from __future__ import annotations

from typing import Generator

import pyarrow.parquet as pq

from largetrain_core.readers.base import Batch, Collector, ReaderConfig, Source, exception_text
from largetrain_core.readers.columnar import _columnar_batch, _columnar_file_error, _read_columns, _reject_rows


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
