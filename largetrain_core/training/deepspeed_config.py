"""The DeepSpeed JSON config of a :class:`TrainConfig`, and the precision it trains in."""

from __future__ import annotations

from largetrain_core.training.config import TrainConfig


def resolve_precision(precision: str, cuda: bool) -> tuple[str, str]:
    """(fp32|fp16|bf16, reason). ``auto`` is fp16 with dynamic loss scaling on CUDA (tensor cores, half
    the activation memory) and fp32 on CPU (DeepSpeed's CPU accelerator refuses fp16, and bf16
    matmul on AVX2-only CPUs is about 12x slower than fp32)."""
    if precision != "auto":
        return precision, f"precision {precision} set in config"
    if cuda:
        return "fp16", "auto on CUDA: fp16 with dynamic loss scaling"
    return (
        "fp32",
        "auto on CPU: fp32 (DeepSpeed's CPU accelerator does not support fp16; bf16 matmul is slow without AMX/AVX512-BF16)",
    )


def deepspeed_config(cfg: TrainConfig, world_size: int, precision: str, load_universal: bool = False) -> dict:
    """The DeepSpeed JSON config for ``cfg`` (keys as in DeepSpeed's config documentation): ZeRO stage
    and offload, AdamW (betas 0.9/0.95, eps 1e-8), WarmupCosineLR (linear warmup, cosine to
    ``min_lr_ratio``), gradient clipping, and fp16 (dynamic loss scaling) or bf16. ``load_universal``:
    the checkpoint to resume is in DeepSpeed's universal format (``checkpoint.load_universal``)."""
    zero: dict = {"stage": cfg.parallelism.zero_stage}
    if cfg.parallelism.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    if cfg.parallelism.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    ds = {
        "train_micro_batch_size_per_gpu": cfg.schedule.micro_batch_size,
        "gradient_accumulation_steps": cfg.schedule.gradient_accumulation_steps,
        "train_batch_size": cfg.schedule.micro_batch_size * cfg.schedule.gradient_accumulation_steps * world_size,
        "gradient_clipping": cfg.optimizer.max_grad_norm,
        "zero_optimization": zero,
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": cfg.optimizer.learning_rate,
                "betas": [0.9, 0.95],
                "eps": 1e-8,
                "weight_decay": cfg.optimizer.weight_decay,
            },
        },
        "scheduler": {
            "type": "WarmupCosineLR",
            "params": {
                "total_num_steps": cfg.schedule.max_steps,
                "warmup_num_steps": max(cfg.schedule.warmup_steps, 1),
                "warmup_type": "linear",
                "warmup_min_ratio": 0.0,
                "cos_min_ratio": cfg.schedule.min_lr_ratio,
            },
        },
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if load_universal:
        ds["checkpoint"] = {"load_universal": True}
    if precision == "fp16":
        # loss_scale 0 = dynamic; start at 2^16, halve on overflow, double after 1000 clean steps (DeepSpeed defaults).
        ds["fp16"] = {
            "enabled": True,
            "loss_scale": 0,
            "initial_scale_power": 16,
            "loss_scale_window": 1000,
            "hysteresis": 2,
            "min_loss_scale": 1,
        }
    elif precision == "bf16":
        ds["bf16"] = {"enabled": True}
    return ds
