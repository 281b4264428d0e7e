"""largetrain_core.balance: class histogram and seeded down/up-sampling to a target distribution."""

from pathlib import Path

import polars as pl
import pytest

from largetrain_core.balance import balance, class_histogram

DF = pl.DataFrame({"id": list(range(12)), "y": ["a"] * 6 + ["b"] * 2 + ["c"] * 4})


def test_histogram_counts_null_as_its_own_class():
    assert class_histogram(pl.Series(["b", "a", None, "a"])) == {"<null>": 1, "a": 2, "b": 1}


def test_down_sample_uniform_and_weighted():
    out, meta = balance(DF, "y")
    assert meta["before"] == {"a": 6, "b": 2, "c": 4} and meta["after"] == {"a": 2, "b": 2, "c": 2}
    assert out["id"].n_unique() == 6 and out["id"].is_sorted()  # no row twice, input order
    # N = min(6/.5, 2/.25, 4/.25) = 8 -> a 4, b 2, c 2
    out, meta = balance(DF, "y", {"a": 0.5, "b": 0.25, "c": 0.25})
    assert meta["after"] == {"a": 4, "b": 2, "c": 2}


def test_up_sample_keeps_every_row_and_fills_minorities():
    out, meta = balance(DF, "y", mode="up", seed=3)
    assert meta["after"] == {"a": 6, "b": 6, "c": 6}
    assert set(out["id"].to_list()) == set(range(12))
    extra = out.filter(pl.col("y") == "b")["id"].to_list()
    assert sorted(set(extra)) == [6, 7] and len(extra) == 6


def test_seeded_and_zero_target_drops_a_class():
    a = balance(DF, "y", seed=1)[0]["id"].to_list()
    assert a == balance(DF, "y", seed=1)[0]["id"].to_list()
    assert any(balance(DF, "y", seed=s)[0]["id"].to_list() != a for s in range(2, 12))
    out, meta = balance(DF, "y", {"a": 1, "b": 0, "c": 1})
    assert meta["after"] == {"a": 4, "c": 4}


def test_errors():
    with pytest.raises(ValueError, match="absent"):
        balance(DF, "y", {"z": 1})
    with pytest.raises(ValueError, match="mode"):
        balance(DF, "y", mode="sideways")
    with pytest.raises(ValueError, match="empty"):
        balance(DF.clear(), "y")


# ---------------------------------------------------------------------------------------------
# balance_parts (a deduplicated_text directory) and the accounting with balancing


def _parts(d, labels_per_part):
    d.mkdir()
    n = 0
    for i, labels in enumerate(labels_per_part):
        ids = [f"d{n + j}" for j in range(len(labels))]
        n += len(labels)
        pl.DataFrame(
            {"doc_id": ids, "source": ["s"] * len(ids), "text": [f"text {x}" for x in ids], "label": labels},
            schema={"doc_id": pl.Utf8, "source": pl.Utf8, "text": pl.Utf8, "label": pl.Utf8},
        ).write_parquet(d / f"part-{i:05d}.parquet")
    return d


def test_balance_parts_down_equals_balancing_the_concatenation(tmp_path):
    from largetrain_core.balance import balance_parts

    labels = [["a", "a", "b", "a"], ["c", "a", None], ["b", "a", "c"]]
    d = _parts(tmp_path / "d", labels)
    whole = pl.concat([pl.read_parquet(p) for p in sorted(d.glob("part-*.parquet"))])
    expect, _ = balance(whole, "label", {"a": 1, "b": 1, "c": 1}, "down", seed=5)
    meta = balance_parts(d, {"a": 1, "b": 1, "c": 1}, "down", seed=5)
    assert meta["before"] == {"<null>": 1, "a": 5, "b": 2, "c": 2} and meta["after"] == {"a": 2, "b": 2, "c": 2}
    got = pl.concat([pl.read_parquet(p) for p in sorted(d.glob("part-*.parquet"))])
    assert got.equals(expect) and got.height == 6
    dropped = pl.read_parquet(d / "balance_dropped.parquet")
    assert meta["balance_dropped"] == dropped.height == 4 and dropped["reason"].unique().to_list() == [
        "balance_downsample"
    ]
    assert set(dropped["doc_id"]) | set(got["doc_id"]) == set(whole["doc_id"]) and "copies" not in got.columns


def test_balance_parts_up_is_a_copies_weight_not_copied_rows(tmp_path):
    from largetrain_core.balance import balance_parts, repeat_counts

    d = _parts(tmp_path / "d", [["a", "a", "b"], ["a", "b"], ["c"]])
    before = pl.concat([pl.read_parquet(p) for p in sorted(d.glob("part-*.parquet"))])
    meta = balance_parts(d, None, "up", seed=2)
    # N = max(3 / (1/3), ...) = 9: a keeps its 3, b gets 1 extra copy, c 2
    assert meta["after"] == {"a": 3, "b": 3, "c": 3} and meta["balance_dropped"] == 0
    assert (meta["repeated_documents"], meta["balance_repeats"]) == (2, 3) == repeat_counts(d)
    after = pl.concat([pl.read_parquet(p) for p in sorted(d.glob("part-*.parquet"))])
    assert after.drop("copies").equals(before)  # every document once, nothing else changed
    weights = dict(zip(after["doc_id"], after["copies"]))
    assert weights["d5"] == 3 and sum(weights.values()) == 9 and min(weights.values()) == 1
    assert sorted(c for doc, c in weights.items() if c > 1) == [2, 3] and after["copies"].dtype == pl.UInt32


def test_balance_parts_up_with_a_repeat_cap_and_temperature(tmp_path):
    """The controls of issue 40: a cap on one document's copies, and shares between natural and uniform."""
    from largetrain_core.balance import balance_parts
    from largetrain_core.stages.deduplicated_text import balance_settings

    d = _parts(tmp_path / "d", [["a"] * 16, ["b"] * 4, ["c"]])
    capped = balance_parts(d, None, "up", seed=0, max_repeats=3)
    # uniform would need 16 of each: c's one document may have at most 3 copies, b's four 12 in all
    assert capped["after"] == {"a": 16, "b": 12, "c": 3} and capped["max_repeats"] == 3
    d2 = _parts(tmp_path / "d2", [["a"] * 16, ["b"] * 4, ["c"]])
    tempered = balance_parts(d2, {}, "up", seed=0, temperature=2.0)
    # shares 4 : 2 : 1 (sqrt of 16, 4, 1): a keeps 16, b up to 8, c up to 4
    assert tempered["after"] == {"a": 16, "b": 8, "c": 4} and tempered["temperature"] == 2.0
    assert balance_settings({}, "upsample", 0) == {"target": None, "mode": "up", "seed": 0}  # versions before hold
    assert balance_settings({}, "upsample", 0, 3, 2.0) == {
        "target": None,
        "mode": "up",
        "seed": 0,
        "max_repeats": 3,
        "temperature": 2.0,
    }
    with pytest.raises(Exception, match="balance_temperature must be >= 1"):
        balance_settings({"a": 1}, "upsample", 0, None, 2.0)


def test_balance_parts_needs_a_label_column(tmp_path):
    from largetrain_core.balance import balance_parts

    d = tmp_path / "d"
    d.mkdir()
    pl.DataFrame({"doc_id": ["x"], "source": ["s"], "text": ["t"]}).write_parquet(d / "part-00000.parquet")
    with pytest.raises(ValueError, match="label"):
        balance_parts(d)


# ---------------------------------------------------------------------------------------------
# Dagster: raw_corpus -> cleaned_text -> deduplicated_text of one role with a label field


def _labelled_corpus(path):
    import json

    def doc(i, label=...):
        rec = {"text": "the cat and the dog of " + " ".join(f"w{i}x{j}" for j in range(10))}
        if label is not ...:
            rec["y"] = label
        return json.dumps(rec)

    lines = [doc(i, "a") for i in range(6)] + [doc(0, "a")]  # 6 a + an exact duplicate of doc 0
    lines += [doc(10, "b"), doc(11, "b"), doc(20, "c"), doc(21, "c"), doc(22, "c")]
    lines += [doc(30), json.dumps({"text": "the and", "y": "b"}), "{not json"]  # no label; too short; rejected
    path.write_text("\n".join(lines) + "\n")
    return path


def _materialize(root, src, dedup_config):
    from dagster import DagsterInstance

    from helpers.lineage import materialize_lineage

    from largetrain_dagster.corpus import corpus_assets
    from largetrain_dagster.definitions import build_definitions

    defs = build_definitions(root=str(root), wandb_mode="disabled")
    run_config = {
        "ops": {
            "domain__raw_corpus": {"config": {"path": str(src), "label_field": "y", "max_rejected_fraction": 0.5}},
            "domain__cleaned_text": {"config": {"min_words": 3}},
            "domain__deduplicated_text": {"config": dedup_config},
        }
    }
    with DagsterInstance.ephemeral() as instance:
        # one JSONL file: it lives in one data partition, the others read nothing
        result = materialize_lineage(corpus_assets("domain")[:3], defs.resources, instance, run_config)
        assert result.success
        md = result.asset_materializations_for_node("domain__deduplicated_text")[0].metadata
        checks = result.get_asset_check_evaluations()
    return md, checks


def test_dagster_balance_downsample_and_upsample(tmp_path):
    src = _labelled_corpus(tmp_path / "labelled.jsonl")
    md, checks = _materialize(tmp_path / "root", src, {"balance_target": {"a": 1, "b": 1, "c": 1}, "balance_seed": 7})
    assert [(c.check_name, c.passed) for c in checks] == [("accounting", True), ("no_source_wiped_out", True)]
    assert "| label: a | 7 | 1 | 0 | 0 | 14.3 % |" in md["dedup_by_source"].value  # dedup per label class
    table = md["class_histogram"].value
    assert "| `<null>` | 1 | 0 |" in table and "| `a` | 6 | 2 |" in table and "| `b` | 2 | 2 |" in table
    assert "| `c` | 3 | 2 |" in table and "| **total** | **12** | **6** |" in table
    # 15 records: 1 rejected, 1 filtered by min_words, 1 exact duplicate, 6 dropped by the balance, 6 kept
    assert (
        md["documents_input"].value,
        md["documents_rejected"].value,
        md["documents_duplicate"].value,
        md["documents_filtered"].value,
        md["documents_kept"].value,
    ) == (15, 1, 1, 7, 6)
    assert "| filtered | balance_downsample | 6 |" in md["outcomes_by_reason"].value
    out = Path(md["path"].value)
    parts = pl.concat([pl.read_parquet(p) for p in sorted(out.glob("part-*.parquet"))])
    assert sorted(parts["label"].to_list()) == ["a", "a", "b", "b", "c", "c"]
    assert pl.read_parquet(out / "balance_dropped.parquet").height == 6

    # up-sampling to uniform over every class present (<null> included): each class to 6 rows
    md, checks = _materialize(tmp_path / "root", src, {"balance_target": {}, "balance_mode": "upsample"})
    assert [(c.check_name, c.passed) for c in checks] == [("accounting", True), ("no_source_wiped_out", True)]
    assert (
        "| `<null>` | 1 | 6 |" in md["class_histogram"].value
        and "| **total** | **12** | **24** |" in md["class_histogram"].value
    )
    assert (md["documents_kept"].value, md["documents_filtered"].value, md["balance_repeats"].value) == (12, 1, 12)
    parts = pl.concat([pl.read_parquet(p) for p in sorted(Path(md["path"].value).glob("part-*.parquet"))])
    assert parts.height == parts["doc_id"].n_unique() == 12 and parts["copies"].sum() == 24


# ---------------------------------------------------------------------------------------------
# label_field without balance_target, and balance_target without labels (issue 15)


def _run_chain(root, src, raw_config, dedup_config):
    import logging

    from dagster import DagsterInstance

    from helpers.lineage import materialize_lineage

    from largetrain_dagster.corpus import corpus_assets
    from largetrain_dagster.definitions import build_definitions
    from largetrain_dagster.summary import render

    defs = build_definitions(root=str(root), wandb_mode="disabled")
    run_config = {
        "ops": {
            "domain__raw_corpus": {"config": {"path": str(src), "max_rejected_fraction": 0.5, **raw_config}},
            "domain__cleaned_text": {"config": {"min_words": 3}},
            "domain__deduplicated_text": {"config": dedup_config},
        }
    }
    with DagsterInstance.ephemeral() as instance:
        result = materialize_lineage(
            corpus_assets("domain")[:3], defs.resources, instance, run_config, raise_on_error=False
        )
        logs = [e for r in result.results for e in instance.all_logs(r.run_id)]
        warnings = [e.user_message for e in logs if e.dagster_event is None and e.level == logging.WARNING]
        failures = [
            e.dagster_event.step_failure_data.error.message
            for e in logs
            if e.dagster_event and e.dagster_event.is_step_failure
        ]
        md = [m.metadata for m in result.asset_materializations_for_node("domain__deduplicated_text")]
        return result.success, warnings, failures, md, render(instance)


def test_labels_read_but_not_balanced_warn_and_show_the_class_counts(tmp_path):
    src = _labelled_corpus(tmp_path / "labelled.jsonl")
    ok, warnings, _, md, summary = _run_chain(tmp_path / "root", src, {"label_field": "y"}, {})
    assert ok
    # 12 kept: a 6 (the exact duplicate of doc 0 removed), c 3, b 2, <null> 1 (doc 30)
    (w,) = [w for w in warnings if "not balanced" in w]
    assert w.startswith(
        "domain corpus: labels were read (raw_corpus label_field) but not balanced: balance_target is "
        "null. Documents per class: a 6, c 3, b 2, <null> 1. deduplicated_text `balance_target: {}` "
        "gives every class an equal share"
    )
    assert md[0]["labels_not_balanced"].value == {"a": 6, "b": 2, "c": 3, "<null>": 1}
    assert "  labels read, not balanced (balance_target null): documents per class a 6, c 3, b 2, <null> 1" in summary
    assert "/ duplicates 1 (exact 1, near 0 verified, 0 candidates kept by verification) /" in summary
    # the per-source view (no_source_wiped_out's table) leads with the source that lost most, and the chart
    assert "  sources that lost most to dedup: label: a 14.3 % (1 of 7); folder: <top level> " in summary
    assert md[0]["cluster_sizes"].value.startswith("![duplicate clusters by size](data:image/png;base64,")
    assert "| exact | 2 | 1 |" in md[0]["cluster_sizes"].value

    # no label_field: nothing to say
    ok, warnings, _, md, summary = _run_chain(tmp_path / "root", src, {}, {})
    assert ok and not [w for w in warnings if "not balanced" in w] and "labels_not_balanced" not in md[0]
    assert "labels read" not in summary


def test_balance_target_with_label_field_null_does_not_balance_and_a_misnamed_label_field_fails(tmp_path):
    """label_field: null (recipe 1's comment offers it) means no balancing, said at WARNING, whatever
    balance_target says; a label_field that no document has fails before any work."""
    src = _labelled_corpus(tmp_path / "labelled.jsonl")
    root = tmp_path / "root"
    balance = {"balance_target": {}, "balance_mode": "upsample"}
    ok, warnings, failures, md, _ = _run_chain(root, src, {"label_field": None}, balance)
    assert ok and not failures and "balance" not in md[0]
    assert (
        "domain/deduplicated_text: balance_target is set but raw_corpus label_field is null, so there is nothing "
        "to balance on: not balanced." in " ".join(warnings)
    )
    ok, _, failures, md, _ = _run_chain(root, src, {"label_field": "category"}, balance)
    assert not ok and not md
    (msg,) = failures
    assert (
        "domain/deduplicated_text: balance_target is set but no labels were read: none of the 14 documents has the "
        "field raw_corpus label_field names. Set label_field to the field holding the class and re-materialize "
        "domain/raw_corpus for every partition, or set label_field: null (no balancing)." in msg
    )
