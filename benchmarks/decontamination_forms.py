"""Decontamination recall on benchmark items in the forms web pages give them, and the share of clean
documents flagged (issue 42, item 1).

Run by hand::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/decontamination_forms.py   # -> benchmarks/results/decontamination_forms.json

Clean documents: the demo corpora under ``.largetrain/corpora`` (kernel docs, the 38 plays, the
fortunes, the Python FAQ), one document per file. Items (one benchmark file):

* 20 long items: English prose of tests/data/language_id.jsonl of at least 14 words, cut as
  benchmarks/prep.py cuts them (prompt = the first max(13, 2/3) words, answer = the rest);
* the 4 long items of tests/data/eval_benchmark.jsonl and its 5-word item (listed as too short);
* 20 short trivia items written for this benchmark (prompts of 5 to 12 words, short answers; one
  of 5 words that must be listed as too short) and the two items of tests/cases/decontamination_forms.

Each checkable item is planted, in each form below, in the middle of a clean document drawn at random
(seed 0): ``verbatim`` (today's form: prompt, a space, answer), ``soft_hyphen`` and ``zero_width``
(U+00AD / U+200B inside three long words), ``line_break_hyphen`` (lines of about 8 words, a long word
split ``xx-\\nyy`` at each break), ``qa_labels`` (``Q: prompt\\nA: answer``), ``question_answer``
(``Question: prompt ... Answer: answer``), ``multiple_choice`` (four lettered options, the answer third,
then ``Correct answer: (c) answer``), ``the_answer_is`` (``prompt The answer is answer.``).

Reported per form and in all: recall (planted documents found with their item) of this code and of
the code on ``main`` (``git show main:largetrain_core/decontamination.py``, when git has it), and the
share of clean documents flagged by each; and the scan time of the clean documents, this code over
main's (interleaved, best of 3, on this machine: 2 cores shared with other work, so noisy).
"""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parent.parent
CORPORA = ROOT / ".largetrain" / "corpora"
if not CORPORA.is_dir():
    CORPORA = Path("/work/main/.largetrain/corpora")
OUT = ROOT / "benchmarks" / "results" / "decontamination_forms.json"

SHORT_ITEMS = [
    ("Which planet in our solar system has the shortest year?", "Mercury"),
    ("What is the chemical symbol for the element sodium?", "Na"),
    ("Who painted the ceiling of the Sistine Chapel in Rome?", "Michelangelo"),
    ("In which year did the Berlin Wall fall?", "1989"),
    ("What is the largest organ of the human body?", "the skin"),
    ("Which gas do plants absorb from the air for photosynthesis?", "carbon dioxide"),
    ("How many bones are in the adult human body?", "206"),
    ("What is the hardest natural substance found on Earth?", "diamond"),
    ("Which ocean lies between Africa and Australia?", "the Indian Ocean"),
    ("Who wrote the novel Pride and Prejudice?", "Jane Austen"),
    ("What is the boiling point of water at sea level in Celsius?", "100 degrees"),
    ("Which country gave the Statue of Liberty to the United States?", "France"),
    ("What is the smallest prime number of all?", "two"),
    ("Which language has the most native speakers in the world?", "Mandarin Chinese"),
    ("What is the capital city of Australia?", "Canberra"),
    ("Which blood cells carry oxygen around the body?", "red blood cells"),
    ("What is the longest bone in the human body?", "the femur"),
    ("Which element has the atomic number one?", "hydrogen"),
    ("Who developed the theory of general relativity?", "Albert Einstein"),
    ("Which instrument measures atmospheric pressure?", "a barometer"),  # 5 words: too short
]
FORMS = (
    "verbatim",
    "soft_hyphen",
    "zero_width",
    "line_break_hyphen",
    "qa_labels",
    "question_answer",
    "multiple_choice",
    "the_answer_is",
)


def _items() -> list[dict]:
    items = []
    rows = [json.loads(line) for line in (ROOT / "tests" / "data" / "language_id.jsonl").open(encoding="utf-8")]
    prose = [r["text"] for r in rows if r["kind"] in ("paragraph", "sentence") and len(r["text"].split()) >= 14]
    for k, text in enumerate(random.Random(1).sample(prose, 20)):
        words = text.split()
        cut = max(13, len(words) * 2 // 3)
        items.append({"id": f"long{k}", "prompt": " ".join(words[:cut]), "answer": " ".join(words[cut:])})
    for line in (ROOT / "tests" / "data" / "eval_benchmark.jsonl").open():
        items.append(json.loads(line))
    for k, (p, a) in enumerate(SHORT_ITEMS):
        items.append({"id": f"short{k}", "prompt": p, "answer": a})
    for line in (ROOT / "tests" / "cases" / "decontamination_forms" / "quiz.jsonl").open():
        items.append(json.loads(line))
    return items


def _hint(words: list[str], mark: str, rng: random.Random) -> list[str]:
    long = [i for i, w in enumerate(words) if len(w) >= 6 and w.isalpha()]
    for i in rng.sample(long, min(3, len(long))):
        w = words[i]
        words[i] = w[:3] + mark + w[3:]
    return words


def _line_breaks(text: str) -> str:
    words, out, line = text.split(), [], []
    for w in words:
        if len(line) >= 8 and len(w) >= 6 and w.isalpha():
            out.append(" ".join(line + [w[:3] + "-"]))
            line = [w[3:]]
        else:
            line.append(w)
    return "\n".join(out + [" ".join(line)])


def form(item: dict, kind: str, distractors: list[str], rng: random.Random) -> str:
    p, a = item["prompt"], item["answer"]
    if kind == "verbatim":
        return f"{p} {a}"
    if kind in ("soft_hyphen", "zero_width"):
        mark = "\u00ad" if kind == "soft_hyphen" else "\u200b"
        return " ".join(_hint(p.split(), mark, rng)) + " " + a
    if kind == "line_break_hyphen":
        return _line_breaks(f"{p} {a}")
    if kind == "qa_labels":
        return f"Q: {p}\nA: {a}"
    if kind == "question_answer":
        return f"Question: {p}\nShow the answer\nAnswer: {a}"
    if kind == "multiple_choice":
        opts = [*distractors[:2], a, distractors[2]]
        block = "\n".join(f"({c}) {o}" for c, o in zip("abcd", opts))
        return f"{p}\n{block}\nCorrect answer: (c) {a}"
    return f"{p} The answer is {a}."


def _documents() -> list[tuple[str, str]]:
    docs = []
    for f in sorted(p for p in CORPORA.rglob("*") if p.is_file() and ".provenance" not in p.name):
        text = f.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            docs.append((str(f.relative_to(CORPORA)), text))
    return docs


def _baseline():
    """The decontamination module of ``main`` (today's code), or None where git has no main."""
    try:
        src = subprocess.run(
            ["git", "show", "main:largetrain_core/decontamination.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None
    path = Path(tempfile.mkdtemp()) / "decontamination_main.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("decontamination_main", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def measure(mod, bench: Path, clean: pl.DataFrame, planted: pl.DataFrame, truth: dict) -> dict:
    index = mod.build_index(mod.read_benchmark(bench))
    found_clean = mod.scan(clean, index)
    found = mod.scan(planted, index)
    hit = set(found.select("doc_id", "item_id").iter_rows())
    by_form = {}
    for kind in FORMS:
        pairs = [(d, i) for d, (i, k) in truth.items() if k == kind]
        by_form[kind] = round(sum(p in hit for p in pairs) / len(pairs), 4)
    return {
        "recall": round(sum((d, i) in hit for d, (i, _) in truth.items()) / len(truth), 4),
        "recall_by_form": by_form,
        "clean_flagged": found_clean.height,
        "clean_flagged_fraction": round(found_clean.height / clean.height, 5),
        "clean_flagged_examples": found_clean.select("doc_id", "item_id", "ngram").head(10).to_dicts(),
        "too_short_items": index.too_short["item_id"].to_list(),
    }


def main() -> None:
    from largetrain_core import decontamination

    rng = random.Random(0)
    items = _items()
    tmp = Path(tempfile.mkdtemp())
    bench = tmp / "bench.jsonl"
    bench.write_text("".join(json.dumps(i) + "\n" for i in items))
    index = decontamination.build_index(decontamination.read_benchmark(bench))
    uncheckable = set(index.too_short["item_id"].to_list())
    docs = _documents()
    rng.shuffle(docs)
    answers = [i["answer"] for i in items if len(i["answer"].split()) <= 4]
    rows, truth, k = [], {}, 0
    for item in items:
        if item["id"] in uncheckable:
            continue
        for kind in FORMS:
            host_id, host = docs[k % len(docs)]
            k += 1
            paras = host.split("\n\n")
            cut = len(paras) // 2
            others = [a for a in rng.sample(answers, 4) if a != item["answer"]][:3]
            text = "\n\n".join(paras[:cut] + [form(item, kind, others, rng)] + paras[cut:])
            doc_id = f"planted-{item['id']}-{kind}"
            rows.append((doc_id, text))
            truth[doc_id] = (item["id"], kind)
    planted = pl.DataFrame(rows, schema={"doc_id": pl.Utf8, "text": pl.Utf8}, orient="row").with_columns(
        source=pl.lit("planted")
    )
    clean = pl.DataFrame(docs, schema={"doc_id": pl.Utf8, "text": pl.Utf8}, orient="row").with_columns(
        source=pl.lit("clean")
    )
    result = {
        "command": "PYTHONPATH=$PWD .venv/bin/python benchmarks/decontamination_forms.py",
        "clean_documents": clean.height,
        "items": len(items),
        "checkable_items": len(items) - len(uncheckable),
        "planted_documents": planted.height,
        "forms": list(FORMS),
        "n": decontamination.N,
        "min_prompt_words": decontamination.MIN_PROMPT_WORDS,
        "answer_window": decontamination.ANSWER_WINDOW,
        "goal": "recall 1.0 on the planted set at <= 1% of clean documents flagged",
        "this_code": measure(decontamination, bench, clean, planted, truth),
    }
    base = _baseline()
    if base is not None:
        result["main"] = measure(base, bench, clean, planted, truth)
        # scan time of the clean documents, interleaved (this, main, this, ...) 3 times, best of each
        sides = {"this_code": decontamination, "main": base}
        indexes = {k: m.build_index(m.read_benchmark(bench)) for k, m in sides.items()}
        times = {k: [] for k in sides}
        for _ in range(3):
            for k, m in sides.items():
                t0 = time.perf_counter()
                m.scan(clean, indexes[k])
                times[k].append(round(time.perf_counter() - t0, 2))
        result["scan_seconds_clean"] = times
        result["scan_time_ratio_this_over_main"] = round(min(times["this_code"]) / min(times["main"]), 2)
    OUT.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    json.dump({k: v for k, v in result.items() if k not in ("this_code", "main")}, sys.stdout, indent=1)
    for side in ("this_code", "main"):
        if side in result:
            r = result[side]
            print(
                f"\n{side}: recall {r['recall']} {r['recall_by_form']}; clean flagged {r['clean_flagged']} "
                f"({r['clean_flagged_fraction']}); too short {r['too_short_items']}"
            )


if __name__ == "__main__":
    main()
