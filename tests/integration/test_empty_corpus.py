"""An empty corpus fails at the first global step, deduplicated_text, naming the corpus and why
(tests/cases/empty_corpus: an empty .jsonl and one of blank lines; a corpus whose every document is
filtered), through real Dagster materializations: the partitions succeed (an empty partition is
fine), the global step fails before any work, and nothing downstream runs. An empty corpus is said at
WARNING by its first step, raw_corpus."""

import logging
import shutil

from dagster import DagsterInstance

from largetrain_dagster.corpus import corpus_assets
from largetrain_dagster.definitions import build_definitions
from helpers.lineage import materialize_lineage


def _failure(tmp_path, corpus, cleaned: dict | None = None) -> tuple[list, str, list[str]]:
    defs = build_definitions(root=str(tmp_path / "root"), wandb_mode="disabled")
    cfg = {
        "ops": {
            "domain__raw_corpus": {"config": {"path": str(corpus)}},
            "domain__cleaned_text": {"config": cleaned or {}},
        }
    }
    with DagsterInstance.ephemeral() as instance:
        runs = materialize_lineage(corpus_assets("domain"), defs.resources, instance, cfg, raise_on_error=False)
        failures = [(r, e) for r in runs.results for e in r.all_events if e.is_step_failure]
        warnings = [
            e.user_message
            for r in runs.results
            for e in instance.all_logs(r.run_id)
            if e.dagster_event is None and e.level == logging.WARNING and e.step_key == "domain__raw_corpus"
        ]
    assert [r.success for r in runs.results[:-1]] == [True] * (len(runs.results) - 1)  # every partition succeeds
    ((run, failure),) = failures
    assert run is runs.last and failure.step_key == "domain__deduplicated_text"
    assert not runs.last.get_asset_materialization_events()
    return runs.results, failure.step_failure_data.error.message, warnings


def test_a_corpus_of_empty_files_fails_at_deduplicated_text_naming_it(cases, tmp_path):
    corpus = tmp_path / "empty_corpus"
    shutil.copytree(cases / "empty_corpus", corpus)
    results, msg, warnings = _failure(tmp_path, corpus)
    raw = [m.metadata for r in results for m in r.asset_materializations_for_node("domain__raw_corpus")]
    assert sum(m["documents"].value for m in raw) == 0 and sum(m["files"].value for m in raw) == 2
    # said at the first step, by every partition (each read nothing, and the corpus holds nothing)
    empty = f"{corpus}: the domain corpus holds no record: each of its corpus files is empty, holds blank lines only"
    assert len([w for w in warnings if empty in w]) == len(raw) == 4, warnings
    assert f"domain corpus at {corpus} holds no document" in msg, msg
    assert "its 2 corpus files in 4 partitions gave 0 records (empty, or blank lines only)" in msg, msg


def test_a_corpus_whose_every_document_is_filtered_names_the_top_reasons(cases, tmp_path):
    corpus = tmp_path / "tiny"
    corpus.mkdir()
    shutil.copy(cases / "tiny_docs.jsonl", corpus)
    _, msg, warnings = _failure(tmp_path, corpus)
    assert not [w for w in warnings if "holds no record" in w]  # it holds records: cleaned_text filtered them
    assert f"domain corpus at {corpus}: no document is left of its " in msg, msg
    assert "records after raw_corpus and cleaned_text" in msg and "0 rejected" in msg
    assert "Top reasons: " in msg and " filtered empty -> no setting: the record has no text" in msg, msg
    assert "filtered gopher_min_words -> cleaned_text `min_words` (default 50" in msg, msg
