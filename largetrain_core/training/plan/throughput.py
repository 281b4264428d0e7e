"""The measured throughput a plan's time and cost come from: a calibration (run here, or its calibration.json) or an optimization report's figures for the same model and hardware."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from largetrain_core.training.config import TrainConfig
from largetrain_core.training.plan.memory import ModelShape


@dataclass(frozen=True)
class Throughput:
    """Measured training throughput: tokens/s over every rank, and where it was measured."""

    tokens_per_s: float
    source: str  # "calibration" or "optimization_report"
    detail: str
    checkpoint_save_s: Optional[float] = None
    setup_s: Optional[float] = None


def from_calibration(result: dict) -> Throughput:
    """The throughput of a calibration's result (calibrate.run)."""
    return Throughput(
        result["tokens_per_s"],
        "calibration",
        f"calibration: median of {result['timed_steps']} timed steps, {result['step_time_s']:.3g} s per step "
        f"on {result['world_size']} rank(s) of {result['device']}",
        result.get("checkpoint_save_s"),
        result.get("setup_s"),
    )


def from_report(
    report: dict, cfg: TrainConfig, shape: ModelShape, world: int, device: str, precision: str, seq_len: int
) -> tuple[Throughput | None, str]:
    """(the throughput of the ``optimization_report`` variant that trains ``cfg``'s way on the same model and
    hardware, or None, why). Same: device name, ranks, sequence length, micro-batch, gradient accumulation,
    parameters and trainable parameters; and a variant whose settings (the baseline's, ZeRO 0, fp32, no
    activation checkpointing, full training, with its one change) are ``cfg``'s."""
    want = {
        "device": device,
        "world_size": world,
        "seq_len": seq_len,
        "micro_batch_size": cfg.schedule.micro_batch_size,
        "gradient_accumulation_steps": cfg.schedule.gradient_accumulation_steps,
    }
    differ = [f"{k} {report.get(k)!r} (this training: {v!r})" for k, v in want.items() if report.get(k) != v]
    if differ:
        return None, "the optimization report was measured otherwise: " + ", ".join(differ)
    mine = {
        "zero_stage": cfg.parallelism.zero_stage,
        "precision": precision,
        "activation_checkpointing": cfg.parallelism.activation_checkpointing,
        "mode": cfg.mode,
    }
    base = {"zero_stage": 0, "precision": "fp32", "activation_checkpointing": False, "mode": "pretrain"}
    for v in report.get("variants", []):
        if v.get("status") != "ran" or {**base, **v.get("changes", {}), "precision": v.get("precision")} != mine:
            continue
        if (v.get("parameters"), v.get("trainable_parameters")) != (shape.parameters, shape.trainable):
            return None, (
                f"the optimization report's {v['name']} variant trains {v.get('parameters'):,} parameters "
                f"({v.get('trainable_parameters'):,} trainable), this training {shape.parameters:,} "
                f"({shape.trainable:,})"
            )
        return Throughput(
            v["tokens_per_s"],
            "optimization_report",
            f"optimization_report variant {v['name']}: {v['tokens_per_s']:.0f} tokens/s, median of "
            f"{report.get('steps')} steps on {world} rank(s) of {device}",
        ), ""
    return None, (
        f"the optimization report has no variant that trains as this training does ({mine}); "
        "its variants change one setting of the baseline each"
    )


def calibrate_here(cfg: TrainConfig, ranks: int, scratch: Path, steps: int) -> dict:
    """Run the calibration of ``cfg`` under torchrun on this host with ``ranks`` ranks into ``scratch``
    (replaced; largetrain_core.training.calibrate.launch with a LocalTorchrun); return calibration.json.
    Raises RuntimeError with the log's tail when it fails."""
    from largetrain_core.launch import LocalTorchrun
    from largetrain_core.training import calibrate

    return calibrate.launch(LocalTorchrun(ranks, what="the calibration"), None, cfg, scratch, steps)
