"""The training run's settings: :class:`TrainConfig` (JSON on disk), its LoRA and tracker settings,
and their validation.

Names follow Hugging Face ``TrainingArguments`` (``learning_rate``, ``max_grad_norm``,
``warmup_steps``, ``logging_steps``, ``save_steps``, ``save_total_limit``, ``report_to``,
``run_name``, ``resume_from_checkpoint``, ``eval_strategy``, ``eval_steps``; ``early_stopping_patience``
and ``early_stopping_threshold`` as in its ``EarlyStoppingCallback``), PEFT ``LoraConfig`` (``r``, ``lora_alpha``,
``lora_dropout``, ``target_modules``) and DeepSpeed (``zero_stage``, ``offload_optimizer``,
``gradient_accumulation_steps``). Every field's ``metadata["description"]`` is what the Dagster
launchpad shows for it.
"""

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Optional

from largetrain_core.model import PRESETS

PRECISIONS = ("auto", "fp32", "fp16", "bf16")
ZERO_STAGES = (0, 1, 2, 3)
# Where the run is reported, not what it trains: outside the config hash, and in Dagster a resource.
TRACKING = ("report_to", "run_name", "wandb", "mlflow")
MODES = ("pretrain", "lora")
EVAL_STRATEGIES = ("steps", "no")
# Evaluation settings change no weight unless early stopping acts on them (then they are in the config hash).
EVALUATION = ("eval_strategy", "eval_steps", "eval_max_sequences", "early_stopping_patience", "early_stopping_threshold")
WANDB_MODES = ("offline", "online", "disabled")


def _doc(text: str) -> dict:
    return {"description": text}


@dataclass
class LoraSettings:
    """LoRA (Hu et al. 2021): W + (lora_alpha / r) B A on the target modules, A and B trained, W frozen."""

    r: int = field(default=8, metadata=_doc("LoRA rank r: inner dimension of the adapter matrices A (r x in) and B (out x r)."))
    lora_alpha: float = field(default=16.0, metadata=_doc("LoRA scaling numerator: the update is scaled by lora_alpha / r."))
    lora_dropout: float = field(default=0.0, metadata=_doc("Dropout probability on the adapter's input, in [0, 1)."))
    target_modules: Optional[list[str]] = field(default=None, metadata=_doc(
        "Module names (last path component, e.g. q_proj, v_proj) to adapt. null = every nn.Linear inside the "
        "decoder blocks (attention and MLP), discovered from the model; the output head is never adapted. "
        "Modules whose weight is tied to another's (lm_head and embed_tokens under tie_word_embeddings) are refused: "
        "their update cannot be merged."))
    adapter_name: str = field(default="default", metadata=_doc(
        "The adapter's name inside the PEFT model (an identifier); load with "
        "PeftModel.from_pretrained(model, dir, adapter_name=...)."))
    merge_export: bool = field(default=False, metadata=_doc(
        "Also write merged/: base + adapter folded into the base weights (peft merge_and_unload), a Hugging Face directory."))


@dataclass
class WandbSettings:
    """Weights & Biases. The API key (online mode) is read by wandb itself from WANDB_API_KEY, never logged."""

    mode: str = field(default="offline", metadata=_doc(
        f"One of {', '.join(WANDB_MODES)}: offline (runs land in <output_dir>/wandb/, upload later with `wandb sync`), "
        "online, or disabled."))
    project: str = field(default="largetrain", metadata=_doc("W&B project."))
    entity: Optional[str] = field(default=None, metadata=_doc("W&B entity (user or team); null = the API key's default."))


@dataclass
class MlflowSettings:
    """MLflow tracking."""

    tracking_uri: Optional[str] = field(default=None, metadata=_doc(
        "MLflow tracking URI (sqlite:///..., http://..., databricks, ...). null = a local SQLite store "
        "sqlite:///<output_dir>/../mlruns.db; a SQLite store keeps new experiments' artefacts beside it in mlartifacts/."))
    experiment_name: str = field(default="largetrain", metadata=_doc("MLflow experiment; created when missing."))


@dataclass
class TrainConfig:
    """Everything one training run needs. Steps are optimizer steps; the learning rate is absolute."""

    output_dir: str = field(metadata=_doc("Directory of checkpoints/, the exported model, metrics.jsonl and summary.json."))
    train_shards: str = field(metadata=_doc("Token-shard directory (largetrain_core.shards); its train split is read."))
    mode: str = field(default="pretrain", metadata=_doc(
        "pretrain (build `preset` from scratch) or lora (load `base_model` and train a LoRA adapter)."))
    preset: str = field(default="llama-3m", metadata=_doc(
        f"Model preset to pretrain (mode pretrain), one of: {', '.join(PRESETS)} (largetrain_core.model.PRESETS; "
        "hidden size, layers and heads there)."))
    base_model: Optional[str] = field(default=None, metadata=_doc("Hugging Face directory of the model to adapt, mode lora."))
    tokenizer: Optional[str] = field(default=None, metadata=_doc(
        "Directory whose tokenizer is saved with the pretrained model; null = the shards' own."))
    zero_stage: int = field(default=2, metadata=_doc(
        f"DeepSpeed ZeRO stage, one of {', '.join(map(str, ZERO_STAGES))} (0: plain data parallel; 1: optimizer state "
        "partitioned across ranks; 2: and gradients; 3: and parameters)."))
    offload_optimizer: bool = field(default=False, metadata=_doc(
        "ZeRO-Offload: keep the optimizer state in CPU memory (needs zero_stage >= 1)."))
    precision: str = field(default="auto", metadata=_doc(
        f"One of {', '.join(PRECISIONS)}: auto (fp16 with dynamic loss scaling on CUDA, fp32 on CPU), fp32, "
        "fp16 (CUDA only) or bf16."))
    activation_checkpointing: bool = field(default=True, metadata=_doc(
        "Recompute each decoder block's activations in the backward pass instead of keeping them."))
    micro_batch_size: int = field(default=4, metadata=_doc("Sequences per rank per forward pass."))
    gradient_accumulation_steps: int = field(default=1, metadata=_doc("Micro-batches per optimizer step."))
    max_steps: int = field(default=100, metadata=_doc(
        "Optimizer steps to train (the total, counting resumed steps); at least warmup_steps."))
    learning_rate: float = field(default=1e-3, metadata=_doc("Peak AdamW learning rate, reached after warmup_steps."))
    min_lr_ratio: float = field(default=0.1, metadata=_doc(
        "Cosine decay floor as a fraction of learning_rate (DeepSpeed WarmupCosineLR cos_min_ratio), in [0, 1]."))
    warmup_steps: int = field(default=10, metadata=_doc(
        "Linear warmup from 0 to learning_rate, in optimizer steps; at most max_steps."))
    weight_decay: float = field(default=0.1, metadata=_doc("AdamW decoupled weight decay."))
    max_grad_norm: float = field(default=1.0, metadata=_doc("Gradient clipping: maximum global L2 norm of the gradients."))
    seed: int = field(default=0, metadata=_doc("Seed of the initialization, the sampler and every RNG."))
    save_steps: int = field(default=50, metadata=_doc("Checkpoint every this many optimizer steps (and at max_steps)."))
    save_total_limit: int = field(default=2, metadata=_doc("Complete checkpoints kept; older ones are deleted."))
    resume_from_checkpoint: str = field(default="auto", metadata=_doc(
        "auto (the newest complete checkpoint in output_dir, else start), never, or a complete checkpoint directory "
        "(.../checkpoints/step-NNNNNN, also one written by another number of ranks: it is converted to DeepSpeed's "
        "universal checkpoint format)."))
    logging_steps: int = field(default=10, metadata=_doc(
        "Log a progress line every this many steps (metrics go to the trackers every step)."))
    eval_strategy: str = field(default="steps", metadata=_doc(
        "steps: validation loss and perplexity on the shards' validation split every eval_steps steps and after the "
        "last step (needs a non-empty validation split); no: no evaluation during training."))
    eval_steps: int = field(default=50, metadata=_doc("Evaluate every this many optimizer steps (eval_strategy steps)."))
    eval_max_sequences: int = field(default=64, metadata=_doc(
        "Validation sequences per evaluation: the first ones of the split (the same each time), divided among the "
        "ranks; bounds the cost of an evaluation."))
    early_stopping_patience: Optional[int] = field(default=None, metadata=_doc(
        "Stop training after this many evaluations in a row without a validation loss below the best one by more "
        "than early_stopping_threshold (a checkpoint is saved there); null = never stop early."))
    early_stopping_threshold: float = field(default=0.0, metadata=_doc(
        "Decrease of the validation loss (nats) that counts as an improvement for early stopping, >= 0."))
    lora: LoraSettings = field(default_factory=LoraSettings, metadata=_doc("LoRA settings (mode lora)."))
    report_to: list[str] = field(default_factory=lambda: ["wandb"], metadata=_doc(
        "Trackers that receive params, per-step metrics and artefacts: any of wandb, mlflow, dagster_pipes "
        "(largetrain_core.training.trackers.TRACKERS), or none. metrics.jsonl in output_dir is always written."))
    run_name: Optional[str] = field(default=None, metadata=_doc("The trackers' run name; null = each tracker's default."))
    wandb: WandbSettings = field(default_factory=WandbSettings, metadata=_doc("Weights & Biases settings (report_to wandb)."))
    mlflow: MlflowSettings = field(default_factory=MlflowSettings, metadata=_doc("MLflow settings (report_to mlflow)."))
    peak_flops: Optional[float] = field(default=None, metadata=_doc(
        "Peak FLOP/s of the whole job's hardware, for MFU. null = derive (CPU: cores x clock x FLOPs/cycle; "
        "CUDA: data-sheet figure by device name; else unknown)."))

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """Build from JSON-like ``d``; raises ValueError naming unknown keys (top level or nested)."""
        return _from_dict(cls, d, "training config")

    def to_dict(self) -> dict:
        return asdict(self)

    def config_hash(self) -> str:
        """sha256 (16 hex digits) of the settings that change the trained weights (not paths, logging,
        trackers, checkpoint cadence, resume, or evaluation without early stopping)."""
        d = self.to_dict()
        for k in ("output_dir", "resume_from_checkpoint", "logging_steps", "save_steps", "save_total_limit",
                  "peak_flops", *TRACKING, *(EVALUATION if self.early_stopping_patience is None else ())):
            d.pop(k)
        d["lora"].pop("merge_export")
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def validate_inputs(self) -> None:
        """Raise ValueError, saying what to change, when the config does not fit its data or its base model:
        the shards' train split (present, not empty), a named resume_from_checkpoint (complete), and in
        mode lora the base model (its ``max_position_embeddings`` at least the shards' ``seq_len``, its
        vocabulary covering the shards' ids, LoRA targets that exist and touch no tied weight). Reads the
        shards' manifest and memory-maps them, and builds the base model from its config.json on the meta
        device: no weights are read. ShardError (a ValueError) when the shards are unreadable."""
        from largetrain_core.shards import TokenShards

        data = TokenShards(Path(self.train_shards), "train")
        p = [] if len(data) else [f"{self.train_shards}: the train split holds no sequence"]
        if self.resume_from_checkpoint not in ("auto", "never"):
            from largetrain_core.training.checkpoints import verify

            problem = verify(Path(self.resume_from_checkpoint))
            if problem:
                p.append(f"resume_from_checkpoint {self.resume_from_checkpoint} is not a complete checkpoint: {problem}")
        if self.mode == "lora" and self.base_model:
            from largetrain_core.training.lora import meta_model, target_problems

            model = meta_model(Path(self.base_model))
            positions = getattr(model.config, "max_position_embeddings", None)
            if positions is not None and positions < data.seq_len:
                p.append(f"the base model {self.base_model} takes at most max_position_embeddings={positions} positions, "
                         f"the shards {self.train_shards} hold sequences of seq_len={data.seq_len} tokens: re-materialize "
                         f"the token shards with seq_len <= {positions}, or use a base model with longer positions")
            if model.config.vocab_size < data.manifest["vocab_size"]:
                p.append(f"{self.train_shards}: token ids up to {data.manifest['vocab_size'] - 1} do not fit the base "
                         f"model's vocabulary of {model.config.vocab_size}: tokenize with the base model's tokenizer")
            p += target_problems(model, self.lora)
        if p:
            raise ValueError("training config does not fit its inputs: " + "; ".join(p))

    def validate(self, cuda: Optional[bool] = None) -> None:
        """Raise ValueError, saying what to change, for an invalid combination. ``cuda`` defaults to torch's view."""
        if cuda is None:
            import torch

            cuda = torch.cuda.is_available()
        problems = _problems(self, cuda)
        if problems:
            raise ValueError("invalid training config: " + "; ".join(problems))


def _from_dict(cls, d: dict, what: str):
    known = {f.name: f for f in fields(cls)}
    unknown = set(d) - set(known)
    if unknown:
        raise ValueError(f"unknown {what} keys {sorted(unknown)}; known: {sorted(known)}")
    d = dict(d)
    for name, f in known.items():
        if isinstance(d.get(name), dict) and isinstance(f.default_factory, type):
            d[name] = _from_dict(f.default_factory, d[name], f"{what} {name}")
    return cls(**d)


def _problems(c: TrainConfig, cuda: bool) -> list[str]:
    from largetrain_core.training.trackers import TRACKERS

    p = []
    if c.mode not in MODES:
        p.append(f"mode must be 'pretrain' or 'lora', not {c.mode!r}")
    if c.mode == "pretrain" and c.preset not in PRESETS:
        p.append(f"preset must be one of {', '.join(PRESETS)}, not {c.preset!r}")
    if c.mode == "lora" and not c.base_model:
        p.append("mode 'lora' needs base_model: the Hugging Face directory of the model to adapt")
    if c.zero_stage not in ZERO_STAGES:
        p.append(f"zero_stage must be one of {', '.join(map(str, ZERO_STAGES))}, not {c.zero_stage}")
    if c.offload_optimizer and c.zero_stage == 0:
        p.append("offload_optimizer needs zero_stage 1, 2 or 3 (ZeRO-Offload partitions the optimizer state)")
    if c.precision not in PRECISIONS:
        p.append(f"precision must be one of {', '.join(PRECISIONS)}, not {c.precision!r}")
    if c.precision == "fp16" and not cuda:
        p.append("precision fp16 needs CUDA: DeepSpeed's CPU accelerator does not support fp16; use 'auto' or 'fp32'")
    for name in ("micro_batch_size", "gradient_accumulation_steps", "max_steps", "save_steps", "save_total_limit",
                 "logging_steps"):
        if getattr(c, name) < 1:
            p.append(f"{name} must be >= 1, not {getattr(c, name)}")
    if c.warmup_steps < 0:
        p.append(f"warmup_steps must be >= 0, not {c.warmup_steps}")
    elif c.warmup_steps > c.max_steps:
        p.append(f"max_steps ({c.max_steps}) is below warmup_steps ({c.warmup_steps}; the learning rate would never "
                 f"reach learning_rate): set warmup_steps to at most {c.max_steps} (e.g. {max(1, c.max_steps // 10)}, "
                 "a tenth of max_steps) or raise max_steps")
    if c.learning_rate <= 0 or not 0 <= c.min_lr_ratio <= 1:
        p.append("learning_rate must be > 0 and min_lr_ratio within 0..1")
    if c.resume_from_checkpoint not in ("auto", "never") and not Path(c.resume_from_checkpoint).is_dir():
        p.append("resume_from_checkpoint must be 'auto', 'never' or an existing checkpoint directory, "
                 f"not {c.resume_from_checkpoint!r}")
    unknown = [t for t in c.report_to if t not in TRACKERS]
    if unknown or len(set(c.report_to)) != len(c.report_to):
        p.append(f"report_to must list distinct trackers among {sorted(TRACKERS)}, not {c.report_to}")
    if c.wandb.mode not in WANDB_MODES:
        p.append(f"wandb.mode must be one of {', '.join(WANDB_MODES)}, not {c.wandb.mode!r}")
    if c.mode == "lora" and (c.lora.r < 1 or c.lora.lora_alpha <= 0):
        p.append("lora.r must be >= 1 and lora.lora_alpha > 0")
    if c.mode == "lora" and not 0 <= c.lora.lora_dropout < 1:
        p.append(f"lora.lora_dropout must be within [0, 1), not {c.lora.lora_dropout}")
    if c.mode == "lora" and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", c.lora.adapter_name or ""):
        p.append(f"lora.adapter_name must be an identifier (letters, digits, _), not {c.lora.adapter_name!r}")
    if c.mode == "pretrain" and c.lora.merge_export:
        p.append("lora.merge_export applies to mode 'lora' only; set it to false for pretraining")
    if c.eval_strategy not in EVAL_STRATEGIES:
        p.append(f"eval_strategy must be one of {', '.join(EVAL_STRATEGIES)}, not {c.eval_strategy!r}")
    if c.eval_steps < 1 or c.eval_max_sequences < 1:
        p.append(f"eval_steps and eval_max_sequences must be >= 1, not {c.eval_steps} and {c.eval_max_sequences}")
    if c.early_stopping_patience is not None and (c.early_stopping_patience < 1 or c.eval_strategy == "no"):
        p.append(f"early_stopping_patience must be null or >= 1 with eval_strategy 'steps', not "
                 f"{c.early_stopping_patience} with {c.eval_strategy!r}")
    if c.early_stopping_threshold < 0:
        p.append(f"early_stopping_threshold must be >= 0 nats, not {c.early_stopping_threshold}")
    if c.peak_flops is not None and c.peak_flops <= 0:
        p.append(f"peak_flops must be > 0 FLOP/s or null (derive), not {c.peak_flops}")
    return p
