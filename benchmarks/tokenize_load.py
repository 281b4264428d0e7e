"""Tokenization and loading speed, as ratios measured side by side in one run (DESIGN.md section 7).

    python benchmarks/tokenize_load.py [--quick] [--out benchmarks/results/tokenize_load.json]

Input: the cleaned kernel docs corpus (``.largetrain/corpora/linux-doc`` read and cleaned in a
temporary directory; ``--quick`` takes a seeded 25% document sample). Keys:

* ``tokenize_ratio_vs_encode_batch``: tokens/s of our tokenize + pack + write stage
  (``build_token_shards``) over tokens/s of bare ``Tokenizer.encode_batch`` on the same texts with
  the same thread pool (the limit: we cannot encode faster than the library). Goal >= 0.9.
* ``load_ratio_vs_memmap``: random batches of 32 sequences per second through our reader
  (``TokenShards`` + ``DistributedSampler``) over a raw ``np.memmap`` fancy-index gather of the
  same tokens (the limit). Goal >= 0.8.
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
from largetrain_core.corpus import ReaderConfig, ingest
from largetrain_core.shards import DistributedSampler, TokenShards, build_token_shards
from largetrain_core.tokenizer import train_bpe

REPO = Path(__file__).resolve().parents[1]


def best(fn, repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a 25%% document sample, fewer batches")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "tokenize_load.json"))
    p.add_argument("--corpus", default=str(Path(os.environ.get("LARGETRAIN_ROOT", REPO / ".largetrain")) / "corpora" / "linux-doc"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=1024)
    args = p.parse_args()

    work = Path(tempfile.mkdtemp(prefix="lt-bench-"))
    raw, clean = work / "raw", work / "clean"
    raw.mkdir(), clean.mkdir()
    ingest(ReaderConfig(args.corpus), raw, sample_fraction=0.25 if args.quick else 1.0, seed=0)
    clean_corpus(raw, clean, QualityConfig())
    texts = pl.concat([pl.read_parquet(f, columns=["text"]) for f in sorted(clean.glob("part-*.parquet"))])["text"].to_list()
    info = train_bpe([texts], 8192, work / "tok")
    tok = Tokenizer.from_file(str(info.path))
    threads = os.environ.get("RAYON_NUM_THREADS", str(os.cpu_count()))

    # --- tokenization: the limit is the library's own batch encoder on the same texts
    n_tokens = sum(len(e.ids) + 1 for e in tok.encode_batch(texts, add_special_tokens=False))
    t_lib, t_lib_all = best(lambda: tok.encode_batch(texts, add_special_tokens=False), args.repeats)

    def ours():
        out = work / f"shards-{time.perf_counter_ns()}"
        out.mkdir()
        build_token_shards(clean, work / "tok", out, seq_len=args.seq_len, validation_fraction=0.0)
        return out

    t_ours, t_ours_all = best(ours, args.repeats)
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

    t_mm, t_mm_all = best(memmap_gather, args.repeats)
    t_load, t_load_all = best(our_loader, args.repeats)
    result = {
        "tokenize_ratio_vs_encode_batch": (n_tokens / t_ours) / (n_tokens / t_lib),
        "load_ratio_vs_memmap": (batches / t_load) / (batches / t_mm),
        "load_speedup_vs_hf_datasets": None,
        "tokens": n_tokens, "documents": len(texts), "sequences": n, "seq_len": args.seq_len, "batches": batches,
        "tokens_per_s": {"ours": n_tokens / t_ours, "encode_batch": n_tokens / t_lib},
        "batches_per_s": {"ours": batches / t_load, "memmap": batches / t_mm},
        "raw_seconds": {"encode_batch": t_lib_all, "ours_tokenize_pack_write": t_ours_all,
                        "memmap_gather": t_mm_all, "ours_load": t_load_all},
        "quick": args.quick, "threads": threads, "cpu_count": os.cpu_count(), "machine": platform.machine(),
    }
    try:
        import datasets

        hf = datasets.Dataset.from_dict({"input_ids": [row for row in mm[: n]]}).with_format("numpy")
        hf_lists = index_lists[: max(20, batches // 10)]

        def hf_gather():
            for idx in hf_lists:
                hf[idx.tolist()]["input_ids"]

        t_hf, t_hf_all = best(hf_gather, args.repeats)
        result["batches_per_s"]["hf_datasets"] = len(hf_lists) / t_hf
        result["load_speedup_vs_hf_datasets"] = result["batches_per_s"]["ours"] / result["batches_per_s"]["hf_datasets"]
        result["raw_seconds"]["hf_datasets_gather"] = t_hf_all
        result["hf_datasets_version"] = datasets.__version__
    except ImportError:
        result["hf_datasets_skipped"] = "datasets is not installed: pip install -e '.[bench]'"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}, indent=2))


if __name__ == "__main__":
    main()
