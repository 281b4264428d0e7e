"""The data-preparation steps as uses of the engine primitives (largetrain_core.executors.base): each
is ``step(engine, out_dir, **inputs) -> counts``, run by ``engine.run_global(step, out_dir, **inputs)``,
its independent parts handed to ``engine.map_tasks``. The steps run the core's functions; an engine
that has a distributed implementation of a step of its own (Spark) runs that instead, with the same
outputs (tests/helpers/executor_contract.py)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import polars as pl

from largetrain_core.corpus import Scan, ingest as read_corpus
from largetrain_core.decontamination import MATCH_SCHEMA, contamination_counts, load_index, scan
from largetrain_core.dedup import DedupConfig, VerifyConfig, deduplicate as dedup, write_signature_settings
from largetrain_core.parts import PartStep, WithSignatures, add_counts, finish, map_part, zero_counts
from largetrain_core.readers import ReaderConfig
from largetrain_core.shards import Packing, partition_parts, tokenize_partition, tokenize_parts
from largetrain_core.storage import part_files

if TYPE_CHECKING:
    from largetrain_core.executors.base import Executor


def ingest(engine: "Executor", out_dir: Path, reader: ReaderConfig, listed: Scan | None = None) -> dict:
    """raw_corpus: largetrain_core.corpus.ingest(reader, out_dir, listed), the partition's documents in
    part files, rejected.parquet, renamed_ids.parquet, skipped_files.txt, and its counts. ``listed``:
    the partition's corpus.scan when the caller made it (else made here). One stream in this process
    (document ids are unique within a read)."""
    return read_corpus(reader, out_dir, listed)


def _map_part(step: PartStep, unit: tuple[Path, Path]) -> tuple[pl.DataFrame, dict]:
    return map_part(step, *unit)


def map_parts(engine: "Executor", out_dir: Path, step: PartStep, in_dir: Path | list[Path]) -> dict:
    """largetrain_core.parts.map_parts(step, in_dir, out_dir): ``step`` over every part file of
    ``in_dir`` (a per-document stage such as cleaned_text's rules), one task per part: kept documents
    per part (numbered in input order), the removed ones in filtered.parquet (and for a
    parts.WithSignatures step ``signatures/``), and the summed counts with ``filtered_by_reason``."""
    parts = part_files(in_dir)
    units = [(p, Path(out_dir) / f"part-{i:05d}.parquet") for i, p in enumerate(parts)]
    totals, removed = zero_counts(step), []
    for rows, counts in engine.map_tasks(partial(_map_part, step), units, step.description):
        removed.append(rows)
        add_counts(totals, counts)
    if isinstance(step, WithSignatures):
        write_signature_settings(out_dir, step.signatures)
    return finish(removed, out_dir, totals)


def deduplicate(
    engine: "Executor",
    out_dir: Path,
    in_dirs: list[Path],
    cfg: DedupConfig,
    verify: VerifyConfig | None = VerifyConfig(),
) -> dict:
    """deduplicated_text: largetrain_core.dedup.deduplicate(in_dirs, out_dir, cfg, verify), the global
    step over every partition (kept part files, duplicates.parquet, unverified.parquet; signatures/
    only when the partitions carry none) and its counts; ``verify`` None: the connected components
    unverified."""
    return dedup(in_dirs, out_dir, cfg, verify)


def _scan_part(index, part: Path) -> pl.DataFrame:
    return scan(pl.read_parquet(part, columns=["doc_id", "source", "text"]), index)


def find_contamination(engine: "Executor", out_dir: Path, in_dirs: list[Path], index_dir: Path, out_file: Path) -> dict:
    """filtered_text's n-gram join of the documents with the evaluation sets' index (an
    evaluation_sets directory, decontamination.load_index), one task per part file: ``out_file``
    (inside ``out_dir``; Parquet, decontamination.MATCH_SCHEMA, one row per contaminated document,
    corpus order, its first matching n-gram) and decontamination.contamination_counts. The index is
    in each task's memory (24 bytes per n-gram of the sets)."""
    index = load_index(index_dir)
    found = engine.map_tasks(
        partial(_scan_part, index), part_files(in_dirs), "filtered_text: 13-gram join with the evaluation sets"
    )
    table = pl.concat(found) if found else pl.DataFrame(schema=MATCH_SCHEMA)
    table.write_parquet(out_file)
    return contamination_counts(table, index)


def _tokenize_run(tokenizer_path: Path, out_dir: Path, packing: Packing, unit: tuple[list[Path], int]) -> dict:
    parts, first = unit
    return tokenize_parts(parts, first, tokenizer_path, out_dir, packing)


def tokenize(
    engine: "Executor",
    out_dir: Path,
    in_dir: Path,
    tokenizer_path: Path,
    partition: int,
    partitions: int,
    packing: Packing,
) -> dict:
    """One partition of token_shards (largetrain_core.shards.tokenize_partition): partition
    ``partition`` of ``partitions`` of the part files of ``in_dir`` tokenized and packed into
    ``out_dir`` (shard files, tails, ``tokenized.json``), and its summary. Its part files are cut into
    ``engine.slots`` contiguous runs, one task each (one run: as tokenize_partition alone); the
    sequences and their order do not depend on the runs (largetrain_core.shards, Packing)."""
    first, mine = partition_parts(part_files(in_dir), partition, partitions)
    runs = None
    if engine.slots > 1 and len(mine) > 1:
        cuts = runs_of(len(mine), engine.slots)
        units = [(mine[a:b], first + a) for a, b in zip(cuts[:-1], cuts[1:])]
        runs = engine.map_tasks(
            partial(_tokenize_run, tokenizer_path, out_dir, packing),
            units,
            f"tokenize partition {partition} of {partitions}",
        )
    return tokenize_partition(in_dir, tokenizer_path, out_dir, partition, partitions, packing, runs=runs)


def runs_of(n: int, runs: int) -> list[int]:
    """Boundaries of ``min(runs, n)`` contiguous runs of ``n`` items, sizes differing by at most one:
    ``[0, ..., n]``."""
    k = max(1, min(runs, n))
    return [i * n // k for i in range(k + 1)]


def map_all(engine: "Executor", out_dir: Path, fn: Callable[[Any], Any], units: Sequence[Any]) -> dict:
    """``{"results": engine.map_tasks(fn, units)}``: the tasks alone, as a step (for an engine whose
    tasks run only inside a job of its own: Spark's map_tasks)."""
    return {"results": engine.map_tasks(fn, units)}
