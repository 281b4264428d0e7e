"""Training: ``base_checkpoint`` (pretrained with DeepSpeed under torchrun, or imported from a local
Hugging Face directory) and ``lora_adapter`` (PEFT LoRA on the base, trained with DeepSpeed); each with
the blocking check ``loss_finite_and_decreasing``. Wiring only: each asset is one call of its core stage
(largetrain_core.stages.base_checkpoint, lora_adapter); the training runs in its own processes, started
by the launcher resource through Dagster Pipes (largetrain_dagster.resources)."""

import functools
from typing import Optional

from dagster import (
    AssetCheckSpec,
    AssetExecutionContext,
    AssetIn,
    AssetKey,
    Backoff,
    DagsterExecutionInterruptedError,
    Failure,
    PermissiveConfig,
    RetryPolicy,
    asset,
)
from pydantic import Field

from largetrain_core.stages.base_checkpoint import base_checkpoint as base_checkpoint_stage
from largetrain_core.stages.lora_adapter import lora_adapter as lora_adapter_stage
from largetrain_core.stages.training import Launch
from largetrain_core.stages.training_metadata import LOSS_CHECK, MAJORITY_CHECK
from largetrain_core.storage import DiskFullError, local_files, read_json
from largetrain_core.training.config import TrainConfig
from largetrain_core.training.plan import PlanSettings
from largetrain_core.training.task_data import TaskDataSettings
from largetrain_dagster.artifacts import CODE_VERSIONS, materialize_stage, stage_run
from largetrain_dagster.configs import dagster_config
from largetrain_dagster.partitions import shards_text
from largetrain_dagster.resources import LINEAGE_ONLY, Storage, TorchrunLauncher, TrackerSettings, read_handle

# Filled in by the stage (paths, mode) or by the TrackerSettings resource, not by the run config.
SET_BY_ASSET = TrainConfig.set_outside_run_config()
# Production defaults where they differ from TrainConfig's (whose defaults suit a short test run).
TRAINING_DEFAULTS = {
    "schedule.micro_batch_size": 8,
    "schedule.max_steps": 1000,
    "schedule.warmup_steps": 50,
    "checkpointing.save_steps": 200,
    "evaluation.eval_steps": 100,
}


TrainingPlanConfig = dagster_config(PlanSettings, "TrainingPlanConfig")
TaskDataConfig = dagster_config(TaskDataSettings, "TaskDataConfig")
PLAN_FIELD = (
    "The training plan computed before the launch (largetrain_core.training.plan): memory, disk, time and "
    "cost, and what it is checked against. Not part of the data version."
)
NOT_TRAIN_CONFIG = {
    "pretrained_model",
    "plan",
    "task_data",
}  # run config fields of the training assets that are no TrainConfig setting


class BaseCheckpointConfig(
    dagster_config(
        TrainConfig,
        "BaseCheckpointTrainConfig",
        exclude=(*SET_BY_ASSET, "lora", "task"),  # pretraining is causal_lm
        defaults={**TRAINING_DEFAULTS, "model.preset": "llama-20m"},
        base=PermissiveConfig,
    )
):
    """Pretraining of ``base_checkpoint`` (largetrain_core.training.config.TrainConfig), or an import. A
    setting at the top level, as configs before the sections wrote them (``max_steps: 500``), is moved
    into its section with a warning."""

    pretrained_model: Optional[str] = Field(
        default=None,
        description=(
            "A local Hugging Face causal-LM directory (config.json, safetensors, tokenizer) to import instead of "
            "pretraining; the tokenizer asset must then take the same directory's tokenizer."
        ),
    )
    plan: TrainingPlanConfig = Field(default_factory=TrainingPlanConfig, description=PLAN_FIELD)


class LoraAdapterConfig(
    dagster_config(
        TrainConfig,
        "LoraAdapterTrainConfig",
        exclude=(*SET_BY_ASSET, "model"),
        defaults={
            **TRAINING_DEFAULTS,
            "schedule.max_steps": 300,
            "optimizer.learning_rate": 2e-3,
            "optimizer.weight_decay": 0.0,
            "schedule.warmup_steps": 10,
        },
        base=PermissiveConfig,
    )
):
    """Training of ``lora_adapter`` (largetrain_core.training.config.TrainConfig) on the base checkpoint. A
    setting at the top level, as configs before the sections wrote them (``max_steps: 300``), is moved
    into its section with a warning."""

    plan: TrainingPlanConfig = Field(default_factory=TrainingPlanConfig, description=PLAN_FIELD)
    task_data: TaskDataConfig = Field(
        default_factory=TaskDataConfig,
        description=(
            "How the examples of tasks classification and chat are made from domain/deduplicated_text "
            "(largetrain_core.training.task_data.TaskDataSettings); part of the data version for those tasks only."
        ),
    )


def launch(context: AssetExecutionContext, storage: Storage, launcher: TorchrunLauncher, trackers: TrackerSettings):
    """The core stages' Launch: the launcher resource run in this step (through Pipes), its ranks and
    hosts, the trackers' settings, and the latest optimization report for the training plan."""
    return Launch(
        launcher,
        launcher.nproc_per_node,
        max(1, len(launcher.hosts)),
        trackers.model_dump(),
        lambda: latest_report(storage.root),
        context,
    )


def latest_report(root) -> tuple[dict | None, str]:
    """(the latest optimization_report's report.json, or None and why there is none)."""
    handle = read_handle(root, AssetKey("optimization_report"))
    if handle is None:
        return None, "optimization_report has not been materialized"
    report = local_files(handle["path"], ["report.json"]) / "report.json"
    return read_json(report, "optimization report (report.json)"), ""


TRAIN_RETRY = RetryPolicy(max_retries=1, delay=5, backoff=Backoff.LINEAR)
# Raised in the asset's own process, these say that a config, a file or the data is wrong, or the disk is
# full: a retry would fail the same way. (What fails inside the training processes is classified by the launcher.)
DETERMINISTIC = (ValueError, LookupError, FileNotFoundError, NotADirectoryError, DiskFullError)


def not_retried_when_deterministic(fn):
    """Wrap a training asset's compute function: a DETERMINISTIC exception becomes
    ``Failure(allow_retries=False)`` naming it, so TRAIN_RETRY retries only what a retry can fix. So does
    the interrupt of a cancelled run (DagsterExecutionInterruptedError, KeyboardInterrupt), which Dagster
    would otherwise answer with a retry under the step's RetryPolicy before the run ends CANCELED: a
    cancel is not a failure to retry. (The training's processes are stopped by then: runner.run_process.)"""

    @functools.wraps(fn)
    def compute(*args, **kwargs):
        try:
            yield from fn(*args, **kwargs)
        except DETERMINISTIC as e:
            raise Failure(
                f"{fn.__name__}: {type(e).__name__}: {e}. Not retried: it would fail the same way again.",
                allow_retries=False,
            ) from e
        except (DagsterExecutionInterruptedError, KeyboardInterrupt) as e:
            raise Failure(
                f"{fn.__name__}: the run was cancelled ({type(e).__name__}) while it ran; a cancel is not retried",
                allow_retries=False,
            ) from e

    return compute


@asset(
    key="base_checkpoint",
    group_name="training",
    code_version=CODE_VERSIONS["base_checkpoint"],
    ins={
        "shards": AssetIn(key=["pretrain", "token_shards"]),
        "text": AssetIn(key=["pretrain", shards_text("pretrain")], metadata={LINEAGE_ONLY: True}),
        "tokenizer": AssetIn(key="tokenizer", metadata={LINEAGE_ONLY: True}),
    },
    io_manager_key="handles",
    pool="accelerators",
    retry_policy=TRAIN_RETRY,
    kinds={"deepspeed", "pytorch"},
    check_specs=[
        AssetCheckSpec("loss_finite_and_decreasing", asset="base_checkpoint", blocking=True, description=LOSS_CHECK)
    ],
    description="A causal LM pretrained from a preset with DeepSpeed (torchrun, ZeRO, activation checkpointing); a Hugging Face directory.",
)
@not_retried_when_deterministic
def base_checkpoint(
    context: AssetExecutionContext,
    config: BaseCheckpointConfig,
    storage: Storage,
    launcher: TorchrunLauncher,
    trackers: TrackerSettings,
    shards: dict,
    text: Optional[dict],
    tokenizer: Optional[dict],
):
    yield from materialize_stage(
        context,
        config,
        base_checkpoint_stage,
        stage_run(context, storage),
        config.model_dump(exclude=NOT_TRAIN_CONFIG),
        config.plan.to_core(),
        launch(context, storage, launcher, trackers),
        shards,
        text,
        tokenizer,
        text_asset=shards_text("pretrain"),
        pretrained_model=config.pretrained_model,
    )


@asset(
    key="lora_adapter",
    group_name="training",
    code_version=CODE_VERSIONS["lora_adapter"],
    ins={
        "base": AssetIn(key="base_checkpoint"),
        "shards": AssetIn(key=["domain", "token_shards"]),
        "text": AssetIn(key=["domain", "deduplicated_text"]),
        "tokenizer": AssetIn(key="tokenizer", metadata={LINEAGE_ONLY: True}),
    },
    io_manager_key="handles",
    pool="accelerators",
    retry_policy=TRAIN_RETRY,
    kinds={"peft", "deepspeed"},
    check_specs=[
        AssetCheckSpec("loss_finite_and_decreasing", asset="lora_adapter", blocking=True, description=LOSS_CHECK),
        AssetCheckSpec("beats_majority_baseline", asset="lora_adapter", blocking=True, description=MAJORITY_CHECK),
    ],
    description="A LoRA adapter (peft) on the base checkpoint, trained with DeepSpeed: on the domain shards (task "
    "causal_lm), a classifier on the domain corpus's labelled records (task classification), or an assistant on "
    "its conversations (task chat, raw_corpus format chat); a PEFT directory.",
)
@not_retried_when_deterministic
def lora_adapter(
    context: AssetExecutionContext,
    config: LoraAdapterConfig,
    storage: Storage,
    launcher: TorchrunLauncher,
    trackers: TrackerSettings,
    base: dict,
    shards: dict,
    text: dict,
    tokenizer: Optional[dict],
):
    yield from materialize_stage(
        context,
        config,
        lora_adapter_stage,
        stage_run(context, storage),
        config.model_dump(exclude=NOT_TRAIN_CONFIG),
        config.plan.to_core(),
        config.task_data.to_core(),
        launch(context, storage, launcher, trackers),
        base,
        shards,
        text,
        tokenizer,
    )
