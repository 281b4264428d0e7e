"""The landing sensor over real ticks (build_sensor_context, a real instance), the landed chain's
dynamic partitions and global dedup, declarative automation, and the adapter schedule."""

import json
import os
import shutil
from pathlib import Path

import polars as pl

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
from largetrain_dagster.landing import MAX_KEY_PART, landed_batches, landing_sensor, partition_key
from largetrain_dagster.resources import read_handle
from helpers.corpora import corpus

RAW, CLEAN, DEDUP = (AssetKey(["landed", n]) for n in ("raw_corpus", "cleaned_text", "deduplicated_text"))


def tick(instance, resources, cursor):
    ctx = build_sensor_context(instance=instance, cursor=cursor, resources={"storage": resources["storage"]})
    return landing_sensor(ctx)


def apply(instance, defs, result: SensorResult) -> list[str]:
    """What the sensor daemon does with a result: add the partitions, then run each request."""
    for req in result.dynamic_partitions_requests:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    for req in result.run_requests:
        assert materialize(
            list(defs.assets),
            resources=defs.resources,
            instance=instance,
            partition_key=req.partition_key,
            selection=list(req.asset_selection),
        ).success
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
        keys = ["shakespeare/as-you-like-it.md", "shakespeare/twelfth%20night.md"]
        assert [r.partition_key for r in result.run_requests] == keys
        assert all(set(r.asset_selection) == {RAW, CLEAN} for r in result.run_requests)
        assert [list(r.partition_keys) for r in result.dynamic_partitions_requests] == [keys]
        assert apply(instance, defs, result) == keys
        assert sorted(instance.get_dynamic_partitions(landed_batches.name)) == keys

        # The second tick, with the cursor of the first: nothing new, a skip with the reason.
        second = tick(instance, res, result.cursor)
        assert (
            isinstance(second, SkipReason) and "no new files" in second.skip_message and "2 seen" in second.skip_message
        )
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


def test_landed_files_never_share_a_partition_key(cases, tmp_path):
    """tests/cases/landing_collision: ``notes 1.md`` and ``notes_1.md`` (and names that are cut, or hold
    dots, or bytes that are not UTF-8) each get a partition of their own, and every file is read."""
    root = tmp_path / "root"
    defs = build_definitions(root=str(root), nproc_per_node=1, wandb_mode="disabled")
    landing = root / "landing" / "web"
    landing.mkdir(parents=True)
    for f in (cases / "landing_collision").iterdir():
        shutil.copy(f, landing / f.name)
    long_a, long_b = "n" * 230 + "-a.md", "n" * 230 + "-b.md"  # the same first 200 characters
    texts = {
        "notes 1.md": (cases / "landing_collision" / "notes 1.md").read_text(),
        "notes_1.md": (cases / "landing_collision" / "notes_1.md").read_text(),
        "notes...md": "Dots in a row. A partition key may not hold three of them.",
        long_a: "The first of two files whose long names differ at the end.",
        long_b: "The second of two files whose long names differ at the end.",
        os.fsdecode(b"caf\xe9.md"): "A Latin-1 file name, not valid UTF-8.",
    }
    for name, text in texts.items():
        if not (landing / name).exists():
            (landing / name).write_text(text)
    with DagsterInstance.ephemeral() as instance:
        result = tick(instance, defs.resources, None)
        keys = [r.partition_key for r in result.run_requests]
        assert len(set(keys)) == len(keys) == len(texts)
        assert {"web/notes%201.md", "web/notes_1.md", "web/notes.%2E%2Emd", "web/caf%E9.md"} <= set(keys)
        assert all(len(k.split("/")[1]) <= MAX_KEY_PART for k in keys)
        assert {r.tags["largetrain/landed_file"] for r in result.run_requests} == {str(landing / n) for n in texts}
        for req in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        for req in result.run_requests:  # each partition read its own file
            run = materialize(
                list(defs.assets),
                resources=defs.resources,
                instance=instance,
                partition_key=req.partition_key,
                selection=list(req.asset_selection),
                raise_on_error=False,
            )
            name = Path(req.tags["largetrain/landed_file"]).name
            if req.partition_key == "web/caf%E9.md":
                # the reader rejects a file name that is not UTF-8, and one record of one rejected is more than
                # max_rejected_fraction: the run fails naming the file and the reason, as the role chains do
                (failure,) = [e for e in run.all_events if e.is_step_failure]
                msg = failure.step_failure_data.error.message
                assert (
                    "1 of 1 records rejected" in msg and "file name is not valid UTF-8" in msg and "caf\\xe9.md" in msg
                ), msg
                continue
            assert run.success
            handle = read_handle(root, AssetKey(["landed", "raw_corpus"]), req.partition_key)
            docs = pl.read_parquet(Path(handle["path"]) / "part-00000.parquet")
            assert [t.strip() for t in docs["text"].to_list()] == [texts[name].strip()]


def test_partition_key_escaping_is_reversible():
    from urllib.parse import unquote_to_bytes

    for name in [
        "notes 1.md",
        "notes_1.md",
        "100%.md",
        "a%20b.md",
        "x...y",
        "\u00e9t\u00e9.txt",
        os.fsdecode(b"\xff\xfe.md"),
    ]:
        key = partition_key("web", name)
        assert unquote_to_bytes(key.split("/")[1]) == os.fsencode(name)
    assert partition_key("web", "notes 1.md") != partition_key("web", "notes_1.md")


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
    # the landed chain's conditions are evaluated by a sensor that runs by default (docs/guides/operations.md) ...
    auto = defs.resolve_sensor_def("landed_automation")
    assert auto.default_status == DefaultSensorStatus.RUNNING
    assert auto.asset_selection.resolve(graph) == {RAW, CLEAN, DEDUP}
    # ... and no asset is left to Dagster's implicit automation sensor, which would start stopped
    assert {s.name for s in defs.get_repository_def().sensor_defs} == {"landing_sensor", "landed_automation"}
