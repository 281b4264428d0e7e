"""One partition of token_shards on Spark: its part files cut into contiguous runs, one task each,
every run tokenized and packed by shards.tokenize_parts (the local executor's code), its shard files
and tails published under the names that code gives them (tagged with the run's first part), then
the partition's summary written by the driver (shards.tokenize_partition with the runs' summaries).

The sequences and their order do not depend on the runs: a part's full windows stay in its run's
shards and its tail goes to the global step, as with one run (largetrain_core.shards, Packing)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import pyarrow as pa
from pyspark.sql import SparkSession

from largetrain_core.executors.spark.commit import Uploads, attempt, check_outputs, input_location, publish, task_input
from largetrain_core.executors.spark.progress import Progress
from largetrain_core.executors.spark.tasks import manifest_batch, run_tasks
from largetrain_core.shards import Packing, partition_parts, run_files, tokenize_partition, tokenize_parts
from largetrain_core.storage import part_files
from largetrain_core.tokenizer import load_tokenizer_info


def _tokenize_task(spec: dict, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for b in batches:
        for run in b.column("id").to_pylist():
            items = spec["runs"].value[run]
            first = items[0][0]
            with attempt(spec, first) as tmp, contextlib.ExitStack() as inputs:
                tokenizer, out = tmp / "tokenizer", tmp / "out"
                tokenizer.mkdir()
                out.mkdir()
                for name, data in spec["tokenizer"].items():
                    (tokenizer / name).write_bytes(data)
                paths = [inputs.enter_context(task_input(location, tmp)) for _, location in items]
                summary = tokenize_parts(paths, first, tokenizer, out, spec["packing"])
                for f in sorted(out.iterdir()):
                    publish(spec, f, f.name)
            yield manifest_batch(first, summary)


def tokenize(
    spark: SparkSession,
    in_dir: Path,
    tokenizer_path: Path,
    out_dir: Path,
    partition: int,
    partitions: int,
    packing: Packing,
    progress: Progress | None = None,
    uploads: Uploads | None = None,
) -> dict:
    """shards.tokenize_partition on Spark, one task per run of the partition's part files: the same
    sequences in the same order as one process (its shard files cut per run), and the same summary
    ``tokenized.json`` for the global step. The tokenizer travels in the tasks' closure (a few MB). The
    tasks read parts of a version at a URL from there, each downloading its run's parts into its node's
    scratch directory before it tokenizes them (disk: the run's bytes, about 8 MiB per task by default),
    and put their files under ``uploads.url`` when given (commit module docstring). Raises RuntimeError
    naming a file a task reported but that is missing."""
    out_dir, progress, uploads = Path(out_dir), progress or Progress(spark), uploads or Uploads()
    first, mine = partition_parts(part_files(in_dir), partition, partitions)
    info = load_tokenizer_info(tokenizer_path)
    config = info.path.parent / "tokenizer_config.json"  # EOS and BOS, read beside tokenizer.json
    spec = {
        "out": str(out_dir),
        "url": uploads.url,
        "packing": packing,
        "tokenizer": {
            "tokenizer.json": info.path.read_bytes(),
            **({config.name: config.read_bytes()} if config.exists() else {}),
        },
    }
    (out_dir / "_attempts").mkdir()
    items = [(first + j, input_location(p)) for j, p in enumerate(mine)]
    manifest = run_tasks(
        spark,
        items,
        [p.stat().st_size for p in mine],
        _tokenize_task,
        spec,
        f"tokenize partition {partition} of {partitions}",
        progress,
    )
    runs = [summary for _, summary in manifest]
    check_outputs(out_dir, {out_dir / f: -1 for s in runs for f in run_files(s)}, uploads)
    return tokenize_partition(in_dir, tokenizer_path, out_dir, partition, partitions, packing, runs=runs)
