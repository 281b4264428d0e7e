"""What every data-preparation engine must do (largetrain_core.executors.base): run tasks as the
primitives say (:func:`check_primitives`) and write what the local engine writes.
``check_executor(executor, corpus, out, tokenizer)`` checks the primitives, then runs raw_corpus ->
cleaned_text -> deduplicated_text of ``corpus`` (2 hash partitions) through the steps
(largetrain_core.executors.steps) on ``executor`` and on the core's own functions,
and asserts the same documents in the same order, the same rejected, filtered and duplicate records,
the same counts, and the executor's record in the stats. The executor cleans as cleaned_text does, with
the MinHash signatures (parts.WithSignatures), the reference without; so the executor's cleaned
partitions must carry the signatures the reference's global step computes, and its global step must
only cluster them to the same duplicates. Then token_shards' 2 partitions of the deduplicated text
(``steps.tokenize``), assembled: the same train and validation sequences in the same order.
tests/unit/test_executors.py calls it for every engine that runs in the test's process
(:func:`in_process_engines`: every known engine but Spark, whose JVMs tests/integration/test_spark.py
starts once and checks with the same function), so a new engine is checked with nothing to add."""

import json
import shutil
from functools import partial
from pathlib import Path

import polars as pl

from helpers import TICKETS
from largetrain_core.clean import Cleaning, QualityConfig, clean_corpus
from largetrain_core.corpus import ingest
from largetrain_core.decontamination import build_index, contamination_counts, find_contamination, read_benchmark
from largetrain_core.dedup import SIGNATURE_SETTINGS, SIGNATURES, DedupConfig, deduplicate
from largetrain_core.executors import steps
from largetrain_core.executors.base import RECORD, Executor, known, load
from largetrain_core.parts import WithSignatures
from largetrain_core.readers import ReaderConfig
from largetrain_core.shards import Packing, TokenShards, assemble_token_shards, tokenize_partition
from largetrain_core.storage import part_files

QUALITY = QualityConfig(gopher_repetition=True, c4=True)
PARTITIONS = 2
JVM_ENGINES = {"spark"}  # checked in tests/integration/test_spark.py, in the session it starts once


def in_process_engines() -> list[Executor]:
    """Every known engine but :data:`JVM_ENGINES`, with its default settings, and an engine whose
    parallelism (a ``workers`` or ``threads`` setting) defaults to 1 also with 2: its tasks apart."""
    import dataclasses

    engines = []
    for name in known():
        if name in JVM_ENGINES:
            continue
        cls = load(name)
        engines.append(cls())
        for f in dataclasses.fields(cls.Settings):
            if f.name in ("workers", "threads", "processes") and f.default == 1:
                engines.append(cls(cls.Settings(**{f.name: 2})))
    return engines


def _square_and_where(offset: int, unit: int) -> tuple[int, int]:
    return unit, unit * unit + offset


def _fails_on_three(unit: int) -> int:
    if unit == 3:
        raise ValueError(f"task {unit} failed")
    return unit


def _step_of_tasks(engine: Executor, out_dir: Path, units: list[int]) -> dict:
    """A step the engine has no implementation of: its tasks write a file each into ``out_dir``."""
    written = engine.map_tasks(partial(_write_unit, out_dir), units, "write units")
    return {"written": written}


def _write_unit(out_dir: Path, unit: int) -> str:
    name = f"unit-{unit:03d}.txt"
    (Path(out_dir) / name).write_text(str(unit * 2))
    return name


def check_primitives(executor: Executor, out: Path) -> None:
    """The primitives: map_tasks gives fn(unit) for every unit in the units' order (none: none) and
    raises a task's own exception; run_global of a step no engine knows runs it, its tasks writing into
    ``out`` (a fresh directory), and adds the engine record."""
    units = list(range(23))[::-1]
    assert executor.map_tasks(partial(_square_and_where, 5), units, "squares") == [(u, u * u + 5) for u in units]
    assert executor.map_tasks(partial(_square_and_where, 5), [], "none") == []
    try:
        executor.map_tasks(_fails_on_three, list(range(6)), "fails")
    except Exception as e:  # noqa: BLE001 (the task's own exception, whatever the engine)
        assert "task 3 failed" in str(e), e
    else:
        raise AssertionError("map_tasks: a task's exception was not raised")
    out.mkdir(parents=True)
    stats = executor.run_global(_step_of_tasks, out, units=[4, 1, 7])
    assert stats.pop(RECORD)["executor"] == executor.name, "run_global: the engine record"
    assert stats == {"written": ["unit-004.txt", "unit-001.txt", "unit-007.txt"]}, "run_global: the step's counts"
    assert sorted(p.name for p in out.iterdir()) == ["unit-001.txt", "unit-004.txt", "unit-007.txt"]
    assert (out / "unit-007.txt").read_text() == "14"


CASES = [
    "bom_crlf.jsonl",
    "lone_surrogate.jsonl",
    "tiny_docs.jsonl",
    "unicode_variants.jsonl",
    "null_ids.jsonl",
    "mixed_parquet",
    "misnamed_compressed",
    "deep_nesting.jsonl",
]


def contract_corpus(cases: Path, root: Path) -> Path:
    """A corpus that exercises every outcome, at ``root``: the handed cases of ``CASES`` (rejected,
    filtered, renamed), 40 documents of 5 support tickets each (most pass the quality rules), an
    exact copy (other spacing) and a near copy (one word changed) of one of them."""
    root.mkdir(parents=True)
    for c in CASES:
        (shutil.copytree if (cases / c).is_dir() else shutil.copy)(cases / c, root / c)
    tickets = [json.loads(line)["text"] for line in TICKETS.read_text().splitlines()[:200]]
    docs = [" ".join(tickets[i : i + 5]) for i in range(0, 200, 5)]
    (root / "docs.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(docs)))
    words = docs[3].split(" ")
    copies = [docs[3].replace(" ", "  "), " ".join(words[:-3] + ["really"] + words[-2:])]
    (root / "more").mkdir()
    (root / "more" / "copies.jsonl").write_text(
        "".join(json.dumps({"id": f"c{i}", "text": t}) + "\n" for i, t in enumerate(copies))
    )
    return root


def _chain(out: Path, corpus: Path, ingest_, clean_, dedup_) -> dict:
    stats, cleaned = {}, []
    for p in range(PARTITIONS):
        raw, clean = out / f"raw{p}", out / f"clean{p}"
        raw.mkdir(parents=True)
        clean.mkdir()
        stats[f"raw{p}"] = ingest_(ReaderConfig(str(corpus), partition=p, partitions=PARTITIONS), raw)
        stats[f"clean{p}"] = clean_(raw, clean)
        cleaned.append(clean)
    (out / "dd").mkdir()
    stats["dd"] = dedup_(cleaned, out / "dd")
    return stats


def _rows(d: Path, name: str | None = None) -> pl.DataFrame:
    files = [d / name] if name else part_files(d)
    return pl.concat([pl.read_parquet(f) for f in files], how="vertical_relaxed") if files else pl.DataFrame()


def _others(d: Path) -> list[str]:
    """The files of a stage directory besides its parts and the signatures (compared on their own)."""
    return sorted(p.name for p in d.iterdir() if not p.name.startswith("part-") and p.name != SIGNATURES)


def check_executor(executor: Executor, corpus: Path, out: Path, tokenizer: Path) -> None:
    """Assert that ``executor`` gives the local outputs and counts on ``corpus`` (module docstring), and
    token_shards' partitions of the deduplicated text with ``tokenizer`` (a tokenizer directory) that
    assemble into the same sequences in the same order."""
    check_primitives(executor, out / "primitives")
    expect = _chain(
        out / "reference",
        corpus,
        ingest,
        lambda i, o: clean_corpus(i, o, QUALITY),
        lambda i, o: deduplicate(i, o, DedupConfig()),
    )
    got = _chain(
        out / executor.name,
        corpus,
        lambda r, o: executor.run_global(steps.ingest, o, reader=r),
        lambda i, o: executor.run_global(
            steps.map_parts, o, step=WithSignatures(Cleaning(QUALITY), DedupConfig()), in_dir=i
        ),
        lambda i, o: executor.run_global(steps.deduplicate, o, in_dirs=i, cfg=DedupConfig()),
    )
    for step, counts in got.items():
        assert counts.pop(RECORD)["executor"] == executor.name, step
        counts.pop("parts", None)  # part-file boundaries of raw_corpus may differ; their contents in order may not
        assert counts == {k: v for k, v in expect[step].items() if k != "parts"}, step
    for d in [f"raw{p}" for p in range(PARTITIONS)] + [f"clean{p}" for p in range(PARTITIONS)] + ["dd"]:
        a, b = out / "reference" / d, out / executor.name / d
        assert _rows(b).equals(_rows(a)), f"{d}: documents differ"
        for side in ("rejected.parquet", "renamed_ids.parquet", "filtered.parquet", "duplicates.parquet"):
            if (a / side).exists():
                assert _rows(b, side).equals(_rows(a, side)), f"{d}/{side} differs"
        assert _others(b) == _others(a), f"{d}: other files"
    # the signatures: computed with the cleaning, per partition, as the reference's global step computes them
    made = [out / executor.name / f"clean{p}" / SIGNATURES for p in range(PARTITIONS)]
    assert all(
        s.is_dir()
        and sorted(f.name for f in s.iterdir()) == sorted([*(f.name for f in part_files(s.parent)), SIGNATURE_SETTINGS])
        for s in made
    ), "cleaned partitions: one signature file per part and the settings"
    assert _rows(out / "reference" / "dd" / SIGNATURES).equals(
        pl.concat([_rows(s) for s in made], how="vertical_relaxed")
    ), "signatures differ"
    assert not (out / executor.name / "dd" / SIGNATURES).exists(), "dd: the global step computed signatures again"
    _check_contamination(executor, out / "reference" / "dd", out)
    _check_tokenize(executor, out / "reference" / "dd", out, tokenizer)


def _check_contamination(executor: Executor, dedup: Path, out: Path) -> None:
    """filtered_text's n-gram join (``steps.find_contamination``) of the deduplicated documents with
    an evaluation set holding the opening of two of them: the core's table and counts."""
    docs = _rows(dedup)
    sets = out / "evaluation_sets"
    sets.mkdir()
    items = [{"id": f"q{i}", "prompt": " ".join(docs["text"][i].split()[:30]), "answer": ""} for i in (2, 17)]
    (sets / "quiz.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
    index = build_index(read_benchmark(sets / "quiz.jsonl"))
    index.save(sets)
    expect = find_contamination([dedup], index)
    assert expect.height >= 2, "the contract corpus: contaminated documents"
    made = out / executor.name / "contamination"
    made.mkdir()
    counts = executor.run_global(
        steps.find_contamination, made, in_dirs=[dedup], index_dir=sets, out_file=made / "contaminated.parquet"
    )
    assert counts.pop(RECORD)["executor"] == executor.name, "find_contamination"
    assert counts == contamination_counts(expect, index), "find_contamination: counts"
    assert pl.read_parquet(made / "contaminated.parquet").equals(expect), "find_contamination: the matches"


def _check_tokenize(executor: Executor, dedup: Path, out: Path, tokenizer: Path) -> None:
    """The deduplicated documents in 6 part files (several per partition: an executor may cut them into
    runs), tokenized per partition by the core and by ``executor``, assembled and compared."""
    docs = _rows(dedup)
    text = out / "tokenize_input"
    text.mkdir()
    step = -(-docs.height // 6)
    for i in range(6):
        docs.slice(i * step, step).write_parquet(text / f"part-{i:05d}.parquet")
    packing = Packing(seq_len=8, validation_fraction=0.2, seed=0, sequences_per_shard=32)
    made, counts = {}, {}
    keys = ("first_part", "parts", "documents", "sequences", "tail_tokens")

    def on_engine(text, tokenizer, d, p, partitions, packing):
        return executor.run_global(
            steps.tokenize,
            d,
            in_dir=text,
            tokenizer_path=tokenizer,
            partition=p,
            partitions=partitions,
            packing=packing,
        )

    for side, tokenize in (("reference", tokenize_partition), (executor.name, on_engine)):
        dirs = [out / side / f"tokenized{p}" for p in range(PARTITIONS)]
        counts[side] = []
        for p, d in enumerate(dirs):
            d.mkdir()
            summary = tokenize(text, tokenizer, d, p, PARTITIONS, packing)
            if side == executor.name:
                assert summary[RECORD]["executor"] == executor.name, "tokenize"
            counts[side].append(
                {k: summary[k] for k in keys} | {"validation": sum(r["validation_documents"] for r in summary["runs"])}
            )
        made[side] = out / side / "token_shards"
        made[side].mkdir()
        assemble_token_shards(dirs, text, tokenizer, made[side], packing)
    assert counts[executor.name] == counts["reference"], "tokenize: counts"
    # documents in validation: else the global step tokenizes everything again itself (module doc of shards)
    assert sum(c["validation"] for c in counts["reference"]), "no document in validation"
    for split in ("train", "validation"):
        a, b = (TokenShards(made[side], split, verify_checksums=True) for side in ("reference", executor.name))
        assert len(a) > 0 and b.take(range(len(b))).tolist() == a.take(range(len(a))).tolist(), f"token shards: {split}"
