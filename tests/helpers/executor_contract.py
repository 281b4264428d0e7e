"""What every data-preparation executor must do (largetrain_core.executors.base): write what the local
executor writes. ``check_executor(executor, corpus, out, tokenizer)`` runs raw_corpus -> cleaned_text ->
deduplicated_text of ``corpus`` (2 hash partitions) on ``executor`` and on the core's own functions,
and asserts the same documents in the same order, the same rejected, filtered and duplicate records,
the same counts, and the executor's record in the stats. The executor cleans as cleaned_text does, with
the MinHash signatures (parts.WithSignatures), the reference without; so the executor's cleaned
partitions must carry the signatures the reference's global step computes, and its global step must
only cluster them to the same duplicates. Then token_shards' 2 partitions of the deduplicated text
(``Executor.tokenize``), assembled: the same train and validation sequences in the same order. The
test of a new executor calls it."""

import json
import shutil
from pathlib import Path

import polars as pl

from helpers import TICKETS
from largetrain_core.clean import Cleaning, QualityConfig, clean_corpus
from largetrain_core.corpus import ingest
from largetrain_core.dedup import SIGNATURE_SETTINGS, SIGNATURES, DedupConfig, deduplicate
from largetrain_core.executors.base import RECORD, Executor
from largetrain_core.parts import WithSignatures
from largetrain_core.readers import ReaderConfig
from largetrain_core.shards import Packing, TokenShards, assemble_token_shards, tokenize_partition
from largetrain_core.storage import part_files

QUALITY = QualityConfig(gopher_repetition=True, c4=True)
PARTITIONS = 2


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
        executor.ingest,
        lambda i, o: executor.map_parts(WithSignatures(Cleaning(QUALITY), DedupConfig()), i, o),
        lambda i, o: executor.deduplicate(i, o, DedupConfig()),
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
    _check_tokenize(executor, out / "reference" / "dd", out, tokenizer)


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
    for side, tokenize in (("reference", tokenize_partition), (executor.name, executor.tokenize)):
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
