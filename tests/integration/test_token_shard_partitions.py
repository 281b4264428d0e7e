"""token_shards partitioned like the data steps (largetrain_core.stages.token_shards, largetrain_dagster.shards):
one step per partition, a global step that writes the manifest, the same sequences as one process; a
partition that lost a shard file is rebuilt while the rest is reused."""

import json
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterEventType, DagsterInstance, materialize

from largetrain_core.shards import TokenShards, build_token_shards
from largetrain_core.stages.base import Artifact, StageRun
from largetrain_core.stages.token_shards import (
    TokenShardsSettings,
    intact,
    token_shard_partition,
    token_shard_partitions,
    token_shards,
)
from largetrain_dagster.executor import DataExecutor
from largetrain_dagster.partitions import shards_text
from largetrain_dagster.resources import HandleIOManager, Storage
from largetrain_dagster.shards import token_shards_asset
from helpers.parts import write_parts

SETTINGS = TokenShardsSettings(seq_len=8, validation_fraction=0.2, seed=1, sequences_per_shard=5)


def _corpus(tmp_path: Path, sentences, parts: int = 6) -> Path:
    docs = [(f"doc-{i:02d}", " ".join(sentences[i * 4 : i * 4 + 2 + i % 5])) for i in range(48)]
    step = len(docs) // parts
    return write_parts(tmp_path / "dedup", [docs[k : k + step] for k in range(0, len(docs), step)])


def _rows(d: Path, split: str) -> list:
    shards = TokenShards(d, split, verify_checksums=True)
    return shards.take(range(len(shards))).tolist()


def test_stage_partitions_give_one_process_shards_and_heal_a_lost_partition_file(tmp_path, bpe_dir, sentences):
    src = _corpus(tmp_path, sentences)
    text, tok = Artifact(src, "text-v1", {}), Artifact(bpe_dir, "tok-v1", {})
    run = StageRun(root=tmp_path / "root", asset=("pretrain", "token_shards"))
    n = token_shard_partitions(SETTINGS, text, tok, run, 4)
    assert n == 4
    parts = [token_shard_partition(SETTINGS, text, tok, run, i, n) for i in range(n)]
    assert [p.path.parent.name for p in parts] == ["000-of-004", "001-of-004", "002-of-004", "003-of-004"]
    result = token_shards(SETTINGS, text, tok, run, parts)
    assert result.checks["token_ids_below_vocab"].passed and result.stats["partitions"] == 4
    one = tmp_path / "one"
    one.mkdir()
    build_token_shards(src, bpe_dir, one, seq_len=8, validation_fraction=0.2, seed=1, sequences_per_shard=5)
    for split in ("train", "validation"):
        assert _rows(result.path, split) == _rows(one, split)
    assert token_shard_partitions(SETTINGS, text, tok, run, 4) == 0  # complete: nothing to tokenize

    manifest = json.loads((result.path / "manifest.json").read_text())
    lost = result.path / next(e["file"] for e in manifest["splits"]["train"]["shards"] if e["file"].startswith(".."))
    lost.unlink()
    assert not intact(result.path) and token_shard_partitions(SETTINGS, text, tok, run, 4) == 4
    again = [token_shard_partition(SETTINGS, text, tok, run, i, 4) for i in range(4)]
    assert sum(not p.reused for p in again) == 1 and lost.exists()  # the partition that lost it, rebuilt
    healed = token_shards(SETTINGS, text, tok, run, again)
    assert healed.reused and healed.path == result.path and intact(healed.path)
    assert _rows(healed.path, "train") == _rows(one, "train")


@pytest.mark.parametrize("executor", ["local", "spark"])
def test_the_asset_tokenizes_each_partition_in_a_step_of_its_own(tmp_path, bpe_dir, sentences, executor, monkeypatch):
    """Also on the Spark executor (local[2], 2 data partitions): each partition's step submits a Spark
    application through Dagster Pipes, its parts tokenized in tasks; the same sequences."""
    from largetrain_core.storage import write_manifest
    from largetrain_dagster import partitions

    import shutil

    if executor == "spark":
        monkeypatch.setattr(partitions, "DATA_PARTITIONS", partitions.data_partitions(2))

    src = _corpus(tmp_path, sentences, parts=8)
    bpe_dir = Path(shutil.copytree(bpe_dir, tmp_path / "tok"))  # the session's tokenizer stays as it is
    for d in (src, bpe_dir):  # as the stages leave them
        write_manifest(d)
    root = tmp_path / "root"
    (root / "_handles" / "pretrain").mkdir(parents=True)
    text_key = shards_text("pretrain")  # the text the pretraining shards are made of (filtered_text)
    (root / "_handles" / "pretrain" / f"{text_key}.json").write_text(
        json.dumps({"path": str(src), "data_version": "text-v1", "stats": {}})
    )
    (root / "_handles" / "tokenizer.json").write_text(
        json.dumps({"path": str(bpe_dir), "data_version": "tok-v1", "stats": {}})
    )
    from dagster import AssetSpec

    upstream = [
        AssetSpec(AssetKey(["pretrain", text_key])).with_io_manager_key("handles"),
        AssetSpec(AssetKey("tokenizer")).with_io_manager_key("handles"),
    ]  # materialized elsewhere: their handles
    config = {
        "ops": {
            "pretrain__token_shards": {
                "config": {"seq_len": 8, "validation_fraction": 0.2, "seed": 1, "sequences_per_shard": 5}
            }
        }
    }
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [*upstream, *token_shards_asset("pretrain")],
            instance=instance,
            run_config=config,
            resources={
                "storage": Storage(root=str(root)),
                "handles": HandleIOManager(root=str(root)),
                "executor": DataExecutor(name=executor, spark={"master": "local[2]"}),
            },
            selection=[AssetKey(["pretrain", "token_shards"])],
        )
        assert result.success
        steps = sorted({e.step_key for e in result.all_events if e.event_type == DagsterEventType.STEP_SUCCESS})
        logs = [r.user_message for r in instance.all_logs(result.run_id)]
    n = len(partitions.DATA_PARTITIONS.get_partition_keys())
    assert len([m for m in logs if f"on the {executor} executor" in m]) == n
    tokenize = [s for s in steps if "tokenize" in s]
    assert len(tokenize) == n and len(steps) == n + 3  # plan, each partition, assemble, the check
    (md,) = result.asset_materializations_for_node("pretrain__token_shards")
    assert md.metadata["partitions"].value == n and not md.metadata["reused"].value
    checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
    assert checks == {"token_ids_below_vocab": True}
    one = tmp_path / "one"
    one.mkdir()
    build_token_shards(src, bpe_dir, one, seq_len=8, validation_fraction=0.2, seed=1, sequences_per_shard=5)
    out = Path(md.metadata["path"].value)
    assert _rows(out, "train") == _rows(one, "train") and _rows(out, "validation") == _rows(one, "validation")
    assert not list(out.glob("train-0*.arrow"))  # the partitions' windows stay in the partitions' directories
