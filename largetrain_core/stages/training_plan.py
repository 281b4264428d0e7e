"""The training plan in the training stages (largetrain_core.training.plan): computed and logged
before the launch (plan.plan_before_launch: memory and disk first, then the throughput, then time and
cost), a refusal that fails the stage before any training process starts and is not retried, and the
calibration it may need, launched like the training."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from largetrain_core.stages.base import Markdown, StageError, StageRun
from largetrain_core.training import calibrate
from largetrain_core.training.config import TrainConfig
from largetrain_core.training.plan import PLAN_TABLE, PlanError, PlanSettings, plan_before_launch

if TYPE_CHECKING:  # the stage that calls this module holds the Launch
    from largetrain_core.stages.training import Launch


def plan_training(
    run: StageRun,
    cfg: TrainConfig,
    settings: PlanSettings,
    out: Path,
    launch: Launch,
    ranks: tuple[int, int],
    report: tuple[dict | None, str],
) -> dict:
    """Plan the training ``cfg`` (checked by preflight; its output_dir set) on ``ranks`` (world size,
    ranks per node), log the plan's table, and return plan.json's dict; plan.json, plan.md and the
    calibration go to ``out`` (the training's local directory). ``report``: the latest optimization
    report (report.json) or None, and why there is none. ``launch`` (the stage's
    largetrain_core.stages.training.Launch) starts the calibration (:func:`run_calibration`) when the plan
    needs one.

    Raises StageError (not retried) naming the figure that does not fit and what to change (PlanError)
    or the invalid plan setting, with the plan table as metadata ``plan``: nothing has been launched."""
    import torch

    from largetrain_core.training.ablation import device_name

    key = run.key[0]
    try:
        plan = plan_before_launch(
            cfg,
            settings,
            ranks[0],
            ranks[1],
            torch.cuda.is_available(),
            run.root,
            report=report[0],
            report_missing=report[1],
            device=device_name(),
            calibrate=lambda scratch: run_calibration(run, launch, cfg, settings, scratch, ranks[1]),
            workdir=out,
        )
    except ValueError as e:
        table = Path(out) / PLAN_TABLE
        why = "it does not fit" if isinstance(e, PlanError) else "the plan settings are invalid"
        raise StageError(
            f"{key}: {e}. Nothing was launched; not retried ({why}: change the config).",
            metadata={"plan": Markdown(table.read_text() if table.exists() else "")},
        ) from e
    run.log.info(
        f"{key}: training plan ({'throughput: ' + plan.throughput.detail if plan.throughput else plan.throughput_note}):\n"
        + plan.table()
    )
    return plan.to_dict()


def run_calibration(
    run: StageRun, launch: Launch, cfg: TrainConfig, settings: PlanSettings, scratch: Path, ranks_per_node: int
) -> dict:
    """Launch the calibration of ``cfg`` (largetrain_core.training.calibrate.launch: its one spec) with the
    training's launcher, into ``scratch`` (replaced), measuring one checkpoint too; returns calibration.json. A
    failed calibration fails the stage as the training would (the launcher's failure, its message
    prefixed to say that the training was not launched)."""
    steps = settings.calibration_steps
    run.log.info(
        f"calibrating: {calibrate.PROFILED_STEPS} profiled + {steps} timed steps of the real training "
        f"on {ranks_per_node} rank(s) per node"
    )
    try:
        result = calibrate.launch(launch.launcher, launch.context, cfg, scratch, steps)
    except Exception as e:  # the launcher's failure: its description, metadata and retry flag are kept
        raise StageError(
            "the calibration before the training failed, so the training was not launched: "
            f"{getattr(e, 'description', None) or e}",
            retryable=getattr(e, "allow_retries", True) is not False,
            metadata=dict(getattr(e, "metadata", None) or {}),
        ) from e
    for d in ("checkpoints", "torchelastic"):
        shutil.rmtree(scratch / d, ignore_errors=True)
    return result
