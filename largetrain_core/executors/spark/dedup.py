"""deduplicated_text on Spark: MinHash signatures per part (dedup.write_signatures, same parameters and
seeds; the signature files are the local executor's), sent to Spark through ``mapInArrow``; the key
hash and the band hashes are exploded to (band, hash, row) and grouped in one shuffle (the exact pass
is band -1: a shuffle on the normalized key's hash); each group of two or more rows gives the edges
(row, smallest row); their connected components (largetrain_core.executors.spark.components) are the
candidate clusters. With near duplicates they are verified on the driver by the local engine's
function (dedup.verify_assignment: the candidate documents' texts read once, exact Jaccard per
candidate pair), so the output is the local engine's. No process holds data for every document: the
driver holds the list of part files and the candidate documents, executors their shuffle partitions. The duplicates are shuffled on their part and
written one file per part; the kept documents are then written per part (dedup.write_kept), in the
same byte-balanced runs of parts as the signatures. The global step runs without adaptive query
execution (:func:`global_step_settings`), its counts from the last connected-components job and the
write tasks (no job of its own)."""

from __future__ import annotations

import contextlib
import json
import shutil
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from largetrain_core import fs
from largetrain_core.dedup import (
    ASSIGNMENT_SCHEMA,
    DUP_SCHEMA,
    UNVERIFIED_SCHEMA,
    UNVERIFIED,
    DedupConfig,
    VerifyConfig,
    band_column,
    partition_signatures,
    same_value_edges,
    verify_assignment,
    write_kept,
    write_signatures,
)
from largetrain_core.executors.spark.commit import Uploads, attempt, check_outputs, input_location, publish, task_input
from largetrain_core.executors.spark.components import connected_components
from largetrain_core.executors.spark.progress import Progress
from largetrain_core.executors.spark.tasks import MANIFEST, items_of, manifest_batch, plan_runs, run_tasks
from largetrain_core.storage import part_files


def _signature_schema(cfg: DedupConfig) -> str:
    bands = "".join(f", {band_column(b)} long" for b in range(cfg.bands)) if cfg.near else ""
    return f"row long, part long, doc_id string, key_hash long, n_words long{bands}"


def _signature_rows(t: pa.Table, first: int, part: int, cfg: DedupConfig) -> Iterator[pa.RecordBatch]:
    """A signature table (dedup.signature_table) as the rows of the Spark signature frame: its global
    rows from ``first``, its part, and the uint64 hashes as int64 (the same bits; Spark has no uint64)."""
    n = t.num_rows
    cols = {
        "row": pa.array(np.arange(first, first + n, dtype=np.int64)),
        "part": pa.array(np.full(n, part, np.int64)),
        "doc_id": t.column("doc_id").cast(pa.string()),
        "key_hash": pa.array(t.column("key_hash").to_numpy().view(np.int64)),
    }
    cols["n_words"] = t.column("n_words") if cfg.near else pa.array(np.zeros(n, np.int64))
    for b in range(cfg.bands if cfg.near else 0):
        cols[band_column(b)] = pa.array(t.column(band_column(b)).to_numpy().view(np.int64))
    yield from pa.table(cols).to_batches(max_chunksize=1024)


def _signature_task(spec: dict, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Per part: dedup.write_signatures (the local engine's signature file, published under
    signatures/), then its rows to Spark."""
    for i, payload in items_of(spec, batches):
        location, first = json.loads(payload)
        with attempt(spec, i) as tmp:
            with task_input(location, tmp) as path:
                write_signatures([path], tmp / "sig.parquet", spec["dedup"])
            t = pq.read_table(tmp / "sig.parquet")
            publish(spec, tmp / "sig.parquet", f"signatures/part-{i:05d}.parquet")
        yield from _signature_rows(t, first, i, spec["dedup"])


def _read_signatures_task(spec: dict, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for i, payload in items_of(spec, batches):
        location, first = json.loads(payload)
        if fs.is_url(location):  # read through largetrain_core.fs
            with fs.open_input(location) as f:
                t = pq.read_table(f)
        else:
            t = pq.read_table(location)
        yield from _signature_rows(t, first, i, spec["dedup"])


def signature_frame(spark: SparkSession, signature_files: list[Path], cfg: DedupConfig = DedupConfig()) -> DataFrame:
    """Signature files already written (dedup.write_signatures, e.g. a deduplicated_text's
    ``signatures/``) as the Spark signature frame, global rows in file order; for :func:`duplicates`."""
    counts = [pq.ParquetFile(f).metadata.num_rows for f in signature_files]
    firsts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    items = [(i, json.dumps([input_location(f), int(firsts[i])])) for i, f in enumerate(signature_files)]
    df, runs = plan_runs(spark, items, [Path(f).stat().st_size for f in signature_files])
    return df.mapInArrow(partial(_read_signatures_task, {"dedup": cfg, "runs": runs}), _signature_schema(cfg))


def duplicates(
    sig: DataFrame, cfg: DedupConfig, log: Callable[[str], None] = lambda m: None
) -> tuple[DataFrame, dict, DataFrame]:
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
    root = sig.select(
        F.col("row").alias("v"), F.col("doc_id").alias("duplicate_of"), F.col("key_hash").alias("root_key")
    )
    dups = (
        stars.join(member, "u")
        .join(root, "v")
        .select(
            "part",
            F.col("u").alias("row"),
            "doc_id",
            F.col("v").alias("cluster_id"),
            "duplicate_of",
            F.when(F.col("key_hash") == F.col("root_key"), F.lit("exact")).otherwise(F.lit("near")).alias("kind"),
            "key_hash",
            F.when(F.col("key_hash") == F.col("root_key"), F.lit(1.0)).otherwise(F.lit(None)).alias("similarity"),
        )
    )
    return dups, {"duplicate": found["leaves"], "clusters": found["centres"]}, stars


def verified_duplicates(
    spark: SparkSession, dups: DataFrame, parts: list[Path], firsts: np.ndarray, cfg: DedupConfig, verify: VerifyConfig
) -> tuple[DataFrame, pl.DataFrame]:
    """The duplicates of :func:`duplicates` verified as the local engine does (dedup.verify_assignment,
    the same function on the same candidates): collected to the driver, which reads the candidate
    documents' texts from ``parts`` (one row per document with a candidate pair, not per document).
    Returns (the verified duplicates as a Spark frame with their part, the candidates kept because
    verification failed)."""
    t = dups.select("row", "doc_id", "cluster_id", "duplicate_of", "kind", "key_hash", "similarity").toArrow()
    assignment = (
        pl.from_arrow(t)
        .with_columns(pl.col("key_hash").cast(pl.Int64).reinterpret(signed=False))
        .sort("row")
        .cast(ASSIGNMENT_SCHEMA)
    )
    verified, unverified = verify_assignment(parts, assignment, cfg, verify)
    frame = verified.with_columns(
        part=pl.Series(np.searchsorted(firsts, verified["row"].to_numpy(), side="right") - 1, dtype=pl.Int64),
        key_hash=pl.col("key_hash").reinterpret(signed=True),
    ).select("part", *ASSIGNMENT_SCHEMA)
    schema = (
        "part long, row long, doc_id string, cluster_id long, duplicate_of string, kind string, key_hash long, "
        "similarity double"
    )
    return spark.createDataFrame(frame.to_pandas(), schema), unverified


@contextlib.contextmanager
def global_step_settings(spark: SparkSession, documents: int, cfg: DedupConfig):
    """Spark SQL settings of the global step, restored on exit: :func:`shuffle_partitions`, and
    adaptive query execution off. AQE re-plans after every shuffle stage, each re-plan a job of its
    own and a driver round trip, several times the step's own jobs; the shuffle
    partitions are set from the document count and AQE does not coalesce persisted plans; the joins
    are planned statically (broadcast below spark.sql.autoBroadcastJoinThreshold)."""
    settings = {
        "spark.sql.shuffle.partitions": str(shuffle_partitions(spark, documents, cfg)),
        "spark.sql.adaptive.enabled": "false",
    }
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
    exploded = sig.select(
        "row",
        F.posexplode(F.when(F.col("n_words") > 0, F.array(*hashes)).otherwise(F.array(F.col("key_hash")))).alias(
            "band", "h"
        ),
    )
    parts = int(sig.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    return exploded.repartition(parts, "band", "h").mapInArrow(_edges_task, "u long, v long").distinct()


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
        with attempt(spec, i) as tmp:
            pq.write_table(t.slice(a, b - a).drop_columns(["part"]), tmp / "dups.parquet")
            publish(spec, tmp / "dups.parquet", f"_by_part/{i:05d}.parquet")
        yield manifest_batch(i, {"rows": int(b - a)})


def _write_task(spec: dict, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Per part: its kept documents (dedup.write_kept) and its duplicates frame, published."""
    by_part = spec["url"] or spec["out"]  # the duplicates by part: where the earlier tasks put them
    for i, payload in items_of(spec, batches):
        location, first = json.loads(payload)
        with attempt(spec, i) as tmp:
            if i in spec["with_duplicates"]:
                with task_input(fs.join(by_part, "_by_part", f"{i:05d}.parquet"), tmp) as f:
                    d = pl.read_parquet(f).sort("row")
            else:
                d = pl.DataFrame(schema=ASSIGNMENT_SCHEMA)
            d = d.with_columns(
                pl.col("row") - first, pl.col("key_hash").cast(pl.Int64).reinterpret(signed=False)
            ).select(*ASSIGNMENT_SCHEMA)
            with task_input(location, tmp) as path:
                frame = write_kept(path, d, tmp / "part.parquet")
                rows = pq.ParquetFile(path).metadata.num_rows
            frame.write_parquet(tmp / "dups.parquet")
            publish(spec, tmp / "part.parquet", f"part-{i:05d}.parquet")
            publish(spec, tmp / "dups.parquet", f"_dups/{i:05d}.parquet")
        yield manifest_batch(
            i, {"input": rows, "duplicate": frame.height, "duplicate_exact": int((frame["kind"] == "exact").sum())}
        )


def deduplicate(
    spark: SparkSession,
    in_dir: Path | list[Path],
    out_dir: Path,
    cfg: DedupConfig = DedupConfig(),
    progress: Progress | None = None,
    uploads: Uploads | None = None,
    verify: VerifyConfig | None = VerifyConfig(),
) -> dict:
    """dedup.deduplicate on Spark: the same kept part files, ``duplicates.parquet`` rows (kept copy,
    cluster id, kind) and counts, and ``signatures/`` when the partitions carry none of their own
    (dedup.partition_signatures: then their files are read, not computed); the clustering distributed
    (module docstring).

    Jobs: signatures with candidate pairs and the connected components' rounds (each round one job,
    usually one round); the duplicates written by part (one shuffle on the part, ``_by_part/``); the
    kept documents written per run of parts, the same balanced runs as the signatures'. The tasks read
    the parts and signatures of versions at a URL from there, and put their files under
    ``uploads.url`` when given (commit module docstring)."""
    out_dir, progress, uploads = Path(out_dir), progress or Progress(spark), uploads or Uploads()
    parts = part_files(in_dir)
    given = partition_signatures(in_dir, cfg)  # cleaned_text's, per partition: then this step only clusters
    for d in ("_attempts", *([] if given else ["signatures"]), "_dups", "_by_part"):
        (out_dir / d).mkdir()
    counts = [pq.ParquetFile(p).metadata.num_rows for p in parts]
    firsts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    n = int(firsts[-1])
    spec = {"dedup": cfg, "out": str(out_dir), "url": uploads.url}
    items = [(i, json.dumps([input_location(p), int(firsts[i])])) for i, p in enumerate(parts)]
    sizes = [p.stat().st_size for p in parts]
    found, unverified, by_part = _cluster(
        spark, parts, firsts, given, items, sizes, cfg, verify, spec, progress, uploads
    )
    manifest = run_tasks(
        spark,
        items,
        sizes,
        _write_task,
        {**spec, "with_duplicates": set(by_part)},
        "deduplicated_text: write kept documents",
        progress,
    )
    _check_written(out_dir, manifest, found, None if given else counts, uploads)
    _collect_duplicates(out_dir, manifest)
    unverified.drop("row").write_parquet(out_dir / UNVERIFIED)
    exact = sum(s["duplicate_exact"] for _, s in manifest)
    return {
        "near_unverified_kept": unverified.height,
        "input": n,
        "kept": n - found["duplicate"],
        **found,
        "duplicate_exact": exact,
        "duplicate_near": found["duplicate"] - exact,
    }


def _cluster(
    spark: SparkSession,
    parts: list[Path],
    firsts: np.ndarray,
    given: list[Path],
    items: list[tuple[int, str]],
    sizes: list[int],
    cfg: DedupConfig,
    verify: VerifyConfig | None,
    spec: dict,
    progress: Progress,
    uploads: Uploads,
) -> tuple[dict, pl.DataFrame, dict[int, int]]:
    """The global step's jobs before the writes: signatures (read from ``given`` or computed), candidate
    pairs and connected components, verification, and the duplicates written by part (``_by_part/``).
    Returns (the counts found: duplicate, clusters; the unverified candidates kept; duplicates per part)."""
    out_dir, log, n = Path(spec["out"]), progress.log, int(firsts[-1])
    with global_step_settings(spark, n, cfg):
        runs_df, runs = plan_runs(
            spark,
            [(i, json.dumps([input_location(f), int(firsts[i])])) for i, f in enumerate(given)] if given else items,
            sizes,
        )
        progress.describe(
            "deduplicated_text: " + ("the partitions' MinHash signatures" if given else "MinHash signatures")
        )
        sig = runs_df.mapInArrow(
            partial(_read_signatures_task if given else _signature_task, {**spec, "runs": runs}), _signature_schema(cfg)
        ).persist(StorageLevel.MEMORY_AND_DISK)
        log(
            f"signatures of {n} documents in {len(parts)} parts, {spark.conf.get('spark.sql.shuffle.partitions')} shuffle partitions"
        )
        progress.describe("deduplicated_text: candidate pairs (shuffle on band, hash) and connected components")
        dups, found, stars = duplicates(sig, cfg, log)
        unverified = pl.DataFrame(schema={"row": pl.Int64, **UNVERIFIED_SCHEMA})
        if found["duplicate"] and verify is not None and cfg.near:
            progress.describe("deduplicated_text: verify the candidates against their kept copies (driver)")
            dups, unverified = verified_duplicates(spark, dups, parts, firsts, cfg, verify)
            found = {"duplicate": dups.count(), "clusters": dups.select("cluster_id").distinct().count()}
        progress.describe("deduplicated_text: duplicates by part")
        by_part = {}
        if found["duplicate"]:
            rows = dups.repartition("part").mapInArrow(partial(_by_part_task, spec), MANIFEST).collect()
            by_part = {r.item: json.loads(r.stats)["rows"] for r in rows}
        check_outputs(out_dir, {out_dir / "_by_part" / f"{i:05d}.parquet": n for i, n in by_part.items()}, uploads)
        (out_dir / "_attempts").mkdir()
        stars.unpersist()
        sig.unpersist()
        runs.destroy()
    return found, unverified, by_part


def _check_written(
    out_dir: Path, manifest: list, found: dict, signature_rows: list[int] | None, uploads: Uploads
) -> None:
    """Check the kept parts, duplicates and (``signature_rows``: rows per part, when computed here)
    signatures the write tasks left; RuntimeError when the duplicates written differ from those found."""
    check_outputs(
        out_dir,
        {
            **{out_dir / f"part-{i:05d}.parquet": s["input"] - s["duplicate"] for i, s in manifest},
            **{out_dir / "_dups" / f"{i:05d}.parquet": s["duplicate"] for i, s in manifest},
            **(
                {}
                if signature_rows is None
                else {out_dir / "signatures" / f"part-{i:05d}.parquet": r for i, r in enumerate(signature_rows)}
            ),
        },
        uploads,
    )
    written = sum(s["duplicate"] for _, s in manifest)
    if written != found["duplicate"]:
        raise RuntimeError(f"Spark wrote {written} duplicates, the connected components found {found['duplicate']}")


def _collect_duplicates(out_dir: Path, manifest: list) -> None:
    """The write tasks' duplicates (``_dups/``) into ``duplicates.parquet``, in part order; the scratch removed."""
    _concat_parquet(
        [out_dir / "_dups" / f"{i:05d}.parquet" for i, _ in manifest],
        out_dir / "duplicates.parquet",
        pl.DataFrame(schema=DUP_SCHEMA).to_arrow().schema,
    )
    shutil.rmtree(out_dir / "_dups")
    shutil.rmtree(out_dir / "_by_part")


def _concat_parquet(files: list[Path], out: Path, schema: pa.Schema) -> None:
    """The rows of ``files`` in order into one Parquet file, one file at a time (bounded memory)."""
    with pq.ParquetWriter(out, schema) as w:
        for f in files:
            t = pq.read_table(f)
            if t.num_rows:
                w.write_table(t.cast(schema))
