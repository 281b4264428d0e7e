"""A running training's progress read from its metrics.jsonl as rank 0 appends to it."""

import json
from pathlib import Path

from largetrain_dagster.progress import TrainingProgress, duration


def test_progress_follows_the_metrics_file_as_it_grows(tmp_path):
    reader = TrainingProgress(tmp_path)
    assert reader.poll(now=0.0) is None  # nothing written yet
    (tmp_path / "train_config.json").write_text(json.dumps({"schedule": {"max_steps": 100}, "lr": 1e-3}))
    metrics = tmp_path / "metrics.jsonl"
    with open(metrics, "w") as fh:
        fh.write(json.dumps({"step": 10, "loss": 7.12345, "tokens_per_s": 5432.1}) + "\n")
        fh.write('{"step": 11, "loss": 7.0')  # a row still being written
    p = reader.poll(now=100.0)
    assert (p.step, p.total, p.loss, p.eta_s) == (10, 100, 7.12345, None)  # one step seen: no rate yet
    assert p.line() == "step 10/100 (10%), loss 7.123, 5,432 tokens/s"

    with open(metrics, "a") as fh:
        fh.write(', "tokens_per_s": 5000.0}\n')
        for step in range(12, 31):
            fh.write(json.dumps({"step": step, "loss": 6.5, "tokens_per_s": 5000.0}) + "\n")
    p = reader.poll(now=140.0)  # 20 steps in 40 s since the first reading: 2 s a step, 70 steps left
    assert (p.step, p.loss, p.eta_s) == (30, 6.5, 140.0)
    assert p.line() == "step 30/100 (30%), loss 6.500, 5,000 tokens/s, ETA 2 min 20 s"


def test_durations_read_as_people_write_them():
    assert [duration(s) for s in (4.4, 59.6, 190, 3600 + 5 * 60 + 10)] == [
        "4 s",
        "1 min 0 s",
        "3 min 10 s",
        "1 h 05 min",
    ]


def test_a_finished_training_shows_no_eta(tmp_path):
    (tmp_path / "train_config.json").write_text(json.dumps({"schedule": {"max_steps": 2}}))
    reader = TrainingProgress(tmp_path)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 3.0, "tokens_per_s": 10.0}) + "\n")
    reader.poll(now=0.0)
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 2, "loss": 2.5, "tokens_per_s": 12.0}) + "\n")
    assert reader.poll(now=1.0).line() == "step 2/2 (100%), loss 2.500, 12 tokens/s"


def test_training_progress_is_observed_on_the_asset_while_it_trains(tmp_path, tiny_shards):
    """base_checkpoint trains llama-tiny through Dagster with a progress line every half second: the instance's
    event log holds AssetObservations of base_checkpoint, written before the training finished, with
    increasing steps and the numbers of the run log's lines."""
    from dagster import AssetKey, DagsterInstance, materialize

    from largetrain_dagster.definitions import build_definitions, lineage_assets
    from largetrain_dagster.resources import TorchrunLauncher, handle_file, read_handle

    root = tmp_path / "root"
    defs = build_definitions(root=str(root), nproc_per_node=1, report_to=[])
    upstream = handle_file(root, AssetKey(["pretrain", "token_shards"]))
    upstream.parent.mkdir(parents=True)
    upstream.write_text(json.dumps({"path": str(tiny_shards), "data_version": "tiny", "stats": {}}))
    steps = 60
    train = {
        "model": {"preset": "llama-tiny"},
        "schedule": {"max_steps": steps, "warmup_steps": 2, "micro_batch_size": 4},
        "optimizer": {"learning_rate": 5e-3},
        "checkpointing": {"save_steps": steps},
        "tracking": {"logging_steps": steps},
    }
    resources = {**defs.resources, "launcher": TorchrunLauncher(nproc_per_node=1, progress_seconds=0.5)}
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            lineage_assets(),
            selection=[AssetKey("base_checkpoint")],
            resources=resources,
            instance=instance,
            run_config={"ops": {"base_checkpoint": {"config": train}}},
        )
        assert result.success
        records = instance.fetch_observations(AssetKey("base_checkpoint"), limit=1000).records
        (materialized,) = instance.fetch_materializations(AssetKey("base_checkpoint"), limit=1).records
        messages = [e.user_message for e in instance.all_logs(result.run_id)]
        logged = [m for m in messages if "training progress: step" in m]
    # the threads of the rank: the OMP_NUM_THREADS the suite's process was given (tests/conftest.py), not cores / ranks
    assert any(m.startswith("launching: ") and " (OMP_NUM_THREADS=1); log: " in m for m in messages), messages
    records = sorted(records, key=lambda r: r.storage_id)
    assert len(records) >= 2, f"a {steps}-step training shows its progress more than once"
    md = [{k: v.value for k, v in r.asset_observation.metadata.items()} for r in records]
    assert [m["step"] for m in md] == sorted({m["step"] for m in md})  # one per new step, increasing
    assert all(m["total_steps"] == steps and 1 <= m["step"] <= steps and m["tokens_per_s"] > 0 for m in md)
    assert all(
        m["progress_percent"] == round(100 * m["step"] / steps, 1) and m["loss"] == round(m["loss"], 3) for m in md
    )
    assert "eta_s" in md[-1] and all(r.run_id == result.run_id for r in records)
    # written while the training ran: before the ranks wrote the summary and before the materialization
    summary = Path(read_handle(root, AssetKey("base_checkpoint"))["path"]) / "summary.json"
    assert records[0].timestamp < summary.stat().st_mtime
    assert all(r.storage_id < materialized.storage_id for r in records)
    # the same readings as the run log's progress lines, one observation per line
    assert len(logged) == len(records)
    assert all(line.startswith(f"training progress: step {m['step']}/{steps} ") for m, line in zip(md, logged))
    assert [r.asset_observation.description for r in records] == [f"{line} (loss in nats per token)" for line in logged]


def test_progress_is_observed_on_the_one_asset_a_step_materializes():
    """progress_asset: the asset (and partition) of a single-asset step, the one selected asset of a
    subsettable multi-asset; None for a step of several assets and for an op."""
    from dagster import (
        AssetKey,
        AssetOut,
        DagsterInstance,
        Output,
        StaticPartitionsDefinition,
        asset,
        job,
        materialize,
        multi_asset,
        op,
    )

    from largetrain_dagster.progress import progress_asset

    seen = {}

    @asset
    def single(context):
        seen["single"] = progress_asset(context)

    @asset(partitions_def=StaticPartitionsDefinition(["p1", "p2"]))
    def parted(context):
        seen["parted"] = progress_asset(context)

    @multi_asset(outs={"left": AssetOut(is_required=False), "right": AssetOut(is_required=False)}, can_subset=True)
    def both(context):
        seen.setdefault("both", []).append(progress_asset(context))
        for name in sorted(context.op_execution_context.selected_output_names):
            yield Output(None, output_name=name)

    @op
    def plain(context):
        seen["op"] = progress_asset(context)

    @job
    def plain_job():
        plain()

    with DagsterInstance.ephemeral() as instance:
        assert materialize([single, both], instance=instance).success
        assert materialize([both], selection=[AssetKey("right")], instance=instance).success
        assert materialize([parted], partition_key="p2", instance=instance).success
        assert plain_job.execute_in_process(instance=instance).success
    assert seen == {
        "single": (AssetKey("single"), None),
        "parted": (AssetKey("parted"), "p2"),
        "both": [None, (AssetKey("right"), None)],
        "op": None,
    }
