"""Language ID on a bounded sample of each document against the whole text (issue 44, Part B item 2).

    python benchmarks/language_sample.py [--repeats 3] [--out benchmarks/results/language_sample.json]

Input, the documents as the ``language_id`` group of ``cleaned_text`` reads them (``ingest``, then
``normalize``; empty documents left out, as the group never sees them):

* ``pretrain``: the kernel documentation (``$LARGETRAIN_ROOT/corpora/linux-doc``, one document per file);
* ``domain``: the 38 Shakespeare plays (``$LARGETRAIN_ROOT/corpora/shakespeare``);
* ``multilingual``: built from the handed cases: every row of tests/data/language_id.jsonl (12
  languages; phrases, sentences, paragraphs, mixed); per language, 8 long documents of its sentences
  and paragraphs in seeded orders (2,000 to 12,000 characters); per ordered pair of languages, one
  long document of the first with a paragraph of the second at a seeded place (start, middle, end
  or between); and every document of tests/cases/* that ``ingest`` reads.

Keys:

* ``agreement[corpus][method][N]``: share of documents whose sampled top label equals the whole
  text's (``label``), and share whose keep/drop decision at ``min_language_score`` 0.65 is the same
  (``keep``, from the sample alone; ``keep_identify``, with :func:`largetrain_core.language.identify`
  taking the unsure decisions again on the whole text, and ``identified_again``, the documents it
  did; ``margins``: the same at the default N for margins 0.1, 0.2, 0.3). The wanted language:
  ``en`` for the two corpora and the handed case files, each language_id.jsonl document's own
  language (its first for a mixed one). ``method``: ``prefix``
  (the first N characters), ``windows_3``, ``windows_8`` (3 or 8 windows) or ``windows``
  (``WINDOWS`` windows, the group's method).
* ``score_error``: quantiles of |sampled score - whole score| over the documents longer than N
  (windows), the source of ``SAMPLE_MARGIN``.
* ``cost``: LID CPU seconds per MB of text (``time.process_time``, one thread), whole text against the
  sample at each N (``detect(texts, N)``, sampling included) and ``identify`` at the default N with
  the corpus's wanted language, interleaved in one run, best of ``--repeats``; ``speedup`` = whole / each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from largetrain_core import language
from largetrain_core.clean import normalize
from largetrain_core.corpus import ingest
from largetrain_core.readers import ReaderConfig
from largetrain_core.rules import LANGUAGE_SAMPLE_CHARS

REPO = Path(__file__).resolve().parents[1]
THRESHOLD = 0.65  # the min_language_score default
SIZES = (500, 1000, 2000, 4000)


def _read(path: Path, work: Path) -> list[str]:
    """The normalized, non-empty documents ``ingest`` reads from ``path`` (a corpus folder or file)."""
    raw = Path(tempfile.mkdtemp(dir=work))
    ingest(ReaderConfig(str(path)), raw)
    parts = sorted(raw.glob("part-*.parquet"))
    if not parts:
        return []
    texts = normalize(pl.concat([pl.read_parquet(p, columns=["text"]) for p in parts]))["text"]
    return [t for t in texts.to_list() if t.strip()]


def multilingual(work: Path) -> tuple[list[str], list[str]]:
    """The multilingual set (the module docstring) and each document's wanted language."""
    rows = [json.loads(line) for line in (REPO / "tests" / "data" / "language_id.jsonl").open(encoding="utf-8")]
    rng = random.Random(0)
    texts, wanted = [r["text"] for r in rows], [r["language"] for r in rows]
    langs = sorted({r["language"] for r in rows})
    body = {
        la: [r["text"] for r in rows if r["language"] == la and r["kind"] in ("sentence", "paragraph")] for la in langs
    }
    paragraphs = {la: [r["text"] for r in rows if r["language"] == la and r["kind"] == "paragraph"] for la in langs}

    def long_doc(la: str, chars: int) -> str:
        parts: list[str] = []
        while sum(map(len, parts)) < chars:
            parts += rng.sample(body[la], len(body[la]))
        return "\n\n".join(parts)

    for la in langs:
        for _ in range(8):
            texts.append(long_doc(la, rng.randint(2000, 12000)))
            wanted.append(la)
    for a in langs:
        for b in langs:
            if a != b:
                parts = long_doc(a, 6000).split("\n\n")
                parts.insert(
                    rng.choice([0, len(parts) // 2, len(parts), rng.randrange(len(parts))]), rng.choice(paragraphs[b])
                )
                texts.append("\n\n".join(parts))
                wanted.append(a)
    for case in sorted((REPO / "tests" / "cases").iterdir()):
        if case.name == "README.md":
            continue
        try:
            docs = _read(case, work)
        except Exception:  # a case made to fail ingest (its tests say how): not a document set
            continue
        texts += docs
        wanted += ["en"] * len(docs)
    return texts, wanted


def _keep(labels, scores, wanted) -> np.ndarray:
    return np.array([la == w and s > THRESHOLD for la, s, w in zip(labels, scores, wanted)])


def agreement(texts: list[str], wanted: list[str]) -> dict:
    whole_labels, whole_scores = language.detect(texts)
    whole_keep = _keep(whole_labels, whole_scores, wanted)
    lengths = np.array([len(t) for t in texts])
    out: dict = {"documents": len(texts), "characters": int(lengths.sum())}
    for method, windows in (("prefix", 1), ("windows_3", 3), ("windows_8", 8), ("windows", language.WINDOWS)):
        out[method] = {}
        for n in SIZES:
            samples = [language.sample(t, n, windows) for t in texts]
            labels, scores = language.detect(samples)
            row = {
                "label": float(np.mean([a == b for a, b in zip(labels, whole_labels)])),
                "keep": float(np.mean(_keep(labels, scores, wanted) == whole_keep)),
                "longer_than_n": int((lengths > n).sum()),
            }
            if windows == language.WINDOWS:
                long = lengths > n
                err = np.abs(scores - whole_scores)[long]
                out.setdefault("score_error", {})[n] = (
                    dict(
                        zip(
                            ("q50", "q90", "q99", "q995", "max"),
                            np.quantile(err, [0.5, 0.9, 0.99, 0.995, 1.0]).round(4).tolist(),
                        )
                    )
                    if long.any()
                    else None
                )
                agree_label, agree_keep, again = _identify_agreement(texts, wanted, n, whole_labels, whole_keep)
                row.update(label_identify=agree_label, keep_identify=agree_keep, identified_again=again)
            out[method][n] = row
    n = LANGUAGE_SAMPLE_CHARS
    out["margins"] = {}
    for margin in (0.1, 0.2, 0.3):
        agree_label, agree_keep, again = _identify_agreement(texts, wanted, n, whole_labels, whole_keep, margin)
        out["margins"][margin] = {"label": agree_label, "keep": agree_keep, "identified_again": again}
    return out


def _identify_agreement(
    texts, wanted, n, whole_labels, whole_keep, margin=language.SAMPLE_MARGIN
) -> tuple[float, float, int]:
    """:func:`language.identify` per wanted language (one call per language, as a run with that setting)."""
    labels, scores, again = [None] * len(texts), np.zeros(len(texts)), 0
    for la in sorted(set(wanted)):
        idx = [i for i, w in enumerate(wanted) if w == la]
        lab, sc, a = language.identify([texts[i] for i in idx], n, (la,), THRESHOLD, margin)
        again += a
        for j, i in enumerate(idx):
            labels[i], scores[i] = lab[j], sc[j]
    keep = _keep(labels, scores, wanted)
    return float(np.mean([a == b for a, b in zip(labels, whole_labels)])), float(np.mean(keep == whole_keep)), again


def cost(corpora: dict[str, tuple[list[str], list[str]]], repeats: int) -> dict:
    """CPU seconds per MB, interleaved (whole, each N, identify, whole, ...), best of ``repeats``."""
    out = {}
    for name, (texts, wanted) in corpora.items():
        mb = sum(len(t.encode()) for t in texts) / 1e6
        lang = max(set(wanted), key=wanted.count)
        fns = {"whole": lambda t=texts: language.detect(t)}
        fns |= {f"sample_{n}": lambda t=texts, n=n: language.detect(t, n) for n in SIZES}
        fns[f"identify_{LANGUAGE_SAMPLE_CHARS}_{lang}"] = lambda t=texts, la=lang: language.identify(
            t, LANGUAGE_SAMPLE_CHARS, (la,), THRESHOLD
        )
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(repeats):
            for k, fn in fns.items():
                t0 = time.process_time()
                fn()
                times[k].append(time.process_time() - t0)
        best = {k: min(v) for k, v in times.items()}
        out[name] = {
            "mb": round(mb, 3),
            "cpu_s_per_mb": {k: v / mb for k, v in best.items()},
            "speedup": {k: best["whole"] / v for k, v in best.items() if k != "whole"},
            "raw_cpu_seconds": times,
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "language_sample.json"))
    p.add_argument("--root", default=str(Path(os.environ.get("LARGETRAIN_ROOT", REPO / ".largetrain")) / "corpora"))
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    t_start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="lt-lidsample-"))
    language.model()
    corpora = {}
    for name, folder in (("pretrain", "linux-doc"), ("domain", "shakespeare")):
        texts = _read(Path(args.root) / folder, work)
        corpora[name] = (texts, ["en"] * len(texts))
    corpora["multilingual"] = multilingual(work)
    agree = {name: agreement(*c) for name, c in corpora.items()}
    n = LANGUAGE_SAMPLE_CHARS
    result = {
        "default_sample_chars": n,
        "windows": language.WINDOWS,
        "sample_margin": language.SAMPLE_MARGIN,
        "threshold": THRESHOLD,
        "headline": {
            name: {
                "label": a["windows"][n]["label"],
                "keep_sample_only": a["windows"][n]["keep"],
                "keep_identify": a["windows"][n]["keep_identify"],
                "identified_again": a["windows"][n]["identified_again"],
                "documents": a["documents"],
            }
            for name, a in agree.items()
        },
        "goals": {"agreement": 0.995, "lid_cost_down": 5.0},
        "agreement": agree,
        "cost": cost(corpora, args.repeats),
        "repeats": args.repeats,
        "command": "python benchmarks/language_sample.py",
        "load_average_at_end": os.getloadavg(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "seconds": round(time.perf_counter() - t_start, 1),
    }
    for name in corpora:
        result["headline"][name]["speedup_sample"] = result["cost"][name]["speedup"][f"sample_{n}"]
        result["headline"][name]["speedup_identify"] = next(
            v for k, v in result["cost"][name]["speedup"].items() if k.startswith("identify_")
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["headline"], indent=1))


if __name__ == "__main__":
    main()
