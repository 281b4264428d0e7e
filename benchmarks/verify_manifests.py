"""What verifying the artifacts before reuse costs: ``verify_manifest`` over every artifact directory of
a storage root, in its default mode (what ``build_or_reuse`` and the handle IO manager run) and with
``full=True`` (every byte hashed), each timed.

    python benchmarks/verify_manifests.py [ROOT] [--repeats 3] [--out benchmarks/results/verify_manifests.json] [--note TEXT]

ROOT: the storage root (default ``$LARGETRAIN_ROOT`` or ``.largetrain``), e.g. after ``make demo``.
Every directory holding a ``_manifest.json`` is verified; the corpora, the landing directory and the
Dagster home are not artifacts and hold none. ``bytes_hashed_default``: the bytes the default mode
reads (files up to FULL_CHECKSUM_MAX_BYTES whole, larger ones as SAMPLE_BLOCKS x SAMPLE_BLOCK, files
whose mtime changed whole). Timings are the best of ``--repeats`` runs, so the files are in the page
cache after the first one; ``first_run_seconds`` keeps the first run of each mode (cold only if the
cache was dropped before, e.g. ``sync; echo 3 > /proc/sys/vm/drop_caches`` as root).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from largetrain_core import storage
from largetrain_core.storage import MANIFEST, verify_manifest


def _hashed_by_default(directory: Path, manifest: dict) -> int:
    total = 0
    for rel, entry in manifest["files"].items():
        path = directory / rel
        if not path.exists():
            continue
        st = path.stat()
        whole = st.st_size <= storage.FULL_CHECKSUM_MAX_BYTES or st.st_mtime_ns != entry["mtime_ns"]
        total += st.st_size if whole else min(st.st_size, storage.SAMPLE_BLOCKS * storage.SAMPLE_BLOCK)
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", nargs="?", default=os.environ.get("LARGETRAIN_ROOT", ".largetrain"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--note", default="", help="what the tree is (recorded in the JSON)")
    args = p.parse_args()

    root = Path(args.root).resolve()
    dirs = sorted(m.parent for m in root.rglob(MANIFEST))
    if not dirs:
        raise SystemExit(f"no {MANIFEST} under {root}: materialize something first (make demo)")
    rows, totals = [], {"default": [], "full": []}
    for mode in ("default", "full"):
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for d in dirs:
                verify_manifest(d, full=mode == "full")
            totals[mode].append(time.perf_counter() - t0)
    problems = [x for d in dirs for x in verify_manifest(d, full=True)]
    for d in dirs:
        manifest = json.loads((d / MANIFEST).read_text())
        size = sum(e["bytes"] for e in manifest["files"].values())
        times = {}
        for mode in ("default", "full"):
            best = float("inf")
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                verify_manifest(d, full=mode == "full")
                best = min(best, time.perf_counter() - t0)
            times[mode] = round(best, 4)
        rows.append(
            {
                "directory": str(d.relative_to(root)),
                "files": len(manifest["files"]),
                "bytes": size,
                "bytes_hashed_default": _hashed_by_default(d, manifest),
                "seconds_default": times["default"],
                "seconds_full": times["full"],
            }
        )
    result = {
        "root": str(root),
        "note": args.note,
        "directories": len(dirs),
        "files": sum(r["files"] for r in rows),
        "bytes": sum(r["bytes"] for r in rows),
        "bytes_hashed_default": sum(r["bytes_hashed_default"] for r in rows),
        "seconds_default": round(min(totals["default"]), 4),
        "seconds_full": round(min(totals["full"]), 4),
        "first_run_seconds": {m: round(t[0], 4) for m, t in totals.items()},
        "problems": problems,
        "full_checksum_max_bytes": storage.FULL_CHECKSUM_MAX_BYTES,
        "sample": f"{storage.SAMPLE_BLOCKS} x {storage.SAMPLE_BLOCK} bytes",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average": os.getloadavg()},
        "per_directory": rows,
    }
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "per_directory"}, indent=2))


if __name__ == "__main__":
    main()
