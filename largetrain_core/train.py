"""The DeepSpeed training entry point: ``torchrun --nproc_per_node N -m largetrain_core.train CONFIG.json``.

One typed :class:`TrainConfig` (JSON on disk) drives both full pretraining of a preset and LoRA
fine-tuning of an existing base model. Each rank reads its own slice of the token shards through
:class:`largetrain_core.shards.DistributedSampler`; DeepSpeed runs ZeRO (stage 0-3), the optimizer
(AdamW), the warmup + cosine schedule and, on CUDA, fp16 with dynamic loss scaling.

Outputs under ``output_dir``:

* ``checkpoints/step-NNNNNN/``: DeepSpeed ``save_checkpoint`` of every rank, plus client state
  (consumed samples, sampler seed, RNG states, config hash). It counts only once
  ``COMPLETE.json`` is written, last, by rank 0 after a barrier. Resume picks the newest complete
  one and logs each skipped incomplete one. The last ``keep_checkpoints`` are kept.
* ``model/`` (pretrain): a Hugging Face directory (config.json, model.safetensors, tokenizer files)
  for ``AutoModelForCausalLM.from_pretrained``; ``adapter/`` (lora): a PEFT directory for
  ``PeftModel.from_pretrained``. Both are written to a temporary directory and renamed.
* ``merged/`` (lora with ``lora.merge_export``): base + adapter merged, a HF directory.
* ``metrics.jsonl``: one JSON object per optimizer step (rank 0): loss, lr, grad_norm, tokens_per_s,
  mfu, step_time_s, consumed_samples, peak memory, and in fp16 loss_scale and skipped_steps.
* ``summary.json`` and ``loss_curve.svg`` (rank 0, at the end).

Tests inject crashes with ``LARGETRAIN_FAULT=after_step:N`` or ``mid_save:N`` (see ``_maybe_fault``).

Only rank 0 talks to Dagster Pipes (when started by Dagster) and to Weights & Biases.
Checkpoint files are our own and are loaded by DeepSpeed with ``torch.load``; never point
``resume`` at a checkpoint from an untrusted source. Model weights are exchanged as safetensors only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import random
import re
import shlex
import shutil
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

log = logging.getLogger("largetrain.train")

PRECISIONS = ("auto", "fp32", "fp16", "bf16")


@dataclass
class LoraSettings:
    """LoRA (Hu et al. 2021): rank r, scaling alpha / r, dropout on the adapter input.

    ``target_modules=None`` means every ``nn.Linear`` inside the transformer blocks (attention and
    MLP projections), discovered from the model; the output head is never adapted.
    """

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list[str] | None = None
    adapter_name: str = "default"
    merge_export: bool = False  # also write merged/: base + adapter folded in (peft merge_and_unload), a HF directory


@dataclass
class TrainConfig:
    """Everything one training run needs. Units: steps are optimizer steps; lr in absolute units.

    mode: "pretrain" (build ``preset`` from scratch) or "lora" (load ``base_model`` and train a LoRA adapter).
    train_shards: token-shard directory (its ``train`` split is read).
    precision: "auto" = fp16 with dynamic loss scaling on CUDA, fp32 on CPU; or fp32/fp16/bf16.
    micro_batch_size: sequences per rank per forward pass; gradient_accumulation_steps: micro-batches per step.
    resume: "auto" (newest complete checkpoint in output_dir, else start), "never", or a checkpoint directory.
    """

    output_dir: str
    train_shards: str
    mode: str = "pretrain"
    preset: str = "llama-3m"
    base_model: str | None = None
    tokenizer: str | None = None
    zero_stage: int = 2
    offload_optimizer: bool = False
    precision: str = "auto"
    activation_checkpointing: bool = True
    micro_batch_size: int = 4
    gradient_accumulation_steps: int = 1
    max_steps: int = 100
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    resume: str = "auto"
    log_every: int = 10
    lora: LoraSettings = field(default_factory=LoraSettings)
    wandb_mode: str = "offline"
    wandb_project: str = "largetrain"
    wandb_entity: str | None = None
    wandb_run_name: str | None = None
    # Peak FLOP/s of the whole job's hardware, for MFU. None: on CPU derived by cpu_peak_flops() per
    # host; on CUDA from CUDA_PEAK_FLOPS by device name (dense fp16/bf16 tensor-core figure), else unknown.
    peak_flops: float | None = None

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown training config keys {sorted(unknown)}; known: {sorted(known)}")
        d = dict(d)
        if isinstance(d.get("lora"), dict):
            d["lora"] = LoraSettings(**d["lora"])
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)

    def config_hash(self) -> str:
        """sha256 of the settings that change the trained weights (not output paths, logging or resume)."""
        d = self.to_dict()
        for k in ("output_dir", "resume", "log_every", "wandb_mode", "wandb_project", "wandb_entity",
                  "wandb_run_name", "checkpoint_every", "keep_checkpoints", "peak_flops"):
            d.pop(k)
        d["lora"].pop("merge_export")
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def validate(self, cuda: bool | None = None) -> None:
        """Raise ValueError, saying what to change, for an invalid combination. ``cuda`` defaults to torch's view."""
        if cuda is None:
            import torch

            cuda = torch.cuda.is_available()
        problems = []
        if self.mode not in ("pretrain", "lora"):
            problems.append(f"mode must be 'pretrain' or 'lora', not {self.mode!r}")
        if self.mode == "lora" and not self.base_model:
            problems.append("mode 'lora' needs base_model: the Hugging Face directory of the model to adapt")
        if self.zero_stage not in (0, 1, 2, 3):
            problems.append(f"zero_stage must be 0, 1, 2 or 3, not {self.zero_stage}")
        if self.offload_optimizer and self.zero_stage == 0:
            problems.append("offload_optimizer needs zero_stage 1, 2 or 3 (ZeRO-Offload partitions the optimizer state)")
        if self.precision not in PRECISIONS:
            problems.append(f"precision must be one of {PRECISIONS}, not {self.precision!r}")
        if self.precision == "fp16" and not cuda:
            problems.append("precision fp16 needs CUDA: DeepSpeed's CPU accelerator does not support fp16; use 'auto' or 'fp32'")
        for name in ("micro_batch_size", "gradient_accumulation_steps", "max_steps", "checkpoint_every", "keep_checkpoints", "log_every"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, not {getattr(self, name)}")
        if not 0 <= self.warmup_steps <= self.max_steps:
            problems.append(f"warmup_steps must be within 0..max_steps ({self.max_steps}), not {self.warmup_steps}")
        if self.lr <= 0 or not 0 <= self.min_lr_ratio <= 1:
            problems.append("lr must be > 0 and min_lr_ratio within 0..1")
        if self.resume not in ("auto", "never") and not Path(self.resume).is_dir():
            problems.append(f"resume must be 'auto', 'never' or an existing checkpoint directory, not {self.resume!r}")
        if self.wandb_mode not in ("offline", "online", "disabled"):
            problems.append(f"wandb_mode must be offline, online or disabled, not {self.wandb_mode!r}")
        if self.mode == "lora" and (self.lora.rank < 1 or self.lora.alpha <= 0):
            problems.append("LoRA rank must be >= 1 and alpha > 0")
        if self.mode == "lora" and not 0 <= self.lora.dropout < 1:
            problems.append(f"LoRA dropout must be within [0, 1), not {self.lora.dropout}")
        if self.mode == "lora" and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.lora.adapter_name or ""):
            problems.append(f"lora.adapter_name must be an identifier (letters, digits, _), not {self.lora.adapter_name!r}")
        if self.mode == "pretrain" and self.lora.merge_export:
            problems.append("lora.merge_export applies to mode 'lora' only; set it to false for pretraining")
        if self.peak_flops is not None and self.peak_flops <= 0:
            problems.append(f"peak_flops must be > 0 FLOP/s or null (derive), not {self.peak_flops}")
        if problems:
            raise ValueError("invalid training config: " + "; ".join(problems))


def resolve_precision(precision: str, cuda: bool) -> tuple[str, str]:
    """(fp32|fp16|bf16, reason). ``auto`` is fp16 with dynamic loss scaling on CUDA (tensor cores, half
    the activation memory) and fp32 on CPU (DeepSpeed's CPU accelerator refuses fp16, and bf16
    matmul on AVX2-only CPUs is about 12x slower than fp32)."""
    if precision != "auto":
        return precision, f"precision {precision} set in config"
    if cuda:
        return "fp16", "auto on CUDA: fp16 with dynamic loss scaling"
    return "fp32", "auto on CPU: fp32 (DeepSpeed's CPU accelerator does not support fp16; bf16 matmul is slow without AMX/AVX512-BF16)"


def deepspeed_config(cfg: TrainConfig, world_size: int, precision: str) -> dict:
    """The DeepSpeed JSON config for ``cfg`` (keys as in DeepSpeed's config documentation)."""
    zero: dict = {"stage": cfg.zero_stage}
    if cfg.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    if cfg.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    ds = {
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "train_batch_size": cfg.micro_batch_size * cfg.gradient_accumulation_steps * world_size,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": cfg.lr, "betas": [0.9, 0.95], "eps": 1e-8,
                                                   "weight_decay": cfg.weight_decay}},
        "scheduler": {"type": "WarmupCosineLR", "params": {
            "total_num_steps": cfg.max_steps, "warmup_num_steps": max(cfg.warmup_steps, 1), "warmup_type": "linear",
            "warmup_min_ratio": 0.0, "cos_min_ratio": cfg.min_lr_ratio}},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if precision == "fp16":
        # loss_scale 0 = dynamic; start at 2^16, halve on overflow, double after 1000 clean steps (DeepSpeed defaults).
        ds["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                      "hysteresis": 2, "min_loss_scale": 1}
    elif precision == "bf16":
        ds["bf16"] = {"enabled": True}
    return ds


def lora_target_modules(model) -> list[str]:
    """Names (last path component) of every nn.Linear inside the decoder blocks; excludes the LM head."""
    import torch

    names = set()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and re.search(r"\.layers?\.\d+\.|\.h\.\d+\.", f".{name}."):
            names.add(name.rsplit(".", 1)[-1])
    if not names:
        raise ValueError("no nn.Linear modules inside decoder blocks found; set lora.target_modules explicitly")
    return sorted(names)


# ----------------------------------------------------------------------------------------------
# FLOPs, hardware peak, MFU

# Dense fp16/bf16 tensor-core peak FLOP/s per device (vendor data sheets, without sparsity).
CUDA_PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12, "V100": 125e12}


def model_flops_per_token(n_params: int, n_layers: int, hidden: int, seq_len: int) -> float:
    """Training FLOPs per token: 6 N + 12 L H S (Chowdhery et al. 2022, PaLM, appendix B; forward +
    backward, attention scores included, activation recomputation not counted, as MFU prescribes).

    n_params: every parameter that takes part in the matmuls (for LoRA: the whole model; the
    frozen weights still cost the forward and the input-gradient part of the backward, so 6 N is an
    upper bound there, by 2 N per token).
    """
    return 6.0 * n_params + 12.0 * n_layers * hidden * seq_len


def cpu_peak_flops(cores: int | None = None, ghz: float | None = None, cpuinfo: str | None = None) -> tuple[float, str]:
    """fp32 peak FLOP/s of this host's CPUs: cores x clock x FLOPs per cycle per core, and how it was derived.

    FLOPs per cycle per core = 2 (a fused multiply-add is 2 FLOPs) x 2 FMA units x fp32 lanes per unit.
    Lanes: 16 with AVX-512 on Intel (two 512-bit FMA units on Xeon Scalable Gold/Platinum), 8 with
    AVX2/FMA and on AMD (Zen 2-4 execute on 256-bit FMA pipes; Zen 4 splits AVX-512 in two), 4 otherwise
    (SSE). cores: the CPUs this process may run on (sched_getaffinity); ghz: nominal clock from the
    model name ("@ 2.60GHz") else "cpu MHz" of /proc/cpuinfo. Override with TrainConfig.peak_flops
    when the host's real figure is known (turbo, one FMA unit on some SKUs).
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    cores = cores or len(os.sched_getaffinity(0))
    flags = set((re.search(r"^flags\s*:(.*)$", cpuinfo, re.M) or re.match("()", "")).group(1).split())
    amd = "AuthenticAMD" in cpuinfo
    if ghz is None:
        nominal = re.search(r"model name.*@\s*([\d.]+)\s*GHz", cpuinfo)
        mhz = re.search(r"^cpu MHz\s*:\s*([\d.]+)", cpuinfo, re.M)
        ghz = float(nominal.group(1)) if nominal else float(mhz.group(1)) / 1000 if mhz else 2.0
    lanes = 16 if "avx512f" in flags and not amd else 8 if ("avx2" in flags or "avx512f" in flags) else 4
    per_cycle = 2 * 2 * lanes
    how = (f"{cores} cores x {ghz:.2f} GHz x {per_cycle} fp32 FLOPs/cycle (2 per FMA x 2 FMA units x {lanes} lanes"
           f"{', AMD 256-bit pipes' if amd else ''}{', AVX-512' if lanes == 16 else ', AVX2' if lanes == 8 else ''})")
    return cores * ghz * 1e9 * per_cycle, how


def job_peak_flops(cfg: TrainConfig, cuda: bool, world: int, local_world: int) -> tuple[float | None, str]:
    """Peak FLOP/s of the whole job and its source (config, device table, CPU derivation, or unknown)."""
    if cfg.peak_flops:
        return cfg.peak_flops, "peak_flops from config"
    if cuda:
        import torch

        name = torch.cuda.get_device_name()
        for key, flops in CUDA_PEAK_FLOPS.items():
            if key in name:
                return flops * world, f"{world} x {key} dense fp16/bf16 peak {flops:.3g} FLOP/s (data sheet)"
        return None, f"no peak known for {name}: set peak_flops"
    per_host, how = cpu_peak_flops()
    hosts = max(1, world // max(local_world, 1))
    return per_host * hosts, f"{hosts} host(s) x {how}"


# ----------------------------------------------------------------------------------------------
# processes; fault injection (tests)


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, process group id) of ``pid`` from Linux ``/proc/<pid>/stat``; None once it
    has ended. State ``Z`` is a zombie: dead, not yet reaped by its parent."""
    try:
        fields_ = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields_[0], int(fields_[1]), int(fields_[2])


def process_tree(root: int) -> list[int]:
    """``root`` and every descendant process (Linux ``/proc/<pid>/stat``), parents before children.

    Needed because torchrun starts each rank in a session of its own (``start_new_session=True`` in
    torch.distributed.elastic's SubprocessHandler): signalling the agent's process group misses the ranks.
    """
    children: dict[int, list[int]] = {}
    for d in Path("/proc").glob("[0-9]*"):
        st = proc_stat(int(d.name))
        if st is not None:  # else the process ended while we looked
            children.setdefault(st[1], []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo.extend(sorted(children.get(pid, [])))
    return out


def _maybe_fault(point: str, step: int, rank: int) -> None:
    """LARGETRAIN_FAULT="after_step:N" (after step N's metrics row) or "mid_save:N" (after this rank's
    ``save_checkpoint`` of step N returned, before the barrier and the completion marker): rank 0
    SIGKILLs the torchrun agent, every rank and itself at once, as a crash or power cut would."""
    spec = os.environ.get("LARGETRAIN_FAULT", "")
    if rank == 0 and spec == f"{point}:{step}":
        import signal

        log.warning(f"LARGETRAIN_FAULT {spec}: SIGKILL to the torchrun agent and all ranks")
        for h in logging.getLogger().handlers:
            h.flush()
        me = os.getpid()
        for pid in process_tree(os.getppid()):
            if pid != me:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        os.kill(me, signal.SIGKILL)


def launch_commands(config_path: str, hosts: list[str], nproc_per_node: int, port: int = 29500,
                    rdzv_backend: str = "static", python: str = "python") -> dict:
    """The commands that start ``config_path`` on ``hosts`` (node rank = position in the list; the first
    host holds the rendezvous store), ``nproc_per_node`` ranks on each.

    Returns ``{"torchrun": [one command per node, to run on that node], "hostfile": DeepSpeed hostfile
    text ("host slots=N" lines), "deepspeed": the one command to run on hosts[0] with that hostfile
    (the deepspeed launcher reaches the other hosts by pdsh/ssh)}``. rdzv_backend "static": torchrun's
    fixed ranks (--node_rank, --master_addr/--master_port); "c10d": elastic rendezvous at hosts[0]:port,
    node ranks assigned by the rendezvous. Raises ValueError on an empty host list or bad backend.
    """
    if not hosts or nproc_per_node < 1:
        raise ValueError("need at least one host and nproc_per_node >= 1")
    if rdzv_backend not in ("static", "c10d"):
        raise ValueError(f"rdzv_backend must be 'static' or 'c10d', not {rdzv_backend!r}")
    n = len(hosts)
    cmds = []
    for i in range(n):
        if n == 1:
            where = "--standalone"
        elif rdzv_backend == "static":
            where = f"--nnodes {n} --node_rank {i} --master_addr {hosts[0]} --master_port {port}"
        else:
            where = f"--nnodes {n} --rdzv_backend c10d --rdzv_endpoint {hosts[0]}:{port} --rdzv_id largetrain"
        cmds.append(f"{shlex.quote(python)} -m torch.distributed.run {where} --nproc_per_node {nproc_per_node} "
                    f"-m largetrain_core.train {shlex.quote(str(config_path))}")
    hostfile = "".join(f"{h} slots={nproc_per_node}\n" for h in dict.fromkeys(hosts))
    ds = (f"deepspeed --hostfile hostfile --master_addr {hosts[0]} --master_port {port} "
          f"--module largetrain_core.train {shlex.quote(str(config_path))}")
    return {"torchrun": cmds, "hostfile": hostfile, "deepspeed": ds}


# ----------------------------------------------------------------------------------------------
# checkpoints


def _step_of(path: Path) -> int:
    return int(path.name.split("-")[1])


def find_resume_checkpoint(ckpt_root: Path) -> tuple[Path | None, list[str]]:
    """Newest complete checkpoint under ``ckpt_root`` and one message per skipped incomplete one.

    Complete = ``COMPLETE.json`` present and every file it lists exists with the recorded size.
    """
    skipped: list[str] = []
    if not ckpt_root.is_dir():
        return None, skipped
    candidates = sorted((p for p in ckpt_root.iterdir() if p.is_dir() and re.fullmatch(r"step-\d+", p.name)),
                        key=_step_of, reverse=True)
    for cand in candidates:
        marker = cand / "COMPLETE.json"
        if not marker.exists():
            skipped.append(f"skipped {cand}: no COMPLETE.json (the save did not finish)")
            continue
        try:
            listed = json.loads(marker.read_text())["files"]
        except (ValueError, KeyError) as e:
            skipped.append(f"skipped {cand}: unreadable COMPLETE.json ({e})")
            continue
        bad = [f for f, size in listed.items() if not (cand / f).exists() or (cand / f).stat().st_size != size]
        if bad:
            skipped.append(f"skipped {cand}: files missing or of the wrong size: {bad[:3]}")
            continue
        return cand, skipped
    return None, skipped


def _mark_complete(ckpt: Path, step: int) -> None:
    files = {p.relative_to(ckpt).as_posix(): p.stat().st_size for p in sorted(ckpt.rglob("*")) if p.is_file()}
    tmp = ckpt / ".COMPLETE.json.tmp"
    tmp.write_text(json.dumps({"step": step, "files": files}, indent=1))
    os.replace(tmp, ckpt / "COMPLETE.json")


def _prune(ckpt_root: Path, keep: int) -> None:
    complete = sorted((p for p in ckpt_root.iterdir() if (p / "COMPLETE.json").exists()), key=_step_of)
    for old in complete[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def _rng_state() -> dict:
    import torch

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(state: dict) -> None:
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def read_metrics(metrics_file: Path) -> list[dict]:
    """metrics.jsonl rows by step, ascending; where a step ran twice (work lost after a crash and redone
    after the resume), the last row wins."""
    rows = {}
    for line in Path(metrics_file).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            rows[r["step"]] = r
    return [rows[k] for k in sorted(rows)]


def loss_curve_svg(rows: list[dict], out: Path, title: str = "training loss") -> Path:
    """Write the loss curve (x: optimizer step, y: loss in nats, linear axes, min/max labelled) as a
    standalone SVG (no plotting library needed; any browser shows it). Atomic write. Returns ``out``."""
    pts = [(r["step"], r["loss"]) for r in rows if r.get("loss") is not None and math.isfinite(r["loss"])]
    w, h, left, right, top, bottom = 640, 360, 60, 20, 30, 40
    if pts:
        x0, x1 = pts[0][0], max(pts[-1][0], pts[0][0] + 1)
        y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
        y1 = y1 if y1 > y0 else y0 + 1
        sx = lambda x: left + (x - x0) / (x1 - x0) * (w - left - right)  # noqa: E731
        sy = lambda y: top + (y1 - y) / (y1 - y0) * (h - top - bottom)  # noqa: E731
        path = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for i, (x, y) in enumerate(pts))
    else:
        x0 = x1 = 0
        y0 = y1 = float("nan")
        path = ""
    svg = f"""<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="{w}" height="{h}" fill="white"/>
<text x="{w / 2}" y="18" text-anchor="middle" font-size="14">{title}</text>
<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" stroke="black"/>
<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="black"/>
<text x="{left}" y="{h - bottom + 16}" text-anchor="middle">{x0}</text>
<text x="{w - right}" y="{h - bottom + 16}" text-anchor="middle">{x1}</text>
<text x="{w / 2}" y="{h - 8}" text-anchor="middle">step</text>
<text x="{left - 6}" y="{top + 4}" text-anchor="end">{y1:.3f}</text>
<text x="{left - 6}" y="{h - bottom}" text-anchor="end">{y0:.3f}</text>
<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" text-anchor="middle">loss (nats)</text>
<path d="{path}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>
</svg>
"""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(svg)
    os.replace(tmp, out)
    return out


# ----------------------------------------------------------------------------------------------
# the run


class _Reporter:
    """Rank 0's outlets: stderr log, metrics.jsonl, Dagster Pipes (if started by Dagster), W&B."""

    def __init__(self, cfg: TrainConfig, rank: int, out: Path):
        self.rank0 = rank == 0
        self.pipes = None
        self.wandb_run = None
        self._stack = contextlib.ExitStack()
        if not self.rank0:
            return
        self.metrics = open(out / "metrics.jsonl", "a")
        if os.environ.get("DAGSTER_PIPES_CONTEXT"):
            from dagster_pipes import open_dagster_pipes

            self.pipes = self._stack.enter_context(open_dagster_pipes())
        if cfg.wandb_mode != "disabled":
            import wandb

            id_file = out / "wandb_run_id"
            run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:8]
            id_file.write_text(run_id)
            self.wandb_run = wandb.init(project=cfg.wandb_project, entity=cfg.wandb_entity, name=cfg.wandb_run_name,
                                        mode=cfg.wandb_mode, id=run_id, resume="allow", dir=str(out),
                                        config=cfg.to_dict())

    def info(self, msg: str) -> None:
        if self.rank0:
            log.info(msg)
            if self.pipes:
                self.pipes.log.info(msg)

    def metric(self, row: dict) -> None:
        if self.rank0:
            self.metrics.write(json.dumps(row) + "\n")
            self.metrics.flush()
            if self.wandb_run:
                self.wandb_run.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])

    def done(self, metadata: dict) -> None:
        if self.rank0 and self.pipes:
            self.pipes.report_asset_materialization(metadata=metadata)

    def close(self) -> None:
        if self.rank0:
            self.metrics.close()
            if self.wandb_run:
                self.wandb_run.finish()
            self._stack.close()


def run(cfg: TrainConfig) -> dict:
    """Train under an initialized launcher environment (RANK/WORLD_SIZE/MASTER_ADDR set by torchrun).

    Returns the summary dict that rank 0 also reports to Dagster Pipes.
    """
    import deepspeed
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from largetrain_core.model import build_model, load_model, parameter_count
    from largetrain_core.shards import DistributedSampler, TokenShards
    from largetrain_core.tokenizer import load_tokenizer_info, save_hf_tokenizer

    cuda = torch.cuda.is_available()
    cfg.validate(cuda)
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    out = Path(cfg.output_dir)
    ckpt_root = out / "checkpoints"
    if rank == 0:
        ckpt_root.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    rep = _Reporter(cfg, rank, out)
    try:
        precision, reason = resolve_precision(cfg.precision, cuda)
        rep.info(f"precision {precision}: {reason}")
        rep.info(f"world size {world}, device {device.type}, ZeRO stage {cfg.zero_stage}, "
                 f"activation checkpointing {'on' if cfg.activation_checkpointing else 'off'}, "
                 f"torch threads per rank {torch.get_num_threads()}")
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)

        data = TokenShards(Path(cfg.train_shards), "train")
        if len(data) == 0:
            raise ValueError(f"{cfg.train_shards}: the train split holds no sequence")
        seq_len = data.seq_len
        if cfg.mode == "pretrain":
            m = data.manifest
            model = build_model(cfg.preset, m["vocab_size"], seq_len, m["eos_id"], m.get("bos_id"), seed=cfg.seed)
        else:
            model = load_model(Path(cfg.base_model))
            if model.config.vocab_size < data.manifest["vocab_size"]:
                raise ValueError(f"{cfg.train_shards}: token ids up to {data.manifest['vocab_size'] - 1} "
                                 f"do not fit the base model's vocabulary of {model.config.vocab_size}")
        if cfg.activation_checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        if cfg.mode == "lora":
            from peft import LoraConfig, get_peft_model

            targets = cfg.lora.target_modules or lora_target_modules(model)
            lcfg = LoraConfig(r=cfg.lora.rank, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                              target_modules=targets, task_type="CAUSAL_LM", bias="none")
            if cfg.activation_checkpointing:
                # The frozen-embedding trap: with the embedding frozen, checkpointed blocks would get inputs
                # that do not require grad; make the embedding output require grad so gradients reach LoRA.
                model.enable_input_require_grads()
            model = get_peft_model(model, lcfg, adapter_name=cfg.lora.adapter_name)
            rep.info(f"LoRA r={cfg.lora.rank} alpha={cfg.lora.alpha} on {targets}")
        n_params, n_trainable = parameter_count(model), parameter_count(model, trainable_only=True)
        rep.info(f"parameters {n_params:,}, trainable {n_trainable:,}")

        ds_cfg = deepspeed_config(cfg, world, precision)
        engine, optimizer, _, scheduler = deepspeed.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=ds_cfg)

        step, consumed = 0, 0
        resume_from = None
        if cfg.resume == "auto":
            resume_from, skipped = find_resume_checkpoint(ckpt_root)
            for s in skipped:
                rep.info(s)
        elif cfg.resume != "never":
            resume_from = Path(cfg.resume)
        if resume_from is not None:
            _, client = engine.load_checkpoint(str(resume_from.parent), tag=resume_from.name)
            if client["config_hash"] != cfg.config_hash():
                rep.info(f"warning: {resume_from} was written with config {client['config_hash']}, "
                         f"this run is {cfg.config_hash()}")
            step, consumed = client["step"], client["consumed_samples"]
            _set_rng_state(client["rng"][min(rank, len(client["rng"]) - 1)] if isinstance(client["rng"], list) else client["rng"])
            rep.info(f"resumed from {resume_from} at step {step}, {consumed} samples consumed")
        else:
            rep.info("starting from scratch" if cfg.mode == "pretrain" else f"starting LoRA on {cfg.base_model}")

        sampler = DistributedSampler(len(data), seed=cfg.seed, rank=rank, world_size=world)
        mb, ga = cfg.micro_batch_size, cfg.gradient_accumulation_steps
        tokens_per_step = mb * ga * world * seq_len
        mcfg = (engine.module.get_base_model() if cfg.mode == "lora" else engine.module).config
        flops_per_token = model_flops_per_token(n_params, mcfg.num_hidden_layers, mcfg.hidden_size, seq_len)
        peak, peak_source = job_peak_flops(cfg, cuda, world, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        rep.info(f"model FLOPs/token {flops_per_token:.3g} (6N + 12LHS); peak {peak or float('nan'):.3g} FLOP/s: {peak_source}")
        first_loss = last_loss = None
        t_run = time.perf_counter()
        steps_this_run = 0
        while step < cfg.max_steps:
            t0 = time.perf_counter()
            loss_sum = torch.zeros((), dtype=torch.float64, device=device)
            for micro in range(ga):
                idx = sampler.indices(consumed + micro * mb * world, mb)
                batch = torch.from_numpy(data.take(idx).astype(np.int64)).to(device)
                logits = engine(input_ids=batch[:, :-1]).logits
                loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
                engine.backward(loss)
                engine.step()
                loss_sum += loss.detach().double()
            consumed += mb * ga * world
            step += 1
            steps_this_run += 1
            dist.all_reduce(loss_sum)
            step_loss = float(loss_sum) / (ga * world)
            dt = time.perf_counter() - t0
            first_loss = step_loss if first_loss is None else first_loss
            last_loss = step_loss
            if not math.isfinite(step_loss):
                rep.info(f"step {step}: loss {step_loss} is not finite")
            grad_norm = engine.get_global_grad_norm()
            row = {"step": step, "loss": step_loss, "lr": scheduler.get_last_lr()[0] if scheduler else cfg.lr,
                   "grad_norm": float(grad_norm) if grad_norm is not None else None,
                   "tokens_per_s": tokens_per_step / dt, "step_time_s": dt, "consumed_samples": consumed,
                   "mfu": tokens_per_step / dt * flops_per_token / peak if peak else None}
            if precision == "fp16":
                row["loss_scale"] = float(getattr(optimizer, "cur_scale", getattr(optimizer, "loss_scale", float("nan"))))
                row["skipped_steps"] = int(engine.skipped_steps)
            if cuda:
                row["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
            else:
                import resource

                row["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            rep.metric(row)
            _maybe_fault("after_step", step, rank)
            if step % cfg.log_every == 0 or step == cfg.max_steps:
                rep.info(f"step {step}/{cfg.max_steps} loss {step_loss:.4f} lr {row['lr']:.2e} "
                         f"{row['tokens_per_s']:.0f} tokens/s")
            if step % cfg.checkpoint_every == 0 or step == cfg.max_steps:
                _save(engine, ckpt_root, step, consumed, cfg, rank, world, dist, len(data))
                rep.info(f"checkpoint step-{step:06d} complete")
        elapsed = time.perf_counter() - t_run

        export_dir = _export(engine, cfg, out, rank, dist, save_hf_tokenizer, load_tokenizer_info)
        # Release DeepSpeed's hooks and background state (ZeRO-3 parameter coordinator) on every rank
        # before the process group goes away: without it a ZeRO-3 rank could abort at interpreter exit
        # ("terminate called without an active exception", about 1 run in 4 here).
        engine.destroy()
        dist.barrier()
        tps = (steps_this_run * tokens_per_step / elapsed) if steps_this_run else None
        summary = {"steps": step, "steps_this_run": steps_this_run, "first_loss": first_loss, "last_loss": last_loss,
                   "tokens_per_s": tps, "mfu": tps * flops_per_token / peak if tps and peak else None,
                   "peak_flops": peak, "peak_flops_source": peak_source, "flops_per_token": flops_per_token,
                   "resumed_from": str(resume_from) if resume_from else None,
                   "tokens_seen": consumed * seq_len, "precision": precision, "precision_reason": reason,
                   "world_size": world, "zero_stage": cfg.zero_stage, "parameters": n_params,
                   "trainable_parameters": n_trainable, "output": str(export_dir), "train_seconds": elapsed}
        if rank == 0:
            rows = read_metrics(out / "metrics.jsonl")
            summary["mean_mfu"] = (sum(r["mfu"] for r in rows if r.get("mfu")) / len(rows)) if peak and rows else None
            summary["loss_curve"] = str(loss_curve_svg(rows, out / "loss_curve.svg", f"{cfg.mode} loss"))
            tmp = out / ".summary.json.tmp"
            tmp.write_text(json.dumps(summary, indent=2))
            os.replace(tmp, out / "summary.json")
        rep.done({k: v for k, v in summary.items() if v is not None})
        return summary
    finally:
        rep.close()


def _save(engine, ckpt_root: Path, step: int, consumed: int, cfg: TrainConfig, rank: int, world: int, dist,
          num_samples: int) -> None:
    """save_checkpoint on every rank, then the completion marker (rank 0, after a barrier), then pruning.

    Client state: step, consumed samples, the sampler's seed and epoch (consumed // num_samples, as
    DistributedSampler derives it), every rank's RNG states (python, numpy, torch) and the config hash."""
    tag = f"step-{step:06d}"
    gathered: list = [None] * world
    dist.all_gather_object(gathered, _rng_state())
    client = {"step": step, "consumed_samples": consumed, "sampler_seed": cfg.seed,
              "sampler_epoch": consumed // num_samples, "rng": gathered,
              "config_hash": cfg.config_hash()}
    engine.save_checkpoint(str(ckpt_root), tag=tag, client_state=client)
    _maybe_fault("mid_save", step, rank)  # this rank's files written, the others' maybe not, no marker yet
    dist.barrier()
    if rank == 0:
        _mark_complete(ckpt_root / tag, step)
        _prune(ckpt_root, cfg.keep_checkpoints)
    dist.barrier()


def _export(engine, cfg: TrainConfig, out: Path, rank: int, dist, save_hf_tokenizer, load_tokenizer_info) -> Path:
    """Write ``model/`` (HF) or ``adapter/`` (PEFT; plus ``merged/`` with ``lora.merge_export``) atomically.

    Under ZeRO-3 the weights are consolidated on rank 0 by DeepSpeed, one layer at a time
    (``_zero3_consolidated_16bit_state_dict``: every rank takes part; it keeps the training dtype,
    fp32 in fp32 runs), and saved as safetensors. A non-default adapter name is saved at the top of
    ``adapter/`` (PEFT would nest it in ``adapter/<name>/``) and recorded in ``adapter_config.json``'s
    sibling ``adapter_name.txt``; load it with ``PeftModel.from_pretrained(model, dir, adapter_name=name)``.
    """
    final = out / ("model" if cfg.mode == "pretrain" else "adapter")
    tmp = out / f".tmp-{final.name}"
    module = engine.module
    state = engine._zero3_consolidated_16bit_state_dict() if cfg.zero_stage == 3 else None
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        if cfg.mode == "pretrain":
            module.config.use_cache = True
            module.save_pretrained(str(tmp), state_dict=state, safe_serialization=True)
            tok_src = Path(cfg.tokenizer) if cfg.tokenizer else Path(cfg.train_shards)
            save_hf_tokenizer(load_tokenizer_info(tok_src), tmp)
        else:
            name = cfg.lora.adapter_name
            if state is not None:
                # PEFT's save_pretrained picks the adapter weights out of a full state dict itself
                module.save_pretrained(str(tmp), state_dict=state, selected_adapters=[name])
            else:
                module.save_pretrained(str(tmp), selected_adapters=[name])
            if name != "default":
                nested = tmp / name
                for f in nested.iterdir():
                    os.replace(f, tmp / f.name)
                nested.rmdir()
            (tmp / "adapter_name.txt").write_text(name + "\n")
        _replace_dir(tmp, final)
        if cfg.mode == "lora" and cfg.lora.merge_export:
            _export_merged(cfg, out, final, save_hf_tokenizer, load_tokenizer_info)
    dist.barrier()
    return final


def _replace_dir(tmp: Path, final: Path) -> None:
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def _export_merged(cfg: TrainConfig, out: Path, adapter_dir: Path, save_hf_tokenizer, load_tokenizer_info) -> None:
    """``merged/``: base + adapter folded into the base weights (W + (alpha / r) B A, peft ``merge_and_unload``),
    a HF directory. Built from the files just exported (base directory + ``adapter/``) on CPU in fp32,
    so that it also proves the exported adapter loads, and works the same under every ZeRO stage."""
    from peft import PeftModel

    from largetrain_core.model import load_model

    name = cfg.lora.adapter_name
    merged = PeftModel.from_pretrained(load_model(Path(cfg.base_model)), str(adapter_dir), adapter_name=name).merge_and_unload()
    merged.config.use_cache = True
    tmp = out / ".tmp-merged"
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(str(tmp), safe_serialization=True)
    base_dir = Path(cfg.base_model)
    if (base_dir / "tokenizer.json").exists():
        save_hf_tokenizer(load_tokenizer_info(base_dir), tmp)
    _replace_dir(tmp, out / "merged")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: torchrun --nproc_per_node N -m largetrain_core.train CONFIG.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # DeepSpeed JIT-builds its CPU comm op into TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions,
    # shared by every virtualenv of the user: two checkouts would rebuild it in turn, ~45 s each time).
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    cfg = TrainConfig.from_dict(json.loads(Path(argv[0]).read_text()))
    run(cfg)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    # Every output is written and fsynced by now. Skip the interpreter's teardown: destructors of
    # DeepSpeed's/gloo's native threads can abort a rank there ("terminate called without an active
    # exception", seen with ZeRO-3 on CPU), which would turn a finished run into a failed one.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
