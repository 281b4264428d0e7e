"""raw_corpus on Spark: the partition's corpus files are listed on the driver (corpus.scan) and cut into
contiguous, byte-balanced chunks, one task each; a task reads its chunk with the core reader
(corpus.ingest of the chunk's files, each named by its path relative to the corpus root, so document
ids, sources and rejected records are the local executor's). The driver numbers the part files in
corpus order and applies ``max_documents`` (the first N documents of the partition) across chunks."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Iterator

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from largetrain_core.corpus import Scan, finish_ingest, ingest as local_ingest, scan, start_ingest
from largetrain_core import fs
from largetrain_core.executors.spark.commit import Uploads, attempt, check_outputs, publish
from largetrain_core.executors.spark.progress import Progress
from largetrain_core.executors.spark.tasks import items_of, manifest_batch, run_tasks
from largetrain_core.storage import part_files
from largetrain_core.readers import ReaderConfig, Source, dangling_link, reader_for


def _ingest_task(spec: dict, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The task's run of files as one chunk (numbered by its first file), read by corpus.ingest."""
    items = list(items_of(spec, batches))
    if not items:
        return
    chunk, rels = items[0][0], [rel for _, payload in items for rel in json.loads(payload)]
    with attempt(spec, chunk) as tmp:
        (tmp / "out").mkdir()
        if spec["whole"]:  # one file, or a piece of one: read as the local engine reads it
            stats = local_ingest(spec["config"], tmp / "out")
        else:  # the run's files, each named by its path relative to the corpus root (the local engine's ids)
            base = (
                spec["base"] if fs.is_url(spec["base"]) else Path(spec["base"])
            )  # a URL: read through largetrain_core.fs
            listed = Scan(
                [
                    Source(
                        fs.join(base, rel) if fs.is_url(base) else base / rel,
                        rel,
                        reader_for(Path(rel).name),
                        size=spec["sizes"].get(rel),
                    )
                    for rel in rels
                ],
                [],
                base,
            )
            stats = local_ingest(spec["config"], tmp / "out", listed)
        stats["part_rows"] = []
        for j, part in enumerate(part_files(tmp / "out")):
            stats["part_rows"].append(pq.ParquetFile(part).metadata.num_rows)
            publish(spec, part, f"_chunks/{chunk:06d}-{j:05d}.parquet")
        for name in ("rejected", "renamed_ids"):
            publish(spec, tmp / "out" / f"{name}.parquet", f"_chunks/{chunk:06d}-{name}.parquet")
    yield manifest_batch(chunk, stats)


def ingest(
    spark: SparkSession,
    config: ReaderConfig,
    out_dir: Path,
    progress: Progress | None = None,
    uploads: Uploads | None = None,
    listed: Scan | None = None,
) -> dict:
    """corpus.ingest on Spark: the same documents (ids, order, text), rejected records, renamed ids and
    counts. Part files are cut per chunk of files, so their boundaries (not their contents in order)
    can differ from the local engine's.

    Document ids are unique within a read (readers.Collector renames a repeated id): when an id
    repeats across chunks, the partition is read again as one chunk, as the local engine reads it.
    A corpus at a URL is read by the tasks through largetrain_core.fs; ``uploads``: where the tasks
    put their files for a version at a URL (commit.Uploads); ``listed``: the partition's corpus.scan when
    the caller made it (else made here). Raises what corpus.scan raises."""
    out_dir, progress, uploads = Path(out_dir), progress or Progress(spark), uploads or Uploads()
    if listed is None:
        listed = scan(config.path, config.partition, config.partitions)
    stats = start_ingest(listed, out_dir)
    whole = _one_file(config, listed) or any(src.piece for src in listed.sources)
    rels = [src.rel for src in listed.sources]
    sizes = [
        src.size if src.size is not None else 0 if dangling_link(src.path) else fs.size(src.path)
        for src in listed.sources
    ]
    spec = {
        "config": config,
        "out": str(out_dir),
        "url": uploads.url,
        "base": str(listed.base),
        "whole": whole,
        "sizes": dict(zip(rels, sizes)),
    }
    if whole:  # one task: the file (or its piece) is read as one stream
        items, sizes = ([(0, json.dumps(rels))] if rels else []), sizes[:1]
    else:
        items = [(i, json.dumps([r])) for i, r in enumerate(rels)]
    manifest = _read_chunks(spark, items, sizes, spec, rels, progress, uploads)
    tables = _gather_parts(manifest, stats, config.max_documents, out_dir)
    stats = finish_ingest(stats, tables["rejected"], tables["renamed_ids"], out_dir)
    shutil.rmtree(out_dir / "_chunks")
    return stats


def _one_file(config: ReaderConfig, listed: Scan) -> bool:
    """Whether the corpus path is one file (at a URL: the scan's only source is the path itself)."""
    if fs.is_url(config.path):
        return len(listed.sources) == 1 and str(listed.sources[0].path).rstrip("/") == str(config.path).rstrip("/")
    return Path(config.path).is_file()


def _read_chunks(
    spark: SparkSession,
    items: list[tuple[int, str]],
    sizes: list[int],
    spec: dict,
    rels: list[str],
    progress: Progress,
    uploads: Uploads,
) -> list:
    """Read the files into ``_chunks/`` by chunk (``items``), again as one chunk when ids repeat across
    chunks; the tasks' manifest, its outputs checked."""
    out_dir = Path(spec["out"])
    for _reading in ("chunks", "one chunk"):
        for d in ("_attempts", "_chunks"):
            shutil.rmtree(out_dir / d, ignore_errors=True)
            (out_dir / d).mkdir()
        manifest = run_tasks(spark, items, sizes, _ingest_task, spec, "raw_corpus: read files", progress)
        check_outputs(
            out_dir,
            {
                **{
                    out_dir / "_chunks" / f"{chunk:06d}-{j:05d}.parquet": n
                    for chunk, s in manifest
                    for j, n in enumerate(s["part_rows"])
                },
                **{
                    out_dir / "_chunks" / f"{chunk:06d}-{name}.parquet": -1
                    for chunk, _ in manifest
                    for name in ("rejected", "renamed_ids")
                },
            },
            uploads,
        )
        if len(manifest) < 2 or not _ids_repeat(out_dir / "_chunks"):
            break
        items = [(0, json.dumps(rels))]  # ids repeat across chunks: read as the local engine does, in one stream
    return manifest


def _gather_parts(manifest: list, stats: dict, max_documents: int | None, out_dir: Path) -> dict[str, list]:
    """Move the chunks' parts into place as ``part-NNNNN.parquet`` in corpus order, cut to ``max_documents``,
    adding their counts to ``stats``; the chunks' rejected and renamed_ids tables."""
    tables: dict[str, list] = {"rejected": [], "renamed_ids": []}
    for chunk, s in manifest:  # corpus order: chunks, then their parts
        for name in tables:
            tables[name].append(pq.read_table(out_dir / "_chunks" / f"{chunk:06d}-{name}.parquet"))
        for k in ("rejected", "renamed_ids", "not_sampled", "bytes", "blank_lines", "utf16_files"):
            stats[k] += s[k]
        for j, n in enumerate(s["part_rows"]):
            part = out_dir / "_chunks" / f"{chunk:06d}-{j:05d}.parquet"
            room = n if max_documents is None else max(0, max_documents - stats["documents"])
            if room < n:  # the partition's first max_documents documents only
                table = pq.read_table(part)
                stats["not_sampled"] += n - room
                stats["bytes"] -= _text_bytes(table.slice(room))
                if room:
                    pq.write_table(table.slice(0, room), part)
            if room:
                os.replace(part, out_dir / f"part-{stats['parts']:05d}.parquet")
                stats["parts"] += 1
                stats["documents"] += room
    return tables


def _ids_repeat(chunks: Path) -> bool:
    """Whether a document id occurs twice among the chunks' part files (only across chunks: each
    chunk's reader made its own ids unique)."""
    parts = sorted(chunks.glob("*-[0-9]*.parquet"))
    return bool(parts) and pl.scan_parquet(parts).select(pl.col("doc_id").is_duplicated().any()).collect().item()


def _text_bytes(table: pa.Table) -> int:
    return int(pc.sum(pc.binary_length(table.column("text"))).as_py() or 0) if table.num_rows else 0
