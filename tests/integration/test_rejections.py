"""Issue 15: why records were rejected is said where the user looks, for every reader format.

The max_rejected_fraction failure names the top reasons (count, first file:line) and, for a missing
text field, the fields the records have; a file rejected as a whole is said to count as its lines or rows.
A successful run with rejected records logs a WARNING (count, reasons, rejected.parquet), and the
summary prints the rejected.parquet paths."""

import json
import logging
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from dagster import DagsterInstance

from helpers import TICKETS
from largetrain_core.corpus import describe_rejections, ingest, rejection_error, rejection_reasons
from largetrain_core.readers import ReaderConfig
from largetrain_core.readers import UNREADABLE_PREFIX
from largetrain_dagster.corpus import corpus_assets
from largetrain_dagster.definitions import build_definitions
from largetrain_dagster.summary import render
from helpers.lineage import materialize_lineage


def _tickets(n: int) -> list[dict]:
    return [json.loads(line) for line in TICKETS.read_text().splitlines()[:n]]


def _ingest(src: Path, tmp_path: Path, **kw) -> tuple[dict, ReaderConfig, Path]:
    out = tmp_path / "raw"
    out.mkdir()
    cfg = ReaderConfig(str(src), **kw)
    return ingest(cfg, out), cfg, out / "rejected.parquet"


def test_a_wrong_text_field_names_the_fields_the_records_have_in_every_format(tmp_path):
    records = _tickets(150)
    jsonl = tmp_path / "jsonl" / "tickets.jsonl"
    jsonl.parent.mkdir()
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    stats, cfg, rejected = _ingest(jsonl, tmp_path, text_field="body")
    msg = rejection_error(stats, cfg, rejected)
    # the whole file counts as its lines: said so, with the reason and the setting to change
    assert msg.startswith(
        "150 of 150 records rejected, more than max_rejected_fraction=0.05; by file: tickets.jsonl (150). "
        "1 file rejected as a whole, counted as 150 records (each row or line of such a file is one). "
    )
    assert (
        f"150 x the whole file is rejected: no string field 'body' on any line: the first {UNREADABLE_PREFIX} "
        "non-empty lines lack it (the rest was not parsed); line 1: the record has fields id, category, text; set "
        "raw_corpus text_field to the one holding the text (first: tickets.jsonl:1)"
    ) in msg
    assert "is it JSON Lines?" not in msg

    table = pa.Table.from_pylist(records)
    for name in ("tickets.parquet", "tickets.arrow"):
        d = tmp_path / name.split(".")[1]
        d.mkdir()
        if name.endswith(".arrow"):
            with pa.OSFile(str(d / name), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
                w.write_table(table)
        else:
            pq.write_table(table, d / name)
        sub = tmp_path / f"out_{d.name}"
        sub.mkdir()
        stats, cfg, rejected = _ingest(d / name, sub, text_field="body")
        msg = rejection_error(stats, cfg, rejected)
        assert (
            f"150 x the whole file is rejected: no column 'body': the file has columns id, category, text; set "
            f"raw_corpus text_field to the one holding the text (first: {name}, row 0)"
        ) in msg, msg


def test_top_reasons_most_frequent_first_with_counts_and_first_line(tmp_path):
    records = [json.dumps(r) for r in _tickets(40)]
    records[5] = "{not json"  # invalid JSON, twice, at different columns
    records[12] = "   {broken"
    records[9] = '{"id": "x", "text": "ok" "more"}'  # invalid JSON of another kind
    records[20] = json.dumps({"id": "T9", "txt": "a typo"})  # text field missing, twice
    records[25] = json.dumps({"id": "T8", "txt": "another"})
    records[30] = "[1, 2]"  # not an object
    records[33] = json.dumps({"id": "T7", "text": 12})  # not a string
    src = tmp_path / "c.jsonl"
    src.write_text("\n".join(records) + "\n")
    stats, cfg, rejected = _ingest(src, tmp_path, max_rejected_fraction=0.0)
    assert stats["rejected"] == 7
    reasons = rejection_reasons(rejected, top=10)
    # most frequent first; a tie in the order met
    assert [(r["records"], r["first"]) for r in reasons] == [
        (2, "c.jsonl:6"),
        (2, "c.jsonl:21"),
        (1, "c.jsonl:10"),
        (1, "c.jsonl:31"),
        (1, "c.jsonl:34"),
    ]
    assert reasons[0]["reason"] == "invalid JSON: Expecting property name enclosed in double quotes at column 2"
    assert reasons[1]["reason"] == (
        "no string field 'text': the record has fields id, txt; set raw_corpus text_field to the one holding the text"
    )
    assert reasons[3]["reason"] == "no string field 'text': the line is a JSON array, not an object"
    assert reasons[4]["reason"] == "no string field 'text': it is a JSON number"
    msg = rejection_error(stats, cfg, rejected)
    assert msg == (
        "7 of 40 records rejected, more than max_rejected_fraction=0.0; by file: c.jsonl (7). Top reasons: "
        "2 x invalid JSON: Expecting property name enclosed in double quotes at column 2 (first: c.jsonl:6); "
        "2 x no string field 'text': the record has fields id, txt; set raw_corpus text_field to the one "
        "holding the text (first: c.jsonl:21); 1 x invalid JSON: Expecting ',' delimiter at column 26 "
        "(first: c.jsonl:10); 2 more reasons."
    )
    # the same fault at another column is the same reason
    src.write_text("\n".join(["{not json", "  {not json", json.dumps({"text": "fine"})]) + "\n")
    sub = tmp_path / "again"
    sub.mkdir()
    stats, cfg, rejected = _ingest(src, sub)
    assert describe_rejections(rejected) == (
        "Top reasons: 2 x invalid JSON: Expecting property name enclosed in double quotes at column 2 (first: c.jsonl:1)."
    )


def _run(tmp_path, corpus: Path, raw: dict):
    defs = build_definitions(root=str(tmp_path / "root"), wandb_mode="disabled")
    cfg = {
        "ops": {
            "domain__raw_corpus": {"config": {"path": str(corpus), **raw}},
            "domain__cleaned_text": {"config": {"gopher_quality": False, "gopher_repetition": False, "c4": False}},
            "domain__deduplicated_text": {"config": {"near": False}},
        }
    }
    instance = DagsterInstance.ephemeral()
    result = materialize_lineage(corpus_assets("domain"), defs.resources, instance, cfg, raise_on_error=False)
    logs = [e for r in result.results for e in instance.all_logs(r.run_id)]
    return instance, result, logs


def test_dagster_failure_says_why_and_a_successful_run_warns_and_the_summary_points_at_rejected(tmp_path):
    corpus = tmp_path / "tickets.jsonl"
    lines = [json.dumps(r) for r in _tickets(60)]
    corpus.write_text("\n".join(lines) + "\n")

    instance, result, logs = _run(tmp_path, corpus, {"text_field": "body"})
    assert not result.success
    (failure,) = [e for e in logs if e.dagster_event and e.dagster_event.is_step_failure]
    msg = failure.dagster_event.step_failure_data.error.message
    # the file is split into pieces, one per partition: each piece's lines count
    assert f"{corpus} (partition " in msg and " records rejected" in msg and "1 file rejected as a whole" in msg
    rejected, read = re.search(r"\(partition \d+\): (\d+) of (\d+) records rejected", msg).groups()
    assert rejected == read and int(read) > 1  # every line of the partition's piece
    assert "the record has fields id, category, text; set raw_corpus text_field" in msg
    assert "Every rejected record: " in msg and msg.rstrip().endswith("rejected.parquet")
    instance.dispose()

    lines[3], lines[6] = "{cut off", json.dumps({"id": "T9", "message": "wrong key"})  # both in the first piece
    corpus.write_text("\n".join(lines) + "\n")
    instance, result, logs = _run(
        tmp_path, corpus, {"max_rejected_fraction": 0.2}
    )  # 2 of the 16 lines of partition 000
    assert result.success
    warnings = [
        e.user_message
        for e in logs
        if e.dagster_event is None and e.level == logging.WARNING and "records rejected" in e.user_message
    ]
    assert len(warnings) == 1, warnings  # the one partition the file's rejected lines fell into
    w = warnings[0]
    assert "2 of " in w and "Top reasons: 1 x invalid JSON" in w and "(first: tickets.jsonl:4)" in w
    assert "the record has fields id, message" in w and "(first: tickets.jsonl:7)" in w
    path = w.split("Every rejected record: ")[1]
    assert Path(path).name == "rejected.parquet" and pq.read_table(path).num_rows == 2
    dedup = result.asset_materializations_for_node("domain__deduplicated_text")[0].metadata
    assert dedup["rejected_files"].value == [path] and dedup["documents_rejected"].value == 2
    raw = [
        m.metadata
        for m in result.asset_materializations_for_node("domain__raw_corpus")
        if "rejected_file" in m.metadata
    ]
    assert len(raw) == 1 and raw[0]["rejected_reasons"].value in w
    text = render(instance)
    assert f"  rejected records (file, position, reason): {path}" in text
    instance.dispose()
