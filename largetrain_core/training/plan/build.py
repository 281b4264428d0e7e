"""Making a plan: :func:`make_plan`, the alternatives it proposes, the blocking check, and the plan a launcher computes before it starts a training."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from largetrain_core.training.config import TrainConfig
from largetrain_core.training.plan.memory import (
    ModelShape,
    bytes_under,
    checkpoint_bytes,
    device_memory,
    free_disk,
    memory,
    model_shape,
    zero_settings,
)
from largetrain_core.training.plan.report import Plan
from largetrain_core.training.plan.settings import GiB, PLAN, PLAN_TABLE, PlanError, PlanSettings
from largetrain_core.training.plan.throughput import Throughput, from_calibration, from_report


def make_plan(
    cfg: TrainConfig,
    settings: PlanSettings,
    world_size: int,
    ranks_per_host: int,
    cuda: bool,
    storage_root: str | Path,
    throughput: Throughput | None = None,
    throughput_note: str = "",
    calibration: dict | None = None,
    workdir: str | Path | None = None,
) -> Plan:
    """The plan of ``cfg`` on ``world_size`` ranks (``ranks_per_host`` per host; ``cuda``: the ranks train on
    CUDA devices). Reads the shards' manifest and builds the model on the meta device (no weights read);
    ``calibration``: a calibration's result (device memory); ``workdir``: where the training's checkpoints
    are found, when ``cfg.output_dir`` is a URL (its local working copy). Raises ValueError for invalid settings."""
    from largetrain_core.training import checkpoints
    from largetrain_core.training.deepspeed_config import deepspeed_config, resolve_precision
    from largetrain_core.training.tasks import open_split

    problems = settings.problems()
    if problems:
        raise ValueError("invalid plan settings: " + "; ".join(problems))
    data = open_split(cfg, "train")
    man = data.manifest
    precision, _ = resolve_precision(cfg.precision.dtype, cuda)
    zero = zero_settings(deepspeed_config(cfg, world_size, precision))
    shape = model_shape(
        cfg, man["vocab_size"], data.seq_len, man["eos_id"], man.get("bos_id"), zero["param_persistence_threshold"]
    )
    out = Path(workdir or cfg.output_dir)
    start = 0
    if cfg.checkpointing.resume_from_checkpoint != "never":
        ckpt, _ = checkpoints.resume_point(cfg.checkpointing.resume_from_checkpoint, out / "checkpoints")
        start = int(ckpt.name.split("-")[1]) if ckpt else 0
    mem = memory(shape, cfg, world_size, precision, data.seq_len, zero)
    sizes = checkpoint_bytes(shape, cfg, precision)
    total = (cfg.checkpointing.save_total_limit + 1) * sizes["checkpoint"] + sizes["export"]
    existing = bytes_under(out / "checkpoints")
    disk = {
        **sizes,
        "total": total,
        "existing": existing,
        "needed": max(0, total - existing),
        "formula_total": f"(save_total_limit + 1) x checkpoint + export - already there = ({cfg.checkpointing.save_total_limit} + 1)"
        f" x {sizes['checkpoint'] / GiB:.3f} + {sizes['export'] / GiB:.3f} - {existing / GiB:.3f} GiB "
        "(a new checkpoint is complete before the oldest is deleted)",
    }
    dev, dev_source = (
        (settings.device_memory_gib * GiB, "plan.device_memory_gib")
        if settings.device_memory_gib
        else device_memory(cuda, ranks_per_host, calibration)
    )
    free, free_source = free_disk(storage_root)
    validation = len(open_split(cfg, "validation")) if cfg.evaluation.eval_strategy != "no" else 0
    config = {
        k: cfg.settings()[k]
        for k in (
            "mode",
            "preset",
            "zero_stage",
            "offload_optimizer",
            "activation_checkpointing",
            "micro_batch_size",
            "gradient_accumulation_steps",
            "max_steps",
            "save_steps",
            "save_total_limit",
            "eval_strategy",
            "eval_steps",
            "eval_max_sequences",
        )
    }
    config["validation_sequences"] = validation
    plan = Plan(
        settings,
        config,
        shape,
        world_size,
        precision,
        data.seq_len,
        cfg.schedule.micro_batch_size * cfg.schedule.gradient_accumulation_steps * world_size * data.seq_len,
        start,
        mem,
        disk,
        dev,
        dev_source,
        free,
        free_source,
        throughput,
        throughput_note,
    )
    usable = plan.usable_memory
    if usable is not None and mem["peak"] > usable:
        plan.alternatives = alternatives(cfg, shape, world_size, precision, data.seq_len, usable)
    return plan


def alternatives(
    cfg: TrainConfig, shape: ModelShape, world: int, precision: str, seq_len: int, usable: float
) -> list[dict]:
    """Memory-saving changes of ``cfg``, alone and then accumulated in this order, with their planned peak
    and whether it fits ``usable`` bytes: activation checkpointing, a higher ZeRO stage (with more than one
    rank), half the micro-batch with twice the gradient accumulation (the same tokens per step), optimizer
    offload (stage >= 1)."""
    from largetrain_core.training.deepspeed_config import deepspeed_config

    steps = []
    if not cfg.parallelism.activation_checkpointing:
        steps.append(("activation_checkpointing: true", {"activation_checkpointing": True}))
    if world > 1:
        for stage in range(cfg.parallelism.zero_stage + 1, 4):
            steps.append((f"zero_stage: {stage}", {"zero_stage": stage}))
    mb, ga = cfg.schedule.micro_batch_size, cfg.schedule.gradient_accumulation_steps
    while mb > 1:
        mb, ga = mb // 2, ga * 2
        steps.append(
            (
                f"micro_batch_size: {mb}, gradient_accumulation_steps: {ga}",
                {"micro_batch_size": mb, "gradient_accumulation_steps": ga},
            )
        )
    steps.append(("offload_optimizer: true", {"offload_optimizer": True}))
    out, together, names = [], {}, []

    def peak(changes):
        c = cfg.with_settings(**changes)
        if c.parallelism.offload_optimizer and c.parallelism.zero_stage == 0:
            return None
        return memory(shape, c, world, precision, seq_len, zero_settings(deepspeed_config(c, world, precision)))["peak"]

    for name, change in steps:
        alone = peak(change)
        if alone is not None:
            out.append({"change": name, "peak": alone, "fits": alone <= usable})
        together.update(change)
        names.append(name)
        both = peak(together)
        if len(names) > 1 and both is not None:
            out.append({"change": " + ".join(names), "peak": both, "fits": both <= usable})
            if both <= usable:
                break
    return out


def check(plan: Plan) -> None:
    """Raise PlanError listing every problem of ``plan`` (and what to change), unless ``plan.settings.check``
    is false or there is none."""
    problems = plan.problems()
    if problems and plan.settings.check:
        raise PlanError(
            "the training plan does not fit: " + " | ".join(problems) + " (plan.check: false launches anyway)"
        )


def plan_before_launch(
    cfg: TrainConfig,
    settings: PlanSettings,
    world_size: int,
    ranks_per_host: int,
    cuda: bool,
    storage_root: str | Path,
    *,
    report: dict | None = None,
    report_missing: str = "",
    device: str = "",
    calibrate=None,
    workdir: str | Path | None = None,
) -> Plan:
    """The plan of ``cfg`` (already checked by preflight) that a launcher computes before it starts the
    training, written to ``<cfg.output_dir>/plan.json`` (:meth:`Plan.to_dict`) and ``plan.md``
    (:meth:`Plan.table`), in the order that makes a plan that cannot fit cost nothing:

    1. the plan without a throughput (memory and disk need none), checked;
    2. the throughput: the optimization report's (``report``: its report.json, None when there is none,
       ``report_missing`` saying why) for the same model and hardware (``device``: ablation.device_name)
       when ``settings.throughput`` is optimization_report or auto; else a calibration when it is
       calibrate, or auto with a max_hours, max_cost or price_per_device_hour (``calibrate(scratch)``:
       runs calibrate.py as the training would run, into the directory ``scratch``, and returns its
       calibration.json as a dict);
    3. the plan with the throughput, written and checked again (time and cost).

    Raises PlanError (a ValueError) naming each figure that does not fit and what to change (not when
    ``settings.check`` is false), ValueError for invalid settings. Returns the last plan. ``workdir``: where
    plan.json, plan.md and the calibration go, when ``cfg.output_dir`` is a URL (its local working copy)."""
    out = Path(workdir or cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)

    def decide(plan: Plan, extra: list[str]) -> Plan:
        from largetrain_core.storage import write_json_atomic

        d = plan.to_dict()
        d["problems"] = d["problems"] + extra
        write_json_atomic(out / PLAN, d)
        (out / PLAN_TABLE).write_text(plan.table() + "\n")
        problems = plan.problems() + extra
        if problems and settings.check:
            raise PlanError(
                "the training plan does not fit: " + " | ".join(problems) + " (plan.check: false launches anyway)"
            )
        return plan

    first = replace(settings, max_hours=None, max_cost=None)
    plan = decide(make_plan(cfg, first, world_size, ranks_per_host, cuda, storage_root, workdir=out), [])
    throughput, note, calibration = None, "plan.throughput none", None
    if settings.throughput in ("auto", "optimization_report"):
        if report is None:
            note = f"no optimization report: {report_missing or 'none given'}"
        else:
            throughput, note = from_report(report, cfg, plan.shape, world_size, device, plan.precision, plan.seq_len)
    wants_time = any(v is not None for v in (settings.max_hours, settings.max_cost, settings.price_per_device_hour))
    if throughput is None and (settings.throughput == "calibrate" or (settings.throughput == "auto" and wants_time)):
        if calibrate is None:
            raise ValueError("plan.throughput asks for a calibration, but this launcher cannot run one")
        calibration = calibrate(out / "calibration")
        throughput = from_calibration(calibration)
    else:  # a calibration of an earlier start is not this plan's
        shutil.rmtree(out / "calibration", ignore_errors=True)
    if throughput is None and settings.throughput == "auto" and not wants_time:
        note += (
            "; no calibration: auto calibrates only for max_hours, max_cost or price_per_device_hour "
            "(plan.throughput: calibrate for a time estimate)"
        )
    plan = make_plan(cfg, settings, world_size, ranks_per_host, cuda, storage_root, throughput, note, calibration, out)
    return decide(plan, plan.budget_problems())
