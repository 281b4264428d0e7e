"""A training step that crashes is retried by the asset's RetryPolicy and resumes from its checkpoint.

The crash is injected from outside, as a node failure would be: once the first checkpoint is
complete (COMPLETE.json), rank 1 is killed with SIGKILL. torchrun fails, no rank recorded an error of
its own (largetrain_core.error_records.describe_failure), the asset raises a retryable Failure, Dagster
retries the step, and the new torchrun resumes from that checkpoint instead of step 0. A deterministic
error is not retried: tests/integration/test_train_faults.py.
"""

import os
import signal
import threading
import time

from dagster import AssetKey, DagsterInstance

from largetrain_dagster.configs import deep_merge
from largetrain_dagster.definitions import build_definitions, lineage_assets
from helpers.lineage import materialize_lineage
from helpers.corpora import CORPORA, tiny_run_config
from helpers.processes import processes_mentioning


def test_crashed_training_retries_and_resumes_from_checkpoint(pretrain_root):
    root = pretrain_root
    defs = build_definitions(root=str(root), nproc_per_node=2, wandb_mode="disabled")
    assets = lineage_assets()  # not the landed chain (test_landing.py)
    train = deep_merge(
        tiny_run_config(CORPORA)["ops"]["base_checkpoint"]["config"],
        {
            "schedule": {"max_steps": 8},
            "checkpointing": {"save_steps": 2, "save_total_limit": 10},
            "tracking": {"logging_steps": 2},
        },
    )
    killed: list[int] = []

    def crash_rank_after_first_checkpoint():
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if list(root.glob("base_checkpoint/*/checkpoints/step-000002/COMPLETE.json")):
                ranks = [
                    p
                    for p, cmd in processes_mentioning(str(root / "base_checkpoint")).items()
                    if "torch.distributed.run" not in cmd
                ]
                if len(ranks) == 2:
                    victim = max(ranks)
                    os.kill(victim, signal.SIGKILL)
                    killed.append(victim)
                    return
            time.sleep(0.05)

    watcher = threading.Thread(target=crash_rank_after_first_checkpoint, daemon=True)
    watcher.start()
    with DagsterInstance.ephemeral() as instance:
        result = materialize_lineage(
            assets,
            defs.resources,
            instance,
            {"ops": {"base_checkpoint": {"config": train}}},
            ["base_checkpoint"],
        )
        watcher.join(timeout=5)
        assert killed, "the crash was not injected"
        assert result.success
        events = [
            e.dagster_event
            for e in instance.all_logs(result.run_id)
            if e.dagster_event and e.step_key == "base_checkpoint"
        ]
        types = [e.event_type_value for e in events]
        assert types.count("STEP_UP_FOR_RETRY") == 1 and types.count("STEP_RESTARTED") == 1
        # the killed rank recorded nothing; what the other rank recorded, if anything, is a consequence
        (retry,) = [e for e in events if e.event_type_value == "STEP_UP_FOR_RETRY"]
        assert (
            "without an error of its own in any rank: a process was killed or preempted"
            in retry.event_specific_data.error.to_string()
        )
        md = instance.get_latest_materialization_event(AssetKey("base_checkpoint")).asset_materialization.metadata
        assert md["steps"].value == 8 and md["reused"].value is False
    log = next(root.glob("base_checkpoint/*/train.log")).read_text(errors="replace")
    resumed = [line for line in log.splitlines() if "resumed from" in line]
    assert resumed and "step-0000" in resumed[-1] and "at step 0 " not in resumed[-1], resumed


def test_preempted_training_is_retried_by_dagster_and_resumes_from_its_preemption_checkpoint(
    pretrain_root, monkeypatch
):
    """A SIGTERM to the torchrun agent and every rank after step 3 (LARGETRAIN_FAULT sigterm_after_step:3, as a
    spot node's reclaim sends; no save_steps checkpoint at step 3): the ranks save checkpoint step-000003 and
    end as preempted, the step is retried by Dagster, and the retry resumes from step-000003. Prints the timeline."""
    monkeypatch.setenv("LARGETRAIN_FAULT", "sigterm_after_step:3")
    root = pretrain_root
    defs = build_definitions(root=str(root), nproc_per_node=1, wandb_mode="disabled")
    train = deep_merge(
        tiny_run_config(CORPORA)["ops"]["base_checkpoint"]["config"],
        {
            "schedule": {"max_steps": 6},
            "checkpointing": {"save_steps": 2, "save_total_limit": 10},
            "tracking": {"logging_steps": 1},
        },
    )
    with DagsterInstance.ephemeral() as instance:
        result = materialize_lineage(
            lineage_assets(),
            defs.resources,
            instance,
            {"ops": {"base_checkpoint": {"config": train}}},
            ["base_checkpoint"],
        )
        assert result.success
        records = [e for e in instance.all_logs(result.run_id) if e.step_key == "base_checkpoint"]
        events = [e.dagster_event for e in records if e.dagster_event]
        types = [e.event_type_value for e in events]
        assert types.count("STEP_UP_FOR_RETRY") == 1 and types.count("STEP_RESTARTED") == 1
        (retry,) = [e for e in events if e.event_type_value == "STEP_UP_FOR_RETRY"]
        assert "training preempted" in retry.event_specific_data.error.to_string()
        md = instance.get_latest_materialization_event(AssetKey("base_checkpoint")).asset_materialization.metadata
        assert md["steps"].value == 6
        t0 = records[0].timestamp
        marks = (
            "preempted (SIGTERM)",
            "checkpoint step-000003",
            "STEP_UP_FOR_RETRY",
            "STEP_RESTARTED",
            "resumed from",
            "STEP_SUCCESS",
        )
        timeline = [
            f"{e.timestamp - t0:7.1f} s  {e.dagster_event.event_type_value if e.dagster_event else e.user_message[:160]}"
            for e in records
            if any(
                m in (e.user_message or "") or (e.dagster_event and e.dagster_event.event_type_value == m)
                for m in marks
            )
        ]
        print("preemption timeline (seconds from the step's first event):\n" + "\n".join(timeline))
    out = next(root.glob("base_checkpoint/*/checkpoints"))
    assert (out / "step-000003" / "COMPLETE.json").exists()
    log = next(root.glob("base_checkpoint/*/train.log")).read_text(errors="replace")
    assert "preempted (SIGTERM) after step 3: saving checkpoint step-000003" in log
    resumed = [line for line in log.splitlines() if "resumed from" in line]
    assert resumed and "step-000003" in resumed[-1], resumed
