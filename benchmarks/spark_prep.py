"""Data preparation on Spark against the local engine: throughput, scaling, identical outputs, and the
memory of the dedup global step per document.

Run by hand (needs the ``spark`` extra and Java 17: ``pip install -e '.[spark]'``,
``scripts/install_system_deps.sh``)::

    .venv/bin/python benchmarks/spark_prep.py            # full kernel docs, 10^6 synthetic signatures
    .venv/bin/python benchmarks/spark_prep.py --quick    # documented sample, < 5 minutes on 2 cores
    .venv/bin/python benchmarks/spark_prep.py --out benchmarks/results/spark_prep.json
    .venv/bin/python benchmarks/spark_prep.py --repeats 5      # runs of each engine (default 3)

Throughput: raw_corpus -> cleaned_text -> deduplicated_text of the kernel docs
(``.largetrain/corpora/linux-doc``, one partition) with the demo's kernel-docs rules (Gopher quality
+ Gopher repetition, C4 off: configs/demo.yaml) and the DedupConfig defaults, by

* the local engine: the core functions in this process, on 2 cores (polars' pool, the 2 MinHash threads);
* Spark on ``local-cluster[1,1,1024]`` and ``local-cluster[2,1,1024]`` (executor JVMs of 1 core each,
  1 GiB): the Spark session's start and one warm-up job that starts each executor's Python worker and
  imports the project are not timed (the issue's "after session start-up").

Each engine runs ``--repeats`` times (default 3), interleaved (local, Spark 1, Spark 2, local, ...;
a fresh Spark application per run), and its fastest run counts: on a shared machine other jobs only
ever add time, so the minimum is the best estimate of the engine's own time. Every sample is in the
JSON (``samples``) with the load average before it and where its CPU time went: ``cpu_seconds``
by process role (driver Python, driver JVM, executor JVMs, Python workers; /proc, utime + stime of
the processes alive at the end of the run) and ``machine_cpu_seconds`` (all processes, /proc/stat),
whose difference is other users' share of the 2 cores during the run. The Spark sessions of one
benchmark share the driver JVM (PySpark keeps its gateway), so the first Spark run also warms the
driver's code: a further reason to take the fastest of several runs.

documents/s = documents read by raw_corpus / seconds of the three stages. ``spark_scaling_efficiency``
= documents/s with 2 executors / (2 x documents/s with 1); ``spark_vs_local_throughput`` = Spark
documents/s with 2 executors of 1 core / local documents/s on the same 2 cores. ``spark_local_identical``:
every Spark run's outputs equal the local engine's (documents and their order, rejected records,
filtered ids and reasons, duplicates with kept copy, cluster and kind, every count, the accounting).
``--quick`` reads a seeded 25% sample of the files (``partition_of(path, 4) == 0``, i.e. data partition
0 of 4) instead of all of them.

Memory of the dedup global step: a synthetic signature set of N = 10^6 documents (for Spark under
``--quick``: 2 x 10^5, whose duplicates are checked against the local engine's) in part files of 1,024: random key and band hashes, 10% exact copies of an earlier document
(key and all bands), 5% near copies (a quarter of the bands of an earlier document, another key), 1%
without words. Each in a fresh process, after the imports and a warm-up read:

* ``before``: ``cluster_signatures`` as it was before the bounded global step (largetrain_core/dedup.py
  at commit BASELINE, loaded from git; signature files with one list column of band hashes);
* ``local``: today's ``cluster_signatures`` (one column per band, hash ranges, candidates-only union-find);
  bytes per document = (peak RSS, VmHWM reset through /proc/self/clear_refs, minus the RSS before) / N;
* ``spark``: largetrain_core.executors.spark.dedup.duplicates (candidate pairs, connected components, the duplicates' join) from
  the same files on ``local-cluster[2,1,1024]``: the largest peak-RSS growth of one process of the
  application (driver JVM, executor JVMs, Python workers; /proc polled every 0.1 s) / N: no process
  needs to hold every document. JVM heaps grow lazily up to their limit, so this is an upper bound.

``dedup_global_memory_reduction`` = before / local bytes per document. The machine's load average
before and after is recorded: on a shared machine timings move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CORPUS = ROOT / ".largetrain" / "corpora" / "linux-doc"
BASELINE = "902dca1"  # main before the bounded global step
PER_FILE = 1024


# ------------------------------------------------------------------------------------------------ memory


def synthetic_signatures(d: Path, n: int, layout: str, bands: int = 14, seed: int = 0) -> None:
    """N documents' signature files in ``layout`` "columns" (band_00..) or "list" (band_hash, the old layout)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    key = rng.integers(0, 2**64, n, dtype=np.uint64)
    bh = rng.integers(0, 2**64, (n, bands), dtype=np.uint64)
    n_words = rng.integers(50, 2000, n).astype(np.int64)
    src, kind = rng.integers(0, n, n), rng.random(n)
    earlier = src < np.arange(n)
    exact, near = (kind < 0.10) & earlier, (kind >= 0.10) & (kind < 0.15) & earlier
    key[exact], bh[exact] = key[src[exact]], bh[src[exact]]
    shared = near[:, None] & (rng.random((n, bands)) < 0.25)
    rows, cols = np.nonzero(shared)
    bh[rows, cols] = bh[src[rows], cols]
    n_words[kind > 0.99] = 0
    for f0 in range(0, n, PER_FILE):
        s = slice(f0, min(n, f0 + PER_FILE))
        t = {
            "doc_id": pa.array(
                [f"corpus/dir{i % 97:02d}/file-{i:07d}.rst.txt" for i in range(s.start, s.stop)], pa.large_string()
            ),
            "key_hash": pa.array(key[s]),
            "n_words": pa.array(n_words[s]),
        }
        if layout == "list":
            t["band_hash"] = pa.FixedSizeListArray.from_arrays(pa.array(bh[s].ravel()), bands)
        else:
            t.update({f"band_{b:02d}": pa.array(bh[s, b]) for b in range(bands)})
        pq.write_table(pa.table(t), d / f"part-{f0 // PER_FILE:05d}.parquet")


def _status(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def global_step_worker(which: str, sig_dir: str) -> None:
    """In a fresh process: RSS growth of one cluster_signatures call (printed as JSON)."""
    import polars as pl
    import pyarrow.parquet as pq

    if which == "before":
        import importlib.util

        src = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{BASELINE}:largetrain_core/dedup.py"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        path = Path(tempfile.mkdtemp()) / "dedup_before.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location("dedup_before", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["dedup_before"] = mod  # dataclasses look their module up
        spec.loader.exec_module(mod)
    else:
        from largetrain_core import dedup as mod
    files = sorted(Path(sig_dir).glob("part-*.parquet"))
    pl.from_arrow(pq.ParquetFile(files[0]).read())  # the libraries' pools and threads, before the baseline
    base = _status("VmRSS:")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    t0 = time.perf_counter()
    out = mod.cluster_signatures(files)
    seconds = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "rss_growth_bytes": _status("VmHWM:") - base,
                "seconds": seconds,
                "duplicates": int(out["duplicate_of"].drop_nulls().len()),
            }
        )
    )


def local_global_step(which: str, sig_dir: Path) -> dict:
    r = subprocess.run(
        [sys.executable, __file__, "--global-step-worker", which, str(sig_dir)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if r.returncode:
        raise SystemExit(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


class RssSampler:
    """Peak RSS growth per process among the descendants of this process (the Spark JVMs and Python
    workers), polling /proc every ``every`` seconds; baseline = each process's RSS when first seen
    after :meth:`start` (a process started later has baseline 0)."""

    def __init__(self, every: float = 0.1):
        from largetrain_core.processes import process_tree

        self.tree, self.every = process_tree, every
        self.base: dict[int, int] = {}
        self.peak: dict[int, int] = {}
        self.stop_event = threading.Event()

    @staticmethod
    def _rss(pid: int) -> int | None:
        try:
            for line in open(f"/proc/{pid}/status"):
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def _sample(self, first: bool) -> None:
        for pid in self.tree(os.getpid()):
            rss = self._rss(pid)
            if rss is None:
                continue
            if pid not in self.base:
                self.base[pid] = rss if first else 0
            self.peak[pid] = max(self.peak.get(pid, 0), rss)

    def start(self) -> None:
        self._sample(first=True)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop_event.wait(self.every):
            self._sample(first=False)

    def stop(self) -> dict:
        self.stop_event.set()
        self.thread.join()
        growth = {pid: self.peak[pid] - self.base[pid] for pid in self.peak}
        return {
            "max_process_growth_bytes": max(growth.values(), default=0),
            "sum_growth_bytes": sum(growth.values()),
            "processes": len(growth),
        }


def spark_global_step(sig_dir: Path) -> dict:
    from largetrain_core.dedup import DedupConfig
    from largetrain_core.executors.spark.dedup import duplicates, global_step_settings, signature_frame
    from largetrain_core.executors.spark.session import session

    files = sorted(sig_dir.glob("part-*.parquet"))
    spark = session("local-cluster[2,1,1024]", "largetrain-bench-global-step")
    try:
        cfg = DedupConfig()
        import pyarrow.parquet as pq

        n = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        from pyspark import StorageLevel

        _warm_up(spark)
        sampler = RssSampler()
        sampler.start()
        t0 = time.perf_counter()
        with global_step_settings(spark, n, cfg):
            sig = signature_frame(spark, files, cfg).persist(StorageLevel.MEMORY_AND_DISK)
            dups, counts, stars = duplicates(sig, cfg, lambda m: print(m, file=sys.stderr, flush=True))
            dups.write.format("noop").mode("overwrite").save()  # the duplicates' joins, as deduplicate computes them
            stars.unpersist()
        count = counts["duplicate"]
        seconds = time.perf_counter() - t0
        mem = sampler.stop()
        return {**mem, "seconds": seconds, "duplicates": count, "documents": n}
    finally:
        spark.stop()


# ------------------------------------------------------------------------------------------------ throughput


def _role(pid: int) -> str | None:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return None
    if pid == os.getpid():
        return "driver_python"
    argv0 = Path(cmd.split(b" ", 1)[0].decode(errors="replace")).name
    if b"CoarseGrainedExecutorBackend" in cmd:
        return "executor_jvm"
    if argv0 == "java":
        return "driver_jvm"  # with the local-cluster's master and workers
    if "python" in argv0:
        return "python_workers"
    return "other"


def _cpu_ticks(pid: int) -> int:
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(f[11]) + int(f[12])  # utime + stime (fields 14, 15)


class CpuMeter:
    """CPU seconds of this process and its descendants by role (:func:`_role`) over a run, and of the
    whole machine (/proc/stat: every process, other users' included)."""

    HZ = os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _machine() -> int:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        return sum(int(x) for x in fields[:3]) + sum(int(x) for x in fields[5:8])  # user nice system irq softirq steal

    def _tree(self) -> dict[int, int]:
        from largetrain_core.processes import process_tree

        return {pid: _cpu_ticks(pid) for pid in process_tree(os.getpid())}

    def start(self) -> None:
        self.before, self.machine = self._tree(), self._machine()

    def stop(self) -> dict:
        after, machine = self._tree(), self._machine()
        roles: dict[str, float] = {}
        for pid, ticks in after.items():
            role = _role(pid)
            if role:
                roles[role] = roles.get(role, 0.0) + (ticks - self.before.get(pid, 0)) / self.HZ
        return {
            "cpu_seconds": {k: round(v, 2) for k, v in sorted(roles.items())},
            "machine_cpu_seconds": round((machine - self.machine) / self.HZ, 2),
        }


def _warm_up(spark) -> None:
    """One task per executor core that imports the project in the Python worker (not timed)."""
    import pyarrow as pa

    def imports(batches):
        import largetrain_core.executors.spark.dedup  # noqa: F401

        for b in batches:
            yield pa.RecordBatch.from_pydict({"id": b.column(0)})

    n = spark.sparkContext.defaultParallelism
    spark.range(n, numPartitions=n).mapInArrow(imports, "id long").collect()


def corpus_sample(quick: bool, tmp: Path) -> Path:
    """The kernel docs, or for --quick the files of data partition 0 of 4 (linked, same relative paths)."""
    if not quick:
        return CORPUS
    from largetrain_core.corpus import list_files

    out = tmp / "sample"
    for f in list_files(CORPUS, 0, 4):
        link = out / f.relative_to(CORPUS)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(f)
    return out


def chain(engine, corpus: Path, out: Path) -> tuple[dict, float]:
    """raw_corpus -> cleaned_text -> deduplicated_text on ``engine`` (None = local, else a SparkSession)."""
    from largetrain_core.clean import QualityConfig, clean_corpus
    from largetrain_core.corpus import ingest
    from largetrain_core.readers import ReaderConfig
    from largetrain_core.dedup import DedupConfig, deduplicate

    quality = QualityConfig(gopher_repetition=True, c4=False)
    dirs = [out / "raw", out / "clean", out / "dd"]
    for d in dirs:
        d.mkdir(parents=True)
    t0 = time.perf_counter()
    if engine is None:
        stats = {
            "raw": ingest(ReaderConfig(str(corpus)), dirs[0]),
            "clean": clean_corpus(dirs[0], dirs[1], quality),
            "dd": deduplicate(dirs[1], dirs[2], DedupConfig()),
        }
    else:
        from largetrain_core.executors.spark import dedup, ingest as spark_ingest, map_parts

        stats = {
            "raw": spark_ingest.ingest(engine, ReaderConfig(str(corpus)), dirs[0]),
            "clean": map_parts.clean(engine, dirs[0], dirs[1], quality),
            "dd": dedup.deduplicate(engine, dirs[1], dirs[2], DedupConfig()),
        }
    return stats, time.perf_counter() - t0


def identical(local: Path, other: Path, ls: dict, os_: dict) -> dict:
    """Which outputs of ``other`` equal the local engine's."""
    import polars as pl

    from largetrain_core.accounting import corpus_accounting, outcome_table
    from largetrain_core.storage import part_files

    def docs(d):
        parts = part_files(d)
        return pl.concat([pl.read_parquet(p) for p in parts], how="vertical_relaxed") if parts else None

    def same(a, b):
        return (a is None and b is None) or (a is not None and b is not None and a.equals(b))

    res = {}
    for stage in ("raw", "clean", "dd"):
        res[f"{stage}_documents"] = same(docs(local / stage), docs(other / stage))
    for name, f in (
        ("rejected", "raw/rejected.parquet"),
        ("filtered", "clean/filtered.parquet"),
        ("duplicates", "dd/duplicates.parquet"),
    ):
        res[name] = pl.read_parquet(local / f).equals(pl.read_parquet(other / f))
    strip = lambda s: {k: v for k, v in s.items() if k != "parts"}  # noqa: E731 (part boundaries may differ)
    res["counts"] = all(strip(ls[k]) == strip(os_[k]) for k in ("raw", "clean", "dd"))
    dirs = lambda d: (d / "raw", d / "clean", d / "dd")  # noqa: E731
    res["accounting"] = corpus_accounting(*dirs(local)) == corpus_accounting(*dirs(other))
    res["outcomes"] = outcome_table(*dirs(local)).equals(outcome_table(*dirs(other)))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "spark_prep.json"))
    ap.add_argument(
        "--repeats", type=int, default=3, help="runs of each engine, interleaved; the fastest counts (default 3)"
    )
    ap.add_argument("--global-step-worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.global_step_worker:
        return global_step_worker(*args.global_step_worker)
    os.environ.setdefault("POLARS_MAX_THREADS", "2")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from largetrain_core.executors.spark.session import session

    load_before = os.getloadavg()
    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="spark-prep-bench-"))
    res: dict = {"quick": args.quick, "cpu_count": os.cpu_count()}
    try:
        corpus = corpus_sample(args.quick, tmp)
        samples: dict[str, list] = {"local": [], "spark_1_executors": [], "spark_2_executors": []}
        checks: dict[str, dict] = {}
        local_stats, documents = None, None
        for r in range(args.repeats):
            for name in samples:
                out = tmp / f"{name}-{r}"
                sample = {"load_average_before": os.getloadavg()}
                spark = None
                if name != "local":
                    executors = int(name.split("_")[1])
                    t0 = time.perf_counter()
                    spark = session(f"local-cluster[{executors},1,1024]", f"largetrain-bench-{executors}")
                    _warm_up(spark)
                    sample |= {
                        "master": spark.sparkContext.master,
                        "session_start_and_warm_up_seconds": time.perf_counter() - t0,
                    }
                meter = CpuMeter()
                meter.start()
                try:
                    stats, seconds = chain(spark, corpus, out)
                    sample |= meter.stop()
                finally:
                    if spark is not None:
                        spark.stop()
                sample["seconds"] = seconds
                samples[name].append(sample)
                if name == "local":
                    if local_stats is None:
                        local_stats, documents = stats, stats["raw"]["documents"]
                        shutil.move(out, tmp / "local")
                    else:
                        shutil.rmtree(out)
                    continue
                same = identical(tmp / "local", out, local_stats, stats)
                checks[name] = {k: checks.get(name, {}).get(k, True) and v for k, v in same.items()}
                shutil.rmtree(out)
                print(json.dumps({name: sample}), file=sys.stderr, flush=True)
        runs = {}
        for name, ss in samples.items():
            best = min(ss, key=lambda x: x["seconds"])
            runs[name] = {
                **{k: v for k, v in best.items() if k != "load_average_before"},
                "documents_per_s": documents / best["seconds"],
                "samples_seconds": [x["seconds"] for x in ss],
            }
        res["repeats"] = args.repeats
        res["documents"] = documents
        res["throughput"] = runs
        res["samples"] = samples
        res["identical"] = checks
        res["spark_local_identical"] = all(all(c.values()) for c in checks.values())
        one, two = runs["spark_1_executors"]["documents_per_s"], runs["spark_2_executors"]["documents_per_s"]
        res["spark_scaling_efficiency"] = two / (2 * one)
        res["spark_vs_local_throughput"] = two / runs["local"]["documents_per_s"]

        n, n_spark = 1_000_000, 200_000 if args.quick else 1_000_000
        for layout in ("list", "columns"):
            synthetic_signatures(tmp / f"sig-{layout}", n, layout)
        before = local_global_step("before", tmp / "sig-list")
        local = local_global_step("local", tmp / "sig-columns")
        if n_spark != n:
            synthetic_signatures(tmp / "sig-spark", n_spark, "columns")
            check = local_global_step("local", tmp / "sig-spark")
        spark = spark_global_step(tmp / ("sig-spark" if n_spark != n else "sig-columns"))
        if (
            not before["duplicates"] == local["duplicates"]
            or spark["duplicates"] != (check if n_spark != n else local)["duplicates"]
        ):
            res["spark_local_identical"] = False
        res["global_step"] = {
            "documents": n,
            "before": before,
            "local": local,
            "spark": {**spark, "documents": n_spark},
        }
        res["dedup_global_bytes_per_doc_before"] = before["rss_growth_bytes"] / n
        res["dedup_global_bytes_per_doc_local"] = local["rss_growth_bytes"] / n
        res["dedup_global_bytes_per_doc_spark"] = spark["max_process_growth_bytes"] / n_spark
        res["dedup_global_memory_reduction"] = before["rss_growth_bytes"] / local["rss_growth_bytes"]
        res["goals"] = {
            "spark_scaling_efficiency": ">= 0.75",
            "spark_vs_local_throughput": ">= 0.5 (within 2x)",
            "dedup_global_memory_reduction": ">= 4",
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res["seconds"] = time.perf_counter() - t_start
    res["load_average_before"], res["load_average_after"] = load_before, os.getloadavg()
    res["peak_rss_kib_self"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1, default=str) + "\n")
    print(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
