"""The training plan (largetrain_core.training.plan) in the training assets: computed and shown before
the launch (plan.plan_before_launch: memory and disk first, then the throughput, then time and cost), a
refusal that fails the step before any training process starts and is not retried, and, after the run,
the plan beside what was measured in the asset's metadata. Only the wiring lives here: the
optimization report's handle, the calibration launched like the training, Dagster's Failure and
metadata."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dagster import AssetKey, Failure, MetadataValue

from largetrain_core.storage import local_files, read_json, write_json_atomic
from largetrain_core.training import calibrate
from largetrain_core.training.plan import (
    PLAN,
    PLAN_TABLE,
    PlanError,
    PlanSettings,
    plan_before_launch,
    plan_numbers,
    plan_vs_measured,
)


def latest_report(root) -> tuple[dict | None, str]:
    """(the latest optimization_report's report.json, or None and why there is none)."""
    from largetrain_dagster.resources import read_handle

    handle = read_handle(root, AssetKey("optimization_report"))
    if handle is None:
        return None, "optimization_report has not been materialized"
    return read_json(
        local_files(handle["path"], ["report.json"]) / "report.json", "optimization report (report.json)"
    ), ""


def plan_training(context, storage, launcher, cfg, settings: PlanSettings, key: str, out: Path) -> dict:
    """Plan the training ``cfg`` (checked by preflight; its output_dir set) on the launcher's ranks, log
    the plan's table, and return plan.json's dict; plan.json, plan.md and the calibration go to ``out``
    (the training's local directory: its working copy when output_dir is a URL). Raises ``Failure(allow_retries=False)`` naming the
    figure that does not fit and what to change (PlanError) or the invalid plan setting, with the plan
    table in its metadata: nothing has been launched."""
    import torch

    from largetrain_core.training.ablation import device_name

    report, missing = latest_report(storage.root)
    try:
        plan = plan_before_launch(
            cfg,
            settings,
            launcher.nproc_per_node * max(1, len(launcher.hosts)),
            launcher.nproc_per_node,
            torch.cuda.is_available(),
            storage.root,
            report=report,
            report_missing=missing,
            device=device_name(),
            calibrate=lambda scratch: run_calibration(context, launcher, cfg, settings, scratch),
            workdir=out,
        )
    except ValueError as e:
        table = Path(out) / PLAN_TABLE
        why = "it does not fit" if isinstance(e, PlanError) else "the plan settings are invalid"
        raise Failure(
            f"{key}: {e}. Nothing was launched; not retried ({why}: change the config).",
            allow_retries=False,
            metadata={"plan": MetadataValue.md(table.read_text() if table.exists() else "")},
        ) from e
    context.log.info(
        f"{key}: training plan ({'throughput: ' + plan.throughput.detail if plan.throughput else plan.throughput_note}):\n"
        + plan.table()
    )
    return plan.to_dict()


def run_calibration(context, launcher, cfg, settings: PlanSettings, scratch: Path) -> dict:
    """Launch the calibration of ``cfg`` (largetrain_core.training.calibrate) with the launcher, as the
    training is launched, into ``scratch`` (replaced), measuring one checkpoint too; returns
    calibration.json. A failed calibration fails the step as the training would (its Failure), saying
    that the training was not launched."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    steps = settings.calibration_steps
    spec = {
        "train": calibrate.calibration_config(cfg, scratch, steps + calibrate.PROFILED_STEPS).to_dict(),
        "steps": steps,
        "profiled_steps": calibrate.PROFILED_STEPS,
        "measure_checkpoint": True,
    }
    spec_path = scratch / "calibration_spec.json"
    write_json_atomic(spec_path, spec)
    context.log.info(
        f"calibrating: {calibrate.PROFILED_STEPS} profiled + {steps} timed steps of the real training "
        f"on {launcher.nproc_per_node} rank(s) per node"
    )
    try:
        launcher.run(context, spec_path, scratch / "calibration.log", module=calibrate.MODULE)
    except Failure as e:
        raise Failure(
            f"the calibration before the training failed, so the training was not launched: {e.description}",
            metadata=e.metadata,
            allow_retries=e.allow_retries,
        ) from e
    result = read_json(scratch / calibrate.CALIBRATION, "calibration result (calibration.json)")
    for d in ("checkpoints", "torchelastic"):
        shutil.rmtree(scratch / d, ignore_errors=True)
    return result


def plan_metadata(out: Path, summary: dict, rows: list[dict]) -> dict:
    """Metadata of a finished training: ``plan`` (the table shown before the launch), ``plan_vs_measured``
    (plan.plan_vs_measured, with the calibration's measured peak when one ran) and the planned numbers
    (plan.plan_numbers); {} for a training without plan.json (trained before plans)."""
    f = Path(out) / PLAN
    if not f.exists():
        return {}
    plan = json.loads(f.read_text())
    cal = Path(out) / "calibration" / calibrate.CALIBRATION
    compared = plan_vs_measured(plan, summary, rows, json.loads(cal.read_text()) if cal.exists() else None)
    table = Path(out) / PLAN_TABLE
    return {
        "plan": MetadataValue.md(table.read_text() if table.exists() else ""),
        "plan_vs_measured": MetadataValue.md(compared["table"]),
        **plan_numbers(plan),
    }
