"""Issue 15: a step whose input was never materialized says what makes it (the asset to select,
for the artifacts recipes build on: `make demo` or the recipe) and which storage root it looked in."""

import os

from dagster import AssetKey, DagsterInstance, materialize

from helpers import REPO
from largetrain_dagster.definitions import build_definitions
from largetrain_core.storage import relative_to_root, write_json_atomic, write_manifest
from largetrain_dagster.resources import MADE_BY, RECIPES, not_materialized


def _failure(root, selection: list[str], **kw) -> str:
    """The message of the one step failure of materializing ``selection`` under ``root``; asserts that the
    step was not retried (the training assets have a RetryPolicy)."""
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
        assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
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


def test_a_missing_or_damaged_input_of_a_retried_training_is_not_retried(tmp_path, monkeypatch):
    """Issue 42 item 8: base_checkpoint (RetryPolicy: one retry after 5 s) whose input pretrain/token_shards is
    missing, then present but damaged after it was written (a shard file cut short): each fails at once,
    naming the input and what to do, and is not retried (no "Exceeded max_retries")."""
    root = tmp_path / "root"
    monkeypatch.setenv("LARGETRAIN_ROOT", str(root))
    msg = _failure(root, ["base_checkpoint"])
    assert msg.startswith("pretrain/token_shards has not been materialized under the storage root")
    assert msg.endswith("Not retried: a retry would fail the same way.") and "max_retries" not in msg

    version = root / "pretrain" / "token_shards" / "v1"
    version.mkdir(parents=True)
    (version / "train-00000.arrow").write_bytes(b"x" * 64)
    write_manifest(version)
    handle = root / "_handles" / "pretrain" / "token_shards.json"
    handle.parent.mkdir(parents=True)
    write_json_atomic(handle, relative_to_root({"path": str(version), "data_version": "v1", "stats": {}}, root))
    (version / "train-00000.arrow").write_bytes(b"x" * 10)
    msg = _failure(root, ["base_checkpoint"])
    assert msg.startswith(f"pretrain/token_shards at {version} was damaged after it was written: ")
    assert "train-00000.arrow" in msg and msg.endswith(
        "Re-materialize pretrain/token_shards: it is rebuilt. Not retried: a retry would fail the same way."
    )
