"""Data preparation on Apache Spark: raw_corpus, cleaned_text and deduplicated_text with the outputs of
the local engine (same documents in the same order, same rejected, filtered and duplicate records with
the same reason codes, same counts), in the same on-disk layout. The only module that imports pyspark.

One implementation of every rule: Spark runs the core functions, it does not re-express them.

* Reading (:func:`ingest`): the partition's corpus files are listed on the driver (corpus.scan) and cut
  into contiguous, byte-balanced chunks, one Spark task each; a task reads its chunk with the core
  reader (corpus.ingest of the chunk's files, each named by its path relative to the corpus root, so
  document ids, sources and rejected records are the local engine's). The driver numbers the part files in
  corpus order and applies ``max_documents`` (the first N documents of the partition) across chunks.
* Cleaning (:func:`clean`): one task per run of raw part files; each part goes through clean.clean_corpus
  (normalization and the quality rules, polars over the part's Arrow data): the cleaned part files
  are the local engine's, byte for byte.
* Deduplication (:func:`deduplicate`): MinHash signatures per part (dedup.write_signatures, same
  parameters and seeds; the signature files are the local engine's), sent to Spark through
  ``mapInArrow``; the key hash and the band hashes are exploded to (band, hash, row) and grouped in one
  shuffle (the exact pass is band -1: a shuffle on the normalized key's hash); each group of two or
  more rows gives the edges (row, smallest row); connected components by alternating large-star and
  small-star (Kiveris, Lattanzi, Mirrokni, Rastogi, Vassilvitskii, "Connected Components in MapReduce
  and Beyond", SoCC 2014), whose fixed point is one star per component centred on its smallest row,
  i.e. the first document in corpus order: the local engine's kept copy. No process holds data for
  every document: the driver holds the list of part files, executors their shuffle partitions. The
  duplicates are shuffled on their part and written one file per part; the kept documents are then
  written per part (dedup.write_kept), in the same byte-balanced runs of parts as the signatures.
  The global step runs without adaptive query execution (:func:`global_step_settings`): 5 Spark jobs
  for the whole deduplication instead of 17, its counts from the last connected-components job and
  the write tasks (no job of its own).

Tasks per stage (:func:`_runs`): a multiple of the cores, 2 to 4 per core, balanced by bytes, so
that each executor gets an equal share of every stage; a Python task uses the executor's cores
(POLARS_MAX_THREADS; the MinHash threads follow polars' pool).

Writes (the atomic-directory rule, largetrain_core.storage): ``out_dir`` is the stage's temporary
directory, renamed into place by the caller when complete. A task writes into an attempt directory
of its own under ``out_dir/_attempts`` and, when done, renames each file to its deterministic name;
outputs are pure functions of the inputs, so a retried or speculative attempt writes the same bytes
and a killed one leaves only its attempt directory, which the driver removes (with ``_attempts``)
before returning. The driver checks that every file the tasks reported exists with its row count.

Spark sessions (:func:`session`): executors run ``PYSPARK_PYTHON`` (default: this interpreter) with
the project importable (installed, on PYTHONPATH, or shipped: README "Running on Spark"); for a
``local*`` master everything binds to 127.0.0.1 and the web UI is off.

Run under ``spark-submit`` (the Dagster assets do it through Dagster Pipes, largetrain_dagster.engine)::

    spark-submit --master local[2] largetrain_core/spark_prep.py JOB.json

JOB.json: ``{"stage": "ingest"|"clean"|"deduplicate", "args": {...}, "stats": PATH}``; the stage's
counts are written to ``stats``, progress and Spark stage completion go to Dagster Pipes when the
process was started by Dagster (else to stderr).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark import StorageLevel, TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from largetrain_core.clean import QualityConfig, clean_corpus
from largetrain_core.corpus import ReaderConfig, Scan, _shown, ingest as local_ingest, scan
from largetrain_core.dedup import (ASSIGNMENT_SCHEMA, DUP_SCHEMA, DedupConfig, band_column, same_value_edges, write_kept,
                                   write_signatures)
from largetrain_core.readers import REJECT_SCHEMA, RENAMED_SCHEMA, Source, reader_for
from largetrain_core.storage import part_files, write_json_atomic

MANIFEST = "item long, stats string"
# JVM settings for local* masters: short-lived single-machine applications start and finish faster
# with the C1 compiler only and the serial collector (here about 40% less wall time per asset); the
# JVMs do little work of their own (the rules run in Python workers)
LOCAL_JVM_CONF = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
                  "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}  # what every task returns: its item (chunk / part) and its counts as JSON


# ------------------------------------------------------------------------------------------------ session


def session(master: str | None = None, app_name: str = "largetrain-prep", conf: dict | None = None) -> SparkSession:
    """A SparkSession for the data-prep stages.

    ``master``: a Spark master URL (``local[*]``, ``local-cluster[2,1,1024]``, ``spark://host:7077``,
    ``k8s://...``, ``yarn``) or None to take the one ``spark-submit`` was given. Executors run
    ``PYSPARK_PYTHON`` (default this interpreter) with POLARS_MAX_THREADS and OMP_NUM_THREADS set to
    ``spark.executor.cores`` (default 1), so a task uses the cores it was given. A ``local*`` master
    binds driver, block manager and workers to 127.0.0.1 (SPARK_LOCAL_IP), turns the web UI off and
    starts the JVMs with :data:`LOCAL_JVM_CONF`.
    ``conf``: more Spark settings, applied last.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    b = SparkSession.builder.appName(app_name)
    if master:
        b = b.master(master)
    effective = master or os.environ.get("MASTER", "") or _submitted_master()
    settings: dict[str, str] = {}
    if effective.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                         "spark.ui.enabled": "false", **LOCAL_JVM_CONF})
    cores = str((conf or {}).get("spark.executor.cores", "1"))
    settings.update({"spark.executorEnv.PYSPARK_PYTHON": os.environ["PYSPARK_PYTHON"],
                     "spark.executorEnv.POLARS_MAX_THREADS": cores, "spark.executorEnv.OMP_NUM_THREADS": cores,
                     "spark.sql.execution.arrow.maxRecordsPerBatch": "1024", "spark.ui.showConsoleProgress": "false"})
    if os.environ.get("PYTHONPATH"):
        settings["spark.executorEnv.PYTHONPATH"] = os.environ["PYTHONPATH"]
    settings.update({k: str(v) for k, v in (conf or {}).items()})
    for k, v in settings.items():
        b = b.config(k, v)
    return b.getOrCreate()


def _submitted_master() -> str:
    """The --master of spark-submit, which passes it to the driver as the system property spark.master
    (visible here only through the JVM once started: read from the submit arguments instead)."""
    args = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    m = re.search(r"--master\s+(\S+)", args)
    return m.group(1) if m else ""


# ------------------------------------------------------------------------------------------------ commits


def _attempt_dir(out_dir: str, item: int) -> Path:
    """A fresh directory for ``item`` in this task attempt under ``out_dir/_attempts`` (which must exist:
    a late attempt after the driver removed it fails instead of writing anywhere)."""
    ctx = TaskContext.get()
    name = (f"{ctx.stageId()}-{ctx.partitionId()}-{ctx.attemptNumber()}-{ctx.taskAttemptId()}" if ctx else "driver") + f"-{item}"
    d = Path(out_dir) / "_attempts" / name
    d.mkdir()
    return d


def _publish(src: Path, dst: Path) -> None:
    """Rename a complete file to its final name (atomic; the same bytes whichever attempt wins)."""
    os.replace(src, dst)


def _finish(out_dir: Path, expected: dict[Path, int]) -> None:
    """Check every reported file (its Parquet row count, or existence for other files, count -1) and
    remove the attempt directories. Raises RuntimeError naming a missing or short file."""
    for f, rows in expected.items():
        if not f.exists():
            raise RuntimeError(f"Spark task output {f} is missing")
        if rows >= 0 and pq.ParquetFile(f).metadata.num_rows != rows:
            raise RuntimeError(f"Spark task output {f} has {pq.ParquetFile(f).metadata.num_rows} rows, expected {rows}")
    shutil.rmtree(out_dir / "_attempts", ignore_errors=True)


BYTES_PER_TASK = 8 << 20  # default of spark.largetrain.bytesPerTask


def _runs(spark: SparkSession, items: list[tuple[int, str]], sizes: list[int]) -> tuple[DataFrame, object]:
    """``items`` (item, payload) cut into contiguous runs, one Spark task each, balanced by ``sizes``
    (bytes): two runs per core at least, more while runs stay above ``spark.largetrain.bytesPerTask``
    (default 8 MiB), at most four per core, and a multiple of the cores (as many items allowing), so
    that every core gets the same share of bytes in every stage (time per task is about proportional
    to its bytes). Returns a DataFrame of one row per run (``id``, one partition each) and the runs as
    a broadcast variable, which the tasks read (:func:`_items_of`)."""
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


_STEP = {"name": ""}  # the step the driver is in, for the progress log


def _describe(spark: SparkSession, description: str) -> None:
    """Name the next jobs (Spark's job description) and the step shown in the progress log."""
    spark.sparkContext.setJobDescription(description)
    _STEP["name"] = description


def _manifest(spark: SparkSession, items: list[tuple[int, str]], sizes: list[int], task: Callable, spec: dict,
              description: str) -> list[tuple[int, dict]]:
    """Run ``task(spec, batches)`` over the runs of ``items`` (mapInArrow) and collect each item's
    (item, stats), sorted by item."""
    if not items:
        return []
    _describe(spark, description)
    df, runs = _runs(spark, items, sizes)
    try:
        rows = df.mapInArrow(partial(task, {**spec, "runs": runs}), MANIFEST).collect()
    finally:
        runs.destroy()
    return sorted((r.item, json.loads(r.stats)) for r in rows)


def _items_of(spec: dict, batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[int, str]]:
    """The (item, payload) of the runs whose ids the task got."""
    for b in batches:
        for run in b.column("id").to_pylist():
            yield from spec["runs"].value[run]


def _manifest_batch(item: int, stats: dict) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"item": [item], "stats": [json.dumps(stats)]})


# ------------------------------------------------------------------------------------------------ raw_corpus


def _ingest_task(spec: dict, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The task's run of files as one chunk (numbered by its first file), read by corpus.ingest."""
    items = list(_items_of(spec, batches))
    if not items:
        return
    chunk, rels = items[0][0], [rel for _, payload in items for rel in json.loads(payload)]
    out = Path(spec["out"])
    tmp = _attempt_dir(spec["out"], chunk)
    (tmp / "out").mkdir()
    if spec["whole"]:  # one file, or a piece of one: read as the local engine reads it
        stats = local_ingest(spec["config"], tmp / "out")
    else:  # the run's files, each named by its path relative to the corpus root (the local engine's ids)
        base = Path(spec["base"])
        listed = Scan([Source(base / rel, rel, reader_for(Path(rel).name)) for rel in rels], [], base)
        stats = local_ingest(spec["config"], tmp / "out", listed)
    stats["part_rows"] = []
    for j, part in enumerate(part_files(tmp / "out")):
        stats["part_rows"].append(pq.ParquetFile(part).metadata.num_rows)
        _publish(part, out / "_chunks" / f"{chunk:06d}-{j:05d}.parquet")
    for name in ("rejected", "renamed_ids"):
        _publish(tmp / "out" / f"{name}.parquet", out / "_chunks" / f"{chunk:06d}-{name}.parquet")
    yield _manifest_batch(chunk, stats)


def ingest(spark: SparkSession, config: ReaderConfig, out_dir: Path) -> dict:
    """corpus.ingest on Spark: the same documents (ids, order, text), rejected records, renamed ids and
    counts. Part files are cut per chunk of files, so their boundaries (not their contents in order)
    can differ from the local engine's.

    Document ids are unique within a read (readers.Collector renames a repeated id): when an id
    repeats across chunks, the partition is read again as one chunk, as the local engine reads it.
    Raises what corpus.scan raises."""
    out_dir = Path(out_dir)
    listed = scan(config.path, config.partition, config.partitions)
    (out_dir / "skipped_files.txt").write_text(
        "".join(_shown(f.relative_to(listed.base).as_posix()) + "\n" for f in listed.skipped))
    whole = Path(config.path).is_file() or any(src.piece for src in listed.sources)
    rels = [src.rel for src in listed.sources]
    sizes = [src.path.stat().st_size for src in listed.sources]
    spec = {"config": config, "out": str(out_dir), "base": str(listed.base), "whole": whole}
    if whole:  # one task: the file (or its piece) is read as one stream
        items, sizes = ([(0, json.dumps(rels))] if rels else []), sizes[:1]
    else:
        items = [(i, json.dumps([r])) for i, r in enumerate(rels)]
    for attempt in ("chunks", "one chunk"):
        for d in ("_attempts", "_chunks"):
            shutil.rmtree(out_dir / d, ignore_errors=True)
            (out_dir / d).mkdir()
        manifest = _manifest(spark, items, sizes, _ingest_task, spec, "raw_corpus: read files")
        _finish(out_dir, {out_dir / "_chunks" / f"{chunk:06d}-{j:05d}.parquet": n
                          for chunk, s in manifest for j, n in enumerate(s["part_rows"])})
        if len(manifest) < 2 or not _ids_repeat(out_dir / "_chunks"):
            break
        items = [(0, json.dumps(rels))]  # ids repeat across chunks: read as the local engine does, in one stream
    stats = {"documents": 0, "rejected": 0, "renamed_ids": 0, "bytes": 0, "not_sampled": 0, "parts": 0,
             "files": len(listed.sources), "skipped_files": len(listed.skipped)}
    tables: dict[str, list] = {"rejected": [], "renamed_ids": []}
    for chunk, s in manifest:  # corpus order: chunks, then their parts
        for name in tables:
            tables[name].append(pq.read_table(out_dir / "_chunks" / f"{chunk:06d}-{name}.parquet"))
        for k in ("rejected", "renamed_ids", "not_sampled", "bytes"):
            stats[k] += s[k]
        for j, n in enumerate(s["part_rows"]):
            part = out_dir / "_chunks" / f"{chunk:06d}-{j:05d}.parquet"
            room = n if config.max_documents is None else max(0, config.max_documents - stats["documents"])
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
    rejected = pa.concat_tables(tables["rejected"]) if tables["rejected"] else REJECT_SCHEMA.empty_table()
    pq.write_table(rejected, out_dir / "rejected.parquet")
    pq.write_table(pa.concat_tables(tables["renamed_ids"]) if tables["renamed_ids"] else RENAMED_SCHEMA.empty_table(),
                   out_dir / "renamed_ids.parquet")
    by_file = pl.from_arrow(rejected.select(["source"])).group_by("source").len().sort(["len", "source"], descending=[True, False])
    stats["rejected_by_file"] = dict(by_file.head(10).iter_rows())
    shutil.rmtree(out_dir / "_chunks")
    return stats


def _ids_repeat(chunks: Path) -> bool:
    """Whether a document id occurs twice among the chunks' part files (only across chunks: each
    chunk's reader made its own ids unique)."""
    parts = sorted(chunks.glob("*-[0-9]*.parquet"))
    return bool(parts) and pl.scan_parquet(parts).select(pl.col("doc_id").is_duplicated().any()).collect().item()


def _text_bytes(table: pa.Table) -> int:
    import pyarrow.compute as pc

    return int(pc.sum(pc.binary_length(table.column("text"))).as_py() or 0) if table.num_rows else 0


# ------------------------------------------------------------------------------------------------ cleaned_text


def _clean_task(spec: dict, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    cfg, out = spec["quality"], Path(spec["out"])
    for i, path in _items_of(spec, batches):
        tmp = _attempt_dir(spec["out"], i)
        (tmp / "in").mkdir()
        (tmp / "out").mkdir()
        (tmp / "in" / "part-00000.parquet").symlink_to(path)
        totals = clean_corpus(tmp / "in", tmp / "out", cfg)  # normalization + every rule, the local engine's code
        _publish(tmp / "out" / "part-00000.parquet", out / f"part-{i:05d}.parquet")
        _publish(tmp / "out" / "filtered.parquet", out / "_filtered" / f"{i:05d}.parquet")
        yield _manifest_batch(i, totals)


def clean(spark: SparkSession, in_dir: Path, out_dir: Path, cfg: QualityConfig) -> dict:
    """clean.clean_corpus on Spark, one task per run of part files: the same part files (byte for
    byte), ``filtered.parquet`` (same rows in order) and counts."""
    out_dir = Path(out_dir)
    parts = part_files(in_dir)
    for d in ("_attempts", "_filtered"):
        (out_dir / d).mkdir()
    spec = {"quality": cfg, "out": str(out_dir)}
    items = [(i, str(p.resolve())) for i, p in enumerate(parts)]
    manifest = _manifest(spark, items, [p.stat().st_size for p in parts], _clean_task, spec, "cleaned_text: normalize and filter")
    _finish(out_dir, {**{out_dir / f"part-{i:05d}.parquet": s["kept"] for i, s in manifest},
                      **{out_dir / "_filtered" / f"{i:05d}.parquet": s["filtered"] for i, s in manifest}})
    empty = out_dir / "_filtered" / "empty"  # clean_corpus of no part: the counts' keys at 0, the filtered schema
    (empty / "in").mkdir(parents=True)
    (empty / "out").mkdir()
    totals = clean_corpus(empty / "in", empty / "out", cfg)
    for _, s in manifest:
        for k, v in s.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                totals[k] = totals.get(k, 0) + v
    filtered = [pl.read_parquet(out_dir / "_filtered" / f"{i:05d}.parquet") for i, _ in manifest]
    table = pl.concat(filtered) if filtered else pl.read_parquet(empty / "out" / "filtered.parquet")
    table.write_parquet(out_dir / "filtered.parquet")
    shutil.rmtree(out_dir / "_filtered")
    counts = table.group_by("reason").len().sort("reason")
    totals["filtered_by_reason"] = dict(zip(counts["reason"].to_list(), counts["len"].to_list()))
    return totals


# ------------------------------------------------------------------------------------------------ deduplicated_text


def _signature_schema(cfg: DedupConfig) -> str:
    bands = "".join(f", {band_column(b)} long" for b in range(cfg.bands)) if cfg.near else ""
    return f"row long, part long, doc_id string, key_hash long, n_words long{bands}"


def _signature_rows(t: pa.Table, first: int, part: int, cfg: DedupConfig) -> Iterator[pa.RecordBatch]:
    """A signature table (dedup.signature_table) as the rows of the Spark signature frame: its global
    rows from ``first``, its part, and the uint64 hashes as int64 (the same bits; Spark has no uint64)."""
    n = t.num_rows
    cols = {"row": pa.array(np.arange(first, first + n, dtype=np.int64)), "part": pa.array(np.full(n, part, np.int64)),
            "doc_id": t.column("doc_id").cast(pa.string()),
            "key_hash": pa.array(t.column("key_hash").to_numpy().view(np.int64))}
    cols["n_words"] = t.column("n_words") if cfg.near else pa.array(np.zeros(n, np.int64))
    for b in range(cfg.bands if cfg.near else 0):
        cols[band_column(b)] = pa.array(t.column(band_column(b)).to_numpy().view(np.int64))
    yield from pa.table(cols).to_batches(max_chunksize=1024)


def _signature_task(spec: dict, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Per part: dedup.write_signatures (the local engine's signature file, published under
    signatures/), then its rows to Spark."""
    for i, payload in _items_of(spec, batches):
        path, first = json.loads(payload)
        tmp = _attempt_dir(spec["out"], i)
        write_signatures([Path(path)], tmp / "sig.parquet", spec["dedup"])
        t = pq.read_table(tmp / "sig.parquet")
        _publish(tmp / "sig.parquet", Path(spec["out"]) / "signatures" / f"part-{i:05d}.parquet")
        yield from _signature_rows(t, first, i, spec["dedup"])


def _read_signatures_task(spec: dict, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for i, payload in _items_of(spec, batches):
        path, first = json.loads(payload)
        yield from _signature_rows(pq.read_table(path), first, i, spec["dedup"])


def signature_frame(spark: SparkSession, signature_files: list[Path], cfg: DedupConfig = DedupConfig()) -> DataFrame:
    """Signature files already written (dedup.write_signatures, e.g. a deduplicated_text's
    ``signatures/``) as the Spark signature frame, global rows in file order; for :func:`duplicates`."""
    counts = [pq.ParquetFile(f).metadata.num_rows for f in signature_files]
    firsts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    items = [(i, json.dumps([str(Path(f).resolve()), int(firsts[i])])) for i, f in enumerate(signature_files)]
    df, runs = _runs(spark, items, [Path(f).stat().st_size for f in signature_files])
    return df.mapInArrow(partial(_read_signatures_task, {"dedup": cfg, "runs": runs}), _signature_schema(cfg))


def duplicates(sig: DataFrame, cfg: DedupConfig,
               log: Callable[[str], None] = lambda m: None) -> tuple[DataFrame, dict, DataFrame]:
    """The global step on Spark: from the signature frame (persisted by the caller) to one row per
    duplicate: part, row (global), doc_id, cluster_id (the kept copy's row), duplicate_of (its doc_id),
    kind ("exact" when the key hashes are equal, else "near"), key_hash (int64 bits), not persisted
    (the caller computes it once); and its counts ``duplicate`` (the stars' leaves) and ``clusters``
    (their centres: the kept copies with at least one duplicate; the local engine counts distinct
    kept doc ids, the same number as document ids are unique in a deduplicated_text input, which the
    asset checks), from the connected components' last job; and the stars (u, v), persisted: the
    caller unpersists them after its action on the duplicates."""
    stars, found = connected_components(candidate_edges(sig, cfg), log)
    member = sig.select(F.col("row").alias("u"), "part", "doc_id", "key_hash")
    root = sig.select(F.col("row").alias("v"), F.col("doc_id").alias("duplicate_of"), F.col("key_hash").alias("root_key"))
    dups = stars.join(member, "u").join(root, "v").select(
        "part", F.col("u").alias("row"), "doc_id", F.col("v").alias("cluster_id"), "duplicate_of",
        F.when(F.col("key_hash") == F.col("root_key"), F.lit("exact")).otherwise(F.lit("near")).alias("kind"), "key_hash")
    return dups, {"duplicate": found["leaves"], "clusters": found["centres"]}, stars


@contextlib.contextmanager
def global_step_settings(spark: SparkSession, documents: int, cfg: DedupConfig):
    """Spark SQL settings of the global step, restored on exit: :func:`shuffle_partitions`, and
    adaptive query execution off. AQE re-plans after every shuffle stage, each re-plan a job of its
    own (here 17 jobs instead of 5 for the kernel docs, about 2 s of driver round trips); the shuffle
    partitions are set from the document count and AQE does not coalesce persisted plans; the joins
    are planned statically (broadcast below spark.sql.autoBroadcastJoinThreshold)."""
    settings = {"spark.sql.shuffle.partitions": str(shuffle_partitions(spark, documents, cfg)),
                "spark.sql.adaptive.enabled": "false"}
    previous = {k: spark.conf.get(k) for k in settings}
    for k, v in settings.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in previous.items():
            spark.conf.set(k, v)


def shuffle_partitions(spark: SparkSession, documents: int, cfg: DedupConfig) -> int:
    """Shuffle partitions of the global step: about 2 million (band, hash) rows each, at least 2 per
    core (AQE does not coalesce the partitions of persisted plans)."""
    return max(2 * spark.sparkContext.defaultParallelism, -(-documents * (cfg.bands + 1) // 2_000_000))


def _edges_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One shuffle partition of (band, h, row): every (band, hash) of it is here whole. Edges (row,
    smallest row with the same band and hash) by the local engine's sort (dedup.same_value_edges)."""
    batches = list(batches)
    t = pa.Table.from_batches(batches) if batches else None
    if t is None or not t.num_rows:
        return
    band, h, rows = (t.column(c).to_numpy() for c in ("band", "h", "row"))
    order = np.argsort(rows, kind="stable")  # rows ascending: the first of each value is the smallest
    band, h, rows = band[order], h[order], rows[order]
    for b in np.unique(band):
        sel = band == b
        u, v = same_value_edges(h[sel], rows[sel])
        if len(u):
            yield pa.RecordBatch.from_pydict({"u": u, "v": v})


def candidate_edges(sig: DataFrame, cfg: DedupConfig) -> DataFrame:
    """Edges (u, v), u > v: every row paired with the smallest row sharing its key hash (band -1) or,
    for documents with words, one of its band hashes. One shuffle, hash-partitioned on (band, hash),
    no sort; each partition's groups found in numpy (:func:`_edges_task`)."""
    hashes = [F.col("key_hash")] + ([F.col(band_column(b)) for b in range(cfg.bands)] if cfg.near else [])
    exploded = sig.select("row", F.posexplode(F.when(F.col("n_words") > 0, F.array(*hashes))
                                              .otherwise(F.array(F.col("key_hash")))).alias("band", "h"))
    parts = int(sig.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    return (exploded.repartition(parts, "band", "h").mapInArrow(_edges_task, "u long, v long").distinct())


def connected_components(edges: DataFrame, log: Callable[[str], None] = lambda m: None) -> tuple[DataFrame, dict]:
    """Connected components of the undirected graph ``edges`` (u, v), u > v, by alternating large-star
    and small-star (Kiveris et al. 2014, algorithm "Alternating", O(log^2 n) rounds): returns (u, v)
    with one row per node that is not the smallest of its component, v = that smallest node, and the
    counts ``leaves`` (its rows) and ``centres`` (the components).

    Large-star: every node x links each larger neighbour y to m(x), the smallest of x and its
    neighbours. Small-star: every node u links itself and each smaller neighbour to the smallest of
    them. Stops at the fixed point, when the graph is a set of stars (no node is both a leaf and a
    centre, no leaf has two centres), whose centres are then the components' smallest nodes.
    Each round's edges are persisted (the plan of the next round reads them, not their lineage; a
    lost block is recomputed from the lineage, deterministically). The result stays persisted."""
    u, v = F.col("u"), F.col("v")

    def stars_or_not(e: DataFrame, rnd: int) -> dict | None:
        """One job: materializes the round's edges and tests the fixed point, a set of stars (no node
        is a leaf twice, none both a leaf and a centre); the candidate pairs often are one already.
        Returns the stars' ``leaves`` (edges) and ``centres`` at the fixed point, else None."""
        nodes = (e.select(u.alias("n"), F.lit(1).alias("leaf"), F.lit(0).alias("centre"))
                 .unionByName(e.select(v.alias("n"), F.lit(0).alias("leaf"), F.lit(1).alias("centre")))
                 .groupBy("n").agg(F.sum("leaf").alias("l"), F.sum("centre").alias("c")))
        check = nodes.agg(F.sum("l").alias("edges"), F.sum(F.when((F.col("l") > 1) | ((F.col("l") > 0) & (F.col("c") > 0)), 1)
                                                            .otherwise(0)).alias("bad"),
                          F.sum(F.when(F.col("c") > 0, 1).otherwise(0)).alias("centres")).first()
        log(f"connected components: round {rnd}, {check['edges'] or 0} edges, {check['bad'] or 0} nodes not in a star")
        return None if check["bad"] else {"leaves": int(check["edges"] or 0), "centres": int(check["centres"] or 0)}

    e = edges.persist(StorageLevel.MEMORY_AND_DISK)
    for rnd in range(200):
        if (found := stars_or_not(e, rnd)) is not None:
            return e, found
        both = e.select(u.alias("x"), v.alias("y")).unionByName(e.select(v.alias("x"), u.alias("y")))
        m = both.groupBy("x").agg(F.least(F.min("y"), F.col("x")).alias("m"))
        large = both.join(m, "x").where(F.col("y") > F.col("x")).select(F.col("y").alias("u"), F.col("m").alias("v")).distinct()
        m2 = large.groupBy("u").agg(F.min("v").alias("m"))
        small = (large.join(m2, "u").where(v != F.col("m")).select(v.alias("u"), F.col("m").alias("v"))
                 .unionByName(m2.select("u", F.col("m").alias("v"))).distinct()).persist(StorageLevel.MEMORY_AND_DISK)
        small.count()  # computed from the cached edges of this round before they are dropped
        e.unpersist()
        e = small
    raise RuntimeError("connected components did not converge in 200 rounds")


def _by_part_task(spec: dict, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One shuffle partition of the duplicates (every part's rows are in one partition): each part's
    rows to ``_by_part/<part>.parquet``, published; its manifest row (part, {"rows": n})."""
    batches = list(batches)
    t = pa.Table.from_batches(batches) if batches else None
    if t is None or not t.num_rows:
        return
    part = t.column("part").to_numpy()
    order = np.argsort(part, kind="stable")
    t, part = t.take(pa.array(order)), part[order]
    starts = np.flatnonzero(np.r_[True, part[1:] != part[:-1]])
    for a, b in zip(starts, np.r_[starts[1:], len(part)]):
        i = int(part[a])
        tmp = _attempt_dir(spec["out"], i)
        pq.write_table(t.slice(a, b - a).drop_columns(["part"]), tmp / "dups.parquet")
        _publish(tmp / "dups.parquet", Path(spec["out"]) / "_by_part" / f"{i:05d}.parquet")
        yield _manifest_batch(i, {"rows": int(b - a)})


def _write_task(spec: dict, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Per part: its kept documents (dedup.write_kept) and its duplicates frame, published."""
    out = Path(spec["out"])
    for i, payload in _items_of(spec, batches):
        path, first = json.loads(payload)
        f = out / "_by_part" / f"{i:05d}.parquet"
        d = pl.read_parquet(f).sort("row") if i in spec["with_duplicates"] else pl.DataFrame(schema=ASSIGNMENT_SCHEMA)
        d = d.with_columns(pl.col("row") - first, pl.col("key_hash").cast(pl.Int64).reinterpret(signed=False)).select(*ASSIGNMENT_SCHEMA)
        tmp = _attempt_dir(spec["out"], i)
        frame = write_kept(Path(path), d, tmp / "part.parquet")
        frame.write_parquet(tmp / "dups.parquet")
        _publish(tmp / "part.parquet", out / f"part-{i:05d}.parquet")
        _publish(tmp / "dups.parquet", out / "_dups" / f"{i:05d}.parquet")
        rows = pq.ParquetFile(path).metadata.num_rows
        yield _manifest_batch(i, {"input": rows, "duplicate": frame.height,
                                  "duplicate_exact": int((frame["kind"] == "exact").sum())})


def deduplicate(spark: SparkSession, in_dir: Path | list[Path], out_dir: Path, cfg: DedupConfig = DedupConfig(),
                log: Callable[[str], None] = lambda m: None) -> dict:
    """dedup.deduplicate on Spark: the same ``signatures/``, kept part files, ``duplicates.parquet`` rows
    (kept copy, cluster id, kind) and counts; the clustering distributed (module docstring).

    Jobs: signatures with candidate pairs and the connected components' rounds (each round one job,
    usually one round); the duplicates written by part (one shuffle on the part, ``_by_part/``); the
    kept documents written per run of parts, the same balanced runs as the signatures'."""
    out_dir = Path(out_dir)
    parts = part_files(in_dir)
    for d in ("_attempts", "signatures", "_dups", "_by_part"):
        (out_dir / d).mkdir()
    counts = [pq.ParquetFile(p).metadata.num_rows for p in parts]
    firsts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    n = int(firsts[-1])
    spec = {"dedup": cfg, "out": str(out_dir)}
    items = [(i, json.dumps([str(p.resolve()), int(firsts[i])])) for i, p in enumerate(parts)]
    sizes = [p.stat().st_size for p in parts]
    with global_step_settings(spark, n, cfg):
        runs_df, runs = _runs(spark, items, sizes)
        _describe(spark, "deduplicated_text: MinHash signatures")
        sig = (runs_df.mapInArrow(partial(_signature_task, {**spec, "runs": runs}), _signature_schema(cfg))
               .persist(StorageLevel.MEMORY_AND_DISK))
        log(f"signatures of {n} documents in {len(parts)} parts, {spark.conf.get('spark.sql.shuffle.partitions')} shuffle partitions")
        _describe(spark, "deduplicated_text: candidate pairs (shuffle on band, hash) and connected components")
        dups, found, stars = duplicates(sig, cfg, log)
        _describe(spark, "deduplicated_text: duplicates by part")
        by_part = {}
        if found["duplicate"]:
            rows = dups.repartition("part").mapInArrow(partial(_by_part_task, spec), MANIFEST).collect()
            by_part = {r.item: json.loads(r.stats)["rows"] for r in rows}
        _finish(out_dir, {out_dir / "_by_part" / f"{i:05d}.parquet": n for i, n in by_part.items()})
        (out_dir / "_attempts").mkdir()
        stars.unpersist()
        sig.unpersist()
        runs.destroy()
    manifest = _manifest(spark, items, sizes, _write_task, {**spec, "with_duplicates": set(by_part)},
                         "deduplicated_text: write kept documents")
    _finish(out_dir, {**{out_dir / f"part-{i:05d}.parquet": s["input"] - s["duplicate"] for i, s in manifest},
                      **{out_dir / "_dups" / f"{i:05d}.parquet": s["duplicate"] for i, s in manifest},
                      **{out_dir / "signatures" / f"part-{i:05d}.parquet": counts[i] for i in range(len(parts))}})
    written = sum(s["duplicate"] for _, s in manifest)
    if written != found["duplicate"]:
        raise RuntimeError(f"Spark wrote {written} duplicates, the connected components found {found['duplicate']}")
    _concat_parquet([out_dir / "_dups" / f"{i:05d}.parquet" for i, _ in manifest], out_dir / "duplicates.parquet",
                    pl.DataFrame(schema=DUP_SCHEMA).to_arrow().schema)
    shutil.rmtree(out_dir / "_dups")
    shutil.rmtree(out_dir / "_by_part")
    exact = sum(s["duplicate_exact"] for _, s in manifest)
    return {"input": n, "kept": n - found["duplicate"], **found, "duplicate_exact": exact,
            "duplicate_near": found["duplicate"] - exact}


def _concat_parquet(files: list[Path], out: Path, schema: pa.Schema) -> None:
    """The rows of ``files`` in order into one Parquet file, one file at a time (bounded memory)."""
    with pq.ParquetWriter(out, schema) as w:
        for f in files:
            t = pq.read_table(f)
            if t.num_rows:
                w.write_table(t.cast(schema))


# ------------------------------------------------------------------------------------------------ progress


@contextlib.contextmanager
def progress(spark: SparkSession, log: Callable[[str], None], every: float = 1.0):
    """Log Spark stage progress (``Spark stage N [step]: done/total tasks, running``) from a thread
    polling the status tracker every ``every`` seconds, and each stage's completion."""
    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()
    seen: dict[int, tuple] = {}

    def poll():
        while not stop.wait(every):
            try:
                active = set(tracker.getActiveStageIds())
                for sid in sorted(active):
                    info = tracker.getStageInfo(sid)
                    if info is None:
                        continue
                    state = (info.numCompletedTasks, info.numActiveTasks, info.numFailedTasks)
                    if seen.get(sid, (None,))[1:] != state:
                        failed = f", {info.numFailedTasks} failed (retried)" if info.numFailedTasks else ""
                        log(f"Spark stage {sid} [{_STEP['name']}]: {info.numCompletedTasks}/{info.numTasks} tasks done, "
                            f"{info.numActiveTasks} running{failed}")
                        seen[sid] = (info.numTasks, *state)
                for sid in sorted(set(seen) - active):
                    log(f"Spark stage {sid} finished ({seen.pop(sid)[0]} tasks)")
            except Exception:  # noqa: BLE001 -- the context is stopping; progress is best effort
                return

    t = threading.Thread(target=poll, name="spark-progress", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(timeout=5)


# ------------------------------------------------------------------------------------------------ job


STAGES = ("ingest", "clean", "deduplicate")


def _tuples(value):
    """JSON lists back into the tuples of the config dataclasses (dataclasses.asdict keeps tuples, JSON does not)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def run_stage(spark: SparkSession, stage: str, args: dict, log: Callable[[str], None]) -> dict:
    """Run one stage from its JSON arguments (as written by largetrain_dagster.engine)."""
    out = Path(args["out_dir"])
    if stage == "ingest":
        return ingest(spark, ReaderConfig(**args["reader"]), out)
    if stage == "clean":
        return clean(spark, Path(args["in_dir"]), out, QualityConfig(**{k: _tuples(v) for k, v in args["quality"].items()}))
    if stage == "deduplicate":
        return deduplicate(spark, [Path(d) for d in args["in_dirs"]], out, DedupConfig(**args["dedup"]), log)
    raise ValueError(f"unknown stage {stage!r}: one of {STAGES}")


def main(argv: list[str]) -> int:
    """``spark-submit .../spark_prep.py JOB.json``: run the job's stage, write its counts to job["stats"]."""
    job = json.loads(Path(argv[0]).read_text())
    with contextlib.ExitStack() as stack:
        pipes = None
        if os.environ.get("DAGSTER_PIPES_CONTEXT"):
            from dagster_pipes import open_dagster_pipes

            pipes = stack.enter_context(open_dagster_pipes())
        lock = threading.Lock()

        def log(msg: str) -> None:
            with lock:
                print(msg, file=sys.stderr, flush=True)
                if pipes:
                    pipes.log.info(msg)

        t0 = time.perf_counter()
        spark = session(conf=job.get("conf"))
        stack.callback(spark.stop)
        sc = spark.sparkContext
        started = time.perf_counter() - t0
        log(f"Spark {spark.version} application {sc.applicationId} on {sc.master} "
            f"(default parallelism {sc.defaultParallelism}), session started in {started:.1f} s")
        with progress(spark, log):
            stats = run_stage(spark, job["stage"], job["args"], log)
        meta = {"spark_application_id": sc.applicationId, "spark_master": sc.master, "spark_version": spark.version,
                "spark_default_parallelism": sc.defaultParallelism, "spark_session_start_seconds": round(started, 3)}
        write_json_atomic(Path(job["stats"]), {"stats": stats, "spark": meta})
        if pipes:
            pipes.report_custom_message(meta)
        log(f"{job['stage']} done in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from largetrain_core import spark_prep

    raise SystemExit(spark_prep.main(sys.argv[1:]))
