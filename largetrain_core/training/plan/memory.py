"""Memory per device (package doc: model states, DeepSpeed's buffers, activations, the peak), the model's shape, the checkpoint's size, the device memory and the disk there are."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from largetrain_core.training.config import TrainConfig


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
