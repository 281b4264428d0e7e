"""The optimization ablation: short training runs of chosen variants on the same model, token shards
and hardware, each measured against a baseline (plain data parallel), as a table and a chart.

A variant changes one setting of the baseline (ZeRO stage 0, fp32, no activation checkpointing,
every weight trained): each ZeRO stage, activation checkpointing, fp16 or bf16 mixed precision, or a
LoRA adapter on the frozen model. Every variant runs the real trainer
(:class:`~largetrain_core.training.trainer.Trainer`: DeepSpeed, the shards' sampler, the same seed and
so the same batches) for ``warmup_steps`` untimed steps then ``steps`` timed ones, one variant after
the other in the same ranks. Variants the hardware cannot run are skipped with the reason (fp16 on a
CPU; bf16 without hardware support; ZeRO with a single rank, where nothing is partitioned).

Measured per variant: tokens/s (from the median step time of the timed steps, every rank's tokens),
peak memory of the busiest rank (CUDA: the caching allocator's peak allocation; CPU: the process's
peak resident set, which includes the libraries' ~0.5 GiB, so ratios on CPU understate the
differences), MFU (``flops.model_flops_per_token``: LoRA counts no weight gradient for the frozen
weights) and the training loss after the last step (the same batches for every variant).

``torchrun --nproc_per_node N -m largetrain_core.training.ablation CONFIG.json`` runs an
:class:`AblationConfig`; rank 0 writes ``report.json``, ``report.md`` and ``optimization_report.png``
into ``output_dir``. :func:`run_ablation` launches that from Python (used by
benchmarks/train_ablation.py); the ``optimization_report`` Dagster asset launches it through its
launcher resource.
"""

from __future__ import annotations

import ctypes
import gc
import json
import logging
import os
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from largetrain_core.training.cpu import cpu_fields, cpu_flags
from largetrain_core.settings import described, from_dict
from largetrain_core.training.config import LoraSettings

log = logging.getLogger("largetrain.training.ablation")

MODULE = "largetrain_core.training.ablation"
REPORT, TABLE, CHART = "report.json", "report.md", "optimization_report.png"
BASELINE = "data_parallel"


@dataclass(frozen=True)
class Variant:
    name: str
    changes: dict  # the settings (TrainConfig.settings names) that differ from the baseline
    what: str


VARIANTS: tuple[Variant, ...] = (
    Variant(
        BASELINE,
        {},
        "baseline: plain data parallel (ZeRO stage 0: every rank holds all weights, gradients and "
        "optimizer state; gradients all-reduced), fp32, no activation checkpointing",
    ),
    Variant("zero1", {"zero_stage": 1}, "ZeRO stage 1: the optimizer state partitioned across ranks"),
    Variant("zero2", {"zero_stage": 2}, "ZeRO stage 2: optimizer state and gradients partitioned"),
    Variant(
        "zero3",
        {"zero_stage": 3},
        "ZeRO stage 3: optimizer state, gradients and weights partitioned, weights gathered layer by layer",
    ),
    Variant(
        "activation_checkpointing",
        {"activation_checkpointing": True},
        "each decoder block's activations recomputed in the backward pass instead of kept",
    ),
    Variant("fp16", {"precision": "fp16"}, "fp16 mixed precision with dynamic loss scaling"),
    Variant("bf16", {"precision": "bf16"}, "bf16 mixed precision"),
    Variant("lora", {"mode": "lora"}, "a LoRA adapter trained on the frozen model (r and lora_alpha from config)"),
)
VARIANT_NAMES = tuple(v.name for v in VARIANTS)


@dataclass
class AblationConfig:
    """One ablation: the model, the data, the variants and how long each runs."""

    output_dir: str = field(
        metadata=described("Directory of report.json, report.md, optimization_report.png and each variant's run.")
    )
    train_shards: str = field(
        metadata=described("Token-shard directory (largetrain_core.shards); its train split is read.")
    )
    preset: str = field(
        default="llama-20m",
        metadata=described(
            "Model preset (largetrain_core.model.PRESETS), as base_checkpoint's; LoRA adapts it freshly initialized."
        ),
    )
    variants: list[str] = field(
        default_factory=lambda: list(VARIANT_NAMES),
        metadata=described(
            f"Variants to run, among {', '.join(VARIANT_NAMES)}; the baseline ({BASELINE}) always runs."
        ),
    )
    steps: int = field(default=10, metadata=described("Timed optimizer steps per variant (after warmup_steps)."))
    warmup_steps: int = field(
        default=2,
        metadata=described(
            "Untimed optimizer steps first (kernel choice, allocator, caches); the loss is read after both."
        ),
    )
    micro_batch_size: int = field(default=8, metadata=described("Sequences per rank per forward pass."))
    gradient_accumulation_steps: int = field(default=1, metadata=described("Micro-batches per optimizer step."))
    learning_rate: float = field(default=1e-3, metadata=described("AdamW learning rate (reached after one step)."))
    seed: int = field(
        default=0,
        metadata=described("Seed of the initialization and the sampler: every variant sees the same batches."),
    )
    lora: LoraSettings = field(default_factory=LoraSettings, metadata=described("The lora variant's settings."))
    peak_flops: Optional[float] = field(
        default=None,
        metadata=described(
            "Peak FLOP/s of the whole job, for MFU; null = derive as the training does (largetrain_core.training.flops)."
        ),
    )

    @classmethod
    def from_dict(cls, d: dict) -> "AblationConfig":
        """Build from JSON-like ``d``; raises ValueError naming unknown keys."""
        return from_dict(cls, d, "ablation config")

    def to_dict(self) -> dict:
        return asdict(self)

    def validate(self) -> None:
        """Raise ValueError, saying what to change, for unknown variants or non-positive sizes."""
        p = []
        unknown = [v for v in self.variants if v not in VARIANT_NAMES]
        if unknown:
            p.append(f"unknown variants {unknown}; known: {list(VARIANT_NAMES)}")
        for name in ("steps", "micro_batch_size", "gradient_accumulation_steps"):
            if getattr(self, name) < 1:
                p.append(f"{name} must be >= 1, not {getattr(self, name)}")
        if self.warmup_steps < 0:
            p.append(f"warmup_steps must be >= 0, not {self.warmup_steps}")
        if p:
            raise ValueError("invalid ablation config: " + "; ".join(p))


def chosen(cfg: AblationConfig) -> list[Variant]:
    """The baseline, then the chosen variants in the order of :data:`VARIANTS`."""
    return [v for v in VARIANTS if v.name == BASELINE or v.name in cfg.variants]


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes bf16 matmuls natively (AVX512-BF16 or AMX-BF16 in /proc/cpuinfo's flags)."""
    flags = cpu_flags(cpuinfo)
    return "avx512_bf16" in flags or "amx_bf16" in flags


def why_skipped(variant: Variant, cuda: bool, world: int, bf16: bool) -> str | None:
    """Why ``variant`` cannot run on this hardware (``bf16``: the device computes bf16 natively), or None."""
    if variant.changes.get("zero_stage") and world == 1:
        return "one rank: ZeRO partitions across ranks, so with one there is nothing to partition (launch 2 or more)"
    precision = variant.changes.get("precision")
    if precision == "fp16" and not cuda:
        return "CPU: DeepSpeed's CPU accelerator does not support fp16"
    if precision == "bf16" and not bf16:
        return (
            "this GPU has no bf16 (compute capability < 8.0)"
            if cuda
            else "this CPU has neither AVX512-BF16 nor AMX-BF16: bf16 matmul would be emulated, slower than fp32"
        )
    return None


def train_config(cfg: AblationConfig, variant: Variant, lora_base: Path):
    """The TrainConfig of ``variant``: the baseline's settings with the variant's changes."""
    from largetrain_core.training.config import TrainConfig

    total = cfg.warmup_steps + cfg.steps
    base = dict(
        output_dir=str(Path(cfg.output_dir) / "runs" / variant.name),
        train_shards=cfg.train_shards,
        preset=cfg.preset,
        zero_stage=0,
        precision="fp32",
        activation_checkpointing=False,
        micro_batch_size=cfg.micro_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        max_steps=total,
        learning_rate=cfg.learning_rate,
        warmup_steps=1,
        seed=cfg.seed,
        save_steps=total,
        logging_steps=total,
        resume_from_checkpoint="never",
        eval_strategy="no",
        report_to=[],
        peak_flops=cfg.peak_flops,
        lora=LoraSettings(**asdict(cfg.lora)),
    )
    changes = dict(variant.changes)
    if changes.get("mode") == "lora":
        changes["base_model"] = str(lora_base)
    return TrainConfig.from_settings(**{**base, **changes})


def _release_memory(cuda: bool) -> None:
    """Free what the last variant left: Python garbage, glibc's free lists (malloc_trim), CUDA's cache."""
    import torch

    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def measure(cfg: AblationConfig, variant: Variant, lora_base: Path) -> dict:
    """Run ``variant`` on every rank; return its measurements (every rank gets the same dict)."""
    import torch
    import torch.distributed as dist

    from largetrain_core.training.trainer import Trainer, peak_memory_gib, reset_peak_memory

    tcfg = train_config(cfg, variant, lora_base)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    _release_memory(device.type == "cuda")
    reset_peak_memory(device)
    trainer = Trainer(tcfg)
    try:
        trainer.setup()
        rows = [trainer.train_step() for _ in range(tcfg.schedule.max_steps)]
        peak = torch.tensor([peak_memory_gib(device)], dtype=torch.float64, device=device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    finally:
        if hasattr(trainer, "engine"):  # release DeepSpeed's hooks and state before the next variant
            trainer.engine.destroy()
            del trainer.engine
    timed = rows[cfg.warmup_steps :]
    step_time = statistics.median(r["step_time_s"] for r in timed)
    from largetrain_core.training.flops import mfu

    tps = trainer.tokens_per_step / step_time
    return {
        "tokens_per_s": tps,
        "step_time_s": step_time,
        "peak_memory_gib": float(peak),
        "mfu": mfu(tps, trainer.flops_per_token, trainer.peak),
        "loss_after_steps": rows[-1]["loss"],
        "losses": [r["loss"] for r in rows],
        "parameters": trainer.n_params,
        "trainable_parameters": trainer.n_trainable,
        "flops_per_token": trainer.flops_per_token,
        "mfu_formula": trainer.mfu_formula,
        "precision": trainer.precision,
        "peak_flops": trainer.peak,
        "peak_flops_source": trainer.peak_source,
        "tokens_per_step": trainer.tokens_per_step,
        "seq_len": trainer.data.seq_len,
    }


def against_baseline(results: list[dict]) -> None:
    """Add ``vs_baseline`` to every measured result: ratios of tokens/s, peak memory and MFU to the
    baseline's, and the loss difference (nats)."""
    base = next((r for r in results if r["name"] == BASELINE and r["status"] == "ran"), None)
    for r in results:
        if base is None or r["status"] != "ran":
            continue
        ratio = lambda k, r=r: r[k] / base[k] if r.get(k) is not None and base.get(k) else None  # noqa: E731
        r["vs_baseline"] = {
            "tokens_per_s": ratio("tokens_per_s"),
            "peak_memory": ratio("peak_memory_gib"),
            "mfu": ratio("mfu"),
            "loss_delta": r["loss_after_steps"] - base["loss_after_steps"],
        }


def table_markdown(report: dict) -> str:
    """The report as a markdown table (one row per variant, skipped and failed ones with the reason)."""
    n = report["warmup_steps"] + report["steps"]

    def x(v):
        return "" if v is None else f"{v:.2f}x"

    lines = [
        f"| variant | tokens/s | vs baseline | peak memory (GiB) | vs baseline | MFU (%) | loss after {n} steps "
        "(nats) | vs baseline | trainable parameters |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["variants"]:
        if r["status"] != "ran":
            lines.append(f"| {r['name']} | {r['status']}: {r['reason']} | | | | | | | |")
            continue
        vs = r.get("vs_baseline", {})
        mfu = "" if r["mfu"] is None else f"{100 * r['mfu']:.1f}"
        delta = "" if vs.get("loss_delta") is None else f"{vs['loss_delta']:+.3f}"
        lines.append(
            f"| {r['name']} | {r['tokens_per_s']:.0f} | {x(vs.get('tokens_per_s'))} | {r['peak_memory_gib']:.3f} | "
            f"{x(vs.get('peak_memory'))} | {mfu} | {r['loss_after_steps']:.3f} | {delta} | "
            f"{r['trainable_parameters']:,} |"
        )
    return "\n".join(lines)


def chart(report: dict, out: Path) -> Path:
    """Bar chart of tokens/s, peak memory, MFU and loss of every variant that ran, against the baseline."""
    from largetrain_core.training.plots import bars_png

    ran = [r for r in report["variants"] if r["status"] == "ran"]
    n = report["warmup_steps"] + report["steps"]
    panels = [
        ("tokens/s (all ranks)", {r["name"]: r["tokens_per_s"] for r in ran}, "ratio"),
        ("peak memory (GiB, busiest rank)", {r["name"]: r["peak_memory_gib"] for r in ran}, "ratio"),
        ("MFU (%)", {r["name"]: None if r["mfu"] is None else 100 * r["mfu"] for r in ran}, "ratio"),
        (f"training loss after {n} steps (nats)", {r["name"]: r["loss_after_steps"] for r in ran}, "difference"),
    ]
    title = (
        f"{report['preset']} on {report['device']}, {report['world_size']} rank(s), "
        f"{report['tokens_per_step']:,} tokens/step"
        if ran
        else "no variant ran"
    )
    return bars_png(panels, BASELINE, out, title)


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    model = cpu_fields().get("model name", "unknown CPU")
    return f"CPU ({model}, {len(os.sched_getaffinity(0))} cores)"


def run(cfg: AblationConfig) -> dict | None:
    """Every rank: run the baseline and the chosen variants (skipping those the hardware cannot run);
    rank 0 writes the report files and returns the report (other ranks return None)."""
    import torch
    import torch.distributed as dist

    from largetrain_core.model import build_model
    from largetrain_core.training import distributed
    from largetrain_core.shards import TokenShards
    from largetrain_core.storage import write_json_atomic

    cfg.validate()
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    cuda = torch.cuda.is_available()
    rank, world, _ = distributed.setup()
    out = Path(cfg.output_dir)
    lora_base = out / "lora_base"
    variants = chosen(cfg)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        if any(v.changes.get("mode") == "lora" for v in variants):  # the preset, freshly initialized, to adapt
            m = TokenShards(cfg.train_shards, "train").manifest
            build_model(
                cfg.preset, m["vocab_size"], m["seq_len"], m["eos_id"], m.get("bos_id"), seed=cfg.seed
            ).save_pretrained(lora_base)
    dist.barrier()
    bf16 = torch.cuda.is_bf16_supported() if cuda else cpu_has_bf16()
    results = []
    for i, v in enumerate(variants, 1):
        result = {"name": v.name, "what": v.what, "changes": v.changes}
        tag = f"variant {i}/{len(variants)} {v.name}"  # the run log's progress through the ablation
        reason = why_skipped(v, cuda, world, bf16)
        if reason:
            result.update(status="skipped", reason=reason)
            if rank == 0:
                log.info(f"{tag}: skipped: {reason}")
        else:
            if rank == 0:
                log.info(f"{tag}: {v.what}: {cfg.warmup_steps} + {cfg.steps} steps")
            try:
                result.update(status="ran", reason=None, **measure(cfg, v, lora_base))
            except Exception as e:  # one variant failing (e.g. out of memory) does not lose the others
                result.update(status="failed", reason=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            if rank == 0:
                log.info(
                    f"{tag}: "
                    + (
                        f"{result['tokens_per_s']:.0f} tokens/s, peak {result['peak_memory_gib']:.3f} GiB, "
                        f"loss {result['loss_after_steps']:.4f}"
                        if result["status"] == "ran"
                        else f"failed: {result['reason']}"
                    )
                )
        results.append(result)
    against_baseline(results)
    if rank != 0:
        return None
    for scratch in (out / "runs", lora_base):  # the variants' empty checkpoint directories, the LoRA base's weights
        shutil.rmtree(scratch, ignore_errors=True)
    ran = [r for r in results if r["status"] == "ran"]
    first = ran[0] if ran else {}
    report = {
        "preset": cfg.preset,
        "device": device_name(),
        "world_size": world,
        "threads_per_rank": torch.get_num_threads(),
        "seq_len": first.get("seq_len"),
        "tokens_per_step": first.get("tokens_per_step", 0),
        "steps": cfg.steps,
        "warmup_steps": cfg.warmup_steps,
        "micro_batch_size": cfg.micro_batch_size,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "baseline": BASELINE,
        "peak_flops": first.get("peak_flops"),
        "peak_flops_source": first.get("peak_flops_source"),
        "variants": results,
        "config": cfg.to_dict(),
        "machine": {
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "wall_s": time.perf_counter() - t0,
            "cpu_count": os.cpu_count(),
        },
    }
    report["table"] = table_markdown(report)
    (out / TABLE).write_text(report["table"] + "\n")
    report["chart"] = chart(report, out / CHART).name
    write_json_atomic(out / REPORT, report)
    log.info("\n" + report["table"])
    return report


def run_ablation(
    cfg: AblationConfig, nproc_per_node: int, log_path: Path | None = None, threads_per_rank: int | None = None
) -> dict:
    """Launch :func:`run` under torchrun on this host with ``nproc_per_node`` ranks (``threads_per_rank``:
    OMP_NUM_THREADS, default cores / ranks) through largetrain_core.launch.LocalTorchrun (a process group
    of its own: an interrupt stops every rank), wait, and return the report. Raises RuntimeError with the
    log's tail when the processes fail."""
    from largetrain_core.launch import LocalTorchrun

    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / "ablation_config.json"
    cfg_path.write_text(json.dumps(cfg.to_dict(), indent=1))
    threads = threads_per_rank or max(1, len(os.sched_getaffinity(0)) // nproc_per_node)
    launcher = LocalTorchrun(nproc_per_node, threads, what="the ablation")
    launcher.run(None, cfg_path, Path(log_path or out / "ablation.log"), module=MODULE)
    return json.loads((out / REPORT).read_text())


def main(argv: list[str] | None = None) -> int:
    """``torchrun ... -m largetrain_core.training.ablation CONFIG.json``: exit status 0 after the report."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(f"usage: torchrun --nproc_per_node N -m {MODULE} CONFIG.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from largetrain_core.rank_signals import finish_rank
    from largetrain_core.training.trackers import DagsterPipesTracker

    cfg = AblationConfig.from_dict(json.loads(Path(argv[0]).read_text()))
    sys.modules.setdefault("mlflow", None)  # the variants track nothing: training.__main__.skip_mlflow_unless_used
    pipes = (
        DagsterPipesTracker()
        if os.environ.get("RANK", "0") == "0" and os.environ.get("DAGSTER_PIPES_CONTEXT")
        else None
    )
    if pipes:
        pipes.start(None, None)  # the log lines go to the Dagster run
    try:
        report = run(cfg)
    except BaseException:
        if pipes:
            pipes.finish(None)
        raise
    if pipes:
        base = next((r for r in report["variants"] if r["name"] == BASELINE), {})
        pipes.finish(
            {
                "variants_ran": sum(r["status"] == "ran" for r in report["variants"]),
                "baseline_tokens_per_s": base.get("tokens_per_s"),
            }
        )
    finish_rank()


if __name__ == "__main__":
    sys.exit(main())
