"""The training plan in base_checkpoint, through Dagster (issue 22 item 1; the plan's formulas and the
command line: tests/integration/test_plan.py): a plan over the device memory refused before anything is launched,
naming the figure and the change that fits; the change followed; a plan over its max_cost refused after
the calibration (launched like the training) and before the training; then a plan within its budget
launched, with the plan beside what was measured in the asset's metadata."""

import json
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance

from largetrain_core.training.plan import GiB
from largetrain_dagster.definitions import build_definitions, lineage_assets
from helpers.corpora import CORPORA, tiny_run_config
from helpers.lineage import materialize_lineage, step_events, step_failure


def test_plan_refuses_before_launch_and_is_set_beside_the_measured_run(pretrain_root):
    root = pretrain_root
    defs = build_definitions(root=str(root), nproc_per_node=1, wandb_mode="disabled", report_to=[])
    assets = lineage_assets()
    ops = tiny_run_config(CORPORA)["ops"]
    train = ops["base_checkpoint"]["config"]

    def run(instance, **train_config):
        return materialize_lineage(
            assets,
            defs.resources,
            instance,
            {"ops": {"base_checkpoint": {"config": train_config}}},
            ["base_checkpoint"],
            raise_on_error=False,
        )

    def refused(instance, result) -> tuple[str, dict]:
        """The failure's description and metadata; failed once, not retried (the config must change first)."""
        assert not result.success
        description, metadata = step_failure(result)
        events = step_events(instance, result.run_id, "base_checkpoint")
        assert "STEP_UP_FOR_RETRY" not in events and events.count("STEP_FAILURE") == 1
        return description, metadata

    def out_dirs() -> list[Path]:
        return sorted(p.parent for p in (root / "base_checkpoint").glob("*/plan.json"))

    with DagsterInstance.ephemeral() as instance:
        # 1. a device of 1 KiB: nothing fits; the figure, the device memory and where it came from are named
        description, metadata = refused(instance, run(instance, **train, plan={"device_memory_gib": 2**-20}))
        assert "base_checkpoint: the training plan does not fit: memory: the planned peak per device is" in description
        assert "of device memory (plan.device_memory_gib)" in description
        assert (
            "None of these fits alone or together" in description and "Nothing was launched; not retried" in description
        )
        assert "| peak memory per device |" in metadata["plan"]
        (out,) = out_dirs()
        plan = json.loads((out / "plan.json").read_text())
        assert (out / "train_config.json").exists() and not (out / "train.log").exists()
        assert not (out / "torchelastic").exists()  # no process was started

        # 2. a device between the planned peak and the peak with half the micro-batch: that change is named
        change = "micro_batch_size: 2, gradient_accumulation_steps: 2"
        (smaller,) = [a["peak"] for a in plan["alternatives"] if a["change"] == change]
        peak = plan["memory"]["peak"]
        assert smaller < peak
        device_gib = (smaller + peak) / 2 / 0.9 / GiB
        description, _ = refused(instance, run(instance, **train, plan={"device_memory_gib": device_gib}))
        assert f"Changes that fit: {change}: peak {smaller / GiB:.2f} GiB" in description
        assert not (out / "train.log").exists()

        # 3. the change followed, with a price and a budget far too small: the calibration runs, the training does not
        followed = {**train, "schedule": {**train["schedule"], "micro_batch_size": 2, "gradient_accumulation_steps": 2}}
        budget = {"device_memory_gib": device_gib, "price_per_device_hour": 100.0, "max_cost": 1e-9}
        description, metadata = refused(instance, run(instance, **followed, plan=budget))
        assert (
            "the training plan does not fit: cost: planned" in description and "more than max_cost 1e-09" in description
        )
        assert "memory:" not in description  # the change fitted
        (out2,) = [p for p in out_dirs() if p != out]
        assert (out2 / "calibration" / "calibration.json").exists() and not (out2 / "train.log").exists()
        assert "| cost |" in metadata["plan"] and "calibration: median of 3 timed steps" in metadata["plan"]

        # 4. a budget it fits: calibrated, launched, and the plan beside what was measured
        result = run(instance, **followed, plan={**budget, "max_cost": 1000.0})
        assert result.success
        ev = instance.get_latest_materialization_event(AssetKey("base_checkpoint"))
        md = {k: getattr(v, "value", v) for k, v in ev.asset_materialization.metadata.items()}
        assert md["plan_throughput_source"] == "calibration" and 0 < md["plan_cost"] <= 1000
        planned = json.loads((out2 / "plan.json").read_text())
        assert md["plan_peak_memory_gib"] == pytest.approx(planned["memory"]["peak"] / GiB, rel=1e-3)
        assert md["plan_step_seconds"] > 0 and md["plan_run_hours"] > 0
        assert md["plan_trainable_parameters"] == md["trainable_parameters"]
        table = md["plan_vs_measured"]
        for row in (
            "| peak memory per device (GiB) |",
            "| peak memory per device, calibration (GiB) |",
            "| time per step (s) |",
            "| time for the run (s) |",
            "| tokens per second (tokens/s) |",
        ):
            line = next(line for line in table.splitlines() if line.startswith(row))
            planned, measured, ratio = [c.strip() for c in line.split("|")[2:5]]
            assert planned and measured and float(ratio) > 0, line
        logs = [e.user_message for e in instance.all_logs(result.run_id) if e.step_key == "base_checkpoint"]
        assert any(m.startswith("base_checkpoint: training plan (throughput: calibration:") for m in logs)
