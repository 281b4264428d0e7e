"""A training step that crashes is retried by the asset's RetryPolicy and resumes from its checkpoint.

The crash is injected from outside, as a node failure would be: once the first checkpoint is
complete (COMPLETE.json), rank 1 is killed with SIGKILL. torchrun fails, no rank recorded an error of
its own (largetrain_core.launch.describe_failure), the asset raises a retryable Failure, Dagster
retries the step, and the new torchrun resumes from that checkpoint instead of step 0. A deterministic
error is not retried: tests/test_train_faults.py.
"""

import os
import signal
import threading
import time

from dagster import AssetKey, DagsterInstance

from largetrain_dagster.definitions import build_definitions, lineage_assets
from lineage import materialize_lineage
from test_pipeline import CORPORA, corpus, tiny_run_config
from test_webserver import _processes_mentioning


def test_crashed_training_retries_and_resumes_from_checkpoint(tmp_path):
    corpus("linux-doc")
    root = tmp_path / "root"
    defs = build_definitions(root=str(root), nproc_per_node=2, wandb_mode="disabled")
    assets = lineage_assets()  # not the landed chain (test_landing.py)
    ops = {k: v for k, v in tiny_run_config(CORPORA)["ops"].items() if k.startswith("pretrain__") or k == "tokenizer"}
    train = {**tiny_run_config(CORPORA)["ops"]["base_checkpoint"]["config"], "max_steps": 8, "save_steps": 2,
             "save_total_limit": 10, "logging_steps": 2}
    killed: list[int] = []

    def crash_rank_after_first_checkpoint():
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if list(root.glob("base_checkpoint/*/checkpoints/step-000002/COMPLETE.json")):
                ranks = [p for p, cmd in _processes_mentioning(str(root / "base_checkpoint")).items()
                         if "torch.distributed.run" not in cmd]
                if len(ranks) == 2:
                    victim = max(ranks)
                    os.kill(victim, signal.SIGKILL)
                    killed.append(victim)
                    return
            time.sleep(0.05)

    watcher = threading.Thread(target=crash_rank_after_first_checkpoint, daemon=True)
    watcher.start()
    with DagsterInstance.ephemeral() as instance:
        result = materialize_lineage(assets, defs.resources, instance, {"ops": {**ops, "base_checkpoint": {"config": train}}},
                                     [k.replace("__", "/") for k in ops] + ["pretrain/cleaned_text", "pretrain/deduplicated_text",
                                                                           "base_checkpoint"])
        watcher.join(timeout=5)
        assert killed, "the crash was not injected"
        assert result.success
        events = [e.dagster_event for e in instance.all_logs(result.run_id) if e.dagster_event and e.step_key == "base_checkpoint"]
        types = [e.event_type_value for e in events]
        assert types.count("STEP_UP_FOR_RETRY") == 1 and types.count("STEP_RESTARTED") == 1
        # the killed rank recorded nothing; what the other rank recorded, if anything, is a consequence
        (retry,) = [e for e in events if e.event_type_value == "STEP_UP_FOR_RETRY"]
        assert "without an error of its own in any rank: a process was killed or preempted" in retry.event_specific_data.error.to_string()
        md = instance.get_latest_materialization_event(AssetKey("base_checkpoint")).asset_materialization.metadata
        assert md["steps"].value == 8 and md["reused"].value is False
    log = next(root.glob("base_checkpoint/*/train.log")).read_text(errors="replace")
    resumed = [line for line in log.splitlines() if "resumed from" in line]
    assert resumed and "step-0000" in resumed[-1] and "at step 0 " not in resumed[-1], resumed
