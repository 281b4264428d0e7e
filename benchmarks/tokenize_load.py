"""Tokenization and loading speed, as ratios measured side by side in one run (docs/ARCHITECTURE.md, Measuring speed).

    python benchmarks/tokenize_load.py [--quick] [--out benchmarks/results/tokenize_load.json]

Input: the cleaned kernel docs corpus (``.largetrain/corpora/linux-doc`` read and cleaned in a
temporary directory; ``--quick`` takes a seeded 25% document sample). Keys:

* ``tokenize_ratio_vs_encode_batch``: tokens/s of our tokenize + pack + write stage
  (``build_token_shards``) over tokens/s of bare ``Tokenizer.encode_batch`` on the same texts with
  the same thread pool. The stage encodes with tiktoken where it expresses the tokenizer (the same
  ids; ``tokenizer_engine`` in the JSON says which ran; benchmarks/tokenizer_engines.py compares the
  engines alone), so the ratio can pass 1.
  ``tokenize_ratio_vs_encode_batch_fast`` is the same against ``encode_batch_fast`` (no offsets),
  the tokenizers encoder the stage falls back to.
* ``load_ratio_vs_memmap``: random batches of 32 sequences per second through our reader
  (``TokenShards`` + ``DistributedSampler``) over a raw ``np.memmap`` fancy-index gather of the
  same tokens (the limit). Goal >= 0.9 (issue 44). ``load_ratio_vs_memmap_cached_bucket``: the same
  for the shards in a bucket (an fsspec ``memory://`` store) read through a ``ShardCache`` that holds
  them, after one pass over every row (a training's later epochs). ``shard_files``: the split's files
  (a split of several files, its parts' shards and the tail, is what the reader must gather from).
* ``load_speedup_vs_hf_datasets``: the same batches per second over Hugging Face ``datasets`` on
  the same sequences stored as Arrow, ``with_format("numpy")``. Goal >= 10. Skipped (null) when
  ``datasets`` is not installed (``pip install -e '.[bench]'``).

Each timing is the best of ``--repeats`` runs; all raw timings go into the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
from tokenizers import Tokenizer

from largetrain_core.clean import QualityConfig, clean_corpus
from largetrain_core.corpus import ingest
from largetrain_core.readers import ReaderConfig
from largetrain_core.shards import DistributedSampler, TokenShards, build_token_shards
from largetrain_core.tokenizer import train_bpe

REPO = Path(__file__).resolve().parents[1]


def interleaved(fns: dict, repeats: int) -> dict[str, list[float]]:
    """Run each function ``repeats`` times, alternating between them, so that a burst of load on a
    shared machine hits all of them alike; returns the raw seconds per function (take the best)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a 25%% document sample, fewer batches")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "tokenize_load.json"))
    p.add_argument(
        "--corpus", default=str(Path(os.environ.get("LARGETRAIN_ROOT", REPO / ".largetrain")) / "corpora" / "linux-doc")
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=1024)
    args = p.parse_args()

    work = Path(tempfile.mkdtemp(prefix="lt-bench-"))
    raw, clean = work / "raw", work / "clean"
    raw.mkdir(), clean.mkdir()
    ingest(ReaderConfig(args.corpus, sample_fraction=0.25 if args.quick else 1.0, seed=0), raw)
    clean_corpus(raw, clean, QualityConfig())
    texts = pl.concat([pl.read_parquet(f, columns=["text"]) for f in sorted(clean.glob("part-*.parquet"))])[
        "text"
    ].to_list()
    info, _ = train_bpe([texts], 8192, work / "tok")
    tok = Tokenizer.from_file(str(info.path))
    threads = os.environ.get("RAYON_NUM_THREADS", str(os.cpu_count()))

    # --- tokenization: the limit is the library's own batch encoder on the same texts
    n_tokens = sum(len(e.ids) + 1 for e in tok.encode_batch(texts, add_special_tokens=False))

    def ours():
        out = work / f"shards-{time.perf_counter_ns()}"
        out.mkdir()
        build_token_shards(clean, work / "tok", out, seq_len=args.seq_len, validation_fraction=0.0)
        return out

    tok_times = interleaved(
        {
            "encode_batch": lambda: tok.encode_batch(texts, add_special_tokens=False),
            "encode_batch_fast": lambda: tok.encode_batch_fast(texts, add_special_tokens=False),
            "ours_tokenize_pack_write": ours,
        },
        args.repeats,
    )
    t_lib, t_fast, t_ours = (
        min(tok_times[k]) for k in ("encode_batch", "encode_batch_fast", "ours_tokenize_pack_write")
    )
    shard_dir = ours()

    # --- loading: random batches of 32 sequences
    data = TokenShards(shard_dir, "train")
    n, width = len(data), args.seq_len + 1
    batches = 200 if args.quick else 1000
    raw_file = work / "tokens.bin"
    np.concatenate([data.take(np.arange(i, min(n, i + 4096))) for i in range(0, n, 4096)]).tofile(raw_file)
    mm = np.memmap(raw_file, dtype=data.dtype, mode="r").reshape(n, width)
    rng = np.random.default_rng(0)
    index_lists = [rng.integers(0, n, 32) for _ in range(batches)]

    def memmap_gather():
        for idx in index_lists:
            np.asarray(mm[idx])

    sampler = DistributedSampler(n, seed=0, rank=0, world_size=1)

    def our_loader():
        for b in range(batches):
            data.take(sampler.indices(b * 32, 32))

    # the same shards in a bucket (fsspec's memory:// store, in this process), read through a ShardCache
    # that holds them: warmed by one pass over every row, as a training's later epochs
    from largetrain_core.cache import ShardCache
    from largetrain_core.fs import write_atomic

    for f in sorted(shard_dir.iterdir()):
        if f.is_file():
            write_atomic(f"memory://bench-{work.name}/shards/{f.name}", f.read_bytes())
    bucket = TokenShards(f"memory://bench-{work.name}/shards", "train")
    files = [f.stat().st_size for f in shard_dir.glob("*.arrow")]
    bucket.cache = ShardCache(work / "cache", max_bytes=(len(files) + 2) * max(files))  # holds the split
    for i in range(0, n, 4096):
        bucket.take(np.arange(i, min(n, i + 4096)))

    def bucket_loader():
        for b in range(batches):
            bucket.take(sampler.indices(b * 32, 32))

    load_times = interleaved(
        {"memmap_gather": memmap_gather, "ours_load": our_loader, "ours_load_cached_bucket": bucket_loader},
        args.repeats,
    )
    t_mm, t_load = min(load_times["memmap_gather"]), min(load_times["ours_load"])
    t_bucket = min(load_times["ours_load_cached_bucket"])
    result = {
        "tokenize_ratio_vs_encode_batch": (n_tokens / t_ours) / (n_tokens / t_lib),
        # the stricter limit: the library's batch encoder without offsets, which our stage uses
        "tokenize_ratio_vs_encode_batch_fast": (n_tokens / t_ours) / (n_tokens / t_fast),
        "load_ratio_vs_memmap": (batches / t_load) / (batches / t_mm),
        "load_ratio_vs_memmap_cached_bucket": (batches / t_bucket) / (batches / t_mm),
        "shard_files": [e["file"] for e in data.manifest["splits"]["train"]["shards"]],
        "load_speedup_vs_hf_datasets": None,
        "tokenizer_engine": json.loads((shard_dir / "tokenized.json").read_text())["runs"][0]["encoder"],
        "tokens": n_tokens,
        "documents": len(texts),
        "sequences": n,
        "seq_len": args.seq_len,
        "batches": batches,
        "tokens_per_s": {
            "ours": n_tokens / t_ours,
            "encode_batch": n_tokens / t_lib,
            "encode_batch_fast": n_tokens / t_fast,
        },
        "batches_per_s": {"ours": batches / t_load, "memmap": batches / t_mm, "ours_cached_bucket": batches / t_bucket},
        "raw_seconds": {**tok_times, **load_times},
        "quick": args.quick,
        "threads": threads,
        "load_average_at_end": os.getloadavg(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
    }
    try:
        import datasets

        hf = datasets.Dataset.from_dict({"input_ids": [row for row in mm[:n]]}).with_format("numpy")
        hf_lists = index_lists[: max(20, batches // 10)]

        def hf_gather():
            for idx in hf_lists:
                hf[idx.tolist()]["input_ids"]

        hf_ours_lists = index_lists[: len(hf_lists)]

        def our_loader_same_batches():
            for b in range(len(hf_ours_lists)):
                data.take(sampler.indices(b * 32, 32))

        hf_times = interleaved(
            {"hf_datasets_gather": hf_gather, "ours_load_hf_batches": our_loader_same_batches}, args.repeats
        )
        result["batches_per_s"]["hf_datasets"] = len(hf_lists) / min(hf_times["hf_datasets_gather"])
        result["load_speedup_vs_hf_datasets"] = min(hf_times["hf_datasets_gather"]) / min(
            hf_times["ours_load_hf_batches"]
        )
        result["raw_seconds"].update(hf_times)
        result["hf_datasets_version"] = datasets.__version__
    except ImportError:
        result["hf_datasets_skipped"] = "datasets is not installed: pip install -e '.[bench]'"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}, indent=2))


if __name__ == "__main__":
    main()
