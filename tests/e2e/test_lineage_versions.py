"""Versioned lineage and blocking checks through a real Dagster instance, on the data-preparation assets.

* Changing a config value (or a cleaning rule, i.e. a code version) marks stale exactly the assets
  downstream of the change; materializing the stale assets until none is left redoes only those,
  and every other asset keeps its materialization (no work).
* A failing blocking check (the accounting recount, after a part file was double-written) stops the
  downstream asset.

Dagster's staleness is one level deep: an asset is STALE when its code version changed or an input's
data version changed since it was materialized. So "materialize the stale assets" is a loop, the
way the UI's "Materialize stale" button is pressed until nothing is stale. raw_corpus and
cleaned_text are partitioned: their status is the worst of their partitions' statuses.
"""

import shutil
from pathlib import Path

import polars as pl

from dagster import AssetKey, DagsterInstance
from dagster._core.definitions.assets.graph.asset_graph import AssetGraph
from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
from dagster._core.definitions.temporal_context import TemporalContext
from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView
from dagster._time import get_current_datetime

from largetrain_core.storage import write_manifest
from largetrain_dagster import artifacts
from largetrain_dagster.definitions import build_definitions
from helpers.lineage import PARTITION_KEYS, is_partitioned, materialize_lineage
from helpers.corpora import CORPORA, corpus, tiny_run_config

DATA_KEYS = [
    f"{role}/{name}"
    for role in ("pretrain", "domain")
    for name in ("raw_corpus", "cleaned_text", "deduplicated_text", "token_shards")
] + ["pretrain/filtered_text", "relevance_classifier", "evaluation_sets", "tokenizer"]


def data_assets(root):
    """The data-preparation assets (no training) of a fresh build of the definitions."""
    defs = build_definitions(root=str(root), nproc_per_node=1, wandb_mode="disabled")
    keep = {AssetKey.from_user_string(k) for k in DATA_KEYS}
    checks = [c for c in defs.asset_checks if {k.asset_key for k in c.check_keys} <= keep]
    return [a for a in defs.assets if set(a.keys) <= keep] + checks, defs.resources


def run_config(overrides=None):
    ops = {
        k: v
        for k, v in tiny_run_config(CORPORA)["ops"].items()
        if k not in ("base_checkpoint", "lora_adapter", "evaluation")
    }
    for op, cfg in (overrides or {}).items():
        ops.setdefault(op, {"config": {}})["config"].update(cfg)
    return {"ops": ops}


def run(instance, assets, resources, config, keys=None, **kw):
    """Materialize ``keys`` (all data assets when None; partitioned ones in every partition)."""
    return materialize_lineage(assets, resources, instance, config, keys or DATA_KEYS, **kw)


def statuses(instance, assets) -> dict[str, StaleStatus]:
    graph = AssetGraph.from_assets(assets)
    view = AssetGraphView(
        temporal_context=TemporalContext(effective_dt=get_current_datetime(), last_event_id=None),
        instance=instance,
        asset_graph=graph,
    )
    resolver = CachingStaleStatusResolver(instance=instance, asset_graph=graph, loading_context=view)

    def status(k: str) -> StaleStatus:
        if not is_partitioned(k):
            return resolver.get_status(AssetKey.from_user_string(k))
        each = {resolver.get_status(AssetKey.from_user_string(k), pk) for pk in PARTITION_KEYS}
        return next(s for s in (StaleStatus.MISSING, StaleStatus.STALE, StaleStatus.FRESH) if s in each)

    return {k: status(k) for k in DATA_KEYS}


def materialize_stale_until_fresh(instance, assets, resources, config) -> tuple[list[set[str]], dict[str, bool]]:
    """Materialize the STALE assets, again and again, until none is stale.

    Returns the stale set of each round and, per asset materialized, whether it reused its artifact."""
    rounds, reused = [], {}
    for _ in range(len(DATA_KEYS) + 1):
        stale = {k for k, s in statuses(instance, assets).items() if s == StaleStatus.STALE}
        if not stale:
            return rounds, reused
        rounds.append(stale)
        result = run(instance, assets, resources, config, sorted(stale))
        assert result.success
        for ev in result.get_asset_materialization_events():
            mat = ev.step_materialization_data.materialization
            reused[mat.asset_key.to_user_string()] = mat.metadata["reused"].value
    raise AssertionError(f"still stale after {len(DATA_KEYS)} rounds: {rounds}")


def test_config_and_code_changes_mark_exactly_downstream_stale(tmp_path, monkeypatch):
    corpus("linux-doc"), corpus("shakespeare")
    assets, resources = data_assets(tmp_path / "root")
    with DagsterInstance.ephemeral() as instance:
        assert run(instance, assets, resources, run_config()).success
        assert set(statuses(instance, assets).values()) == {StaleStatus.FRESH}

        # Unchanged code, config and inputs: materializing again does no work (same data versions, reused).
        again = run(instance, assets, resources, run_config(), ["domain/cleaned_text"])
        assert [m.metadata["reused"].value for m in again.asset_materializations_for_node("domain__cleaned_text")] == [
            True
        ] * len(PARTITION_KEYS)
        assert set(statuses(instance, assets).values()) == {StaleStatus.FRESH}

        # A config value changes: domain/cleaned_text rematerialized with another min_words.
        changed = run_config({"domain__cleaned_text": {"min_words": 20}})
        result = run(instance, assets, resources, changed, ["domain/cleaned_text"])
        assert result.success
        assert [m.metadata["reused"].value for m in result.asset_materializations_for_node("domain__cleaned_text")] == [
            False
        ] * len(PARTITION_KEYS)
        st = statuses(instance, assets)
        assert {k for k, s in st.items() if s == StaleStatus.STALE} == {"domain/deduplicated_text"}
        rounds, reused = materialize_stale_until_fresh(instance, assets, resources, changed)
        # the domain text also feeds the relevance classifier, whose scores filter the pretraining text
        assert rounds == [
            {"domain/deduplicated_text"},
            {"domain/token_shards", "relevance_classifier"},
            {"pretrain/filtered_text"},
            {"pretrain/token_shards"},
        ]
        assert reused == {
            k: False
            for k in (
                "domain/deduplicated_text",
                "domain/token_shards",
                "relevance_classifier",
                "pretrain/filtered_text",
                "pretrain/token_shards",
            )
        }

        # A cleaning rule changes (the code version of cleaned_text): both cleaned_text assets are stale,
        # then exactly their downstream; raw_corpus never reruns.
        monkeypatch.setitem(artifacts.CODE_VERSIONS, "cleaned_text", artifacts.CODE_VERSIONS["cleaned_text"] + "-rule")
        new_assets, resources = data_assets(tmp_path / "root")
        st = statuses(instance, new_assets)
        assert {k for k, s in st.items() if s == StaleStatus.STALE} == {"pretrain/cleaned_text", "domain/cleaned_text"}
        rounds, reused = materialize_stale_until_fresh(instance, new_assets, resources, changed)
        downstream = {
            f"{r}/{n}" for r in ("pretrain", "domain") for n in ("cleaned_text", "deduplicated_text", "token_shards")
        } | {"tokenizer", "relevance_classifier", "pretrain/filtered_text"}
        assert set().union(*rounds) == downstream
        assert set(reused) == downstream and not any(reused.values())
        assert "pretrain/raw_corpus" not in reused and "domain/raw_corpus" not in reused


def test_failing_blocking_checks_stop_downstream(tmp_path):
    corpus("linux-doc")
    assets, resources = data_assets(tmp_path / "root")
    upstream = [f"pretrain/{n}" for n in ("raw_corpus", "cleaned_text", "deduplicated_text")]
    with DagsterInstance.ephemeral() as instance:
        ok = run(instance, assets, resources, run_config(), upstream)
        assert ok.success
        # A part file written twice: the recount of kept documents no longer balances.
        handle = ok.output_for_node("pretrain__deduplicated_text")
        parts = sorted((tmp_path / "root").glob("pretrain/deduplicated_text/*/part-*.parquet"))
        assert parts and str(parts[0]).startswith(handle["path"])
        shutil.copy(parts[0], parts[0].with_name("part-99999.parquet"))
        # recorded in the manifest as if the stage itself had written it (a bug, not damage after the fact,
        # which would be rebuilt): the directory is reused and the checks see it
        write_manifest(Path(handle["path"]))

        def rerun_and_expect(failed_checks: dict):
            result = run(
                instance,
                assets,
                resources,
                run_config(),
                ["pretrain/deduplicated_text", "tokenizer"],
                raise_on_error=False,
            )
            assert not result.success
            checks = {
                (e.asset_key.to_user_string(), e.check_name): e.passed for e in result.get_asset_check_evaluations()
            }
            assert checks == failed_checks
            assert instance.get_latest_materialization_event(AssetKey("tokenizer")) is None
            assert not (tmp_path / "root" / "tokenizer").exists()
            logs = instance.all_logs(result.run_id)
            started = {e.step_key for e in logs if e.dagster_event and e.dagster_event.event_type_value == "STEP_START"}
            assert "tokenizer" not in started  # the tokenizer step never started
            assert any(
                e.step_key == "tokenizer" and "Dependencies for step tokenizer failed" in e.user_message for e in logs
            )

        # The accounting check (inside the asset) fails: the check on duplicates never runs, the tokenizer never starts.
        rerun_and_expect(
            {
                ("pretrain/deduplicated_text", "accounting"): False,
                ("pretrain/deduplicated_text", "no_source_wiped_out"): True,
            }
        )

        # Same number of rows, but one kept document is now a copy of another: accounting holds, the
        # standalone blocking check no_exact_duplicates fails and stops the tokenizer.
        extra = parts[0].with_name("part-99999.parquet")
        extra.unlink()
        df = pl.read_parquet(parts[0])
        assert df.height >= 2
        pl.concat([df.head(df.height - 1), df.head(1)]).write_parquet(parts[0])
        write_manifest(Path(handle["path"]))
        rerun_and_expect(
            {
                ("pretrain/deduplicated_text", "accounting"): True,
                ("pretrain/deduplicated_text", "no_source_wiped_out"): True,
                ("pretrain/deduplicated_text", "no_exact_duplicates"): False,
            }
        )
