"""Issue 15, fault 4: when a step removes more than warn_removed_fraction of its input, the run log
says so in a WARNING with the top reasons and the setting that changes each, and the metadata too."""

import json
import logging

from dagster import DagsterInstance

from largetrain_core.accounting import reason_setting, removal_warning
from largetrain_core.rules import GROUPS
from largetrain_dagster.corpus import corpus_assets
from largetrain_dagster.definitions import build_definitions
from helpers.lineage import materialize_lineage


def test_every_reason_names_its_setting():
    for group in GROUPS:
        for rule in group.rules:
            hint = reason_setting("filtered", rule.code)
            assert f"`{rule.params[0].name}" in hint and f"`{group.name}: false`" in hint, rule.code
    assert "gopher_quality" in reason_setting("filtered", "gopher_min_words") and "default 50" in reason_setting(
        "filtered", "gopher_min_words"
    )
    assert "balance_mode: upsample" in reason_setting("filtered", "balance_downsample")
    assert "near: false" in reason_setting("duplicate", "near") and "no setting" in reason_setting("duplicate", "exact")
    assert "rejected.parquet" in reason_setting("rejected", "invalid JSON")
    assert "text_field" in reason_setting("filtered", "empty")


def test_warning_above_the_share_only_with_the_top_reasons():
    removed = [
        ("filtered", "gopher_min_words", 60),
        ("filtered", "gopher_stop_words", 20),
        ("duplicate", "exact", 5),
        ("filtered", "empty", 1),
        ("rejected", "invalid JSON", 1),
        ("duplicate", "near", 3),
    ]
    w = removal_warning("domain corpus", 100, removed, 0.5, top=3)
    assert w.startswith(
        "domain corpus: 90 of 100 documents removed (90%, more than warn_removed_fraction 0.5). Top reasons: "
        "60 filtered gopher_min_words -> cleaned_text `min_words`"
    )
    assert (
        "; 20 filtered gopher_stop_words -> cleaned_text `min_stop_words`" in w
        and "; 5 duplicate exact -> no setting" in w
    )
    assert "3 more reasons" in w and "near" not in w.split("Top reasons")[1].split("more reasons")[0]
    assert removal_warning("x", 100, removed, 0.9) is None  # 90 is not more than 90
    assert removal_warning("x", 100, removed, None) is None and removal_warning("x", 0, [], 0.5) is None


def test_short_records_under_the_default_rules_warn_in_the_log_and_metadata(tmp_path):
    """~93% of short records go under gopher_quality's defaults (min_words 50): each cleaned_text
    partition and the whole chain warn, naming min_words and gopher_quality; with gopher_quality off
    nothing is removed and nothing is said."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = [
        json.dumps({"id": f"r{i}", "text": f"Order {i} arrived late and the box was open when it came to the door."})
        for i in range(28)
    ]
    lines += [
        json.dumps({"id": f"long{i}", "text": " ".join(["the quiet river runs to the sea and we wait"] * 6) + f" {i}"})
        for i in range(2)
    ]
    (corpus / "records.jsonl").write_text("\n".join(lines) + "\n")
    defs = build_definitions(root=str(tmp_path / "root"), wandb_mode="disabled")

    def run(cleaned: dict):
        cfg = {
            "ops": {
                "domain__raw_corpus": {"config": {"path": str(corpus)}},
                "domain__cleaned_text": {"config": cleaned},
                "domain__deduplicated_text": {"config": {"near": False}},
            }
        }
        with DagsterInstance.ephemeral() as instance:
            result = materialize_lineage(corpus_assets("domain"), defs.resources, instance, cfg)
            assert result.success
            warnings = [
                e.user_message
                for r in result.results
                for e in instance.all_logs(r.run_id)
                if e.dagster_event is None and e.level == logging.WARNING
            ]
            md = {
                k: v.value
                for k, v in result.asset_materializations_for_node("domain__deduplicated_text")[0].metadata.items()
            }
            cleaned_md = [m.metadata for m in result.asset_materializations_for_node("domain__cleaned_text")]
        return warnings, md, cleaned_md

    warnings, md, cleaned_md = run({})
    chain = [w for w in warnings if w.startswith("domain corpus")]
    assert len(chain) == 1 and md["removal_warning"] == chain[0]
    assert chain[0].startswith(
        f"domain corpus (raw_corpus -> cleaned_text -> deduplicated_text): {md['documents_filtered']} of 30 "
    )
    assert (
        "filtered gopher_min_words -> cleaned_text `min_words` (default 50" in chain[0]
        and "`gopher_quality: false`" in chain[0]
    )
    parts = [w for w in warnings if w.startswith("domain/cleaned_text partition")]
    assert parts and len(parts) == sum("removal_warning" in m for m in cleaned_md)
    assert md["documents_kept"] == 2

    warnings, md, cleaned_md = run({"gopher_quality": False})
    assert md["documents_kept"] == 30 and "removal_warning" not in md
    assert not [w for w in warnings if "documents removed" in w] and not any("removal_warning" in m for m in cleaned_md)
