"""The training plan: what a training will need and take, computed before anything is launched, and
the blocking check that refuses a training that cannot fit.

:func:`make_plan` gives, for a :class:`~largetrain_core.training.config.TrainConfig` on ``world_size``
ranks: parameters (all, trainable), tokens per step, memory per device (model states, DeepSpeed's
buffers, activations, the peak), the checkpoint size on disk, time per step and for the run from a
measured throughput (:class:`Throughput`: a calibration, :mod:`largetrain_core.training.calibrate`, or
the ``optimization_report``'s figures for the same model and hardware), tokens per parameter, and the
cost from a price per device-hour. :meth:`Plan.problems` says what does not fit (device memory, the
storage root's disk, ``max_hours``, ``max_cost``) and what to change; :func:`check` raises
:class:`PlanError` with it. :func:`plan_vs_measured` sets the plan beside what a finished run measured.

Memory per device, in bytes (Ψ parameters, Ψ_t of them trained, N_d data-parallel ranks; w bytes per
weight and g per gradient in the training dtype: 4 in fp32, 2 in fp16/bf16):

* Model states, Rajbhandari et al. 2020 (ZeRO), section 3 and Figure 1: mixed-precision Adam keeps
  wΨ weights, gΨ_t gradients and KΨ_t optimizer state, K = 12 (fp32 weights, momentum, variance).
  DeepSpeed keeps that fp32 copy also when training in fp32 (the ZeRO optimizers step on an fp32
  partition of their own), so K = 12 for every stage >= 1; without ZeRO in fp32 the optimizer steps
  the weights themselves, K = 8. Stage 1 divides the optimizer state by N_d, stage 2 also the
  gradients, stage 3 also the weights, except the parameters DeepSpeed keeps whole on every rank
  (fewer elements than ``stage3_param_persistence_threshold``, default 10^5).
* DeepSpeed's buffers (its ZeRO config defaults, deepspeed.runtime.zero.config): the gradient
  reduction bucket of ``reduce_bucket_size`` elements (5 x 10^8) in the training dtype, allocated
  during each backward pass under stages 1-2 (two with ``overlap_comm``) and kept under stage 3; under
  stage 3 also the gathered weights of the partitioned parameters in use (at most the largest module
  plus ``stage3_prefetch_bucket_size``).
* Activations per micro-batch of b sequences of s tokens (T = b·s), d bytes per activation (the
  training dtype), h hidden size, h_kv the key/value width, i the MLP width, a heads, L layers, V the
  vocabulary: every tensor autograd saves for the backward pass, counted as Korthikanti et al. 2022
  ("Reducing Activation Recomputation in Large Transformer Models"), section 4.1, count them for GPT,
  here for transformers' Llama decoder block with memory-efficient attention (SDPA: no a·s² term),
  per token and layer ``2(4 + d)h + d(4h + 2h_kv) + 4di + 4a + 8`` (the two RMSNorms keep their fp32
  input and normalized output; attention its normed input, rotated q and k, v, output and o_proj
  input; the SwiGLU MLP gate, SiLU(gate), up and their product; the attention's fp32 log-sum-exp and
  the norms' fp32 reciprocal RMS). The coefficients were counted with
  ``torch.autograd.graph.saved_tensors_hooks`` on transformers 5's LlamaDecoderLayer in fp32 and bf16.
  The output head keeps ``(4 + 2d)h + 4V`` per token (the final norm, the head's input and the fp32
  log-softmax of the logits: the logits themselves are saved by no backward function and are freed once
  training/loss.py returns the loss), and the loss's backward pass adds ``8V`` (the fp32 gradients
  of the log-softmax and of its input). With activation checkpointing each block keeps only its input
  (d·h per token) and the backward pass recomputes one block at a time: the peak is then during the
  backward pass of the last block, with its recomputed activations, its own gradients in flight
  (d(3i + 2h) per token) and the output head's weight gradient.
* Peak per device = weights + optimizer state + what the backward pass adds, which depends on the
  stage (DeepSpeed 0.19's order of allocations, measured here): stage 0, max(activation peak, 2 x
  gradients: the all-reduce flattens them into one buffer at the end of the backward pass); stages
  1-2, max(activation peak, reduce bucket + the activations left once the output head's backward is
  done, when the first gradient fills the bucket); stage 3, gradient partition + reduce bucket +
  gathered weights + activation peak + the gathered weights' full gradients (made before their
  reduce-scatter).

A LoRA adapter adds its A output (d·r per token per adapted module) to the activations; its base
weights are frozen (no gradient, no optimizer state). In mode lora the trainer's activation
checkpointing was measured to save nothing under DeepSpeed (the same peak as without it, on CPU), so
the plan counts the activations without it there. Other model types than Llama are estimated with
the same count (stated in the plan). Tested (tests/integration/test_plan.py) against the calibration's measured
memory on CPU for several presets and stages: within 10 % of the peak (the reduce bucket aside).
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal, Optional

from largetrain_core.settings import described
from largetrain_core.training.config import TrainConfig

GiB = 2**30
THROUGHPUT_SOURCES = ("auto", "calibrate", "optimization_report", "none")
PLAN, PLAN_TABLE = "plan.json", "plan.md"  # written into the training's output directory before its launch


@dataclass
class PlanSettings:
    """What the training plan checks against, and where its throughput comes from."""

    check: bool = field(
        default=True,
        metadata=described(
            "Refuse to launch a training whose plan does not fit the device memory, the storage root's free disk, "
            "max_hours or max_cost (the failure says what to change); false = compute and show the plan only."
        ),
    )
    device_memory_gib: Optional[float] = field(
        default=None,
        metadata=described(
            "Memory of one device (GiB). null = detected: CUDA, the calibration's device (or nvidia-smi); CPU, this "
            "host's MemAvailable divided by the ranks on the host."
        ),
    )
    usable_memory_fraction: float = field(
        default=0.9,
        metadata=described(
            "Share of device_memory_gib the planned peak may use, in (0, 1]: headroom for what tensor allocations do "
            "not count (the CUDA context, allocator fragmentation; on CPU the interpreter and libraries, ~0.5 GiB per "
            "rank). An assumption: set it from your own peak reserved / peak allocated."
        ),
    )
    throughput: Literal["auto", "calibrate", "optimization_report", "none"] = field(
        default="auto",
        metadata=described(
            f"Where tokens/s come from, one of {', '.join(THROUGHPUT_SOURCES)}: calibrate (a short run of the real "
            "training on the real ranks before the launch: calibration_steps timed steps), optimization_report (its "
            "figures for the same model, hardware, ranks and settings), auto (the report when it matches, else a "
            "calibration when max_hours, max_cost or price_per_device_hour asks for a time, else no time estimate), "
            "none (no time or cost estimate)."
        ),
    )
    calibration_steps: int = field(
        default=3,
        metadata=described(
            "Timed optimizer steps of the calibration (after 2 profiled ones that measure memory), >= 1."
        ),
    )
    price_per_device_hour: Optional[float] = field(
        default=None,
        metadata=described(
            "Price of one device (GPU; on CPU one rank) for one hour, in `currency`; null = no cost estimate."
        ),
    )
    currency: str = field(default="USD", metadata=described("Currency of price_per_device_hour and max_cost."))
    max_hours: Optional[float] = field(
        default=None,
        metadata=described(
            "Refuse a training planned to take longer than this many hours (wall clock); null = no limit."
        ),
    )
    max_cost: Optional[float] = field(
        default=None,
        metadata=described(
            "Refuse a training planned to cost more than this (needs price_per_device_hour); null = no limit."
        ),
    )

    def problems(self) -> list[str]:
        p = []
        if self.throughput not in THROUGHPUT_SOURCES:
            p.append(f"plan.throughput must be one of {', '.join(THROUGHPUT_SOURCES)}, not {self.throughput!r}")
        if not 0 < self.usable_memory_fraction <= 1:
            p.append(f"plan.usable_memory_fraction must be within (0, 1], not {self.usable_memory_fraction}")
        if self.calibration_steps < 1:
            p.append(f"plan.calibration_steps must be >= 1, not {self.calibration_steps}")
        for name in ("device_memory_gib", "price_per_device_hour", "max_hours", "max_cost"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                p.append(f"plan.{name} must be > 0 or null, not {v}")
        if self.max_cost is not None and self.price_per_device_hour is None:
            p.append("plan.max_cost needs plan.price_per_device_hour (the cost is hours x devices x price)")
        if (self.max_hours is not None or self.max_cost is not None) and self.throughput == "none":
            p.append("plan.max_hours and plan.max_cost need a throughput: set plan.throughput to auto or calibrate")
        return p


class PlanError(ValueError):
    """A training whose plan does not fit; the message says what and what to change."""


# ----------------------------------------------------------------------------------------------
# the model's shape


@dataclass(frozen=True)
class ModelShape:
    """What the formulas need of a model: parameter counts (tied weights once) and block sizes."""

    parameters: int
    trainable: int
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_width: int  # key/value projection width: num_key_value_heads x head_dim
    vocab: int
    model_type: str
    lora_modules_per_layer: int = 0
    lora_r: int = 0
    # ZeRO-3: parameters below the persistence threshold stay whole; the largest module's partitioned parameters
    persistent_parameters: int = 0
    largest_partitioned_module: int = 0


def model_shape(
    cfg: TrainConfig, vocab_size: int, seq_len: int, eos_id: int, bos_id: int | None, persistence_threshold: int
) -> ModelShape:
    """The shape of the model ``cfg`` trains (the preset, or the base model with its LoRA adapter), built
    on torch's meta device: no weight is read or allocated. ``persistence_threshold``: ZeRO-3's
    ``stage3_param_persistence_threshold`` (elements)."""
    import torch
    from transformers import AutoModelForCausalLM

    if cfg.mode == "pretrain":
        from largetrain_core.model import build_config

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(
                build_config(cfg.model.preset, vocab_size, seq_len, eos_id, bos_id)
            )
    else:
        from largetrain_core.training.lora import meta_model

        from largetrain_core.storage import local_copy

        model = meta_model(local_copy(cfg.model.base_model))  # a base model at a URL: its verified working copy
    mc = model.config
    lora_modules = 0
    if cfg.mode == "lora":
        from largetrain_core.training.lora import add_lora

        model, targets = add_lora(model, cfg.lora, False)
        lora_modules = sum(1 for name, _ in model.named_modules() if name.endswith("lora_A"))
    params = {id(p): p for p in model.parameters()}.values()
    n = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    persistent = sum(p.numel() for p in params if p.numel() < persistence_threshold)
    largest = max(
        (
            sum(p.numel() for p in m.parameters(recurse=False) if p.numel() >= persistence_threshold)
            for m in model.modules()
        ),
        default=0,
    )
    heads = mc.num_attention_heads
    head_dim = getattr(mc, "head_dim", None) or mc.hidden_size // heads
    layers = mc.num_hidden_layers
    return ModelShape(
        parameters=n,
        trainable=trainable,
        layers=layers,
        hidden=mc.hidden_size,
        intermediate=getattr(mc, "intermediate_size", 4 * mc.hidden_size),
        heads=heads,
        kv_width=getattr(mc, "num_key_value_heads", heads) * head_dim,
        vocab=mc.vocab_size,
        model_type=mc.model_type,
        lora_modules_per_layer=lora_modules // max(layers, 1),
        lora_r=cfg.lora.r if cfg.mode == "lora" else 0,
        persistent_parameters=persistent,
        largest_partitioned_module=largest,
    )


# ----------------------------------------------------------------------------------------------
# memory


def zero_settings(ds_config: dict) -> dict:
    """The ZeRO settings DeepSpeed resolves for ``ds_config`` (its ``zero_optimization``; defaults from
    DeepSpeed's own config class): stage, reduce_bucket_size, overlap_comm, param_persistence_threshold,
    prefetch_bucket_size, offload_optimizer."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    z = DeepSpeedZeroConfig(**ds_config.get("zero_optimization", {}))
    return {
        "stage": int(z.stage),
        "reduce_bucket_size": int(z.reduce_bucket_size),
        "overlap_comm": bool(z.overlap_comm),
        "param_persistence_threshold": int(z.param_persistence_threshold),
        "prefetch_bucket_size": int(z.prefetch_bucket_size),
        "offload_optimizer": z.offload_optimizer is not None and str(z.offload_optimizer.device) != "none",
    }


def memory(shape: ModelShape, cfg: TrainConfig, world: int, precision: str, seq_len: int, zero: dict) -> dict:
    """Bytes per device (see the module docstring): ``weights``, ``gradients``, ``optimizer_states``,
    ``model_states`` (their sum, Rajbhandari et al.), ``buffers``, ``activations`` (the activation
    peak), ``peak``, ``persistent`` (what stays allocated between steps: weights, optimizer state,
    stage 3's gradient partition and reduce bucket), ``host_optimizer_states`` (offloaded to host
    memory), and ``formulas`` (each line's formula with its numbers)."""
    n, nt, nd, stage = shape.parameters, shape.trainable, world, cfg.parallelism.zero_stage
    w = 4 if precision == "fp32" else 2
    g, d = w, w
    k = 12 if (stage >= 1 or precision != "fp32") else 8
    f = {}
    if stage == 3:
        persist = min(shape.persistent_parameters, n)
        weights = w * (persist + n / nd)
        f["weights"] = f"w(Ψ_persistent + Ψ/N_d) = {w} x ({persist:,} + {n:,}/{nd})"
    else:
        weights = w * n
        f["weights"] = f"wΨ = {w} x {n:,}"
    grads = g * nt / nd if stage >= 2 else g * nt
    f["gradients"] = f"gΨ_t{'/N_d' if stage >= 2 else ''} = {g} x {nt:,}{f'/{nd}' if stage >= 2 else ''}"
    opt = k * nt / nd if stage >= 1 else k * nt
    f["optimizer_states"] = f"KΨ_t{'/N_d' if stage >= 1 else ''} = {k} x {nt:,}{f'/{nd}' if stage >= 1 else ''}"
    host_opt = 0.0
    if cfg.parallelism.offload_optimizer and stage >= 1:
        host_opt, opt = opt, 0.0
        f["optimizer_states"] = f"offloaded to host memory (ZeRO-Offload): {f['optimizer_states']} there"
    buffers, kept_grads, gathered = 0.0, 0.0, 0
    if stage in (1, 2):
        buffers = zero["reduce_bucket_size"] * w * (2 if zero["overlap_comm"] else 1)
        f["buffers"] = (
            f"reduce bucket: reduce_bucket_size x w{' x 2 (overlap_comm)' if zero['overlap_comm'] else ''}"
            f" = {zero['reduce_bucket_size']:,} x {w}"
        )
    elif stage == 3:
        gathered = min(n - shape.persistent_parameters, shape.largest_partitioned_module + zero["prefetch_bucket_size"])
        buffers = zero["reduce_bucket_size"] * w + w * max(gathered, 0)
        kept_grads = grads
        f["buffers"] = (
            f"reduce bucket reduce_bucket_size x w + gathered weights w x min(partitioned, largest module + "
            f"prefetch bucket) = {zero['reduce_bucket_size']:,} x {w} + {w} x {max(gathered, 0):,}"
        )
    # Measured here (tests/integration/test_plan.py): in mode lora the trainer's activation checkpointing saves no
    # memory under DeepSpeed (the same peak as without it), so the plan does not count on it there.
    checkpointing = cfg.parallelism.activation_checkpointing and cfg.mode != "lora"
    act = activations(shape, cfg.schedule.micro_batch_size, seq_len, d, checkpointing, g)
    f["activations"] = act["formula"]
    if stage in (1, 2):  # the bucket is allocated at the first gradient, once the output head's backward is done
        peak = weights + opt + max(act["peak"], buffers + act["after_head"], buffers + grads)
        f["peak"] = (
            "weights + optimizer states + max(activations, buffers + activations left after the output "
            "head's backward, buffers + gradients)"
        )
    elif stage == 0:  # the gradients' all-reduce flattens them into one buffer at the end of the backward pass
        peak = weights + opt + max(act["peak"], 2 * grads)
        f["peak"] = "weights + optimizer states + max(activations, 2 x gradients (and their flattened all-reduce copy))"
    else:  # each gathered weight's full gradient exists before its reduce-scatter into the partition
        peak = weights + opt + kept_grads + buffers + act["peak"] + g * max(gathered, 0)
        f["peak"] = (
            "weights + optimizer states + gradient partition + buffers + activations + the gathered weights' gradients"
        )
    persistent = weights + opt + kept_grads + (zero["reduce_bucket_size"] * w if stage == 3 else 0)
    return {
        "weights": weights,
        "gradients": grads,
        "optimizer_states": opt,
        "model_states": weights + grads + opt,
        "host_optimizer_states": host_opt,
        "buffers": buffers,
        "persistent": persistent,
        "activations": act["peak"],
        "activations_stored": act["stored"],
        "peak": peak,
        "bytes_per_weight": w,
        "optimizer_k": k,
        "formulas": f,
    }


def activations(shape: ModelShape, micro_batch: int, seq_len: int, d: int, checkpointing: bool, g: int) -> dict:
    """Activation bytes per device for one micro-batch (module docstring): ``stored`` (kept from the
    forward pass for the backward pass), ``peak`` (the most live during the backward pass),
    ``after_head`` (what is left once the output head's backward pass is done, when the first weight
    gradient is ready: the log-softmax output and the loss's gradients are freed), ``formula``."""
    t = micro_batch * seq_len
    h, hkv, i, a, v, layers = shape.hidden, shape.kv_width, shape.intermediate, shape.heads, shape.vocab, shape.layers
    layer = (
        2 * (4 + d) * h
        + d * (4 * h + 2 * hkv)
        + 4 * d * i
        + 4 * a
        + 8
        + d * shape.lora_r * shape.lora_modules_per_layer
    )
    head = (4 + 2 * d) * h + 4 * v
    loss = 8 * v
    if not checkpointing:
        stored = t * (layers * layer + head)
        peak = stored + t * loss
        after_head = t * (layers * layer + head - 4 * v + d * h)
        formula = (
            f"T(L x layer + head + loss) = {t:,} x ({layers} x {layer:,} + {head:,} + {loss:,}) bytes "
            f"(T = b·s tokens; per token: layer 2(4+d)h + d(4h+2h_kv) + 4di + 4a + 8"
            f"{' + d·r·modules' if shape.lora_r else ''}, head (4+2d)h + 4V, loss 8V; d = {d})"
        )
    else:
        stored = t * (layers * d * h + head)
        head_grad = g * v * h if shape.trainable == shape.parameters else 0
        last_block = t * (layers * d * h + head - 4 * v + layer + d * (3 * i + 2 * h)) + head_grad
        peak = max(stored + t * loss, last_block)
        after_head = last_block - head_grad
        formula = (
            f"max(T(L·d·h + head + loss), T(L·d·h + head - 4V + layer + d(3i+2h)) + gVh) = max({t:,} x "
            f"({layers * d * h:,} + {head:,} + {loss:,}), {t:,} x ({layers * d * h:,} + {head - 4 * v:,} + "
            f"{layer:,} + {d * (3 * i + 2 * h):,}) + {head_grad:,}) bytes (activation checkpointing; d = {d})"
        )
    return {"stored": stored, "peak": peak, "after_head": after_head, "formula": formula}


def checkpoint_bytes(shape: ModelShape, cfg: TrainConfig, precision: str) -> dict:
    """Bytes on disk of one checkpoint (all ranks' files) and of the exported model. DeepSpeed saves the
    module's weights in the training dtype (wΨ; none under stage 3, whose weights are in the optimizer's
    fp32 partitions) and the optimizer state of the trained parameters: 12Ψ_t under ZeRO (fp32 weights,
    momentum, variance) or mixed precision, 8Ψ_t without ZeRO in fp32 (Rajbhandari et al.'s K; the
    docs/guides/running-at-scale.md). Gradients are not saved. Export: the model (pretrain) in the training
    dtype, or the adapter (wΨ_t; merged/ adds the base in fp32)."""
    n, nt = shape.parameters, shape.trainable
    w = 4 if precision == "fp32" else 2
    k = 12 if (cfg.parallelism.zero_stage >= 1 or precision != "fp32") else 8
    weights = 0 if cfg.parallelism.zero_stage == 3 else w * n
    ckpt = weights + k * nt
    export = w * n if cfg.mode == "pretrain" else w * nt + (4 * n if cfg.lora.merge_export else 0)
    return {
        "checkpoint": ckpt,
        "export": export,
        "formula": f"{'' if cfg.parallelism.zero_stage == 3 else 'wΨ + '}KΨ_t = {'' if cfg.parallelism.zero_stage == 3 else f'{w} x {n:,} + '}"
        f"{k} x {nt:,} bytes per checkpoint",
    }


# ----------------------------------------------------------------------------------------------
# throughput


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


# ----------------------------------------------------------------------------------------------
# where it runs


def device_memory(cuda: bool, ranks_per_host: int, calibration: dict | None = None) -> tuple[float | None, str]:
    """(bytes of one device's memory, how it was found): the calibration's device (CUDA), nvidia-smi's
    ``memory.total`` of GPU 0 (without creating a CUDA context in this process), or on CPU this host's
    MemAvailable (/proc/meminfo) divided by ``ranks_per_host``; None when unknown."""
    if calibration and calibration.get("device_memory_bytes"):
        return float(calibration["device_memory_bytes"]), f"the calibration's device ({calibration['device']})"
    if cuda:
        import subprocess

        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout
            return float(out.split()[0]) * 2**20, "nvidia-smi memory.total of GPU 0"
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            return None, "unknown (no nvidia-smi): set plan.device_memory_gib"
    try:
        text = Path("/proc/meminfo").read_text()
        kb = int(next(line.split()[1] for line in text.splitlines() if line.startswith("MemAvailable:")))
    except (OSError, StopIteration, ValueError):
        return None, "unknown (no /proc/meminfo): set plan.device_memory_gib"
    return kb * 1024 / ranks_per_host, f"CPU: MemAvailable {kb / 2**20:.1f} GiB / {ranks_per_host} rank(s) on this host"


def free_disk(root: str | Path) -> tuple[float | None, str]:
    """(free bytes on the file system of the storage root ``root``, how), None for a URL root (an object
    store has no free-space figure)."""
    if "://" in str(root):
        return None, f"{root} is an object store: its free space is not known, not checked"
    p = Path(root)
    while not p.exists() and p != p.parent:
        p = p.parent
    return float(shutil.disk_usage(p).free), f"free space of the file system of {p}"


def bytes_under(path: Path) -> int:
    """Total size of the files under ``path`` (0 when it does not exist)."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) if Path(path).exists() else 0


# ----------------------------------------------------------------------------------------------
# the plan


@dataclass
class Plan:
    """A training's plan; :meth:`to_dict` is plan.json. Bytes are per device unless named otherwise."""

    settings: PlanSettings
    config: dict  # the settings of the TrainConfig that matter here
    shape: ModelShape
    world_size: int
    precision: str
    seq_len: int
    tokens_per_step: int
    start_step: int
    memory: dict
    disk: dict
    device_memory: Optional[float]
    device_memory_source: str
    free_disk: Optional[float]
    free_disk_source: str
    throughput: Optional[Throughput]
    throughput_note: str = ""
    alternatives: list = field(default_factory=list)  # memory-saving changes that fit, when the peak does not

    @property
    def steps_to_run(self) -> int:
        return max(0, self.config["max_steps"] - self.start_step)

    @property
    def tokens_total(self) -> int:
        return self.config["max_steps"] * self.tokens_per_step

    @property
    def usable_memory(self) -> Optional[float]:
        return None if self.device_memory is None else self.device_memory * self.settings.usable_memory_fraction

    def timing(self) -> dict:
        """Seconds per step and for the run (the steps left to run, their evaluations and checkpoints, setup);
        None without a throughput. Evaluation is forward only: (2N + 4LHS) / (4N + 2N_t + 12LHS) of a training
        step's FLOPs per token (flops.model_flops_per_token)."""
        if self.throughput is None:
            return {"step_s": None, "run_s": None}
        c, s = self.config, self.shape
        step_s = self.tokens_per_step / self.throughput.tokens_per_s
        forward = (2 * s.parameters + 4 * s.layers * s.hidden * self.seq_len) / (
            4 * s.parameters + 2 * s.trainable + 12 * s.layers * s.hidden * self.seq_len
        )
        steps = self.steps_to_run
        evals = 0 if c["eval_strategy"] == "no" else steps // c["eval_steps"] + 1
        eval_tokens = (
            min(c["eval_max_sequences"], c.get("validation_sequences") or c["eval_max_sequences"]) * self.seq_len
        )
        eval_s = evals * eval_tokens * forward / self.throughput.tokens_per_s
        saves = steps // c["save_steps"] + 1 if steps else 0
        save_s = saves * (self.throughput.checkpoint_save_s or 0.0)
        setup_s = self.throughput.setup_s or 0.0
        return {
            "step_s": step_s,
            "train_s": steps * step_s,
            "eval_s": eval_s,
            "evaluations": evals,
            "checkpoint_s": save_s,
            "checkpoints": saves,
            "setup_s": setup_s,
            "run_s": steps * step_s + eval_s + save_s + setup_s,
            "checkpoint_time_known": self.throughput.checkpoint_save_s is not None,
        }

    def cost(self) -> Optional[float]:
        t = self.timing()["run_s"]
        price = self.settings.price_per_device_hour
        return None if t is None or price is None else t / 3600 * self.world_size * price

    def problems(self) -> list[str]:
        """What does not fit, each with what to change; [] when the plan fits (or nothing is known to check)."""
        p, gib = [], (lambda b: f"{b / GiB:.2f} GiB")
        m = self.memory
        if self.usable_memory is not None and m["peak"] > self.usable_memory:
            fits = "; ".join(f"{a['change']}: peak {gib(a['peak'])}" for a in self.alternatives if a["fits"])
            tried = "; ".join(f"{a['change']}: {gib(a['peak'])}" for a in self.alternatives if not a["fits"])
            p.append(
                f"memory: the planned peak per device is {gib(m['peak'])} (model states {gib(m['model_states'])}, "
                f"DeepSpeed buffers {gib(m['buffers'])}, activations {gib(m['activations'])}), more than "
                f"{self.settings.usable_memory_fraction:g} x {gib(self.device_memory)} of device memory "
                f"({self.device_memory_source}). "
                + (
                    f"Changes that fit: {fits}."
                    if fits
                    else f"None of these fits alone or together: {tried}; "
                    "use more ranks or a smaller model/sequence length."
                )
                + " (Or set plan.device_memory_gib / plan.usable_memory_fraction if the device has more.)"
            )
        need = self.disk["needed"]
        if self.free_disk is not None and need > self.free_disk:
            p.append(
                f"disk: the training needs {gib(need)} more on the storage root ({self.disk['formula']}), "
                f"{gib(self.free_disk)} is free ({self.free_disk_source}). Lower save_total_limit (now "
                f"{self.config['save_total_limit']}), free space, or use another storage root (LARGETRAIN_ROOT)"
            )
        t = self.timing()
        hours = None if t["run_s"] is None else t["run_s"] / 3600
        if self.settings.max_hours is not None and hours is not None and hours > self.settings.max_hours:
            p.append(
                f"time: planned {hours:.2f} h ({self.steps_to_run} steps x {t['step_s']:.3g} s + evaluation, "
                f"checkpoints, setup), more than max_hours {self.settings.max_hours:g}. "
                f"{self._steps_within(self.settings.max_hours * 3600)}, raise max_hours, or use more ranks"
            )
        cost = self.cost()
        if self.settings.max_cost is not None and cost is not None and cost > self.settings.max_cost:
            budget_s = self.settings.max_cost / (self.world_size * self.settings.price_per_device_hour) * 3600
            p.append(
                f"cost: planned {cost:.2f} {self.settings.currency} ({hours:.2f} h x {self.world_size} device(s) x "
                f"{self.settings.price_per_device_hour:g}), more than max_cost {self.settings.max_cost:g}. "
                f"{self._steps_within(budget_s)}, or raise max_cost"
            )
        return p

    def budget_problems(self) -> list[str]:
        """A max_hours or max_cost that cannot be checked because no throughput is known."""
        budgets = [n for n in ("max_hours", "max_cost") if getattr(self.settings, n) is not None]
        if not budgets or self.throughput is not None:
            return []
        return [
            f"time: {' and '.join('plan.' + b for b in budgets)} set, but no throughput is known to check "
            f"{'it' if len(budgets) == 1 else 'them'} against ({self.throughput_note}). Set plan.throughput to "
            "calibrate (or auto), or materialize optimization_report for this model and hardware"
        ]

    def _steps_within(self, seconds: float) -> str:
        t = self.timing()
        fixed = t["run_s"] - t["train_s"]
        per_step = t["step_s"] * (1 + (t["eval_s"] + t["checkpoint_s"]) / max(t["train_s"], 1e-9))
        steps = int(max(0.0, seconds - t["setup_s"]) // per_step) if per_step else 0
        return (
            f"Lower max_steps to about {self.start_step + steps} (the budget's {seconds / 3600:.2f} h; "
            f"{fixed:.0f} s of it fixed)"
            if steps > 0
            else "Not even one step fits the budget"
        )

    def to_dict(self) -> dict:
        t = self.timing()
        return {
            "settings": asdict(self.settings),
            "config": self.config,
            "model": asdict(self.shape),
            "world_size": self.world_size,
            "precision": self.precision,
            "seq_len": self.seq_len,
            "tokens_per_step": self.tokens_per_step,
            "start_step": self.start_step,
            "steps_to_run": self.steps_to_run,
            "tokens_total": self.tokens_total,
            "tokens_per_parameter": self.tokens_total / self.shape.parameters,
            "tokens_per_trainable_parameter": self.tokens_total / self.shape.trainable,
            "memory": self.memory,
            "disk": self.disk,
            "device_memory_bytes": self.device_memory,
            "device_memory_source": self.device_memory_source,
            "usable_memory_bytes": self.usable_memory,
            "free_disk_bytes": self.free_disk,
            "free_disk_source": self.free_disk_source,
            "throughput": asdict(self.throughput) if self.throughput else None,
            "throughput_note": self.throughput_note,
            "timing": t,
            "cost": self.cost(),
            "alternatives": self.alternatives,
            "problems": self.problems(),
        }

    def table(self) -> str:
        """The plan as a markdown table (quantity, planned value, how)."""

        def gib(b):
            return "" if b is None else f"{b / GiB:.3f} GiB"

        m, t, s = self.memory, self.timing(), self.shape
        rows = [
            ("parameters", f"{s.parameters:,}", f"{s.model_type}, {s.layers} layers, hidden {s.hidden}"),
            ("trainable parameters", f"{s.trainable:,}", self.config["mode"]),
            (
                "tokens per step",
                f"{self.tokens_per_step:,}",
                f"{self.config['micro_batch_size']} x {self.config['gradient_accumulation_steps']} x {self.world_size} "
                f"ranks x {self.seq_len}",
            ),
            (
                "tokens per parameter",
                f"{self.tokens_total / s.parameters:.2f}",
                f"{self.tokens_total:,} tokens in {self.config['max_steps']} steps (compute-optimal is ~20: "
                "Hoffmann et al. 2022)",
            ),
            ("weights per device", gib(m["weights"]), m["formulas"]["weights"]),
            ("gradients per device", gib(m["gradients"]), m["formulas"]["gradients"]),
            ("optimizer states per device", gib(m["optimizer_states"]), m["formulas"]["optimizer_states"]),
            (
                "model states per device",
                gib(m["model_states"]),
                f"ZeRO stage {self.config['zero_stage']}, N_d = {self.world_size} (Rajbhandari et al. 2020)",
            ),
            ("DeepSpeed buffers per device", gib(m["buffers"]), m["formulas"].get("buffers", "none at stage 0")),
            ("activations per device", gib(m["activations"]), m["formulas"]["activations"]),
            ("peak memory per device", gib(m["peak"]), m["formulas"]["peak"]),
            (
                "usable device memory",
                gib(self.usable_memory),
                f"{self.settings.usable_memory_fraction:g} x {gib(self.device_memory)} ({self.device_memory_source})",
            ),
            ("checkpoint size", gib(self.disk["checkpoint"]), self.disk["formula"]),
            (
                "disk needed",
                gib(self.disk["needed"]),
                f"{self.disk['formula_total']}; {self.free_disk_source}: {gib(self.free_disk) or 'unknown'}",
            ),
            (
                "throughput",
                "" if not self.throughput else f"{self.throughput.tokens_per_s:,.0f} tokens/s",
                self.throughput.detail if self.throughput else self.throughput_note,
            ),
            ("time per step", "" if t["step_s"] is None else f"{t['step_s']:.3g} s", "tokens per step / throughput"),
            (
                "time for the run",
                "" if t["run_s"] is None else f"{t['run_s'] / 3600:.3f} h",
                ""
                if t["run_s"] is None
                else f"{self.steps_to_run} steps {t['train_s']:.0f} s + {t['evaluations']} evaluations {t['eval_s']:.0f} s + "
                f"{t['checkpoints']} checkpoints {t['checkpoint_s']:.0f} s"
                f"{'' if t['checkpoint_time_known'] else ' (save time not measured)'} + setup {t['setup_s']:.0f} s",
            ),
            (
                "cost",
                "" if self.cost() is None else f"{self.cost():.2f} {self.settings.currency}",
                "no price_per_device_hour"
                if self.settings.price_per_device_hour is None
                else f"hours x {self.world_size} device(s) x {self.settings.price_per_device_hour:g}",
            ),
        ]
        return "| quantity | plan | how |\n|---|---|---|\n" + "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows)


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


def plan_numbers(plan: dict) -> dict:
    """The planned figures of plan.json's dict as flat numbers, the unit in the name (GiB to 4 significant
    decimals, seconds, hours, the cost in the plan's currency): for metadata and plots."""
    t = plan["timing"]
    n = {
        "plan_parameters": plan["model"]["parameters"],
        "plan_trainable_parameters": plan["model"]["trainable"],
        "plan_tokens_per_step": plan["tokens_per_step"],
        "plan_peak_memory_gib": round(plan["memory"]["peak"] / GiB, 4),
        "plan_model_states_gib": round(plan["memory"]["model_states"] / GiB, 4),
        "plan_activations_gib": round(plan["memory"]["activations"] / GiB, 4),
        "plan_checkpoint_gib": round(plan["disk"]["checkpoint"] / GiB, 4),
        "plan_tokens_per_parameter": round(plan["tokens_per_parameter"], 3),
        "plan_throughput_source": plan["throughput"]["source"] if plan.get("throughput") else "none",
    }
    if t.get("step_s") is not None:
        n.update(plan_step_seconds=round(t["step_s"], 4), plan_run_hours=round(t["run_s"] / 3600, 4))
    if plan.get("cost") is not None:
        n["plan_cost"] = round(plan["cost"], 2)
    return n


def plan_vs_measured(plan: dict, summary: dict, rows: list[dict], calibration: dict | None = None) -> dict:
    """The plan (plan.json's dict) beside what the finished run measured: ``rows`` of (quantity, planned,
    measured, measured / planned) and ``table`` (markdown). Memory: the trainer's peak per rank (CUDA's
    peak allocation; on CPU the peak resident set, which also counts the interpreter and libraries),
    and the calibration's peak allocation (``calibration``: its calibration.json, when one ran before the
    launch); time: the median step time of ``rows`` (metrics.jsonl) and the run's wall time of this start."""
    import statistics

    out = []

    def add(name, planned, measured, unit, note=""):
        ratio = measured / planned if planned and measured is not None else None
        out.append(
            {"quantity": name, "planned": planned, "measured": measured, "unit": unit, "ratio": ratio, "note": note}
        )

    last = rows[-1] if rows else {}
    cuda_mem = last.get("peak_memory_gib")
    cpu_mem = last.get("peak_rss_gib")
    measured_mem = cuda_mem if cuda_mem is not None else cpu_mem
    add(
        "peak memory per device",
        plan["memory"]["peak"] / GiB,
        measured_mem,
        "GiB",
        "CUDA peak allocated" if cuda_mem is not None else "CPU peak resident set: also the interpreter and libraries",
    )
    if calibration is not None:
        add(
            "peak memory per device, calibration",
            plan["memory"]["peak"] / GiB,
            calibration["peak_step_bytes"] / GiB,
            "GiB",
            f"{calibration['memory_measure']}, before the launch",
        )
    times = [r["step_time_s"] for r in rows if r.get("step_time_s") is not None]
    add(
        "time per step",
        plan["timing"].get("step_s"),
        statistics.median(times) if times else None,
        "s",
        "median over the run's steps",
    )
    train_s = summary.get("train_seconds")
    add(
        "time for the run",
        plan["timing"].get("run_s"),
        train_s,
        "s",
        "wall time of this start (steps, evaluation, saves)",
    )
    add(
        "tokens per second",
        plan["throughput"]["tokens_per_s"] if plan.get("throughput") else None,
        summary.get("tokens_per_s"),
        "tokens/s",
        "the run's, evaluation excluded",
    )

    def fmt(v):
        return "" if v is None else f"{v:,.4g}"

    table = "| quantity | planned | measured | measured / planned | note |\n|---|---|---|---|---|\n" + "\n".join(
        f"| {r['quantity']} ({r['unit']}) | {fmt(r['planned'])} | {fmt(r['measured'])} | "
        f"{'' if r['ratio'] is None else format(r['ratio'], '.2f')} | {r['note']} |"
        for r in out
    )
    return {"rows": out, "table": table}


def main(argv: list[str] | None = None) -> int:
    """``python -m largetrain_core.training.plan TRAIN_CONFIG.json [options]``: print the plan of a training
    config (a train_config.json) as a markdown table and its problems; exit status 1 when it does not fit."""
    import argparse
    import json
    import sys

    ap = argparse.ArgumentParser(prog="python -m largetrain_core.training.plan", description=main.__doc__)
    ap.add_argument("config", help="a TrainConfig JSON file (the train_config.json a training asset writes)")
    ap.add_argument("--ranks", type=int, default=1, help="ranks in all (data-parallel size N_d)")
    ap.add_argument("--ranks-per-host", type=int, default=None, help="ranks on each host (default: --ranks)")
    ap.add_argument("--storage-root", default=None, help="where the checkpoints go (default: the config's output_dir)")
    ap.add_argument("--report", default=None, help="an optimization report.json to take the throughput from")
    ap.add_argument(
        "--calibrate",
        action="store_true",
        help="measure the throughput: run the calibration under torchrun on this host with --ranks ranks first",
    )
    ap.add_argument(
        "--settings",
        default="{}",
        help='plan settings as JSON, e.g. \'{"max_hours": 2, "price_per_device_hour": 2.5}\' (PlanSettings\' fields)',
    )
    args = ap.parse_args(argv)
    import torch

    from largetrain_core.training.ablation import device_name

    cfg = TrainConfig.from_dict(json.loads(Path(args.config).read_text()))
    settings = PlanSettings(**json.loads(args.settings))
    cuda = torch.cuda.is_available()
    per_host = args.ranks_per_host or args.ranks
    root = args.storage_root or cfg.output_dir
    throughput, note, calibration = None, "no --report or --calibrate: no time or cost estimate", None
    if args.report:
        plan = make_plan(
            cfg, replace(settings, throughput="none", max_hours=None, max_cost=None), args.ranks, per_host, cuda, root
        )
        throughput, note = from_report(
            json.loads(Path(args.report).read_text()),
            cfg,
            plan.shape,
            args.ranks,
            device_name(),
            plan.precision,
            plan.seq_len,
        )
    if args.calibrate and throughput is None:
        calibration = calibrate_here(cfg, args.ranks, Path(cfg.output_dir) / "calibration", settings.calibration_steps)
        throughput = from_calibration(calibration)
    plan = make_plan(cfg, settings, args.ranks, per_host, cuda, root, throughput, note, calibration)
    print(plan.table())
    problems = plan.problems()
    for p in problems:
        print(f"does not fit: {p}", file=sys.stderr)
    return 1 if problems and settings.check else 0


def calibrate_here(cfg: TrainConfig, ranks: int, scratch: Path, steps: int) -> dict:
    """Run the calibration of ``cfg`` under torchrun on this host with ``ranks`` ranks into ``scratch``
    (replaced; largetrain_core.training.calibrate.launch with a LocalTorchrun); return calibration.json.
    Raises RuntimeError with the log's tail when it fails."""
    from largetrain_core.launch import LocalTorchrun
    from largetrain_core.training import calibrate

    return calibrate.launch(LocalTorchrun(ranks, what="the calibration"), None, cfg, scratch, steps)


if __name__ == "__main__":
    import sys

    sys.exit(main())
