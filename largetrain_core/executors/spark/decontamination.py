"""The global part of decontamination on Spark: the join of the documents' word 13-grams with the
evaluation sets' index (largetrain_core.decontamination). One task per run of part files; each task
scans its parts with decontamination.scan, the local executor's code, against the index, which the
driver broadcasts (24 bytes per n-gram of the sets, plus the items). A task returns its matches (one row
per contaminated document, few) with its counts; the driver concatenates them in part order, as
decontamination.find_contamination does, so both executors write the same table."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import polars as pl
import pyarrow as pa
from pyspark.sql import SparkSession

from largetrain_core.cache import cache_dir
from largetrain_core.decontamination import MATCH_SCHEMA, contamination_counts, load_index, scan
from largetrain_core.executors.spark.commit import input_location, task_input
from largetrain_core.executors.spark.progress import Progress
from largetrain_core.executors.spark.tasks import items_of, manifest_batch, run_tasks
from largetrain_core.storage import part_files


def _scan_task(spec: dict, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    index = spec["index"].value
    scratch = Path(tempfile.mkdtemp(prefix="decontamination-", dir=cache_dir()))  # a part at a URL is fetched here
    try:
        for i, location in items_of(spec, batches):
            with task_input(location, scratch) as path:
                found = scan(pl.read_parquet(path, columns=["doc_id", "source", "text"]), index)
            yield manifest_batch(i, {"matches": found.to_dicts()})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def find_contamination(
    spark: SparkSession, in_dirs: list[Path], index_dir: Path, out_file: Path, progress: Progress | None = None
) -> dict:
    """decontamination.find_contamination on Spark: ``out_file`` (Parquet, MATCH_SCHEMA, corpus order)
    and decontamination.contamination_counts. The tasks read the parts of a version at a URL from there."""
    progress = progress or Progress(spark)
    index = load_index(index_dir)
    parts = part_files(in_dirs)
    items = [(i, input_location(p)) for i, p in enumerate(parts)]
    shared = spark.sparkContext.broadcast(index)
    try:
        manifest = run_tasks(
            spark,
            items,
            [p.stat().st_size for p in parts],
            _scan_task,
            {"index": shared},
            "filtered_text: 13-gram join with the evaluation sets",
            progress,
        )
    finally:
        shared.destroy()
    table = pl.DataFrame([row for _, s in manifest for row in s["matches"]], schema=MATCH_SCHEMA)
    table.write_parquet(out_file)
    return contamination_counts(table, index)
