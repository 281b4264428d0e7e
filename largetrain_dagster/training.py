"""Training: ``base_checkpoint`` (pretrained with DeepSpeed under torchrun, or imported from a local
Hugging Face directory) and ``lora_adapter`` (PEFT LoRA on the base, trained with DeepSpeed); each with
the blocking check ``loss_finite_and_decreasing``. The training runs in its own processes, started by
the launcher resource through Dagster Pipes (largetrain_dagster.resources)."""

import functools
import json
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetIn,
    Backoff,
    Config,
    DagsterExecutionInterruptedError,
    Failure,
    MetadataValue,
    Output,
    PermissiveConfig,
    RetryPolicy,
    asset,
)
from pydantic import Field

from largetrain_core.digest import DigestCache, tree_digest
from largetrain_core.model import embedding_overflow, import_pretrained, max_positions, tokenizer_mismatch
from largetrain_core.shards import TokenShards
from largetrain_core.storage import (
    DiskFullError,
    data_version,
    fetch_tree,
    local_copy,
    local_files,
    read_json,
    stored_location,
)
from largetrain_core.stages.base import StageError
from largetrain_core.stages.training import fine_tuning_examples, local_dir, seal_training, train, training_version
from largetrain_core.training import task_evaluation
from largetrain_core.training.task_data import TaskDataSettings
from largetrain_core.training import health
from largetrain_core.training.config import TrainConfig, sectioned
from largetrain_core.training.plan import PlanSettings
from largetrain_core.training.trackers import METRICS, RECORDS, log_outputs, read_metrics
from largetrain_dagster.artifacts import CODE_VERSIONS, asset_output, build_or_reuse, stage_run
from largetrain_dagster.configs import dagster_config, deep_merge
from largetrain_dagster.model_cards import write_card
from largetrain_dagster.planning import plan_metadata, plan_training
from largetrain_dagster.resources import Storage, TorchrunLauncher, TrackerSettings

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
)  # what the shards and a model directory carry of their tokenizer
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


def train_config(context, config: Config, **set_by_asset) -> TrainConfig:
    """The TrainConfig of a training asset's run ``config`` with ``set_by_asset`` (paths, mode, nested
    ones as dicts: ``model={"base_model": ...}``) merged in. Settings written outside their sections
    (an old run config) are moved into them, with a WARNING in the run log naming each. Raises
    ValueError for an unknown or invalid setting (nothing has been launched)."""
    d, moved = sectioned(config.model_dump(exclude=NOT_TRAIN_CONFIG))
    if moved:
        context.log.warning(
            f"run config of {context.op.name}: settings written without their sections, read as "
            f"{', '.join(moved)}; write them there (docs/CONFIG.md) to silence this"
        )
    return TrainConfig.from_dict(deep_merge(d, set_by_asset))


def _loss_check(context: AssetExecutionContext, out: Path, summary: dict, cfg: TrainConfig) -> AssetCheckResult:
    """The blocking check of a finished training: largetrain_core.training.health.judge_metrics of its
    metrics.jsonl with the run config's ``health`` thresholds (read now, so a changed threshold re-judges
    a reused training); its counts and causes in the run log too."""
    verdict = health.judge_metrics(out / METRICS, summary.get("vocab_size"), cfg.health, summary.get("collapsed"))
    n = verdict.numbers
    counts = (
        f"{n.get('skipped_steps', 0)} of {n['steps_logged']} steps skipped (gradient overflow), "
        f"{n.get('nonfinite_grad_norm_steps', 0)} with a non-finite gradient norm, "
        f"{n.get('nonfinite_loss_steps', 0)} with a non-finite loss"
    )
    if verdict.passed:
        context.log.info(f"training health of {context.op.name}: {counts}; passed")
    else:
        context.log.error(f"training health of {context.op.name}: {counts}; failed: " + "; ".join(verdict.problems))
    return AssetCheckResult(
        check_name="loss_finite_and_decreasing",
        passed=verdict.passed,
        severity=AssetCheckSeverity.ERROR,
        description="; ".join(verdict.problems) or None,
        metadata={**{k: v for k, v in n.items() if v is not None}, "problems": MetadataValue.json(verdict.problems)},
    )


def log_trained_outputs(context: AssetExecutionContext, out: Path, summary: dict) -> None:
    """Log the exported directory (and merged/) to the training's tracker runs, after its model card and
    lineage.json are written into it (trackers.log_outputs; the training itself logged only the curves)."""
    logged = log_outputs(out, [local_dir(summary["output"]), out / "merged"])
    if logged:
        context.log.info(f"{local_dir(summary['output']).name}/ with its model card logged to {', '.join(logged)}")


def _train_output(out: Path, version: str, summary: dict, cfg: TrainConfig, reused: bool) -> Output:
    """Metadata: the training's settings (``config``: sectioned, as train_config.json, less its paths), the curves (training and validation loss and learning rate against step) as an inline
    PNG and its path, the run's numbers rounded with the unit in the name (:func:`training_numbers`),
    the loss table, and each tracker's run record (``<tracker>_run_id``, its location, e.g.
    ``wandb_sync_command`` for offline W&B)."""
    import base64

    rows = read_metrics(out / METRICS)
    extra = {}
    png = local_dir(summary.get("loss_curve") or out / "loss_curve.png")
    if png.suffix == ".png" and png.exists():
        b64 = base64.b64encode(png.read_bytes()).decode()
        extra["training_curves"] = MetadataValue.md(
            f"![training and validation loss, learning rate](data:image/png;base64,{b64})"
        )
        extra["training_curves_png"] = MetadataValue.path(str(png))
    extra.update(training_numbers(summary, rows))
    extra.update(plan_metadata(out, summary, rows))
    extra.update(
        {
            "loss_table": MetadataValue.md(loss_table(rows)),
            "mfu_formula": MetadataValue.text(summary["mfu_formula"]),
            "precision": summary["precision"],
            "precision_reason": summary["precision_reason"],
            "peak_flops_source": str(summary.get("peak_flops_source")),
            "output": MetadataValue.path(summary["output"]),
            "resumed_from": (
                MetadataValue.path(summary["resumed_from"])
                if summary.get("resumed_from")
                else "none: started from step 0"
            ),
            **_tracker_metadata(out / RECORDS),
        }
    )
    settings = {k: v for k, v in cfg.to_dict().items() if k not in ("output_dir", "train_shards")}
    return asset_output(out, version, {**summary}, settings, reused, extra, stats_metadata=False)


def training_numbers(summary: dict, rows: list[dict]) -> dict:
    """The run's numbers for people and Dagster's plots: every integer of the summary as it is (steps,
    parameters, resumed_from_step, ...), and its measurements rounded, the unit in the name (losses in
    nats to 3 decimals, percentages to 1, TFLOP/s to 3, seconds to 1, memory in GiB to 3); None left out."""
    last = rows[-1] if rows else {}
    peak_mem = last.get("peak_memory_gib", last.get("peak_rss_gib"))

    def r(value, digits):
        return None if value is None else round(value, digits) if digits else int(round(value))

    def pct(value):
        return None if value is None else round(100 * value, 1)

    numbers = {k: v for k, v in summary.items() if isinstance(v, int) and not isinstance(v, bool)}
    numbers.update(
        {
            "stopped_early": summary.get("stopped_early"),
            "first_loss": r(summary["first_loss"], 3),
            "last_loss": r(summary["last_loss"], 3),
            "eval_loss": r(summary.get("eval_loss"), 3),
            "eval_perplexity": r(summary.get("eval_perplexity"), 2),
            "best_eval_loss": r(summary.get("best_eval_loss"), 3),
            "best_eval_step": summary.get("best_eval_step"),
            "tokens_per_s": r(summary["tokens_per_s"], 0),
            "mfu_percent": pct(summary["mfu"]),
            "mean_mfu_percent": pct(summary.get("mean_mfu")),
            "peak_tflops": r(summary["peak_flops"] / 1e12 if summary["peak_flops"] else None, 3),
            "mflops_per_token": r(summary["flops_per_token"] / 1e6, 2),
            "peak_memory_gib": r(peak_mem, 3),
            "train_seconds": r(summary["train_seconds"], 1),
            "eval_seconds": r(summary.get("eval_seconds"), 1),
            "trainable_percent": round(100 * summary["trainable_parameters"] / summary["parameters"], 2),
        }
    )
    return {k: v for k, v in numbers.items() if v is not None}


def loss_table(rows: list[dict], about: int = 20) -> str:
    """Markdown table of about ``about`` evenly spaced steps plus every evaluated step and the last step:
    step, training loss, validation loss, learning rate, MFU (%)."""
    every = max(1, len(rows) // about)
    keep = {r["step"] for r in rows[::every]} | {r["step"] for r in rows if r.get("eval_loss") is not None}
    keep |= {rows[-1]["step"]} if rows else set()

    def num(value, fmt):
        return "" if value is None else format(value, fmt)

    lines = [
        f"| {r['step']} | {num(r['loss'], '.4f')} | {num(r.get('eval_loss'), '.4f')} | {num(r.get('lr'), '.2e')} | "
        f"{num(100 * r['mfu'] if r.get('mfu') is not None else None, '.1f')} |"
        for r in rows
        if r["step"] in keep
    ]
    return (
        "| step | training loss (nats) | validation loss (nats) | learning rate | MFU (%) |\n|---|---|---|---|---|\n"
        + "\n".join(lines)
    )


def adapter_metadata(adapter_dir: Path) -> dict:
    """``lora_r``, ``lora_alpha`` and ``lora_target_modules`` (sorted, comma-separated) from PEFT's
    adapter_config.json in ``adapter_dir``; {} when it is missing."""
    f = Path(adapter_dir) / "adapter_config.json"
    if not f.exists():
        return {}
    a = json.loads(f.read_text())
    return {
        "lora_r": a.get("r"),
        "lora_alpha": a.get("lora_alpha"),
        "lora_target_modules": ", ".join(sorted(a.get("target_modules") or [])),
    }


def _tracker_metadata(records_file: Path) -> dict:
    """``<tracker>_<key>`` for every entry of every tracker's run record (trackers.json): directories as
    paths, URLs as links, commands as code."""
    records = json.loads(records_file.read_text()) if records_file.exists() else {}
    md = {}
    for name, record in sorted(records.items()):
        for k, v in record.items():
            md[f"{name}_{k}"] = (
                MetadataValue.path(v)
                if k == "dir"
                else MetadataValue.url(v)
                if k == "url"
                else MetadataValue.md(f"`{v}`")
                if k.endswith("_command")
                else str(v)
            )
    return md


LOSS_CHECK = (
    "training health (largetrain_core.training.health; thresholds in the run config's health section): every "
    "training loss finite; at most health.max_skipped_fraction of the steps skipped (gradient overflow) or with a "
    "non-finite gradient norm; the mean loss of the last 10% of steps below that of the first 10% by "
    "health.min_loss_decrease and below ln(vocabulary size), a uniform prediction's loss, by "
    "health.min_nats_below_uniform nats (0: not judged); not stopped early as collapsed "
    "(health.stop_after_collapsed_steps) (blocking)"
)

MAJORITY_CHECK = (
    "task classification: the classifier's macro-F1 on the held-out test split is above the majority-class "
    "baseline's (largetrain_core.training.task_evaluation.evaluate_classifier; blocking). Other tasks: passes, with a note."
)

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
    ins={"shards": AssetIn(key=["pretrain", "token_shards"])},
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
):
    if config.pretrained_model:
        yield from _import_base(context, config, storage, shards)
        return
    set_by_asset = {"mode": "pretrain", "train_shards": shards["path"], "model": {"tokenizer": shards["path"]}}
    settled = _settled(context, config, set_by_asset)
    version = training_version(
        "base_checkpoint", settled, shards["data_version"], ranks=launcher.nproc_per_node, pretrained_model=None
    )
    yield from _trained(context, storage, launcher, trackers, "base_checkpoint", version, settled, config, shards)


def _settled(context, config: Config, set_by_asset: dict) -> TrainConfig:
    """:func:`train_config` of the run config before the output directory is known (its data version is
    computed from it); a bad setting is a Failure that is not retried."""
    try:
        return train_config(context, config, **deep_merge(set_by_asset, {"output_dir": "-"}))
    except ValueError as e:
        raise Failure(
            f"{context.op.name}: {e}. Nothing was launched; not retried (change the config).", allow_retries=False
        ) from e


def _import_base(context: AssetExecutionContext, config: BaseCheckpointConfig, storage: Storage, shards: dict):
    """base_checkpoint from an existing local HF model: checked against the shards' tokenizer, copied as
    config.json + model.safetensors + tokenizer into ``<version>/model/``; no training, so the loss
    check passes vacuously with the reason in its metadata."""
    src = fetch_tree(config.pretrained_model)  # a URL: downloaded into the local cache
    cache = DigestCache(storage.path("_cache", "digests", "pretrained_model.json"))
    content = tree_digest(src, cache)  # the files' names and bytes, not the directory's location or times
    cache.save()
    version = data_version(CODE_VERSIONS["base_checkpoint"], {"pretrained_model": content}, shards["data_version"])
    manifest = TokenShards(shards["path"], "train").manifest
    overflow = embedding_overflow(src)  # the directory itself is unusable: no tokenizer setting helps
    if overflow:
        raise Failure(
            f"base_checkpoint cannot import {overflow}; then materialize base_checkpoint again. Not retried.",
            allow_retries=False,
        )
    problem = tokenizer_mismatch(src, manifest, local_files(shards["path"], TOKENIZER_FILES))
    if problem:
        raise Failure(
            f"base_checkpoint imports {src}, but pretrain/token_shards do not use its tokenizer: {problem}. "
            f"Set the tokenizer asset's pretrained_model to {src} and re-materialize the shards.",
            allow_retries=False,
        )
    positions = max_positions(src)
    if positions is not None and positions < manifest["seq_len"]:
        raise Failure(
            f"base_checkpoint imports {src}, whose max_position_embeddings is {positions}, but "
            f"pretrain/token_shards hold sequences of seq_len={manifest['seq_len']} tokens: set the token_shards' "
            f"seq_len to at most {positions} (both corpora) and re-materialize them. Not retried.",
            allow_retries=False,
        )

    def build(out: Path) -> dict:
        info = import_pretrained(src, out / "model")
        write_card(
            context,
            storage,
            "base_model",
            out / "model",
            version,
            shards,
            imported={"from": str(src), "content_digest": content},
        )
        return {**info, "imported_from": str(src), "imported_content_digest": content}

    path, stats, reused = build_or_reuse(context, storage, ["base_checkpoint"], version, build)
    stats["output"] = stored_location(path / "model")
    yield asset_output(
        path,
        version,
        stats,
        config,
        reused,
        {
            "output": MetadataValue.path(stats["output"]),
            "imported_from": MetadataValue.path(str(src)),
            "imported_content_digest": content,
        },
    )
    yield AssetCheckResult(
        check_name="loss_finite_and_decreasing",
        passed=True,
        metadata={"note": "imported pretrained model: no training run to check"},
    )


@asset(
    key="lora_adapter",
    group_name="training",
    code_version=CODE_VERSIONS["lora_adapter"],
    ins={
        "base": AssetIn(key="base_checkpoint"),
        "shards": AssetIn(key=["domain", "token_shards"]),
        "text": AssetIn(key=["domain", "deduplicated_text"]),
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
):
    _check_shards_fit_base(base, shards)
    set_by_asset = {"mode": "lora", "train_shards": shards["path"], "model": {"base_model": base["stats"]["output"]}}
    settled = _settled(context, config, set_by_asset)
    if settled.task == "causal_lm":
        version = training_version(
            "lora_adapter", settled, base["data_version"], shards["data_version"], ranks=launcher.nproc_per_node
        )
        yield from _trained(
            context, storage, launcher, trackers, "lora_adapter", version, settled, config, shards, base
        )
        return
    task_data = config.task_data.to_core()
    version = training_version(
        "lora_adapter",
        settled,
        base["data_version"],
        text["data_version"],
        ranks=launcher.nproc_per_node,
        task_data=asdict(task_data),
    )
    try:
        settled, report = fine_tuning_examples(
            stage_run(context, storage),
            version,
            settled,
            local_copy(text["path"]),
            task_data,
            corpus_labels=(text["stats"].get("corpus") or {}).get("labels"),
        )
    except StageError as e:
        raise Failure(str(e), allow_retries=e.retryable) from e
    report["balancing"] = text["stats"].get("balance")
    yield from _trained(
        context, storage, launcher, trackers, "lora_adapter", version, settled, config, shards, base, report
    )


def _check_shards_fit_base(base: dict, shards: dict) -> None:
    """Raise a Failure (not retried) when the domain shards were not tokenized with the base model's tokenizer."""
    problem = tokenizer_mismatch(
        local_files(base["stats"]["output"], (*TOKENIZER_FILES, "config.json")),
        TokenShards(shards["path"], "train").manifest,
        local_files(shards["path"], TOKENIZER_FILES),
    )
    if problem:
        raise Failure(
            f"domain shards {shards['path']} do not fit the base model {base['stats']['output']}: {problem}. "
            f"Tokenize the domain corpus with the base model's tokenizer: materialize tokenizer with "
            f"pretrained_model {base['stats']['output']}, then domain/token_shards. Not retried.",
            allow_retries=False,
        )


def _trained(context, storage, launcher, trackers, key, version, settled, config, shards, base=None, examples=None):
    """Train ``key`` (base_checkpoint, or lora_adapter on ``base``) or reuse it (largetrain_core.stages.training.train), write
    its model card, seal a new training, then yield the Output and the loss check."""
    run = stage_run(context, storage)
    plan = config.plan.to_core()
    try:
        out, summary, reused = train(
            run,
            version,
            settled,
            trackers.model_dump(),
            launch=lambda cfg_path, log, grace: launcher.run(context, cfg_path, log, grace_seconds=grace),
            plan=lambda cfg, out: plan_training(context, storage, launcher, cfg, plan, key, out),
        )
    except StageError as e:
        raise Failure(str(e), allow_retries=e.retryable) from e
    model_dir = local_dir(summary["output"])
    evaluated = None
    if settled.task != "causal_lm":
        base_dir, examples_dir = local_copy(base["stats"]["output"]), Path(settled.train_shards)
        evaluated = (
            read_json(out / "evaluation.json", f"{settled.task} evaluation (evaluation.json)")
            if reused
            else task_evaluation.evaluate_classifier(base_dir, model_dir, examples_dir, out, settled.seed)
            if settled.task == "classification"
            else task_evaluation.evaluate_chat(base_dir, model_dir, examples_dir, out)
        )
    card = write_card(
        context,
        storage,
        "lora_adapter" if base is not None else "base_model",
        model_dir,
        version,
        shards,
        train_dir=out,
        **({"base_model": local_copy(base["stats"]["output"])} if base is not None else {}),
        task=card_task(settled, evaluated, examples),
    )
    if not reused:
        log_trained_outputs(context, out, summary)
        seal_training(out, storage.location(key, version), card)
    output = _train_output(out, version, summary, settled, reused)
    if base is not None:
        output = output.with_metadata(
            {**output.metadata, **adapter_metadata(model_dir), **task_metadata(settled, out, examples, evaluated)}
        )
    yield output
    yield _loss_check(context, out, summary, settled)
    if base is not None:
        yield _majority_check(context, evaluated)


def task_metadata(cfg: TrainConfig, out: Path, examples: dict | None, evaluated: dict | None) -> dict:
    """The adapter's task in the metadata; for classification the label set, the split, the documents left
    out (no label in the set), the test metrics beside the baselines (tables) and the confusion matrix."""
    import base64

    from largetrain_core.classification import metrics_markdown

    md = {"task": cfg.task}
    if examples is None or evaluated is None:
        return md
    if cfg.task == "chat":
        rows = "\n".join(
            "| {} | {} | {} |".format(
                *(x.replace("|", "\\|").replace("\n", " ") for x in (g["prompt"], g["reference"], g["generated"]))
            )
            for g in evaluated["generations"]
        )
        md.update(
            {
                "test_assistant_loss": round(evaluated["assistant_loss"], 4),
                "test_assistant_perplexity": evaluated["assistant_perplexity"]
                and round(evaluated["assistant_perplexity"], 2),
                "test_assistant_tokens": evaluated["assistant_tokens"],
                "generations": MetadataValue.md("| prompt | reference | generated |\n|---|---|---|\n" + rows),
                "split": MetadataValue.json(examples["split"]["counts"]),
                "documents_left_out": len(examples["left_out"]),
                "chat_template": MetadataValue.text(examples["manifest"].get("chat_template") or ""),
            }
        )
        return md
    names = evaluated["label_names"]
    rows = "\n".join(
        f"| {name} | {evaluated[name]['accuracy']:.4f} | {evaluated[name]['macro_f1']:.4f} |"
        for name in ("lora", "tfidf_logreg", "majority")
    )
    png = out / "confusion_matrix.png"
    md.update(
        {
            "label_names": MetadataValue.json(names),
            "test_accuracy": round(evaluated["lora"]["accuracy"], 4),
            "test_macro_f1": round(evaluated["lora"]["macro_f1"], 4),
            "baselines": MetadataValue.md("| model | accuracy | macro-F1 |\n|---|---|---|\n" + rows),
            "per_class": MetadataValue.md(metrics_markdown(evaluated["lora"])),
            "validation_loss_per_class": MetadataValue.json(evaluated.get("validation_loss_per_class")),
            "split": MetadataValue.json(examples["split"]["counts"]),
            "documents_left_out": len(examples["left_out"]),
            "left_out": MetadataValue.json(examples["left_out"][:100]),
        }
    )
    if png.exists():
        b64 = base64.b64encode(png.read_bytes()).decode()
        md["confusion_matrix"] = MetadataValue.md(f"![confusion matrix, test split](data:image/png;base64,{b64})")
    return md


def _majority_check(context, evaluated: dict | None) -> AssetCheckResult:
    """``beats_majority_baseline`` (MAJORITY_CHECK) of a classifier's evaluation, or a pass with a note."""
    if evaluated is None or "majority" not in evaluated:
        return AssetCheckResult(
            check_name="beats_majority_baseline", passed=True, metadata={"note": "not a classifier: nothing to check"}
        )
    lora, majority = evaluated["lora"]["macro_f1"], evaluated["majority"]["macro_f1"]
    passed = lora > majority
    description = (
        None
        if passed
        else (
            f"the classifier's test macro-F1 {lora:.4f} is not above the majority-class baseline's {majority:.4f}: "
            "it has not learnt the classes (train longer, raise learning_rate, balance the classes, or check the labels)"
        )
    )
    if not passed:
        context.log.error(f"lora_adapter: {description}")
    return AssetCheckResult(
        check_name="beats_majority_baseline",
        passed=passed,
        severity=AssetCheckSeverity.ERROR,
        description=description,
        metadata={"macro_f1": round(lora, 4), "majority_macro_f1": round(majority, 4)},
    )


def card_task(cfg: TrainConfig, evaluated: dict | None, examples: dict | None) -> dict | None:
    """The model card's Task section (largetrain_core.model_card) of a fine-tuning task, else None: the
    label set, the test metrics beside the baselines, and the balancing of the train split."""
    if cfg.task == "causal_lm":
        return None
    task = {"task": cfg.task}
    balance = (examples or {}).get("balancing")
    if balance:
        per_class = ", ".join(f"{c} {balance['before'][c]} -> {balance['after'].get(c, 0)}" for c in balance["before"])
        task["balancing"] = f"{balance['mode']} (seed {balance['seed']}), documents per class {per_class}"
    if evaluated is not None and cfg.task == "classification":
        task.update(
            label_names=evaluated["label_names"],
            test={k: evaluated[k] for k in ("lora", "tfidf_logreg", "majority")},
        )
    if cfg.task == "chat" and examples:
        task["chat_template"] = examples["manifest"].get("chat_template")
        if evaluated is not None:
            task["assistant_perplexity"] = evaluated["assistant_perplexity"]
    return task
