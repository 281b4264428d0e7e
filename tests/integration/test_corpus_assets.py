"""The corpus steps through Dagster (raw_corpus, cleaned_text, deduplicated_text): a raw_corpus failure names
the files, ids repeating across partitions stop the global step, and the handed cases of tests/cases
(deep_nesting.jsonl, huge_integer.jsonl, utf16_text/) keep their good records and count every line. The
readers and rules themselves are tested in tests/unit/test_corpus.py and tests/unit/test_reader_faults.py."""

import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from dagster import DagsterInstance

from helpers.corpora import read_all, write_jsonl
from helpers.lineage import PARTITION_KEYS, materialize_lineage
from largetrain_core.corpus import partition_of
from largetrain_dagster.corpus import corpus_assets
from largetrain_dagster.definitions import build_definitions


def _failures(runs) -> list[str]:
    return [e.event_specific_data.error.message for r in runs.results for e in r.all_events if e.is_step_failure]


def test_dagster_failures_name_the_files_and_the_repeated_ids(tmp_path):
    n = len(PARTITION_KEYS)
    defs = build_definitions(root=str(tmp_path / "root"), wandb_mode="disabled")
    bad = tmp_path / "bad"
    bad.mkdir()
    write_jsonl(bad / "mostly_broken.jsonl", [{"text": "fine"}] + ["{broken"] * 5)
    write_jsonl(bad / "other.jsonl", [{"text": "fine too"}])  # two files: hash partitions, not pieces of one file
    src = tmp_path / "ids"
    src.mkdir()
    names = [f"shard{i}.jsonl" for i in range(12)]
    first = names[0]
    second = next(m for m in names if partition_of(m, n) != partition_of(first, n))
    for m in names:  # every shard numbers its records from 0; two shards in different partitions clash on "0"
        write_jsonl(src / m, [{"id": "0" if m in (first, second) else m, "text": f"text of {m}"}])
    with DagsterInstance.ephemeral() as instance:
        runs = materialize_lineage(
            corpus_assets("domain")[:1],
            defs.resources,
            instance,
            {"ops": {"domain__raw_corpus": {"config": {"path": str(bad)}}}},
            raise_on_error=False,
        )
        assert not runs.success
        assert any(
            "records rejected, more than max_rejected_fraction=0.05; by file: mostly_broken.jsonl (5)" in m
            for m in _failures(runs)
        ), _failures(runs)

        ops = {
            "domain__raw_corpus": {"config": {"path": str(src)}},
            "domain__cleaned_text": {"config": {"gopher_quality": False}},
        }
        runs = materialize_lineage(
            corpus_assets("domain")[:3], defs.resources, instance, {"ops": ops}, raise_on_error=False
        )
        assert not runs.success
        where = ", ".join(sorted(f"{PARTITION_KEYS[partition_of(m, n)]}: {m}" for m in (first, second)))
        assert any(f"'0' in {where}" in m and "id_field: null" in m for m in _failures(runs)), _failures(runs)[0][-400:]
        ops["domain__raw_corpus"]["config"]["id_field"] = None  # ids from file and line: unique
        assert materialize_lineage(corpus_assets("domain")[:3], defs.resources, instance, {"ops": ops}).success


# ---------------------------------------------------------------------------------------------
# through Dagster: raw_corpus, cleaned_text, deduplicated_text of the three cases together


def test_dagster_materialization_of_the_cases_keeps_the_good_records_and_counts_every_line(cases, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("deep_nesting.jsonl", "huge_integer.jsonl"):
        (corpus / name).write_bytes((cases / name).read_bytes())
    for f in (cases / "utf16_text").iterdir():
        (corpus / f.name).write_bytes(f.read_bytes())
    defs = build_definitions(root=str(tmp_path / "root"), wandb_mode="disabled")
    cfg = {
        "ops": {
            "domain__raw_corpus": {"config": {"path": str(corpus), "max_rejected_fraction": 0.5}},
            "domain__cleaned_text": {"config": {"gopher_quality": False, "gopher_repetition": False, "c4": False}},
            "domain__deduplicated_text": {"config": {"near": False}},
        }
    }
    instance = DagsterInstance.ephemeral()
    result = materialize_lineage(corpus_assets("domain"), defs.resources, instance, cfg, raise_on_error=False)
    assert result.success
    raw = [m.metadata for m in result.asset_materializations_for_node("domain__raw_corpus")]
    assert len(raw) == 4  # every partition, whichever files fell into it
    total = lambda k: sum(m[k].value for m in raw)  # noqa: E731
    assert (total("documents"), total("rejected"), total("utf16_files"), total("blank_lines")) == (12, 2, 2, 0)
    assert total("documents") + total("rejected") == 5 + 6 + 3  # every line of the JSONL files, every text file
    rejected = [r for m in raw if "rejected_file" in m for r in pq.read_table(m["rejected_file"].value).to_pylist()]
    assert sorted((r["source"], r["position"]) for r in rejected) == [
        ("deep_nesting.jsonl", 3),
        ("huge_integer.jsonl", 3),
    ]
    logs = [e for r in result.results for e in instance.all_logs(r.run_id)]
    warnings = " ".join(e.user_message for e in logs if e.dagster_event is None and e.level == logging.WARNING)
    assert "(first: deep_nesting.jsonl:3)" in warnings and "(first: huge_integer.jsonl:3)" in warnings
    dedup = result.asset_materializations_for_node("domain__deduplicated_text")[0].metadata
    # the cases share their sentences: the UTF-16 files' decoded texts are exact duplicates of UTF-8 records
    assert (dedup["documents_rejected"].value, dedup["documents_duplicate"].value, dedup["documents_kept"].value) == (
        2,
        6,
        6,
    )
    expected = {
        json.loads(line)["text"]
        for name in ("deep_nesting.jsonl", "huge_integer.jsonl")
        for i, line in enumerate((cases / name).read_text().splitlines())
        if i != 2
    }
    expected |= {
        docs.column("text")[i].as_py().strip() for docs in [read_all(cases / "utf16_text")[0]] for i in range(3)
    }
    kept = pa.concat_tables([pq.read_table(f) for f in sorted(Path(dedup["path"].value).glob("part-*.parquet"))])
    assert len(expected) == 6 and {t.strip() for t in kept.column("text").to_pylist()} == expected
    (check,) = [c for c in result.get_asset_check_evaluations() if c.check_name == "accounting"]
    assert check.passed
    # half of the documents are copies, but of files at the top level (one source of 12, not wiped out)
    (wipeout,) = [c for c in result.get_asset_check_evaluations() if c.check_name == "no_source_wiped_out"]
    assert wipeout.passed, wipeout.metadata
    assert "| folder: <top level> | 12 | 6 | 0 | 0 | 50.0 % |" in dedup["dedup_by_source"].value
    instance.dispose()
