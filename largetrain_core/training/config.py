"""The training run's settings: :class:`TrainConfig` (JSON on disk, ``train_config.json``) in typed
sections, each validating its own fields beside them; choices are ``Literal`` types.

Sections (as torchtitan's ``job_config.py`` groups its settings): ``model``, ``schedule`` (steps,
batch, learning-rate schedule), ``optimizer``, ``parallelism``, ``precision``, ``checkpointing``,
``evaluation``, ``health`` (when a finished run counts as trained), ``lora``, ``tracking``. Field names follow Hugging Face ``TrainingArguments``
(``learning_rate``, ``max_grad_norm``, ``warmup_steps``, ``logging_steps``, ``save_steps``,
``save_total_limit``, ``report_to``, ``run_name``, ``resume_from_checkpoint``, ``eval_strategy``,
``eval_steps``; ``early_stopping_patience`` and ``early_stopping_threshold`` as in its
``EarlyStoppingCallback``), PEFT ``LoraConfig`` (``r``, ``lora_alpha``, ``lora_dropout``,
``target_modules``) and DeepSpeed (``zero_stage``, ``offload_optimizer``,
``gradient_accumulation_steps``). Every field's description is what the Dagster launchpad shows.

A config written before the sections (every setting at the top level: ``{"max_steps": 100,
"zero_stage": 2, "precision": "fp32"}``) is still read: :func:`sectioned` moves each setting into its
section and says which it moved. Whether a config fits its inputs (the shards, the base model, the
trackers known) is :mod:`largetrain_core.training.preflight`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable, Literal, Optional

from largetrain_core.model import PRESETS
from largetrain_core.settings import INPUT, OUTPUTS, WEIGHTS, choice_problems, described, from_dict, merged

Mode = Literal["pretrain", "lora"]
Task = Literal["causal_lm", "classification", "chat"]
Precision = Literal["auto", "fp32", "fp16", "bf16"]
ZeroStage = Literal[0, 1, 2, 3]
EvalStrategy = Literal["steps", "no"]
WandbMode = Literal["offline", "online", "disabled"]
Preset = Literal[tuple(PRESETS)]  # type: ignore[valid-type]

log = logging.getLogger("largetrain.training")

MODES, PRECISIONS, ZERO_STAGES = typing.get_args(Mode), typing.get_args(Precision), typing.get_args(ZeroStage)
EVAL_STRATEGIES, WANDB_MODES = typing.get_args(EvalStrategy), typing.get_args(WandbMode)


class Section:
    """A settings section: :meth:`problems` lists what is wrong with its own fields."""

    def problems(self, where: str) -> list[str]:
        """Every invalid value, each naming the field as ``<where>.<field>``; [] when all are valid."""
        return choice_problems(self, f"{where}.")


def _at_least(section, where: str, minimum: int, *names: str) -> list[str]:
    return [
        f"{where}.{n} must be >= {minimum}, not {getattr(section, n)}" for n in names if getattr(section, n) < minimum
    ]


@dataclass
class ModelSettings(Section):
    """What is trained: a preset built from scratch (mode pretrain) or a base model (mode lora)."""

    preset: Preset = field(
        default="llama-3m",
        metadata=described(
            f"Model preset to pretrain (mode pretrain), one of: {', '.join(PRESETS)} (largetrain_core.model.PRESETS; "
            "hidden size, layers and heads there)."
        ),
    )
    base_model: Optional[str] = field(
        default=None,
        metadata=described("Hugging Face directory of the model to adapt, mode lora.", INPUT, set_by="stage"),
    )
    tokenizer: Optional[str] = field(
        default=None,
        metadata=described(
            "Directory whose tokenizer is saved with the pretrained model; null = the shards' own.",
            INPUT,
            set_by="stage",
        ),
    )


@dataclass
class ScheduleSettings(Section):
    """How long, in what steps and in what order: optimizer steps, their size, the learning rate's warmup and
    cosine decay, and the order the sampler reads the shards in."""

    max_steps: int = field(
        default=100,
        metadata=described("Optimizer steps to train (the total, counting resumed steps); at least warmup_steps."),
    )
    micro_batch_size: int = field(default=4, metadata=described("Sequences per rank per forward pass."))
    gradient_accumulation_steps: int = field(default=1, metadata=described("Micro-batches per optimizer step."))
    warmup_steps: int = field(
        default=10, metadata=described("Linear warmup from 0 to learning_rate, in optimizer steps; at most max_steps.")
    )
    min_lr_ratio: float = field(
        default=0.1,
        metadata=described(
            "Cosine decay floor as a fraction of learning_rate (DeepSpeed WarmupCosineLR cos_min_ratio), in [0, 1]."
        ),
    )
    shuffle_window_shards: int = field(
        default=0,
        metadata=described(
            "0: each epoch is one permutation of every train sequence. k > 0: shuffle by windows of k shards (each "
            "epoch the shards are permuted and read k at a time, the sequences of a window permuted together; "
            "largetrain_core.shards.DistributedSampler), so that shards streamed from an object store through a "
            "cache that holds 2k of them (LARGETRAIN_SHARD_CACHE_BYTES) are each fetched once per epoch. Changes the "
            "order, so the trained weights.",
            omit_default=True,
        ),
    )

    def problems(self, where: str) -> list[str]:
        p = _at_least(self, where, 1, "max_steps", "micro_batch_size", "gradient_accumulation_steps")
        p += _at_least(self, where, 0, "shuffle_window_shards")
        if self.warmup_steps < 0:
            p.append(f"{where}.warmup_steps must be >= 0, not {self.warmup_steps}")
        elif self.warmup_steps > self.max_steps:
            p.append(
                f"max_steps ({self.max_steps}) is below warmup_steps ({self.warmup_steps}; the learning rate would "
                f"never reach learning_rate): set warmup_steps to at most {self.max_steps} (e.g. "
                f"{max(1, self.max_steps // 10)}, a tenth of max_steps) or raise max_steps"
            )
        if not 0 <= self.min_lr_ratio <= 1:
            p.append(f"{where}.min_lr_ratio must be within 0..1, not {self.min_lr_ratio}")
        return p


@dataclass
class OptimizerSettings(Section):
    """AdamW (betas 0.9/0.95, eps 1e-8; largetrain_core.training.deepspeed_config)."""

    learning_rate: float = field(
        default=1e-3, metadata=described("Peak AdamW learning rate, reached after warmup_steps.")
    )
    weight_decay: float = field(default=0.1, metadata=described("AdamW decoupled weight decay."))
    max_grad_norm: float = field(
        default=1.0, metadata=described("Gradient clipping: maximum global L2 norm of the gradients.")
    )

    def problems(self, where: str) -> list[str]:
        p = [] if self.learning_rate > 0 else [f"{where}.learning_rate must be > 0, not {self.learning_rate}"]
        if self.weight_decay < 0 or self.max_grad_norm <= 0:
            p.append(
                f"{where}.weight_decay must be >= 0 and max_grad_norm > 0, not {self.weight_decay} and "
                f"{self.max_grad_norm}"
            )
        return p


@dataclass
class ParallelismSettings(Section):
    """How the model's memory and work are spread over the ranks (DeepSpeed ZeRO) and recomputed."""

    zero_stage: ZeroStage = field(
        default=2,
        metadata=described(
            f"DeepSpeed ZeRO stage, one of {', '.join(map(str, ZERO_STAGES))} (0: plain data parallel; 1: optimizer state "
            "partitioned across ranks; 2: and gradients; 3: and parameters)."
        ),
    )
    offload_optimizer: bool = field(
        default=False,
        metadata=described("ZeRO-Offload: keep the optimizer state in CPU memory (needs zero_stage >= 1)."),
    )
    activation_checkpointing: bool = field(
        default=True,
        metadata=described("Recompute each decoder block's activations in the backward pass instead of keeping them."),
    )

    def problems(self, where: str) -> list[str]:
        p = super().problems(where)
        if self.offload_optimizer and self.zero_stage == 0:
            p.append("offload_optimizer needs zero_stage 1, 2 or 3 (ZeRO-Offload partitions the optimizer state)")
        return p


@dataclass
class PrecisionSettings(Section):
    """The number format of the weights' computation."""

    dtype: Precision = field(
        default="auto",
        metadata=described(
            f"One of {', '.join(PRECISIONS)}: auto (fp16 with dynamic loss scaling on CUDA, fp32 on CPU), fp32, "
            "fp16 (CUDA only) or bf16."
        ),
    )

    def problems(self, where: str) -> list[str]:
        # named as the setting was named before it had a section: "precision must be one of ..."
        return [p.replace(f"{where}.dtype", "precision") for p in super().problems(where)]


@dataclass
class CheckpointingSettings(Section):
    """When checkpoints are written, how many are kept, and where a run resumes."""

    save_steps: int = field(
        default=50, metadata=described("Checkpoint every this many optimizer steps (and at max_steps).", OUTPUTS)
    )
    save_total_limit: int = field(
        default=2, metadata=described("Complete checkpoints kept; older ones are deleted.", OUTPUTS)
    )
    gguf_export: Optional[list[str]] = field(
        default=None,
        metadata=described(
            "Also write the exported model as GGUF for llama.cpp, Ollama and LM Studio, one file per type: "
            "gguf/model-<type>.gguf, types f16, q8_0, f32, bf16 (largetrain_core.gguf_export: llama.cpp's own "
            "convert_hf_to_gguf.py). Pretraining converts model/; LoRA converts merged/, so it needs "
            "lora.merge_export. A causal LM only (not a classifier). null: none.",
            OUTPUTS,
            omit_default=True,
        ),
    )
    resume_from_checkpoint: str = field(
        default="auto",
        metadata=described(
            "auto (the newest complete checkpoint in output_dir, else start), never, or a complete checkpoint directory "
            "(.../checkpoints/step-NNNNNN, also one written by another number of ranks: it is converted to DeepSpeed's "
            "universal checkpoint format).",
            None,
        ),
    )
    resume_across_data_change: bool = field(
        default=False,
        metadata=described(
            "Resume a checkpoint whose train data (the token shards' content, seq_len or sequence count) differs from "
            "this run's; false: such a resume is refused, naming what differs (largetrain_core.training.resume_check). "
            "Other changed settings are named at WARNING either way.",
            None,
        ),
    )
    preemption_save: bool = field(
        default=True,
        metadata=described(
            "On SIGTERM (a spot or preemptible node reclaimed, the pod deleted, the run cancelled) every rank finishes "
            "its step, the ranks save a complete checkpoint of it together and exit as preempted (retried); false: "
            "they stop at once and a retry resumes from the last save_steps checkpoint.",
            None,
        ),
    )
    preemption_min_new_steps: int = field(
        default=1,
        metadata=described(
            "The preemption save is skipped (with a log line) when the newest checkpoint is fewer than this many "
            "steps older than the step reached.",
            None,
        ),
    )
    preemption_grace_seconds: float = field(
        default=60.0,
        metadata=described(
            "Seconds between SIGTERM and SIGKILL that the ranks get to save: torchrun's shutdown timeout, the "
            "launcher's stop and the Kubernetes pods' terminationGracePeriodSeconds. Cloud providers give 30 s "
            "(GCP spot, Azure spot) to 120 s (AWS spot's two-minute notice).",
            None,
        ),
    )

    def problems(self, where: str) -> list[str]:
        from largetrain_core.gguf_export import OUTTYPES, converter_dir

        p = _at_least(self, where, 1, "save_steps", "save_total_limit", "preemption_min_new_steps")
        unknown = [t for t in self.gguf_export or [] if t not in OUTTYPES]
        if unknown:
            p.append(f"{where}.gguf_export: unknown GGUF types {unknown}; choose from {list(OUTTYPES)}")
        if self.gguf_export and not (converter_dir() / "convert_hf_to_gguf.py").is_file():
            p.append(
                f"{where}.gguf_export needs llama.cpp's converter in {converter_dir()}: `make install` puts it there "
                "(or set LARGETRAIN_LLAMA_CPP)"
            )
        if not self.preemption_grace_seconds > 0:
            p.append(f"{where}.preemption_grace_seconds must be > 0, not {self.preemption_grace_seconds}")
        if self.resume_from_checkpoint not in ("auto", "never") and not Path(self.resume_from_checkpoint).is_dir():
            p.append(
                "resume_from_checkpoint must be 'auto', 'never' or an existing checkpoint directory, "
                f"not {self.resume_from_checkpoint!r}"
            )
        return p


@dataclass
class EvaluationSettings(Section):
    """Validation loss during training, and early stopping on it."""

    eval_strategy: EvalStrategy = field(
        default="steps",
        metadata=described(
            "steps: validation loss and perplexity on the shards' validation split every eval_steps steps and after the "
            "last step (needs a non-empty validation split); no: no evaluation during training.",
            OUTPUTS,
        ),
    )
    eval_steps: int = field(
        default=50, metadata=described("Evaluate every this many optimizer steps (eval_strategy steps).", OUTPUTS)
    )
    eval_max_sequences: int = field(
        default=64,
        metadata=described(
            "Validation sequences per evaluation: the first ones of the split (the same each time), divided among the "
            "ranks; bounds the cost of an evaluation.",
            OUTPUTS,
        ),
    )
    early_stopping_patience: Optional[int] = field(
        default=None,
        metadata=described(
            "Stop training after this many evaluations in a row without a validation loss below the best one by more "
            "than early_stopping_threshold (a checkpoint is saved there); null = never stop early.",
            OUTPUTS,
        ),
    )
    early_stopping_threshold: float = field(
        default=0.0,
        metadata=described(
            "Decrease of the validation loss (nats) that counts as an improvement for early stopping, >= 0.", OUTPUTS
        ),
    )

    def problems(self, where: str) -> list[str]:
        p = super().problems(where)
        if self.eval_steps < 1 or self.eval_max_sequences < 1:
            p.append(
                f"eval_steps and eval_max_sequences must be >= 1, not {self.eval_steps} and {self.eval_max_sequences}"
            )
        if self.early_stopping_patience is not None and (
            self.early_stopping_patience < 1 or self.eval_strategy == "no"
        ):
            p.append(
                f"early_stopping_patience must be null or >= 1 with eval_strategy 'steps', not "
                f"{self.early_stopping_patience} with {self.eval_strategy!r}"
            )
        if self.early_stopping_threshold < 0:
            p.append(f"early_stopping_threshold must be >= 0 nats, not {self.early_stopping_threshold}")
        return p


@dataclass
class HealthSettings(Section):
    """When a finished training counts as healthy (largetrain_core.training.health, the training assets'
    blocking check): few skipped steps, a loss that fell, and ends below the uniform-prediction level;
    and when a collapsed training stops early. A genuine short run (a smoke test of a few steps) sets
    min_loss_decrease and min_nats_below_uniform to 0: then a finite loss that fell at all, and few
    skipped steps, suffice (the ln V rule is off)."""

    max_skipped_fraction: float = field(
        default=0.1,
        metadata=described(
            "Most steps, as a fraction of all, that DeepSpeed may skip for a gradient overflow (fp16, or ZeRO's check in any "
            "precision) or that may have a non-finite gradient norm. "
            "Source: DeepSpeed's dynamic loss scaling as configured here (initial_scale_power 16, hysteresis 2, "
            "loss_scale_window 1000) skips a step per overflow while the scale comes down at the start, a few steps, "
            "then about one per 1000; a diverged run skips nearly all (issue 23: every step from the 4th).",
            None,
        ),
    )
    min_loss_decrease: float = field(
        default=0.05,
        metadata=described(
            "Least fall of the mean training loss from the first 10% of steps to the last 10%, as a fraction of the "
            "first (0.05 = 5%); 0 = any fall. Source: healthy runs here fell by 10-47% (the 12-step tiny test "
            "pretraining 10%, the quick start's LoRA 32%), the diverged run of issue 23 by under 1%.",
            None,
        ),
    )
    min_nats_below_uniform: float = field(
        default=0.5,
        metadata=described(
            "Least distance (nats) of the last 10% of steps' mean loss below ln(vocabulary size), the loss of a "
            "model that predicts every token equally; 0 = any distance. Source: a model that learnt only the tokens' "
            "frequencies is already ln(V) minus the unigram entropy below it (0.9-2.5 nats on the test corpora, "
            "vocabularies of 300-512); a diverged run stays at ln(V).",
            None,
        ),
    )
    stop_after_collapsed_steps: Optional[int] = field(
        default=50,
        metadata=described(
            "Stop the training early, before max_steps, after this many consecutive collapsed steps: each skipped "
            "for a gradient overflow, with a non-finite loss or gradient norm, or (after the warmup) with a loss within "
            "health.collapse_tolerance nats of ln(vocabulary size), a uniform prediction's loss. The run then fails "
            "this check, naming the steps. null = never stop. Source: fp16's loss scaler as configured here skips at "
            "most about 32 steps in a row while its scale comes down from 2^16 (hysteresis 2), so 50 stops no healthy "
            "run; a diverged run skips every step from the 4th (issue 23).",
            None,
        ),
    )
    collapse_tolerance: float = field(
        default=0.01,
        metadata=described(
            "Nats from ln(vocabulary size) within which a step's loss counts as collapsed to the uniform prediction "
            "(health.stop_after_collapsed_steps; after schedule.warmup_steps only, as a fresh model starts there). "
            "Source: a model predicting every token equally trains at ln(V) within 1e-4 nats "
            "(tests/integration/test_training_health.py); after their warmup the demo's pretraining (V 8192) is at "
            "least 1.57 nats below it and its LoRA 2.85.",
            None,
        ),
    )
    warning_interval_s: float = field(
        default=30.0,
        metadata=described(
            "Seconds between two rank warnings of one kind (skipped step, non-finite loss or gradient norm) in the "
            "log, after the first 3 of each kind; the ones held back are counted in the next.",
            None,
        ),
    )

    def problems(self, where: str) -> list[str]:
        p = []
        if not 0 <= self.max_skipped_fraction <= 1:
            p.append(f"{where}.max_skipped_fraction must be in [0, 1], not {self.max_skipped_fraction}")
        if not 0 <= self.min_loss_decrease < 1:
            p.append(f"{where}.min_loss_decrease must be in [0, 1), not {self.min_loss_decrease}")
        if self.stop_after_collapsed_steps is not None and self.stop_after_collapsed_steps < 1:
            p.append(f"{where}.stop_after_collapsed_steps must be >= 1 or null, not {self.stop_after_collapsed_steps}")
        for n in ("min_nats_below_uniform", "warning_interval_s", "collapse_tolerance"):
            if getattr(self, n) < 0:
                p.append(f"{where}.{n} must be >= 0, not {getattr(self, n)}")
        return p


@dataclass
class LoraSettings(Section):
    """LoRA (Hu et al. 2021): W + (lora_alpha / r) B A on the target modules, A and B trained, W frozen."""

    r: int = field(
        default=8,
        metadata=described("LoRA rank r: inner dimension of the adapter matrices A (r x in) and B (out x r)."),
    )
    lora_alpha: float = field(
        default=16.0, metadata=described("LoRA scaling numerator: the update is scaled by lora_alpha / r.")
    )
    lora_dropout: float = field(
        default=0.0, metadata=described("Dropout probability on the adapter's input, in [0, 1).")
    )
    target_modules: Optional[list[str]] = field(
        default=None,
        metadata=described(
            "Module names (last path component, e.g. q_proj, v_proj) to adapt. null = every linear layer inside the "
            "decoder blocks (attention and MLP: nn.Linear, or transformers Conv1D as in GPT-2, with fan_in_fan_out), "
            "discovered from the model; the output head is never adapted. "
            "Modules whose weight is tied to another's (lm_head and embed_tokens under tie_word_embeddings) are refused: "
            "their update cannot be merged."
        ),
    )
    adapter_name: str = field(
        default="default",
        metadata=described(
            "The adapter's name inside the PEFT model (an identifier); load with "
            "PeftModel.from_pretrained(model, dir, adapter_name=...)."
        ),
    )
    merge_export: bool = field(
        default=False,
        metadata=described(
            "Also write merged/: base + adapter folded into the base weights (peft merge_and_unload), a Hugging Face directory.",
            OUTPUTS,
        ),
    )

    def problems(self, where: str) -> list[str]:
        import re

        p = []
        if self.r < 1 or self.lora_alpha <= 0:
            p.append(f"{where}.r must be >= 1 and {where}.lora_alpha > 0")
        if not 0 <= self.lora_dropout < 1:
            p.append(f"{where}.lora_dropout must be within [0, 1), not {self.lora_dropout}")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.adapter_name or ""):
            p.append(f"{where}.adapter_name must be an identifier (letters, digits, _), not {self.adapter_name!r}")
        return p


@dataclass
class WandbSettings(Section):
    """Weights & Biases. The API key (online mode) is read by wandb itself from WANDB_API_KEY, never logged."""

    mode: WandbMode = field(
        default="offline",
        metadata=described(
            f"One of {', '.join(WANDB_MODES)}: offline (runs land in <output_dir>/wandb/, upload later with `wandb sync`), "
            "online, or disabled."
        ),
    )
    project: str = field(default="largetrain", metadata=described("W&B project."))
    entity: Optional[str] = field(
        default=None, metadata=described("W&B entity (user or team); null = the API key's default.")
    )


@dataclass
class MlflowSettings(Section):
    """MLflow tracking."""

    tracking_uri: Optional[str] = field(
        default=None,
        metadata=described(
            "MLflow tracking URI (sqlite:///..., http://..., databricks, ...). null = a local SQLite store "
            "sqlite:///<output_dir>/../mlruns.db; a SQLite store keeps new experiments' artifacts beside it in mlartifacts/."
        ),
    )
    experiment_name: str = field(default="largetrain", metadata=described("MLflow experiment; created when missing."))


@dataclass
class TrackingSettings(Section):
    """Where the run is reported (trackers: largetrain_core.training.trackers) and how often it says so."""

    report_to: list[str] = field(
        default_factory=lambda: ["wandb"],
        metadata=described(
            "Trackers that receive params, per-step metrics and artifacts: any of wandb, mlflow, dagster_pipes "
            "(largetrain_core.training.trackers.TRACKERS), or none. metrics.jsonl in output_dir is always written.",
            None,
            set_by="resource",
        ),
    )
    run_name: Optional[str] = field(
        default=None,
        metadata=described("The trackers' run name; null = each tracker's default.", None, set_by="resource"),
    )
    logging_steps: int = field(
        default=10,
        metadata=described(
            "Log a progress line every this many steps (metrics go to the trackers every step).", OUTPUTS
        ),
    )
    peak_flops: Optional[float] = field(
        default=None,
        metadata=described(
            "Peak FLOP/s of the whole job's hardware, for MFU. null = derive (CPU: cores x clock x FLOPs/cycle; "
            "CUDA: data-sheet figure by device name; else unknown).",
            None,
        ),
    )
    wandb: WandbSettings = field(
        default_factory=WandbSettings,
        metadata=described("Weights & Biases settings (report_to wandb).", None, set_by="resource"),
    )
    mlflow: MlflowSettings = field(
        default_factory=MlflowSettings,
        metadata=described("MLflow settings (report_to mlflow).", None, set_by="resource"),
    )

    def problems(self, where: str) -> list[str]:
        p = _at_least(self, where, 1, "logging_steps") + self.wandb.problems(f"{where}.wandb")
        if len(set(self.report_to)) != len(self.report_to):
            p.append(f"{where}.report_to must list distinct trackers, not {self.report_to}")
        if self.peak_flops is not None and self.peak_flops <= 0:
            p.append(f"peak_flops must be > 0 FLOP/s or null (derive), not {self.peak_flops}")
        return p


@dataclass
class TrainConfig:
    """Everything one training run needs. Steps are optimizer steps; the learning rate is absolute."""

    output_dir: str = field(
        metadata=described(
            "Directory of checkpoints/, the exported model, metrics.jsonl and summary.json.", None, set_by="stage"
        )
    )
    train_shards: str = field(
        metadata=described(
            "Token-shard directory (largetrain_core.shards); its train split is read.", INPUT, set_by="stage"
        )
    )
    mode: Mode = field(
        default="pretrain",
        metadata=described(
            "pretrain (build model.preset from scratch) or lora (load model.base_model and train a LoRA adapter).",
            INPUT,
            set_by="stage",
        ),
    )
    task: Task = field(
        default="causal_lm",
        metadata=described(
            "What is learnt (largetrain_core.training.tasks): causal_lm (the next-token loss over the token shards: "
            "pretraining, domain adaptation), classification (a label per record: a sequence-classification head "
            "with LoRA) or chat (the trained assistant turns of conversations, packed). classification and chat "
            "need mode lora and task examples (largetrain_core.training.tasks) as train_shards.",
            omit_default=True,
        ),
    )
    seed: int = field(default=0, metadata=described("Seed of the initialization, the sampler and every RNG."))
    model: ModelSettings = field(default_factory=ModelSettings, metadata=described(ModelSettings.__doc__))
    schedule: ScheduleSettings = field(default_factory=ScheduleSettings, metadata=described(ScheduleSettings.__doc__))
    optimizer: OptimizerSettings = field(
        default_factory=OptimizerSettings, metadata=described(OptimizerSettings.__doc__)
    )
    parallelism: ParallelismSettings = field(
        default_factory=ParallelismSettings, metadata=described(ParallelismSettings.__doc__)
    )
    precision: PrecisionSettings = field(
        default_factory=PrecisionSettings, metadata=described(PrecisionSettings.__doc__)
    )
    checkpointing: CheckpointingSettings = field(
        default_factory=CheckpointingSettings, metadata=described(CheckpointingSettings.__doc__)
    )
    evaluation: EvaluationSettings = field(
        default_factory=EvaluationSettings, metadata=described(EvaluationSettings.__doc__)
    )
    health: HealthSettings = field(default_factory=HealthSettings, metadata=described(HealthSettings.__doc__))
    lora: LoraSettings = field(default_factory=LoraSettings, metadata=described("LoRA settings (mode lora)."))
    tracking: TrackingSettings = field(default_factory=TrackingSettings, metadata=described(TrackingSettings.__doc__))

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """Build from JSON-like ``d``, sectioned as :meth:`to_dict` writes it. A config written before the
        sections is read through the one deprecation shim, :func:`read_sectioned`. Raises ValueError
        naming unknown keys (top level or nested)."""
        return from_dict(cls, read_sectioned(d, "training config", log.warning), "training config")

    @classmethod
    def from_settings(cls, **settings) -> "TrainConfig":
        """Build from every setting under its own name, as :meth:`settings` gives them (``max_steps=8,
        zero_stage=3, precision="fp32", lora={"r": 4}``). Raises ValueError naming unknown names."""
        return from_dict(cls, sectioned(settings)[0], "training config")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def set_outside_run_config(cls) -> tuple[str, ...]:
        """The dotted names of the settings that a training stage (its paths and mode) or a resource (the
        trackers) sets, never the run config: the fields marked ``set_by``."""
        hints = typing.get_type_hints(cls)
        out = []
        for f in fields(cls):
            if f.metadata.get("set_by"):
                out.append(f.name)
            elif isinstance(f.default_factory, type) and issubclass(f.default_factory, Section):
                out += [f"{f.name}.{g.name}" for g in fields(hints[f.name]) if g.metadata.get("set_by")]
        return tuple(out)

    def with_settings(self, **settings) -> "TrainConfig":
        """A copy with ``settings`` (by their own names, as :meth:`settings` gives them: ``max_steps=3,
        zero_stage=0, lora={"r": 4}``) replaced. Raises ValueError naming an unknown name."""
        return from_dict(type(self), merged(self.to_dict(), sectioned(settings)[0]), "training config")

    def settings(self) -> dict:
        """Every setting under its own name, without the sections (``{"max_steps": ..., "zero_stage": ...,
        "precision": "fp32", "lora": {...}, "wandb": {...}}``): the names the setting has everywhere, and
        the form the config hash and the training assets' data versions are computed from (unchanged by
        the sections)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "lora" or not isinstance(value, Section):
                out[f.name] = asdict(value) if isinstance(value, Section) else value
            elif f.name == "precision":
                out["precision"] = value.dtype
            else:
                out.update(asdict(value))
        return out

    def identity(self, scope: Literal["weights", "artifact"]) -> dict:
        """The settings that make this run what it is, under their own names (as :meth:`settings` gives them),
        read from each field's marks (largetrain_core.settings.described):

        * ``"weights"``: what changes the trained weights: the fields marked WEIGHTS and INPUT (the paths
          and mode the stage sets), and the evaluation settings when early stopping acts on them; the
          :meth:`config_hash` of a checkpoint.
        * ``"artifact"``: what changes the training's output directory: the fields marked WEIGHTS and
          OUTPUTS (checkpoint cadence, evaluations, exports), not INPUT (the stage's inputs' data versions
          stand for those); the training assets' data versions.

        Never in either: the fields marked None (trackers, resume, preemption, health thresholds, peak
        FLOP/s). A field marked ``omit_default`` is left out at its default; a setting of one mode only
        (:data:`MODE_ONLY`) is left out in the other."""
        counted = {"weights": (WEIGHTS, INPUT), "artifact": (WEIGHTS, OUTPUTS)}[scope]
        early_stopping = scope == "weights" and self.evaluation.early_stopping_patience is not None

        def kept(f, value) -> bool:
            mark = f.metadata.get("identity", WEIGHTS)
            if early_stopping and f.name in EVALUATION:
                mark = WEIGHTS
            if MODE_ONLY.get(f.name, self.mode) != self.mode:
                return False
            return mark in counted and not (f.metadata.get("omit_default") and value == f.default)

        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "lora":
                if kept(f, value):
                    out["lora"] = {
                        g.name: getattr(value, g.name) for g in fields(value) if kept(g, getattr(value, g.name))
                    }
            elif isinstance(value, Section):
                for g in fields(value):
                    name = "precision" if f.name == "precision" else g.name
                    v = getattr(value, g.name)
                    if kept(g, v):
                        out[name] = asdict(v) if isinstance(v, Section) else v
            elif kept(f, value):
                out[f.name] = value
        return out

    def config_hash(self) -> str:
        """sha256 (16 hex digits) of :meth:`identity` ``("weights")``, the input paths as written. A checkpoint
        records largetrain_core.training.resume_check's hash instead, of the inputs' content digests."""
        return hashlib.sha256(json.dumps(self.identity("weights"), sort_keys=True).encode()).hexdigest()[:16]

    def problems(self, cuda: bool) -> list[str]:
        """Every invalid value or combination (each section's own, then those across sections), each
        saying what to change; ``cuda``: whether this machine has CUDA (fp16 needs it)."""
        p = choice_problems(self)
        for f in fields(self):
            section = getattr(self, f.name)
            if isinstance(section, Section) and (f.name != "lora" or self.mode == "lora"):
                p += section.problems(f.name)
        if self.mode == "lora" and not self.model.base_model:
            p.append("mode 'lora' needs model.base_model: the Hugging Face directory of the model to adapt")
        if self.precision.dtype == "fp16" and not cuda:
            p.append(
                "precision fp16 needs CUDA: DeepSpeed's CPU accelerator does not support fp16; use 'auto' or 'fp32'"
            )
        if self.task != "causal_lm" and self.mode != "lora":
            p.append(f"task {self.task!r} fine-tunes a base model: it needs mode 'lora' (pretraining is causal_lm)")
        if self.task == "classification" and self.lora.merge_export:
            p.append("lora.merge_export is for tasks causal_lm and chat; a classifier is loaded with PeftModel")
        if self.mode == "pretrain" and self.lora.merge_export:
            p.append("lora.merge_export applies to mode 'lora' only; set it to false for pretraining")
        if self.checkpointing.gguf_export and self.task == "classification":
            p.append("checkpointing.gguf_export converts a causal LM; a classifier has no GGUF export")
        elif self.checkpointing.gguf_export and self.mode == "lora" and not self.lora.merge_export:
            p.append("checkpointing.gguf_export of an adapter converts merged/: set lora.merge_export to true")
        return p

    def validate(self, cuda: Optional[bool] = None) -> None:
        """Raise ValueError listing :meth:`problems`. ``cuda`` defaults to torch's view."""
        if cuda is None:
            import torch

            cuda = torch.cuda.is_available()
        problems = self.problems(cuda)
        if problems:
            raise ValueError("invalid training config: " + "; ".join(problems))


# The settings of one mode only: left out of the other mode's identity.
MODE_ONLY = {"preset": "pretrain", "lora": "lora"}
# Where the run is reported, not what it trains: outside the config hash, and in Dagster a resource.
TRACKING = ("report_to", "run_name", "wandb", "mlflow")
# How a run stops on SIGTERM: no weight changes (a resume is bitwise), outside the config hash.
PREEMPTION = ("preemption_save", "preemption_min_new_steps", "preemption_grace_seconds")
# Evaluation settings change no weight unless early stopping acts on them (then they are in the config hash).
EVALUATION = tuple(f.name for f in fields(EvaluationSettings))
# How a finished run is judged, not what it trains: outside the config hash and the data versions.
HEALTH = tuple(f.name for f in fields(HealthSettings))
SECTIONS = {
    f.name: typing.get_type_hints(TrainConfig)[f.name]
    for f in fields(TrainConfig)
    if isinstance(f.default_factory, type) and issubclass(f.default_factory, Section)
}
# A setting's section, by the name it had before the sections (every name is unique across them).
SECTION_OF = {
    name: section for section, cls in SECTIONS.items() if section != "lora" for name in (f.name for f in fields(cls))
}
SECTION_OF["precision"] = "precision"


def read_sectioned(d: dict, source: str, warn: Callable[[str], None]) -> dict:
    """The deprecation shim of the names before the sections, the one place they are accepted from a
    config (a run config, a train_config.json): ``d`` with every setting written at the top level moved
    into its section (:func:`sectioned`), and ``warn`` (a logger's ``warning``) called once naming
    ``source`` and each name moved. Raises ValueError as :func:`sectioned` does."""
    d, moved = sectioned(d)
    if moved:
        warn(
            f"{source}: settings written without their sections (deprecated), read as {', '.join(moved)}; "
            "write them there (docs/CONFIG.md) to silence this"
        )
    return d


def sectioned(d: dict) -> tuple[dict, list[str]]:
    """(``d`` with every setting written outside its section moved into it, the names moved).

    A config written before the sections had every setting at the top level (``max_steps``,
    ``zero_stage``, ``precision: fp16``, ``wandb: {...}``); each such name moves to its section
    (``schedule.max_steps``, ``parallelism.zero_stage``, ``precision.dtype``, ``tracking.wandb``),
    replacing the section's value: the section may hold only the defaults that Dagster fills in.
    Raises ValueError naming a top-level key that is no setting (with the closest names) or a section
    that is not a mapping."""
    top = {f.name for f in fields(TrainConfig)}
    unknown = [k for k in d if k not in top and k not in SECTION_OF]
    if unknown:
        import difflib

        names = sorted(top | {f"{SECTION_OF[n]}.{n}" for n in SECTION_OF if n != "precision"})
        full = {**{n.rpartition(".")[2]: n for n in names}, **{n: n for n in names}}
        hints = [
            f"{k}: did you mean {' or '.join(full[c] for c in close)}?"
            for k in unknown
            if (close := difflib.get_close_matches(k, list(full), n=2, cutoff=0.75))
        ]
        raise ValueError(
            f"unknown training config keys {sorted(unknown)}"
            + (f" ({'; '.join(hints)})" if hints else "")
            + f"; settings: {', '.join(names)} (docs/CONFIG.md)"
        )
    out = {k: (dict(v) if k in SECTIONS and isinstance(v, dict) else v) for k, v in d.items()}
    moved = []
    for name in list(out):
        flat_precision = name == "precision" and not isinstance(out[name], dict)
        if name in SECTIONS and not flat_precision or name not in SECTION_OF:
            continue
        value = out.pop(name)
        section, leaf = SECTION_OF[name], ("dtype" if flat_precision else name)
        target = out.setdefault(section, {})
        if not isinstance(target, dict):
            raise ValueError(f"training config: {section} must be a mapping of its settings, not {target!r}")
        target[leaf] = value
        moved.append(f"{name} -> {section}.{leaf}")
    return out, moved
