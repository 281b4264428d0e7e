"""Peak RSS of cleaning + dedup on the kernel docs and on the same corpus replicated 4 times.

Run by hand::

    .venv/bin/python benchmarks/prep_memory.py [--out benchmarks/results/prep_memory.json]

For each corpus a fresh Python process runs ingest -> clean_corpus (Gopher quality + repetition + C4,
QualityConfig defaults) -> deduplicate (exact + MinHash-LSH, DedupConfig defaults) into a temp dir.
Its peak resident set size is ``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` (Linux: KiB) read by
a one-child launcher process, so that each figure belongs to exactly one run (RUSAGE_CHILDREN is the
maximum over all waited-for children of the reader). The worker also reports its own peak after each
step (``RUSAGE_SELF``), which shows which step grows. "x4" is the corpus directory copied 4 times
under the prefixes copy0..copy3 (4x the documents and bytes; 3 of 4 copies are exact duplicates).
Streaming in bounded batches (``ReaderConfig.batch_size`` documents per part file) should keep the
peak roughly flat; the JSON holds ``ratio_x4_over_x1``.
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / ".largetrain" / "corpora" / "linux-doc"


def worker(corpus: str, work: str) -> None:
    sys.path.insert(0, str(ROOT))
    from largetrain_core.clean import QualityConfig, clean_corpus
    from largetrain_core.corpus import ingest
    from largetrain_core.readers import ReaderConfig
    from largetrain_core.dedup import DedupConfig, deduplicate

    peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # noqa: E731
    w = Path(work)
    steps, out = {"imports": peak()}, {}
    for d in ("raw", "cleaned", "dd"):
        (w / d).mkdir()
    t = time.perf_counter()
    out["ingest"] = ingest(ReaderConfig(corpus), w / "raw")
    steps["ingest"] = peak()
    out["clean"] = clean_corpus(w / "raw", w / "cleaned", QualityConfig(gopher_repetition=True, c4=True))
    steps["clean"] = peak()
    out["dedup"] = deduplicate(w / "cleaned", w / "dd", DedupConfig())
    steps["dedup"] = peak()
    print(
        json.dumps(
            {
                "peak_kib_after_step": steps,
                "seconds": time.perf_counter() - t,
                "documents": out["ingest"]["documents"],
                "bytes": out["ingest"]["bytes"],
                "kept_after_clean": out["clean"]["kept"],
                "kept_after_dedup": out["dedup"]["kept"],
                "duplicates": out["dedup"]["duplicate"],
            }
        )
    )


def launcher(corpus: str, work: str) -> None:
    r = subprocess.run([sys.executable, __file__, "--worker", corpus, work], capture_output=True, text=True)
    if r.returncode:
        sys.stderr.write(r.stderr)
        raise SystemExit(r.returncode)
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["peak_rss_kib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps(res))


def measure(corpus: Path, tmp: Path, name: str) -> dict:
    work = tmp / f"work-{name}"
    work.mkdir()
    r = subprocess.run(
        [sys.executable, __file__, "--launch", str(corpus), str(work)], capture_output=True, text=True, check=True
    )
    shutil.rmtree(work)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "prep_memory.json"))
    ap.add_argument("--worker", nargs=2)
    ap.add_argument("--launch", nargs=2)
    args = ap.parse_args()
    if args.worker:
        return worker(*args.worker)
    if args.launch:
        return launcher(*args.launch)
    tmp = Path(tempfile.mkdtemp(prefix="prep-mem-"))
    try:
        x4 = tmp / "x4"
        for i in range(4):
            shutil.copytree(CORPUS, x4 / f"copy{i}")
        res = {"x1": measure(CORPUS, tmp, "x1"), "x4": measure(x4, tmp, "x4")}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res["ratio_x4_over_x1"] = res["x4"]["peak_rss_kib"] / res["x1"]["peak_rss_kib"]
    res["unit"] = "KiB (ru_maxrss on Linux)"
    res["load_average"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
