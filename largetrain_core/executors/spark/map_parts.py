"""A per-document stage (largetrain_core.parts.PartStep: cleaned_text's rules, any filter) on Spark:
one task per run of part files, each part through parts.map_part (the local executor's code, so the
output parts are the same bytes; a parts.WithSignatures step's MinHash signatures computed in the
same task), then the removed rows concatenated in part order (parts.finish)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import polars as pl
import pyarrow as pa
from pyspark.sql import SparkSession

from largetrain_core.clean import Cleaning, QualityConfig
from largetrain_core.dedup import SIGNATURES, write_signature_settings
from largetrain_core.executors.spark.commit import Uploads, attempt, check_outputs, input_location, publish, task_input
from largetrain_core.executors.spark.progress import Progress
from largetrain_core.executors.spark.tasks import items_of, manifest_batch, run_tasks
from largetrain_core.storage import part_files
from largetrain_core.parts import PartStep, WithSignatures, add_counts, finish, map_part, zero_counts


def _map_parts_task(spec: dict, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    step = spec["step"]
    for i, location in items_of(spec, batches):
        with attempt(spec, i) as tmp:
            with task_input(location, tmp) as path:
                removed, counts = map_part(step, path, tmp / "part.parquet")  # the local executor's code, part by part
            removed.write_parquet(tmp / "filtered.parquet")
            publish(spec, tmp / "part.parquet", f"part-{i:05d}.parquet")
            publish(spec, tmp / "filtered.parquet", f"_filtered/{i:05d}.parquet")
            if isinstance(step, WithSignatures):  # the part's signatures, computed in the task
                publish(spec, tmp / SIGNATURES / "part.parquet", f"{SIGNATURES}/part-{i:05d}.parquet")
        yield manifest_batch(i, counts)


def map_parts(
    spark: SparkSession,
    step: PartStep,
    in_dir: Path,
    out_dir: Path,
    progress: Progress | None = None,
    uploads: Uploads | None = None,
) -> dict:
    """parts.map_parts on Spark, one task per run of part files: the same part files (byte for byte),
    ``filtered.parquet`` (same rows in order) and counts. The tasks read the parts of a version at a URL
    from there, and put their files under ``uploads.url`` when given (commit module docstring)."""
    out_dir, progress, uploads = Path(out_dir), progress or Progress(spark), uploads or Uploads()
    parts = part_files(in_dir)
    signed = step.signatures if isinstance(step, WithSignatures) else None
    for d in ("_attempts", "_filtered", *([SIGNATURES] if signed is not None else [])):
        (out_dir / d).mkdir()
    spec = {"step": step, "out": str(out_dir), "url": uploads.url}
    items = [(i, input_location(p)) for i, p in enumerate(parts)]
    manifest = run_tasks(
        spark, items, [p.stat().st_size for p in parts], _map_parts_task, spec, step.description, progress
    )
    check_outputs(
        out_dir,
        {
            **{out_dir / f"part-{i:05d}.parquet": s["kept"] for i, s in manifest},
            **{out_dir / "_filtered" / f"{i:05d}.parquet": s["filtered"] for i, s in manifest},
            **(
                {out_dir / SIGNATURES / f"part-{i:05d}.parquet": s["kept"] for i, s in manifest}
                if signed is not None
                else {}
            ),
        },
        uploads,
    )
    if signed is not None:
        write_signature_settings(out_dir, signed)
    totals = zero_counts(step)
    for _, s in manifest:
        add_counts(totals, s)
    totals = finish([pl.read_parquet(out_dir / "_filtered" / f"{i:05d}.parquet") for i, _ in manifest], out_dir, totals)
    shutil.rmtree(out_dir / "_filtered")
    return totals


def clean(
    spark: SparkSession, in_dir: Path, out_dir: Path, cfg: QualityConfig, progress: Progress | None = None
) -> dict:
    """clean.clean_corpus on Spark (:func:`map_parts` of clean.Cleaning)."""
    return map_parts(spark, Cleaning(cfg), in_dir, out_dir, progress)
