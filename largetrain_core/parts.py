"""A per-document stage over part files: each input part gives one output part of the documents it
keeps, and the documents it removes, with their reason code, go to ``filtered.parquet``.

cleaned_text is one (largetrain_core.clean.Cleaning); so is any filter stage: a :class:`PartStep`
is a callable over one part's frame, and every executor runs it part by part
(largetrain_core.executors): the local executor through :func:`map_parts`, the Spark executor one
task per run of parts through :func:`map_part`, both then :func:`finish`. A :class:`WithSignatures`
step (cleaned_text's) also writes each output part's MinHash signatures, ``signatures/part-NNNNN.parquet``,
and, once every part is done, ``signatures/settings.json`` (largetrain_core.dedup.write_signature_settings):
an executor that runs :func:`map_part` elsewhere publishes both (see executors/spark/map_parts.py).
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import polars as pl

from largetrain_core.dedup import SIGNATURES, DedupConfig, write_signature_settings, write_signatures
from largetrain_core.storage import part_files

FILTERED = "filtered.parquet"
FILTERED_SCHEMA = {"doc_id": pl.Utf8, "source": pl.Utf8, "reason": pl.Utf8}


class PartStep(Protocol):
    """One part's documents in, (kept documents, removed documents, counts) out.

    ``kept``: the output part's columns (doc_id, source, text, label where the input has one), in
    input order; ``removed``: FILTERED_SCHEMA, one row per removed document, its reason code; counts:
    the names in ``counts`` (integers summed over the parts; input, kept and filtered are counted by
    :func:`map_part`). Must be picklable (a module-level class), as the Spark executor ships it."""

    counts: tuple[str, ...]
    description: str  # the step in words, for progress logs ("cleaned_text: normalize and filter")

    def __call__(self, df: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, int]]: ...


@dataclass(frozen=True)
class WithSignatures:
    """``step``, whose output parts also get their MinHash signatures (largetrain_core.dedup.write_signatures
    with ``signatures``) beside them, ``signatures/<part name>``: a cleaned_text partition carries what
    the global dedup step clusters, computed where the partition is (docs/ARCHITECTURE.md, Lineage)."""

    step: PartStep
    signatures: DedupConfig

    @property
    def counts(self) -> tuple[str, ...]:
        return self.step.counts

    @property
    def description(self) -> str:
        return f"{self.step.description}, MinHash signatures"

    def __call__(self, df: pl.DataFrame):
        return self.step(df)


def map_part(step: PartStep, part: Path, out_part: Path) -> tuple[pl.DataFrame, dict]:
    """``step`` over one part file: writes ``out_part`` (and, for a :class:`WithSignatures` step, its
    signatures to ``signatures/<out_part's name>`` beside it); returns (removed rows, counts)."""
    df = pl.read_parquet(part)
    kept, removed, counts = step(df)
    kept.write_parquet(out_part)
    if isinstance(step, WithSignatures):
        (out_part.parent / SIGNATURES).mkdir(exist_ok=True)
        write_signatures([out_part], out_part.parent / SIGNATURES / out_part.name, step.signatures)
    return removed, {"input": df.height, "kept": kept.height, "filtered": removed.height, **counts}


def zero_counts(step: PartStep) -> dict:
    return {"input": 0, "kept": 0, "filtered": 0, **{k: 0 for k in step.counts}}


def add_counts(totals: dict, counts: dict) -> dict:
    """``counts`` added into ``totals`` (integers only)."""
    for k, v in counts.items():
        if isinstance(v, int) and not isinstance(v, bool):
            totals[k] = totals.get(k, 0) + v
    return totals


def filtered_by_reason(table: pl.DataFrame) -> dict[str, int]:
    """Removed documents per reason code, sorted by code."""
    counts = table.group_by("reason").len().sort("reason")
    return dict(zip(counts["reason"].to_list(), counts["len"].to_list()))


def finish(removed: list[pl.DataFrame], out_dir: Path, totals: dict) -> dict:
    """Write the removed rows of every part, in part order, to ``out_dir/filtered.parquet``; returns
    ``totals`` with ``filtered_by_reason``."""
    table = pl.concat(removed) if removed else pl.DataFrame(schema=FILTERED_SCHEMA)
    table.write_parquet(Path(out_dir) / FILTERED)
    return {**totals, "filtered_by_reason": filtered_by_reason(table)}


def map_parts(step: PartStep, in_dir: Path | list[Path], out_dir: Path, workers: int = 1) -> dict:
    """``step`` over every ``part-*.parquet`` of ``in_dir``: ``out_dir/part-NNNNN.parquet`` per input part
    (numbered in input order), ``out_dir/filtered.parquet`` (and for a :class:`WithSignatures` step
    ``out_dir/signatures/``); returns the summed counts and ``filtered_by_reason``.

    ``workers``: part files in progress at once. 1: one at a time in this process; more: each part in
    one of ``workers`` spawned processes (as datatrove's LocalPipelineExecutor ``workers``), memory
    about ``workers`` parts. The files and counts are the same for any ``workers``. A part's error is
    raised as it is; a worker that died (killed, out of memory) raises
    concurrent.futures.process.BrokenProcessPool (the local executor says what to do)."""
    parts = part_files(in_dir)
    outs = [Path(out_dir) / f"part-{i:05d}.parquet" for i in range(len(parts))]
    totals, removed = zero_counts(step), []
    if workers > 1 and len(parts) > 1:
        # spawn, not fork: the caller (a Dagster step, the polars pool) holds threads
        pool = ProcessPoolExecutor(min(workers, len(parts)), mp_context=multiprocessing.get_context("spawn"))
        try:
            results = list(pool.map(map_part, [step] * len(parts), parts, outs))
        except BaseException:  # a part failed, or the step was cancelled: start no other part
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
    else:
        results = (map_part(step, part, out) for part, out in zip(parts, outs))
    for rows, counts in results:
        removed.append(rows)
        add_counts(totals, counts)
    if isinstance(step, WithSignatures):
        write_signature_settings(out_dir, step.signatures)
    return finish(removed, out_dir, totals)
