"""The engine inside a Spark application (the driver of ``spark-submit .../job.py``, or a test's
session): :meth:`SparkDriver.map_tasks` runs the tasks as Spark tasks (one per run of units,
tasks.run_tasks), :meth:`SparkDriver.run_global` runs Spark's own distributed implementation of a step
where it has one (:data:`IMPLEMENTATIONS`), else the step itself on the driver, its tasks on the
executors. A new step needs nothing here; an implementation of its own is an optimization."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa
from pyspark.sql import SparkSession

from largetrain_core.dedup import VerifyConfig
from largetrain_core.executors import steps
from largetrain_core.executors.base import Executor
from largetrain_core.executors.spark.commit import Uploads
from largetrain_core.executors.spark.decontamination import find_contamination
from largetrain_core.executors.spark.dedup import deduplicate
from largetrain_core.executors.spark.ingest import ingest
from largetrain_core.executors.spark.map_parts import map_parts
from largetrain_core.executors.spark.progress import Progress
from largetrain_core.executors.spark.submit import decode, encode
from largetrain_core.executors.spark.tasks import items_of, manifest_batch, run_tasks
from largetrain_core.executors.spark.tokenize import tokenize


def _ingest(e: "SparkDriver", out: Path, reader, listed=None) -> dict:
    return ingest(e.spark, reader, out, e.progress, e.uploads, listed)


def _map_parts(e: "SparkDriver", out: Path, step, in_dir) -> dict:
    return map_parts(e.spark, step, in_dir, out, e.progress, e.uploads)


def _deduplicate(e: "SparkDriver", out: Path, in_dirs, cfg, verify: VerifyConfig | None = VerifyConfig()) -> dict:
    return deduplicate(e.spark, [Path(d) for d in in_dirs], out, cfg, e.progress, e.uploads, verify)


def _find_contamination(e: "SparkDriver", out: Path, in_dirs, index_dir, out_file) -> dict:
    return find_contamination(e.spark, [Path(d) for d in in_dirs], Path(index_dir), Path(out_file), e.progress)


def _tokenize(e: "SparkDriver", out: Path, in_dir, tokenizer_path, partition, partitions, packing) -> dict:
    return tokenize(
        e.spark, Path(in_dir), Path(tokenizer_path), out, partition, partitions, packing, e.progress, e.uploads
    )


# a step -> Spark's distributed implementation of it (same outputs: tests/helpers/executor_contract.py)
IMPLEMENTATIONS: dict[Callable, Callable] = {
    steps.ingest: _ingest,
    steps.map_parts: _map_parts,
    steps.deduplicate: _deduplicate,
    steps.find_contamination: _find_contamination,
    steps.tokenize: _tokenize,
}


def _task(spec: dict, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A run of units: ``spec["fn"](unit)`` each, its result pickled in the manifest row."""
    for i, payload in items_of(spec, batches):
        yield manifest_batch(i, {"result": encode(spec["fn"](decode(payload)))})


class SparkDriver(Executor):
    """The engine of a Spark application's driver (module docstring); ``uploads``: where the tasks put
    a version's files when it is at a URL (commit.Uploads)."""

    name = "spark"
    process_name = "the Spark application"

    def __init__(self, spark: SparkSession, progress: Progress | None = None, uploads: Uploads | None = None):
        super().__init__()
        self.spark, self.progress, self.uploads = spark, progress or Progress(spark), uploads or Uploads()

    @property
    def slots(self) -> int:
        return self.spark.sparkContext.defaultParallelism

    def map_tasks(self, fn: Callable[[Any], Any], units: Sequence[Any], description: str = "") -> list:
        items = [(i, encode(u)) for i, u in enumerate(units)]
        manifest = run_tasks(
            self.spark, items, [1] * len(items), _task, {"fn": fn}, description or "tasks", self.progress
        )
        return [decode(s["result"]) for _, s in manifest]

    def run_global(self, fn: Callable[..., dict], out_dir: Path, **inputs) -> dict:
        own = IMPLEMENTATIONS.get(fn)
        stats = own(self, Path(out_dir), **inputs) if own else fn(self, Path(out_dir), **inputs)
        return {**stats, **self.record()}

    def record(self, **extra) -> dict:
        sc = self.spark.sparkContext
        return super().record(spark_master=sc.master, spark_version=self.spark.version, **extra)
