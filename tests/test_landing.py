"""The landing sensor over real ticks (build_sensor_context, a real instance), the landed chain's
dynamic partitions and global dedup, declarative automation, and the adapter schedule."""

import json
import shutil

from dagster import (
    AssetKey,
    DagsterInstance,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    SensorResult,
    SkipReason,
    build_sensor_context,
    evaluate_automation_conditions,
    materialize,
)

from largetrain_dagster.definitions import build_definitions
from largetrain_dagster.landing import landed_batches, landing_sensor
from test_pipeline import CORPORA, corpus

RAW, CLEAN, DEDUP = (AssetKey(["landed", n]) for n in ("raw_corpus", "cleaned_text", "deduplicated_text"))


def tick(instance, resources, cursor):
    ctx = build_sensor_context(instance=instance, cursor=cursor, resources={"storage": resources["storage"]})
    return landing_sensor(ctx)


def apply(instance, defs, result: SensorResult) -> list[str]:
    """What the sensor daemon does with a result: add the partitions, then run each request."""
    for req in result.dynamic_partitions_requests:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    for req in result.run_requests:
        assert materialize(list(defs.assets), resources=defs.resources, instance=instance, partition_key=req.partition_key,
                           selection=list(req.asset_selection)).success
    return [r.partition_key for r in result.run_requests]


def test_sensor_two_ticks_partitions_and_global_dedup(tmp_path):
    plays = corpus("shakespeare") / "comedies"
    root = tmp_path / "root"
    defs = build_definitions(root=str(root), nproc_per_node=1, wandb_mode="disabled")
    res = defs.resources
    with DagsterInstance.ephemeral() as instance:
        first = tick(instance, res, None)
        assert isinstance(first, SkipReason) and "no new files" in first.skip_message

        landing = root / "landing" / "shakespeare"
        landing.mkdir(parents=True)
        shutil.copy(plays / "as-you-like-it.md", landing)
        shutil.copy(plays / "twelfth-night.md", landing / "twelfth night.md")
        (landing / "the-tempest.md.part").write_text("still uploading")  # ignored until renamed

        result = tick(instance, res, None)
        assert isinstance(result, SensorResult)
        keys = ["shakespeare/as-you-like-it.md", "shakespeare/twelfth_night.md"]
        assert [r.partition_key for r in result.run_requests] == keys
        assert all(set(r.asset_selection) == {RAW, CLEAN} for r in result.run_requests)
        assert [list(r.partition_keys) for r in result.dynamic_partitions_requests] == [keys]
        assert apply(instance, defs, result) == keys
        assert sorted(instance.get_dynamic_partitions(landed_batches.name)) == keys

        # The second tick, with the cursor of the first: nothing new, a skip with the reason.
        second = tick(instance, res, result.cursor)
        assert isinstance(second, SkipReason) and "no new files" in second.skip_message and "2 seen" in second.skip_message
        # Had the cursor been lost, the same files would give the same run keys, which Dagster runs once.
        assert [r.run_key for r in tick(instance, res, None).run_requests] == [r.run_key for r in result.run_requests]

        # The global step reads every partition.
        done = materialize(list(defs.assets), resources=res, instance=instance, selection=[DEDUP])
        handle = done.output_for_node("landed__deduplicated_text")
        assert handle["stats"]["partitions"] == 2 and handle["stats"]["duplicate"] == 0

        # Declarative automation, as the daemon evaluates it tick after tick: nothing to do now ...
        def requested(cursor):
            auto = evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
            return {k.to_user_string() for k in auto._requested_partitions_by_asset_key}, auto.cursor

        now, cursor = requested(None)
        assert not now

        # ... a new file lands (a copy of a play already landed): one new partition, one run ...
        shutil.copy(plays / "as-you-like-it.md", landing / "as-you-like-it-again.md")
        third = tick(instance, res, result.cursor)
        assert apply(instance, defs, third) == ["shakespeare/as-you-like-it-again.md"]
        assert json.loads(third.cursor).keys() == set(keys) | {"shakespeare/as-you-like-it-again.md"}

        # ... then the global dedup is requested because a partition upstream was updated; no training
        # asset is ever requested by automation. The dedup now removes the copy across partitions.
        now, cursor = requested(cursor)
        assert now == {"landed/deduplicated_text"}
        done = materialize(list(defs.assets), resources=res, instance=instance, selection=[DEDUP])
        stats = done.output_for_node("landed__deduplicated_text")["stats"]
        assert stats["partitions"] == 3 and stats["duplicate"] == 1 and stats["input"] == 3


def test_automation_and_schedule_policies():
    defs = build_definitions(root="/nonexistent", nproc_per_node=1, wandb_mode="disabled")
    graph = defs.resolve_asset_graph()
    for key in ("base_checkpoint", "lora_adapter", "evaluation"):
        assert graph.get(AssetKey(key)).automation_condition is None, f"{key} must never start by itself"
    for key in (CLEAN, DEDUP):
        assert graph.get(key).automation_condition is not None
    schedule = defs.resolve_schedule_def("retrain_lora_adapter")
    assert schedule.default_status == DefaultScheduleStatus.STOPPED
    assert schedule.cron_schedule == "0 3 * * 0"
    assert defs.resolve_sensor_def("landing_sensor").default_status == DefaultSensorStatus.RUNNING
