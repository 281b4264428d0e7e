"""Every data-prep stage at 1x, 8x, 32x (96x) the kernel docs: wall time, MB/s, peak RSS, and the wall
time with 1 and 2 partitions run in parallel; the tokenizer's training sample against training on
everything.

    python benchmarks/scale.py run [--scales 1 8 32] [--work /tmp/largetrain-scale]   # -> benchmarks/results/scale.json
    python benchmarks/scale.py generate OUT --scale 8      # the corpus only: JSONL files under OUT/corpus
    python benchmarks/scale.py tokenizer-quality OUT [--sample-mb 4 16 0]   # -> benchmarks/results/scale.json

The corpus (:func:`generate`): a paragraph remix of the kernel docs (``.largetrain/corpora/linux-doc``,
3,183 files, 24.2 MB, 150,456 paragraphs split at blank lines). 5% of the paragraphs (seeded) are held
out: they never enter the corpus and form ``OUT/heldout.jsonl``, the held-out text of the tokenizer's
compression measure. Each document takes the paragraph count of a random kernel doc and that many
paragraphs drawn at random from the rest (so documents are new texts of the kernel docs' length
distribution, not copies). Planted duplicates, among the documents: 4% are near copies of one of the
last 1,000 documents (2% of their words replaced by a random word of the copied document: word
5-gram Jaccard about 0.9, above the LSH's 0.72 threshold), 1% exact copies up to whitespace and case
(the dedup key's normalization). ``scale`` x 24.2 MB of text, JSONL files of about 256 KiB (so that
hash partitioning over files spreads bytes evenly), one ``{"id", "text"}`` object per line.
``OUT/generated.json`` counts documents, bytes and planted copies.

Stages (``run``), each in fresh worker processes with one thread each
(POLARS_MAX_THREADS=RAYON_NUM_THREADS=OMP_NUM_THREADS=1), so that "2 partitions in parallel" means two
workers on two cores, and each worker's peak RSS (``ru_maxrss`` of it and its children: the BPE
trainer runs in one) is its own:

* ``read_clean``: corpus.ingest + cleaned_text's step of a partition (the QualityConfig defaults, and
  the MinHash signatures of the kept documents with the DedupConfig defaults, as cleaned_text computes them);
* ``dedup``: dedup.deduplicate over the cleaned corpus: the global step, clustering the partitions'
  signatures (exact + MinHash-LSH);
* ``tokenizer``: BPE training (8,192 ids) on the training sample of the deduplicated corpus, bounded
  by ``--max-training-bytes`` (default 24 MB, about the 1x corpus, so that the bound shows from 8x
  on; the stage's own default is 10^9 bytes);
* ``tokenize_write``: shards.tokenize_partition (seq_len 1024) of 1 partition, and of 2 at once;
  ``assemble``: the global step over the 2 partitions (tails and manifest);
* ``encode_batch``: per core, tokenize + pack + write of each part file (shards.tokenize_parts)
  against bare ``Tokenizer.encode_batch`` and ``encode_batch_fast`` of the same texts, interleaved
  part by part in one process (``ratio_vs_encode_batch``: their seconds over ours; goal >= 0.9), at the
  sizes of ``--ratio-scales`` (1x and 8x: a per-core ratio; 32x would add about 18 minutes).

Per stage and size: ``seconds`` (in the worker), ``mb_per_s`` (input text, 10^6 bytes, per core),
``peak_rss_mib``, and for the partitioned stages ``seconds_2_partitions`` (the slower of two workers
at once) with ``parallel_efficiency`` = seconds / (2 x seconds_2_partitions) (1.0: perfect scaling;
the goal of 0.8 for tokenize_write assumes a quiet machine). ``summary``: per stage its peak RSS and
MB/s by size, ``peak_rss_growth_32x`` (32x over 1x; goal <= 1.2) and ``core_hours_per_tb``. The load averages before and
after each measurement are recorded: this machine is shared, and its load slows the workers unevenly.

Tokenizer quality (:func:`tokenizer_quality`): byte-level BPEs of 8,192 ids trained on seeded samples
of the corpus (largetrain_core.tokenizer.training_sample) and on all of it, each scored by the UTF-8
bytes of the held-out paragraphs per token (higher: better compression). Note that the remix holds
no more distinct text than the kernel docs (24 MB), so beyond that a larger sample cannot add
vocabulary; the comparison says that a bounded sample loses nothing against the whole corpus.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNEL_DOCS = ROOT / ".largetrain" / "corpora" / "linux-doc"

HELDOUT_FRACTION = 0.05
NEAR_FRACTION = 0.04
EXACT_FRACTION = 0.01
NEAR_WORDS_REPLACED = 0.02
RECENT = 1000
FILE_BYTES = 1 << 18


def paragraphs(source: Path = KERNEL_DOCS) -> tuple[list[str], list[int]]:
    """The paragraphs of every file under ``source`` (text split at blank lines, stripped, empty ones
    left out), in sorted file order, and each file's paragraph count."""
    out, counts = [], []
    for f in sorted(source.rglob("*.txt")):
        ps = [
            p.strip("\n") for p in re.split(r"\n[ \t]*\n", f.read_text(encoding="utf-8", errors="replace")) if p.strip()
        ]
        out += ps
        counts.append(len(ps))
    return out, counts


def _near_copy(text: str, rng: random.Random) -> str:
    """``text`` with NEAR_WORDS_REPLACED of its words (whitespace runs kept) replaced by a random
    word of the same text."""
    parts = re.split(r"(\s+)", text)
    words = [i for i in range(0, len(parts), 2) if parts[i]]
    for i in rng.sample(words, max(1, int(len(words) * NEAR_WORDS_REPLACED))) if words else []:
        parts[i] = parts[rng.choice(words)]
    return "".join(parts)


def _exact_copy(text: str, rng: random.Random) -> str:
    """``text`` with its whitespace runs doubled or its case changed: the same dedup key."""
    return re.sub(r" ", "  ", text) if rng.random() < 0.5 else text.upper()


def generate(out: Path, scale: float, seed: int = 0, source: Path = KERNEL_DOCS) -> dict:
    """Write the remix corpus of ``scale`` x the kernel docs' bytes under ``out/corpus`` (module doc);
    returns (and writes to ``out/generated.json``) its counts. Deterministic in (scale, seed, source)."""
    out = Path(out)
    (out / "corpus").mkdir(parents=True, exist_ok=True)
    paras, counts = paragraphs(source)
    source_bytes = sum(f.stat().st_size for f in source.rglob("*.txt"))
    rng = random.Random(seed)
    order = list(range(len(paras)))
    rng.shuffle(order)
    cut = int(len(paras) * HELDOUT_FRACTION)
    held, pool = sorted(order[:cut]), [paras[i] for i in sorted(order[cut:])]
    with open(out / "heldout.jsonl", "w", encoding="utf-8") as fh:
        for k in range(0, len(held), 40):  # documents of 40 held-out paragraphs
            fh.write(
                json.dumps({"id": f"heldout-{k // 40}", "text": "\n\n".join(paras[i] for i in held[k : k + 40])}) + "\n"
            )
    target = int(scale * source_bytes)
    stats = {
        "scale": scale,
        "seed": seed,
        "source_bytes": source_bytes,
        "documents": 0,
        "bytes": 0,
        "files": 0,
        "planted_near": 0,
        "planted_exact": 0,
        "heldout_paragraphs": len(held),
    }
    recent: list[str] = []
    fh, in_file = None, 0
    while stats["bytes"] < target:
        u = rng.random()
        if recent and u < NEAR_FRACTION:
            text, kind = _near_copy(rng.choice(recent), rng), "planted_near"
        elif recent and u < NEAR_FRACTION + EXACT_FRACTION:
            text, kind = _exact_copy(rng.choice(recent), rng), "planted_exact"
        else:
            n = max(1, counts[rng.randrange(len(counts))])
            text, kind = "\n\n".join(pool[rng.randrange(len(pool))] for _ in range(n)) + "\n", None
        if kind:
            stats[kind] += 1
        recent.append(text)
        if len(recent) > RECENT:
            recent.pop(0)
        if fh is None or in_file >= FILE_BYTES:
            if fh:
                fh.close()
            d = out / "corpus" / f"{stats['files'] // 100:04d}"
            d.mkdir(exist_ok=True)
            fh, in_file = open(d / f"{stats['files']:06d}.jsonl", "w", encoding="utf-8"), 0
            stats["files"] += 1
        line = json.dumps({"id": f"remix-{stats['documents']}", "text": text}, ensure_ascii=False) + "\n"
        fh.write(line)
        in_file += len(line)
        stats["documents"] += 1
        stats["bytes"] += len(text.encode())
    if fh:
        fh.close()
    (out / "generated.json").write_text(json.dumps(stats, indent=1) + "\n")
    return stats


def tokenizer_quality(corpus_dir: Path, work: Path, sample_bytes: list[int | None], vocab_size: int = 8192) -> dict:
    """Held-out compression of tokenizers trained on samples of the generated corpus ``corpus_dir/corpus``
    (largetrain_core.tokenizer.training_sample, seed 0; None: the whole corpus) against each other:
    ``heldout_bytes_per_token`` (UTF-8 bytes of ``corpus_dir/heldout.jsonl`` per token, EOS not counted;
    higher is better), the bytes trained on and the seconds of training."""
    from tokenizers import Tokenizer

    from largetrain_core.corpus import ingest
    from largetrain_core.readers import ReaderConfig
    from largetrain_core.storage import part_files
    from largetrain_core.tokenizer import train_bpe, training_sample

    raw = work / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    if not part_files(raw):
        ingest(ReaderConfig(str(corpus_dir / "corpus")), raw)
    held = [json.loads(line)["text"] for line in (corpus_dir / "heldout.jsonl").read_text().splitlines()]
    held_bytes = sum(len(t.encode()) for t in held)
    out = {}
    for limit in sample_bytes:
        sample = training_sample(part_files(raw), limit)
        t0 = time.perf_counter()
        info, stats = train_bpe(sample.texts(), vocab_size, work / f"tok-{limit}")
        seconds = time.perf_counter() - t0
        tok = Tokenizer.from_file(str(info.path))
        tokens = sum(len(e.ids) for e in tok.encode_batch(held, add_special_tokens=False))
        out["all" if limit is None else str(limit)] = {
            "max_training_bytes": limit,
            "trained_on_characters": stats["characters"],
            "sample_fraction": sample.fraction,
            "seconds": round(seconds, 1),
            "heldout_bytes_per_token": held_bytes / tokens,
            "load_average": os.getloadavg(),
        }
    return {
        "vocab_size": vocab_size,
        "heldout_bytes": held_bytes,
        "corpus_bytes": sample.corpus_bytes,
        "by_sample": out,
    }


# ------------------------------------------------------------------------------------------------ stages

ONE_THREAD = {
    "POLARS_MAX_THREADS": "1",
    "RAYON_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "true",
}


def _peak_mib() -> float:
    """This process's peak RSS and its waited-for children's (the BPE trainer runs in one), MiB."""
    import resource

    return (
        max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
        / 1024
    )


def _text_mb(dirs=None, parts=None) -> float:
    """MB (10^6 bytes) of text in the part files of ``dirs``, or in ``parts``."""
    from largetrain_core.storage import part_files
    from largetrain_core.tokenizer import text_bytes

    return text_bytes(part_files(dirs) if parts is None else parts) / 1e6


def work_read_clean(a: dict) -> dict:
    """corpus.ingest + cleaned_text's step (the quality rules and the MinHash signatures:
    parts.WithSignatures) of partition ``a["partition"]`` of ``a["partitions"]``."""
    from largetrain_core.clean import Cleaning, QualityConfig
    from largetrain_core.corpus import ingest
    from largetrain_core.dedup import DedupConfig
    from largetrain_core.parts import WithSignatures, map_parts
    from largetrain_core.readers import ReaderConfig

    raw, clean = Path(a["out"]) / "raw", Path(a["out"]) / "clean"
    raw.mkdir(parents=True), clean.mkdir()
    t0 = time.perf_counter()
    got = ingest(ReaderConfig(a["corpus"], partition=a["partition"], partitions=a["partitions"]), raw)
    kept = map_parts(WithSignatures(Cleaning(QualityConfig()), DedupConfig()), raw, clean)
    return {
        "seconds": time.perf_counter() - t0,
        "input_mb": got["bytes"] / 1e6,
        "documents": got["documents"],
        "kept": kept["kept"],
    }


def work_dedup(a: dict) -> dict:
    """dedup.deduplicate over the cleaned partitions ``a["inputs"]``."""
    from largetrain_core.dedup import DedupConfig, deduplicate

    out = Path(a["out"])
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    got = deduplicate([Path(d) for d in a["inputs"]], out, DedupConfig())
    return {
        "seconds": time.perf_counter() - t0,
        "input_mb": _text_mb([Path(d) for d in a["inputs"]]),
        "documents": got["input"],
        "duplicate_exact": got["duplicate_exact"],
        "duplicate_near": got["duplicate_near"],
    }


def work_tokenizer(a: dict) -> dict:
    """BPE training on the training sample (``a["max_training_bytes"]``) of the deduplicated corpus."""
    from largetrain_core.storage import part_files
    from largetrain_core.tokenizer import train_bpe, training_sample

    t0 = time.perf_counter()
    sample = training_sample(part_files(Path(a["input"])), a["max_training_bytes"])
    _, stats = train_bpe(sample.texts(), 8192, Path(a["out"]))
    return {
        "seconds": time.perf_counter() - t0,
        "input_mb": sample.corpus_bytes / 1e6,
        "trained_on_mb": stats["characters"] / 1e6,
        "sample_fraction": sample.fraction,
    }


def work_tokenize_write(a: dict) -> dict:
    """Tokenize + pack + write partition ``a["partition"]`` of ``a["partitions"]`` of the deduplicated
    corpus (shards.tokenize_partition, seq_len 1024) into ``a["out"]``."""
    from largetrain_core.shards import Packing, partition_parts, tokenize_partition
    from largetrain_core.storage import part_files

    out = Path(a["out"])
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    s = tokenize_partition(
        Path(a["input"]), Path(a["tokenizer"]), out, a["partition"], a["partitions"], Packing(seq_len=1024)
    )
    mine = partition_parts(part_files(Path(a["input"])), a["partition"], a["partitions"])[1]
    return {
        "seconds": time.perf_counter() - t0,
        "input_mb": _text_mb(parts=mine),
        "tokens": s["sequences"] * 1025 + s["tail_tokens"],
    }


def work_assemble(a: dict) -> dict:
    """The global step of the token shards over the partitions ``a["inputs"]`` (shards.assemble_token_shards)."""
    from largetrain_core.shards import Packing, assemble_token_shards

    out = Path(a["out"])
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    m = assemble_token_shards(
        [Path(d) for d in a["inputs"]], Path(a["input"]), Path(a["tokenizer"]), out, Packing(seq_len=1024)
    )
    return {"seconds": time.perf_counter() - t0, "input_mb": 0.0, "tokens": m["total_tokens"]}


def work_encode_batch(a: dict) -> dict:
    """Our tokenize + pack + write against bare ``Tokenizer.encode_batch`` (and ``encode_batch_fast``, the
    encoder the stage calls) on the same texts, interleaved part by part in this one process, so that
    the machine's load hits both alike: per part file, shards.tokenize_parts of it, then the bare
    encoders on its texts (read beforehand, not timed)."""
    import tempfile

    import polars as pl

    from largetrain_core.shards import Packing, tokenize_parts
    from largetrain_core.storage import part_files
    from largetrain_core.tokenizer import read_tokenizer

    tok = read_tokenizer(Path(a["tokenizer"]) / "tokenizer.json")
    ours = bare = fast = 0.0
    tokens = 0
    with tempfile.TemporaryDirectory(prefix="scale-encode-") as tmp:
        for j, part in enumerate(part_files(Path(a["input"]))):
            t0 = time.perf_counter()
            r = tokenize_parts([part], j, Path(a["tokenizer"]), Path(tmp), Packing(seq_len=1024))
            ours += time.perf_counter() - t0
            texts = pl.read_parquet(part, columns=["text"])["text"].to_list()
            t0 = time.perf_counter()
            enc = tok.encode_batch(texts, add_special_tokens=False)
            bare += time.perf_counter() - t0
            n = sum(len(e.ids) + 1 for e in enc)
            del enc  # a part's Encodings (ids, offsets, masks) are hundreds of MB: not held into the next encoder
            t0 = time.perf_counter()
            tok.encode_batch_fast(texts, add_special_tokens=False)
            fast += time.perf_counter() - t0
            tokens += n
            for f in Path(tmp).iterdir():
                f.unlink()
            assert sum(w["document_tokens"] + w["repeat_tokens"] for w in r["writers"].values()) == n
    return {
        "seconds": ours,
        "seconds_encode_batch": bare,
        "seconds_encode_batch_fast": fast,
        "tokens": tokens,
        "input_mb": _text_mb(Path(a["input"])),
        "ratio_vs_encode_batch": bare / ours,
        "ratio_vs_encode_batch_fast": fast / ours,
    }


WORK = {
    "read_clean": work_read_clean,
    "dedup": work_dedup,
    "tokenizer": work_tokenizer,
    "tokenize_write": work_tokenize_write,
    "assemble": work_assemble,
    "encode_batch": work_encode_batch,
}


def run_workers(jobs: list[tuple[str, dict]]) -> tuple[float, list[dict]]:
    """Start one worker process per (stage, arguments) at once, one thread each (ONE_THREAD); returns the
    wall time until the last ends and each worker's result (with its ``peak_rss_mib``)."""
    import subprocess

    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "worker", stage, json.dumps(args)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for stage, args in jobs
    ]
    outs = [p.communicate() for p in procs]
    wall = time.perf_counter() - t0
    for p, (_out, err), (stage, _) in zip(procs, outs, jobs):
        if p.returncode:
            raise RuntimeError(f"worker {stage} exited with {p.returncode}:\n{err[-3000:]}")
    return wall, [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def measure(name: str, one: tuple[str, dict], two: list[tuple[str, dict]] | None) -> dict:
    """One stage at one size: 1 worker, then (``two``) 2 workers at once; the load averages around each."""
    before = os.getloadavg()
    wall, (r,) = run_workers([one])
    res = {
        **r,
        "wall_seconds": wall,
        "mb_per_s": r["input_mb"] / r["seconds"],
        "load_average_before": before,
        "load_average_after": os.getloadavg(),
    }
    if two:
        before = os.getloadavg()
        wall2, rs = run_workers(two)
        slowest = max(x["seconds"] for x in rs)  # in the workers: without the interpreters' start
        res.update(
            seconds_2_partitions=slowest,
            wall_seconds_2_partitions=wall2,
            parallel_efficiency=r["seconds"] / (2 * slowest),
            parallel_efficiency_wall=wall / (2 * wall2),
            partition_input_mb=[x["input_mb"] for x in rs],
            partition_seconds=[x["seconds"] for x in rs],
            partition_peak_rss_mib=[x["peak_rss_mib"] for x in rs],
            load_average_before_2=before,
            load_average_after_2=os.getloadavg(),
        )
    print(
        f"{name}: {json.dumps({k: v for k, v in res.items() if not isinstance(v, (list, tuple))})}",
        file=sys.stderr,
        flush=True,
    )
    return res


def run_scale(scale: float, work: Path, max_training_bytes: int, ratio: bool = True) -> dict:
    """Every stage at one corpus size (module doc); ``encode_batch`` only with ``ratio``."""
    corpus = work / f"x{scale:g}"
    if not (corpus / "generated.json").exists():
        generate(corpus, scale)
    w = work / f"run-x{scale:g}"
    if w.exists():
        import shutil

        shutil.rmtree(w)
    print(
        f"x{scale:g}: {corpus} ({json.loads((corpus / 'generated.json').read_text())['bytes'] / 1e6:.0f} MB)",
        file=sys.stderr,
    )
    c = str(corpus / "corpus")
    out = {"corpus": json.loads((corpus / "generated.json").read_text())}
    out["read_clean"] = measure(
        f"x{scale:g} read_clean",
        ("read_clean", {"corpus": c, "partition": 0, "partitions": 1, "out": str(w / "p1")}),
        [("read_clean", {"corpus": c, "partition": i, "partitions": 2, "out": str(w / f"p2-{i}")}) for i in range(2)],
    )
    out["dedup"] = measure(
        f"x{scale:g} dedup", ("dedup", {"inputs": [str(w / "p1" / "clean")], "out": str(w / "p1" / "dd")}), None
    )
    dd = str(w / "p1" / "dd")
    out["tokenizer"] = measure(
        f"x{scale:g} tokenizer",
        ("tokenizer", {"input": dd, "out": str(w / "tok"), "max_training_bytes": max_training_bytes}),
        None,
    )
    tok = str(w / "tok")
    tw = {"input": dd, "tokenizer": tok}
    out["tokenize_write"] = measure(
        f"x{scale:g} tokenize_write",
        ("tokenize_write", {**tw, "partition": 0, "partitions": 1, "out": str(w / "shards1" / "p0")}),
        [
            ("tokenize_write", {**tw, "partition": i, "partitions": 2, "out": str(w / "shards2" / f"p{i}")})
            for i in range(2)
        ],
    )
    out["assemble"] = measure(
        f"x{scale:g} assemble",
        (
            "assemble",
            {**tw, "inputs": [str(w / "shards2" / f"p{i}") for i in range(2)], "out": str(w / "shards2" / "global")},
        ),
        None,
    )
    if ratio:
        out["encode_batch"] = measure(f"x{scale:g} encode_batch", ("encode_batch", tw), None)
        out["tokenize_write"]["ratio_vs_encode_batch_per_core"] = out["encode_batch"]["ratio_vs_encode_batch"]
        out["tokenize_write"]["ratio_vs_encode_batch_fast_per_core"] = out["encode_batch"]["ratio_vs_encode_batch_fast"]
    import shutil

    shutil.rmtree(w)  # the stages' outputs (several GB at 32x); the corpus is kept for the next run
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="write the remix corpus")
    g.add_argument("out")
    g.add_argument("--scale", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    q = sub.add_parser(
        "tokenizer-quality",
        help="held-out bytes per token of tokenizers trained on samples of a generated corpus (OUT of `generate`)",
    )
    q.add_argument("corpus", help="the directory `generate` wrote")
    q.add_argument(
        "--sample-mb", type=float, nargs="+", default=[4, 16, 0], help="sample sizes in MB (10^6 bytes); 0: all"
    )
    q.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "scale.json"))
    r = sub.add_parser("run", help="every stage at each size -> benchmarks/results/scale.json (key stages)")
    r.add_argument("--scales", type=float, nargs="+", default=[1, 8, 32])
    r.add_argument(
        "--ratio-scales",
        type=float,
        nargs="+",
        default=[1, 8],
        help="the sizes at which encode_batch runs (a per-core ratio; it tokenizes every part three times, "
        "about 18 minutes at 32x)",
    )
    r.add_argument("--work", default="/tmp/largetrain-scale", help="corpora and stage outputs (several GB at 32x)")
    r.add_argument(
        "--max-training-bytes",
        type=int,
        default=24_000_000,
        help="the tokenizer's training sample bound (default: about the 1x corpus, so its bound shows at 8x)",
    )
    r.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "scale.json"))
    w = sub.add_parser("worker", help=argparse.SUPPRESS)
    w.add_argument("stage", choices=sorted(WORK))
    w.add_argument("args")
    args = ap.parse_args(argv)
    if args.cmd == "worker":
        res = WORK[args.stage](json.loads(args.args))
        print(json.dumps({**res, "peak_rss_mib": _peak_mib()}))
    elif args.cmd == "run":
        work = Path(args.work)
        work.mkdir(parents=True, exist_ok=True)
        out = Path(args.out)
        stages = json.loads(out.read_text()).get("stages", {}) if out.exists() else {}  # other sizes' results stay
        for scale in args.scales:
            stages[f"x{scale:g}"] = run_scale(scale, work, args.max_training_bytes, scale in args.ratio_scales)
            merge_results(
                Path(args.out),
                {
                    "stages": stages,
                    "summary": summarize(stages),
                    "cpu_count": os.cpu_count(),
                    "threads_per_worker": 1,
                    "max_training_bytes": args.max_training_bytes,
                },
            )
        print(json.dumps(summarize(stages), indent=1))
    elif args.cmd == "generate":
        print(json.dumps(generate(Path(args.out), args.scale, args.seed)))
    elif args.cmd == "tokenizer-quality":
        with tempfile.TemporaryDirectory(prefix="scale-tok-") as work:
            res = tokenizer_quality(Path(args.corpus), Path(work), [int(m * 1e6) or None for m in args.sample_mb])
        res["corpus"] = json.loads((Path(args.corpus) / "generated.json").read_text())
        merge_results(Path(args.out), {"tokenizer_quality": res})
        print(json.dumps(res, indent=1))
    return 0


def summarize(stages: dict) -> dict:
    """Per stage: peak RSS by size and ``peak_rss_growth_32x`` (32x over 1x), MB/s by size, the
    ``parallel_efficiency`` of 2 workers by size, and ``core_hours_per_tb`` by size: 10^12 bytes of
    input text at the size's MB/s of one core, 10^6 / mb_per_s / 3,600 (not for the tokenizer, whose
    time is its bounded sample's, nor for assemble, which reads the partitions' tails only)."""
    out = {}
    for stage in ("read_clean", "dedup", "tokenizer", "tokenize_write", "assemble"):
        by = {size: r[stage] for size, r in stages.items() if stage in r}
        s = {
            "peak_rss_mib": {k: v["peak_rss_mib"] for k, v in by.items()},
            "mb_per_s": {k: v["mb_per_s"] for k, v in by.items()},
            "parallel_efficiency": {k: v.get("parallel_efficiency") for k, v in by.items()},
        }
        if stage not in ("tokenizer", "assemble"):
            s["core_hours_per_tb"] = {k: 1e6 / v["mb_per_s"] / 3600 for k, v in by.items()}
        if "x1" in by and "x32" in by:
            s["peak_rss_growth_32x"] = by["x32"]["peak_rss_mib"] / by["x1"]["peak_rss_mib"]
        if stage == "tokenize_write":
            for k in ("ratio_vs_encode_batch_per_core", "ratio_vs_encode_batch_fast_per_core"):
                s[k] = {size: v[k] for size, v in by.items() if k in v}
        out[stage] = s
    return out


def merge_results(path: Path, update: dict) -> None:
    """Write ``update``'s keys into the JSON object at ``path`` (created if missing), keeping its other keys."""
    old = json.loads(path.read_text()) if path.exists() else {}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**old, **update}, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
