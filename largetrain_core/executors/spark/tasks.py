"""Work cut into Spark tasks: items (files, part files) in contiguous byte-balanced runs, one task
each (:func:`plan_runs`), run through ``mapInArrow`` and their counts collected (:func:`run_tasks`).

Tasks per stage: a multiple of the cores, 2 to 4 per core, balanced by bytes, so that each executor
gets an equal share of every stage; a Python task uses the executor's cores (POLARS_MAX_THREADS; the
MinHash threads follow polars' pool)."""

from __future__ import annotations

import json
from functools import partial
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from largetrain_core.executors.spark.progress import Progress

MANIFEST = "item long, stats string"  # what every task returns: its item (chunk / part) and its counts as JSON


BYTES_PER_TASK = 8 << 20  # default of spark.largetrain.bytesPerTask


def plan_runs(spark: SparkSession, items: list[tuple[int, str]], sizes: list[int]) -> tuple[DataFrame, object]:
    """``items`` (item, payload) cut into contiguous runs, one Spark task each, balanced by ``sizes``
    (bytes): two runs per core at least, more while runs stay above ``spark.largetrain.bytesPerTask``
    (default 8 MiB), at most four per core, and a multiple of the cores (as many items allowing), so
    that every core gets the same share of bytes in every stage (time per task is about proportional
    to its bytes). Returns a DataFrame of one row per run (``id``, one partition each) and the runs as
    a broadcast variable, which the tasks read (:func:`items_of`)."""
    n, par = len(items), spark.sparkContext.defaultParallelism
    target = int(spark.conf.get("spark.largetrain.bytesPerTask", str(BYTES_PER_TASK)))
    w = np.asarray(sizes, dtype=np.float64) + 1.0
    wanted = min(4 * par, max(2 * par, int(np.ceil(w.sum() / max(1, target)))))
    tasks = max(1, min(n, -(-wanted // par) * par))
    cut = np.searchsorted(np.cumsum(w), np.linspace(0, w.sum(), tasks + 1)[1:-1], side="right")
    for k in range(len(cut)):  # no empty run: each boundary after the previous one, room left for the rest
        cut[k] = min(max(cut[k], cut[k - 1] + 1 if k else 1), n - (tasks - 1 - k))
    runs = [[items[i] for i in r] for r in np.split(np.arange(n), cut)]
    return spark.range(len(runs), numPartitions=len(runs)), spark.sparkContext.broadcast(runs)


def run_tasks(
    spark: SparkSession,
    items: list[tuple[int, str]],
    sizes: list[int],
    task: Callable,
    spec: dict,
    description: str,
    progress: Progress,
) -> list[tuple[int, dict]]:
    """Run ``task(spec, batches)`` over the runs of ``items`` (mapInArrow) and collect each item's
    (item, stats), sorted by item."""
    if not items:
        return []
    progress.describe(description)
    df, runs = plan_runs(spark, items, sizes)
    try:
        rows = df.mapInArrow(partial(task, {**spec, "runs": runs}), MANIFEST).collect()
    finally:
        runs.destroy()
    return sorted((r.item, json.loads(r.stats)) for r in rows)


def items_of(spec: dict, batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[int, str]]:
    """The (item, payload) of the runs whose ids the task got."""
    for b in batches:
        for run in b.column("id").to_pylist():
            yield from spec["runs"].value[run]


def manifest_batch(item: int, stats: dict) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"item": [item], "stats": [json.dumps(stats)]})
