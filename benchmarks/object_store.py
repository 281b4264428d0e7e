"""Object storage against local disk: data preparation and the training loader, as ratios measured side
by side in one run (issue 19's proof; docs/guides/object-storage.md).

    python benchmarks/object_store.py [--quick] [--repeats 3] [--out benchmarks/results/object_store.json]

Needs the dev extra (``moto[server]``). The S3 store is moto's server (``python -m moto.server -H 127.0.0.1``, what tests/conftest.py's
``s3_server`` fixture starts) on a free port of 127.0.0.1, started and stopped by the benchmark, in its
own process so that its work does not hold this process's GIL (a real store runs elsewhere). The
standard variables (AWS_ENDPOINT_URL, test credentials) point largetrain_core.fs at it.

Input: the kernel docs (``.largetrain/corpora/linux-doc`` and its provenance file, uploaded once to
``s3://bench/corpora/``). ``--quick`` reads data partition 0 of 4 (``partition_of(path, 4) == 0``,
about a quarter of the files) on both sides.

Keys (every one a median of ``--repeats`` runs, local and s3 interleaved, their order alternating):

* ``s3_vs_local_prep``: documents/s of raw_corpus then cleaned_text (largetrain_core.stages, the
  local executor, the demo's kernel-docs rules from configs/demo.yaml) with the corpus and the storage
  root on ``s3://`` over the same with both on local disk. documents/s = raw_corpus's documents /
  seconds of the two stages; each run has a fresh root and a fresh LARGETRAIN_CACHE (nothing reused).
* ``s3_vs_local_load_cold`` / ``s3_vs_local_load_warm``: micro-batches/s of the trainer's loader
  (largetrain_core.training.trainer: ``TokenShards`` of the token shard directory, its
  ``DistributedSampler``, ``follow`` prefetching, per micro-batch ``take(sampler.indices(...))`` and the
  ``astype(int64)`` the trainer does) reading the shards at an ``s3://`` URL through a ShardCache
  that holds the data, over the same loader on the local directory. Cold: the first epoch of a
  loader opened on an empty cache (every shard fetched: by the prefetch thread or by the read that
  needs it). Warm: the loader's next epochs (whole epochs, at least ``--warm-batches`` micro-batches in
  all), every shard in the cache. The local directory was
  just written, so its pages are in the OS page cache in both epochs (this machine cannot drop them).
* ``bytes_fetched_per_epoch_ratio``: bytes the ShardCache downloaded (its own counter,
  ``ShardCache.fetched_bytes``: the prefetch thread's and the reads' downloads) per epoch over the
  bytes of the split's shard files, for a cache bound that holds the data (room for every file and
  one more at the largest file's size, what TokenShards takes as holding the split: epoch 1, and the
  most of any later epoch) and
  one of a quarter of it, with the default global shuffle and with ``schedule.shuffle_window_shards``
  (a window of half the files the quarter holds, the guide's "a cache that holds 2k shards"). The
  quarter cache without a window refetches on most micro-batches; that case is measured over
  ``--unwindowed-batches`` micro-batches at most and the per-epoch ratio extrapolated (said in the JSON).
* ``peak_cache_bytes``: per case, the cache's own record (``ShardCache.peak_bytes``: files plus
  reservations) and the largest sum of file sizes in the cache directory seen by a thread that scans
  it every 5 ms, against the bound.

Goals (issue 19): warm loading at least 0.9x local; at most one fetch of each byte per epoch per node
when the cache holds the data set (epoch 1 ratio <= 1, every later epoch 0); the cache never above its
bound. Each is recorded with whether it was met. The machine's load average before and after goes in
the JSON: this machine is shared (2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np
import polars as pl

from largetrain_core import fs
from largetrain_core.clean import QualityConfig
from largetrain_core.dedup import DedupConfig
from largetrain_core.executors.local import LocalExecutor
from largetrain_core.readers import ReaderConfig
from largetrain_core.shards import DistributedSampler, TokenShards, build_token_shards
from largetrain_core.stages.base import StageRun
from largetrain_core.stages.cleaned_text import cleaned_text
from largetrain_core.stages.raw_corpus import raw_corpus
from largetrain_core.tokenizer import train_bpe

BUCKET = "bench"
# configs/demo.yaml, pretrain__cleaned_text: the demo's rules for the kernel docs
DEMO_QUALITY = QualityConfig(
    min_words=50,
    max_words=100000,
    min_mean_word_length=3.0,
    max_mean_word_length=10.0,
    min_alpha_word_fraction=0.8,
    min_stop_words=2,
    gopher_repetition=True,
    c4=False,
)
DEMO_DEDUP = DedupConfig(ngram=5, bands=14, rows=8, seed=1)


# ------------------------------------------------------------------------------------------------ the S3 server


def start_s3_server() -> tuple[subprocess.Popen, str]:
    """moto's server on a free port of 127.0.0.1 (as tests/conftest.py's s3_server); the standard
    variables point every S3 client at it. Returns (process, endpoint)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop(proc)
                raise RuntimeError(f"moto server did not start on {endpoint} (exit {proc.poll()})") from None
            time.sleep(0.2)
    for k in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        os.environ.pop(k, None)
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "bench-key-id",
            "AWS_SECRET_ACCESS_KEY": "bench-secret-key",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    )
    return proc, endpoint


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def upload(local: Path, url: str) -> None:
    fsys, root = fs.filesystem(url)
    files = [p for p in sorted(local.rglob("*")) if p.is_file()] if local.is_dir() else [local]
    base = local if local.is_dir() else local.parent
    fsys.put([str(p) for p in files], [f"{root}/{p.relative_to(base).as_posix()}" for p in files])


def use_cache(path: Path, max_bytes: int | None = None) -> None:
    """Point LARGETRAIN_CACHE (working copies, the shard cache) at a fresh ``path``, bounded to ``max_bytes``."""
    path.mkdir(parents=True, exist_ok=True)
    os.environ["LARGETRAIN_CACHE"] = str(path)
    if max_bytes is None:
        os.environ.pop("LARGETRAIN_SHARD_CACHE_BYTES", None)
    else:
        os.environ["LARGETRAIN_SHARD_CACHE_BYTES"] = str(max_bytes)


# ------------------------------------------------------------------------------------------------ data preparation


def prep(corpus: str, root: str, partition: int, partitions: int) -> tuple[float, int, object]:
    """raw_corpus then cleaned_text of one partition: (seconds, documents read, cleaned_text's result)."""
    ex = LocalExecutor()
    t0 = time.perf_counter()
    raw = raw_corpus(
        ReaderConfig(corpus, batch_size=1024, partition=partition, partitions=partitions),
        StageRun(root, ("pretrain", "raw_corpus"), str(partition), executor=ex),
    )
    clean = cleaned_text(
        DEMO_QUALITY, raw, StageRun(root, ("pretrain", "cleaned_text"), str(partition), executor=ex), dedup=DEMO_DEDUP
    )
    seconds = time.perf_counter() - t0
    assert not raw.reused and not clean.reused, "a fresh root reused a version: the timing would not be a build"
    return seconds, int(raw.stats["documents"]), clean


# ------------------------------------------------------------------------------------------------ the loader


class DiskWatch:
    """The largest sum of file sizes (shards and partial downloads) in a directory, scanned every 5 ms."""

    def __init__(self, directory: Path):
        self.dir, self.peak, self._stop = directory, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            try:
                for e in os.scandir(self.dir):
                    if not e.name.startswith(".") and not e.name.endswith(".dl"):
                        try:
                            total += e.stat().st_size
                        except FileNotFoundError:
                            pass
            except FileNotFoundError:
                pass
            self.peak = max(self.peak, total)
            self._stop.wait(0.005)

    def start(self) -> "DiskWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the scan (again: nothing); ``peak`` keeps what it saw."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def open_loader(location: str, micro_batch: int, window: int = 0, seed: int = 0):
    """The trainer's loader (largetrain_core.training.trainer.Trainer.setup): the train split, its
    sampler (rank 0 of 1) and the prefetching that follows it. Returns (data, sampler, position)."""
    data = TokenShards(location, "train")
    sampler = DistributedSampler(
        len(data), seed=seed, rank=0, world_size=1, shard_sizes=tuple(data.shard_sizes), window_shards=window
    )
    position = {"consumed": 0}
    data.follow(sampler, micro_batch, lambda: position["consumed"])
    return data, sampler, position


def run_batches(data, sampler, position, micro_batch: int, batches: int) -> float:
    """``batches`` micro-batches as Trainer.train_step reads them; returns the seconds."""
    t0 = time.perf_counter()
    for _ in range(batches):
        idx = sampler.indices(position["consumed"], micro_batch)
        data.take(idx).astype(np.int64)
        position["consumed"] += micro_batch
    return time.perf_counter() - t0


def split_bytes(data: TokenShards) -> int:
    files = {e["file"]: int(e["bytes"]) for e in data.manifest["splits"]["train"]["shards"]}
    return sum(files.values())


def load_case(
    url: str,
    cache: Path,
    bound: int,
    micro_batch: int,
    window: int,
    epochs: int,
    max_batches: int | None = None,
    scan_epochs: int | None = None,
) -> dict:
    """The loader over ``url`` through a fresh cache of ``bound`` bytes: per epoch the seconds and the
    bytes fetched, and the peaks against the bound. ``scan_epochs``: the directory scan (DiskWatch)
    runs during the first that many epochs only (None: all); the cache's own record covers every epoch."""
    use_cache(cache, bound)
    data, sampler, position = open_loader(url, micro_batch, window)
    per_epoch = -(-len(data) // micro_batch)
    total = split_bytes(data)
    out = {
        "bound_bytes": bound,
        "split_bytes": total,
        "files": len({e["file"] for e in data._entries}),
        "window_shards": window,
        "micro_batches_per_epoch": per_epoch,
        "prefetch_depth": data.prefetch_depth,
        "max_open": data.max_open,
        "epochs": [],
    }
    watch = DiskWatch(cache / "shards").start()
    try:
        for epoch in range(epochs):
            if epoch == scan_epochs:
                watch.stop()
            n = per_epoch if max_batches is None else min(per_epoch, max_batches)
            before = data.cache.fetched_bytes if data.cache else 0
            seconds = run_batches(data, sampler, position, micro_batch, n)
            fetched = data.cache.fetched_bytes - before
            out["epochs"].append(
                {
                    "micro_batches": n,
                    "seconds": seconds,
                    "fetched_bytes": fetched,
                    "measured_fraction_of_epoch": n / per_epoch,
                    "fetched_per_epoch_ratio": fetched / total * per_epoch / n,
                }
            )
        data.close()
    finally:
        watch.stop()
    out["peak_bytes_cache_record"] = data.cache.peak_bytes()
    out["peak_bytes_disk_scan"] = watch.peak
    out["fetches"] = data.cache.fetches
    out["within_bound"] = max(out["peak_bytes_cache_record"], out["peak_bytes_disk_scan"]) <= bound
    return out


# ------------------------------------------------------------------------------------------------ main


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="data partition 0 of 4 (about a quarter of the files)")
    p.add_argument("--corpus", default=str(REPO / ".largetrain" / "corpora" / "linux-doc"))
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "object_store.json"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--shard-files", type=int, default=32, help="about this many shard files in the train split")
    p.add_argument(
        "--warm-batches",
        type=int,
        default=40000,
        help="the warm figure is timed over whole epochs after the first, at least this many micro-batches "
        "(about 2 s: a shorter timing varies by more than the 10%% the goal allows)",
    )
    p.add_argument(
        "--unwindowed-batches",
        type=int,
        default=200,
        help="micro-batches measured for the quarter cache without a window (extrapolated to the epoch)",
    )
    args = p.parse_args()

    corpus = Path(args.corpus)
    if not corpus.is_dir():
        raise SystemExit(
            f"{corpus}: no corpus there (ln -s /work/main/.largetrain/corpora .largetrain/corpora, or make corpora)"
        )
    partition, partitions = (0, 4) if args.quick else (0, 1)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout still stops the S3 server (finally)
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="lt-objstore-"))
    server, _ = start_s3_server()
    t_start = time.perf_counter()
    try:
        fsys, _ = fs.filesystem(f"s3://{BUCKET}")
        fsys.mkdir(BUCKET)
        t0 = time.perf_counter()
        upload(corpus, f"s3://{BUCKET}/corpora/{corpus.name}")
        prov = corpus.with_name(corpus.name + ".provenance.json")
        if prov.exists():
            fsys.put(str(prov), f"{BUCKET}/corpora/{prov.name}")
        upload_seconds = time.perf_counter() - t0
        s3_corpus = f"s3://{BUCKET}/corpora/{corpus.name}"

        # --- data preparation, interleaved
        prep_runs = {"local": [], "s3": []}
        clean_dir = None
        for r in range(args.repeats):
            order = ("local", "s3") if r % 2 == 0 else ("s3", "local")
            for side in order:
                use_cache(work / f"prep-cache-{side}-{r}")
                if side == "local":
                    secs, docs, clean = prep(str(corpus), str(work / f"root-{r}"), partition, partitions)
                    clean_dir = clean.path
                else:
                    secs, docs, clean = prep(s3_corpus, f"s3://{BUCKET}/root-{r}", partition, partitions)
                prep_runs[side].append(
                    {
                        "seconds": secs,
                        "documents": docs,
                        "kept": clean.stats["kept"],
                        "data_version": clean.data_version,
                    }
                )
                print(f"prep {side} run {r}: {docs} documents in {secs:.2f} s", flush=True)
        same_versions = len({x["data_version"] for x in prep_runs["local"] + prep_runs["s3"]}) == 1
        dps = {side: statistics.median(x["documents"] / x["seconds"] for x in runs) for side, runs in prep_runs.items()}

        # --- token shards of the cleaned text (a BPE of 8,192 ids trained on it), about --shard-files files:
        # written locally, then uploaded
        texts = pl.concat(
            [pl.read_parquet(f, columns=["text"]) for f in sorted(Path(clean_dir).glob("part-*.parquet"))]
        )["text"].to_list()
        train_bpe([texts], 8192, work / "tok")
        probe = work / "probe"
        probe.mkdir()
        m = build_token_shards(clean_dir, work / "tok", probe, seq_len=args.seq_len, validation_fraction=0.0)
        sequences = int(m["splits"]["train"]["sequences"])
        per_shard = max(1, -(-sequences // args.shard_files))
        local_shards = work / "shards"
        local_shards.mkdir()
        build_token_shards(
            clean_dir,
            work / "tok",
            local_shards,
            seq_len=args.seq_len,
            validation_fraction=0.0,
            sequences_per_shard=per_shard,
        )
        shutil.rmtree(probe)
        s3_shards = f"s3://{BUCKET}/shards"
        upload(local_shards, s3_shards)
        total = split_bytes(TokenShards(str(local_shards), "train"))
        biggest = max(int(e["bytes"]) for e in TokenShards(str(local_shards), "train")._entries)
        files = len({e["file"] for e in TokenShards(str(local_shards), "train")._entries})
        # room for every file and one more, at the largest file's size: what TokenShards takes as a cache that
        # holds the split (prefetch_depth and max_open: every file)
        full_bound = (files + 1) * biggest
        mb = args.micro_batch
        warm_epochs = max(1, -(-args.warm_batches // -(-sequences // mb)))  # epochs of at least --warm-batches in all

        # --- loader: cold and warm epochs, interleaved
        load_runs = {"local": [], "s3": []}
        for r in range(args.repeats):
            order = ("local", "s3") if r % 2 == 0 else ("s3", "local")
            for side in order:
                if side == "local":
                    data, sampler, position = open_loader(str(local_shards), mb)
                    n = -(-len(data) // mb)
                    cold = run_batches(data, sampler, position, mb, n)
                    warm = sum(run_batches(data, sampler, position, mb, n) for _ in range(warm_epochs))
                    data.close()
                    load_runs["local"].append({"micro_batches": n, "cold_seconds": cold, "warm_seconds": warm})
                else:
                    # the scan thread costs CPU that the local side does not pay: only during the epoch that fetches
                    case = load_case(
                        s3_shards, work / f"load-cache-{r}", full_bound, mb, 0, 1 + warm_epochs, scan_epochs=1
                    )
                    n = case["epochs"][0]["micro_batches"]
                    load_runs["s3"].append(
                        {
                            "micro_batches": n,
                            "cold_seconds": case["epochs"][0]["seconds"],
                            "warm_seconds": sum(e["seconds"] for e in case["epochs"][1:]),
                            "case": case,
                        }
                    )
                print(
                    f"load {side} run {r}: cold {load_runs[side][-1]['cold_seconds']:.3f} s, "
                    f"warm {load_runs[side][-1]['warm_seconds']:.3f} s",
                    flush=True,
                )
        bps = {
            side: {
                k: statistics.median(
                    x["micro_batches"] * (warm_epochs if k == "warm" else 1) / x[f"{k}_seconds"] for x in runs
                )
                for k in ("cold", "warm")
            }
            for side, runs in load_runs.items()
        }

        # --- bytes fetched per epoch and peaks: a cache that holds the data, and one of a quarter of it
        quarter = total // 4
        share = quarter // biggest
        if share < 4:
            raise SystemExit(
                f"a quarter of the split holds {share} shard files: too few to measure (raise --shard-files)"
            )
        window = max(1, share // 2)
        cases = {"full_cache": load_runs["s3"][-1]["case"]}
        cases["quarter_cache_window"] = load_case(s3_shards, work / "quarter-window", quarter, mb, window, 2)
        cases["quarter_cache_global_shuffle"] = load_case(
            s3_shards, work / "quarter-global", quarter, mb, 0, 1, max_batches=args.unwindowed_batches
        )
        for name, c in cases.items():
            print(
                f"{name}: fetched/epoch {[round(e['fetched_per_epoch_ratio'], 3) for e in c['epochs']]}, "
                f"peak {c['peak_bytes_cache_record']:,} / {c['peak_bytes_disk_scan']:,} of {c['bound_bytes']:,}",
                flush=True,
            )
    finally:
        stop(server)

    full = cases["full_cache"]["epochs"]
    warm_ratio = bps["s3"]["warm"] / bps["local"]["warm"]
    fetch_full = [full[0]["fetched_per_epoch_ratio"], max(e["fetched_per_epoch_ratio"] for e in full[1:])]
    result = {
        "s3_vs_local_prep": dps["s3"] / dps["local"],
        "s3_vs_local_load_cold": bps["s3"]["cold"] / bps["local"]["cold"],
        "s3_vs_local_load_warm": warm_ratio,
        "bytes_fetched_per_epoch_ratio": {
            "full_cache_epoch_1": fetch_full[0],
            "full_cache_later_epochs_max": fetch_full[1],
            "quarter_cache_window_epoch_1": cases["quarter_cache_window"]["epochs"][0]["fetched_per_epoch_ratio"],
            "quarter_cache_window_epoch_2": cases["quarter_cache_window"]["epochs"][1]["fetched_per_epoch_ratio"],
            "quarter_cache_global_shuffle": cases["quarter_cache_global_shuffle"]["epochs"][0][
                "fetched_per_epoch_ratio"
            ],
            "quarter_cache_global_shuffle_extrapolated_from_fraction": cases["quarter_cache_global_shuffle"]["epochs"][
                0
            ]["measured_fraction_of_epoch"],
            "quarter_cache_window_shards": window,
        },
        "peak_cache_bytes": {
            name: {
                "bound": c["bound_bytes"],
                "cache_record": c["peak_bytes_cache_record"],
                "disk_scan": c["peak_bytes_disk_scan"],
                "within_bound": c["within_bound"],
            }
            for name, c in cases.items()
        },
        "goals": {
            "load_warm_at_least_0.9x_local": {"value": warm_ratio, "goal": ">= 0.9", "met": warm_ratio >= 0.9},
            "each_byte_fetched_at_most_once_per_epoch_when_cached": {
                "value": fetch_full,
                "goal": "epoch 1 <= 1, every later epoch 0",
                "met": fetch_full[0] <= 1.0 + 1e-9 and fetch_full[1] == 0,
            },
            "cache_never_above_bound": {
                "value": {n: c["within_bound"] for n, c in cases.items()},
                "goal": "peak <= bound in every case",
                "met": all(c["within_bound"] for c in cases.values()),
            },
        },
        "prep_same_data_version_local_and_s3": same_versions,
        "documents_per_s": dps,
        "micro_batches_per_s": bps,
        "corpus": str(corpus.name),
        "subset": "data partition 0 of 4 (partition_of(path, 4) == 0)" if args.quick else "whole corpus",
        "documents": prep_runs["local"][0]["documents"],
        "sequences": sequences,
        "seq_len": args.seq_len,
        "micro_batch": mb,
        "warm_epochs": warm_epochs,
        "shard_files": cases["full_cache"]["files"],
        "split_bytes": total,
        "sequences_per_shard": per_shard,
        "s3_server": "moto.server (moto " + __import__("moto").__version__ + ") on 127.0.0.1, its own process",
        "corpus_upload_seconds": upload_seconds,
        "runs": {
            "prep": prep_runs,
            "load": [{k: v for k, v in x.items() if k != "case"} for x in load_runs["s3"]],
            "load_local": load_runs["local"],
            "cases": cases,
        },
        "repeats": args.repeats,
        "quick": args.quick,
        "wall_seconds": time.perf_counter() - t_start,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    shutil.rmtree(work, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "s3_vs_local_prep",
                    "s3_vs_local_load_cold",
                    "s3_vs_local_load_warm",
                    "bytes_fetched_per_epoch_ratio",
                    "peak_cache_bytes",
                    "goals",
                )
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
