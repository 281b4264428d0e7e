"""Issue 15: a step whose input was never materialized says what makes it (the asset to select,
for the artifacts recipes build on: `make demo` or the recipe) and which storage root it looked in."""

import os

from dagster import AssetKey, DagsterInstance, materialize

from helpers import REPO
from largetrain_dagster.definitions import build_definitions
from largetrain_dagster.resources import MADE_BY, RECIPES, not_materialized


def _failure(root, selection: list[str], **kw) -> str:
    defs = build_definitions(root=str(root), wandb_mode="disabled")
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            list(defs.assets),
            resources=defs.resources,
            instance=instance,
            raise_on_error=False,
            selection=[AssetKey.from_user_string(k) for k in selection],
            **kw,
        )
        assert not result.success
        (failure,) = [e for e in result.all_events if e.is_step_failure]
        return failure.step_failure_data.error.message.removeprefix(
            "dagster._core.definitions.events.Failure: "
        ).strip()


def test_a_missing_artifact_names_the_asset_the_recipes_that_make_it_and_the_root(tmp_path, monkeypatch):
    root = tmp_path / "fresh"
    monkeypatch.setenv("LARGETRAIN_ROOT", str(root))
    msg = _failure(root, ["pretrain/token_shards"])
    from largetrain_dagster.partitions import shards_text

    text = f"pretrain/{shards_text('pretrain')}"  # the text of the pretraining shards (filtered_text)
    missing = "tokenizer" if msg.startswith("tokenizer") else text  # inputs load in either order
    assert msg.startswith(
        f"{missing} has not been materialized under the storage root {root.resolve()} (LARGETRAIN_ROOT; "
        f"no {root.resolve()}/_handles/{missing}.json). Materialize it first (`dagster asset "
        f"materialize -m largetrain_dagster.definitions -c <your config> --select '{missing}'`"
    )
    assert "`make demo` builds it, as " in msg and "recipe 2 (configs/pretrain_on_my_corpus.yaml)" in msg

    # a partition of a per-document step: the partition to materialize; the root set by the caller is said so
    monkeypatch.delenv("LARGETRAIN_ROOT")
    msg = _failure(root, ["domain/deduplicated_text"])
    assert msg.startswith("partition 000 of domain/") and "LARGETRAIN_ROOT is unset;" in msg
    assert "--partition 000 --select 'domain/" in msg and "make demo" not in msg


def test_every_named_recipe_file_exists_and_the_demo_artifacts_name_their_makers():
    repo = str(REPO)
    assert all(os.path.exists(os.path.join(repo, f)) for f in RECIPES.values())
    msg = not_materialized(AssetKey("base_checkpoint"), "/nowhere")
    assert msg.endswith(
        "`make demo` builds it, as do recipe 2 (configs/pretrain_on_my_corpus.yaml) and recipe 3 "
        "(configs/import_hf_model.yaml)."
    )
    assert set(MADE_BY) >= {"tokenizer", "base_checkpoint", "pretrain/deduplicated_text", "pretrain/token_shards"}
