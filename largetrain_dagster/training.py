"""Training: ``base_checkpoint`` (pretrained with DeepSpeed under torchrun, or imported from a local
Hugging Face directory) and ``lora_adapter`` (PEFT LoRA on the base, trained with DeepSpeed); each with
the blocking check ``loss_finite_and_decreasing``. The training runs in its own processes, started by
the launcher resource through Dagster Pipes (largetrain_dagster.resources)."""

import functools
import json
from pathlib import Path
from typing import Optional

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetIn,
    Backoff,
    Config,
    Failure,
    MetadataValue,
    Output,
    RetryPolicy,
    asset,
)
from pydantic import Field

from largetrain_core.digest import DigestCache, tree_digest
from largetrain_core.model import import_pretrained, max_positions, tokenizer_mismatch
from largetrain_core.shards import TokenShards
from largetrain_core.storage import (
    data_version,
    loading,
    read_json,
    relative_to_root,
    resolve_under,
    verify_manifest,
    write_json_atomic,
    write_manifest,
)
from largetrain_core.training.config import TRACKING, TrainConfig
from largetrain_core.training.trackers import METRICS, RECORDS, read_metrics
from largetrain_dagster.artefacts import CODE_VERSIONS, asset_output, build_or_reuse
from largetrain_dagster.configs import dagster_config
from largetrain_dagster.model_cards import write_card
from largetrain_dagster.resources import Storage, TorchrunLauncher, TrackerSettings

# Filled in by the asset (paths, mode) or by the TrackerSettings resource, not by the run config.
SET_BY_ASSET = ("output_dir", "train_shards", "mode", "base_model", "tokenizer", *TRACKING)
# Production defaults where they differ from TrainConfig's (whose defaults suit a short test run).
TRAINING_DEFAULTS = {"micro_batch_size": 8, "max_steps": 1000, "warmup_steps": 50, "save_steps": 200, "eval_steps": 100}


class BaseCheckpointConfig(dagster_config(TrainConfig, "BaseCheckpointTrainConfig", exclude=(*SET_BY_ASSET, "lora"),
                                          defaults={**TRAINING_DEFAULTS, "preset": "llama-20m"})):
    """Pretraining of ``base_checkpoint`` (largetrain_core.training.config.TrainConfig), or an import."""

    pretrained_model: Optional[str] = Field(default=None, description=(
        "A local Hugging Face causal-LM directory (config.json, safetensors, tokenizer) to import instead of "
        "pretraining; the tokenizer asset must then take the same directory's tokenizer."))


LoraAdapterConfig = dagster_config(TrainConfig, "LoraAdapterConfig", exclude=(*SET_BY_ASSET, "preset"),
                                   defaults={**TRAINING_DEFAULTS, "max_steps": 300, "learning_rate": 2e-3,
                                             "weight_decay": 0.0, "warmup_steps": 10})


def _loss_check(metrics_file: Path) -> AssetCheckResult:
    with loading(metrics_file, "training metrics (JSON lines with a loss)"):
        losses = [json.loads(line)["loss"] for line in metrics_file.read_text().splitlines() if line.strip()]
    import math

    finite = bool(losses) and all(math.isfinite(x) for x in losses)
    k = max(1, len(losses) // 10)
    start, end = (sum(losses[:k]) / k, sum(losses[-k:]) / k) if losses else (float("nan"), float("nan"))
    return AssetCheckResult(check_name="loss_finite_and_decreasing", passed=finite and end < start,
                            metadata={"steps_logged": len(losses), "mean_loss_first_10pct": start, "mean_loss_last_10pct": end})


def _train(context: AssetExecutionContext, storage: Storage, launcher: TorchrunLauncher, trackers: TrackerSettings,
           key: str, version: str, config: Config, **set_by_asset) -> tuple[Path, dict, bool]:
    """Run (or resume, or reuse) one training under ``<root>/<key>/<version>/``. Its TrainConfig is the
    run config, ``set_by_asset`` (mode, paths) and the trackers' settings (MLflow's store defaults to
    ``sqlite:///<root>/mlruns.db``; ``dagster_pipes`` is always added), validated before any process starts."""
    out = storage.path(key, version)
    summary_file = out / "summary.json"
    final = out / ("model" if key == "base_checkpoint" else "adapter")
    rebuilt_because = None
    if summary_file.exists() and final.exists():
        problems = verify_manifest(out)
        if not problems:
            context.log.info(f"{key} {version} already trained at {out} and matches its manifest: reusing it")
            return out, moved_summary(out), True
        rebuilt_because = "; ".join(problems)
        context.log.warning(f"{key} {version} at {out} does not match its manifest; running the training again "
                            f"(it resumes from its newest complete checkpoint): {rebuilt_because}")
    tracking = trackers.model_dump()
    tracking["mlflow"]["tracking_uri"] = tracking["mlflow"]["tracking_uri"] or f"sqlite:///{storage.path('mlruns.db')}"
    tracking["report_to"] = [*tracking["report_to"], *(["dagster_pipes"] if "dagster_pipes" not in tracking["report_to"] else [])]
    try:  # fail here, before any process starts, and never retry: a config error fails the same way again
        cfg = TrainConfig.from_dict({**config.model_dump(exclude={"pretrained_model"}), **set_by_asset, **tracking,
                                     "output_dir": str(out), "run_name": f"{key}-{version}"})
        cfg.validate()
        cfg.validate_inputs()
    except ValueError as e:
        raise Failure(f"{key}: {e}. Nothing was launched; not retried (change the config).", allow_retries=False) from e
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / "train_config.json"
    write_json_atomic(cfg_path, cfg.to_dict())
    reported = launcher.run(context, cfg_path, out / "train.log")
    context.log.info(f"rank 0 reported {sorted(reported)}")
    summary = read_json(summary_file, "training summary (summary.json)")
    return out, {**summary, "rebuilt_because": rebuilt_because} if rebuilt_because else summary, False


# What a finished training leaves in its output directory, recorded in its _manifest.json and verified before reuse.
TRAINED_OUTPUTS = ("summary.json", METRICS, "model", "adapter", "merged", "loss_curve.png")


def seal_training(out: Path) -> None:
    """Record a finished training's outputs (TRAINED_OUTPUTS under ``out``; not the checkpoints and the log,
    which keep changing) in ``out/_manifest.json``, once everything is written into them (the model card)."""
    write_manifest(out, [p for p in TRAINED_OUTPUTS if (out / p).exists()])


def moved_summary(out: Path) -> dict:
    """``out/summary.json`` with the paths that the training wrote under its output directory (named in
    ``train_config.json``) resolved under ``out``: a copied or moved root reads its own model files."""
    summary = read_json(out / "summary.json", "training summary (summary.json)")
    cfg = out / "train_config.json"
    written_in = read_json(cfg, "training config (train_config.json)").get("output_dir") if cfg.exists() else None
    return resolve_under(relative_to_root(summary, written_in), out) if written_in else summary


def _train_output(out: Path, version: str, summary: dict, config: Config, reused: bool) -> Output:
    """Metadata: the curves (training and validation loss and learning rate against step) as an inline
    PNG and its path, the run's numbers rounded with the unit in the name (:func:`training_numbers`),
    the loss table, and each tracker's run record (``<tracker>_run_id``, its location, e.g.
    ``wandb_sync_command`` for offline W&B)."""
    import base64

    rows = read_metrics(out / METRICS)
    extra = {}
    png = Path(summary.get("loss_curve") or out / "loss_curve.png")
    if png.suffix == ".png" and png.exists():
        b64 = base64.b64encode(png.read_bytes()).decode()
        extra["training_curves"] = MetadataValue.md(f"![training and validation loss, learning rate](data:image/png;base64,{b64})")
        extra["training_curves_png"] = MetadataValue.path(str(png))
    extra.update(training_numbers(summary, rows))
    extra.update({"loss_table": MetadataValue.md(loss_table(rows)), "mfu_formula": MetadataValue.text(summary["mfu_formula"]),
                  "precision": summary["precision"], "precision_reason": summary["precision_reason"],
                  "peak_flops_source": str(summary.get("peak_flops_source")), "output": MetadataValue.path(summary["output"]),
                  "resumed_from": (MetadataValue.path(summary["resumed_from"]) if summary.get("resumed_from")
                                   else "none: started from step 0"),
                  **_tracker_metadata(out / RECORDS)})
    return asset_output(out, version, {**summary}, config, reused, extra, stats_metadata=False)


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
    numbers.update({
        "stopped_early": summary.get("stopped_early"),
        "first_loss": r(summary["first_loss"], 3), "last_loss": r(summary["last_loss"], 3),
        "eval_loss": r(summary.get("eval_loss"), 3), "eval_perplexity": r(summary.get("eval_perplexity"), 2),
        "best_eval_loss": r(summary.get("best_eval_loss"), 3), "best_eval_step": summary.get("best_eval_step"),
        "tokens_per_s": r(summary["tokens_per_s"], 0), "mfu_percent": pct(summary["mfu"]),
        "mean_mfu_percent": pct(summary.get("mean_mfu")),
        "peak_tflops": r(summary["peak_flops"] / 1e12 if summary["peak_flops"] else None, 3),
        "mflops_per_token": r(summary["flops_per_token"] / 1e6, 2), "peak_memory_gib": r(peak_mem, 3),
        "train_seconds": r(summary["train_seconds"], 1), "eval_seconds": r(summary.get("eval_seconds"), 1),
        "trainable_percent": round(100 * summary["trainable_parameters"] / summary["parameters"], 2),
    })
    return {k: v for k, v in numbers.items() if v is not None}


def loss_table(rows: list[dict], about: int = 20) -> str:
    """Markdown table of about ``about`` evenly spaced steps plus every evaluated step and the last step:
    step, training loss, validation loss, learning rate, MFU (%)."""
    every = max(1, len(rows) // about)
    keep = {r["step"] for r in rows[::every]} | {r["step"] for r in rows if r.get("eval_loss") is not None}
    keep |= {rows[-1]["step"]} if rows else set()

    def num(value, fmt):
        return "" if value is None else format(value, fmt)

    lines = [f"| {r['step']} | {num(r['loss'], '.4f')} | {num(r.get('eval_loss'), '.4f')} | {num(r.get('lr'), '.2e')} | "
             f"{num(100 * r['mfu'] if r.get('mfu') is not None else None, '.1f')} |" for r in rows if r["step"] in keep]
    return "| step | training loss (nats) | validation loss (nats) | learning rate | MFU (%) |\n|---|---|---|---|---|\n" + \
        "\n".join(lines)


def adapter_metadata(adapter_dir: Path) -> dict:
    """``lora_r``, ``lora_alpha`` and ``lora_target_modules`` (sorted, comma-separated) from PEFT's
    adapter_config.json in ``adapter_dir``; {} when it is missing."""
    f = Path(adapter_dir) / "adapter_config.json"
    if not f.exists():
        return {}
    a = json.loads(f.read_text())
    return {"lora_r": a.get("r"), "lora_alpha": a.get("lora_alpha"),
            "lora_target_modules": ", ".join(sorted(a.get("target_modules") or []))}


def _tracker_metadata(records_file: Path) -> dict:
    """``<tracker>_<key>`` for every entry of every tracker's run record (trackers.json): directories as
    paths, URLs as links, commands as code."""
    records = json.loads(records_file.read_text()) if records_file.exists() else {}
    md = {}
    for name, record in sorted(records.items()):
        for k, v in record.items():
            md[f"{name}_{k}"] = (MetadataValue.path(v) if k == "dir" else MetadataValue.url(v) if k == "url"
                                 else MetadataValue.md(f"`{v}`") if k.endswith("_command") else str(v))
    return md


LOSS_CHECK = ("every logged training loss is finite and the mean of the last 10% of steps is below the mean of the "
              "first 10% (blocking)")

# Settings that do not change the trained weights stay out of the data version, so that changing them
# (e.g. resume_from_checkpoint: never after a bad checkpoint) reuses the same output directory and its checkpoints.
NOT_VERSIONED = {"resume_from_checkpoint", "peak_flops"}
TRAIN_RETRY = RetryPolicy(max_retries=1, delay=5, backoff=Backoff.LINEAR)
# Raised in the asset's own process, these say that a config, a file or the data is wrong: a retry would
# fail the same way. (What fails inside the training processes is classified by the launcher.)
DETERMINISTIC = (ValueError, LookupError, FileNotFoundError, NotADirectoryError)


def not_retried_when_deterministic(fn):
    """Wrap a training asset's compute function: a DETERMINISTIC exception becomes
    ``Failure(allow_retries=False)`` naming it, so TRAIN_RETRY retries only what a retry can fix."""
    @functools.wraps(fn)
    def compute(*args, **kwargs):
        try:
            yield from fn(*args, **kwargs)
        except DETERMINISTIC as e:
            raise Failure(f"{fn.__name__}: {type(e).__name__}: {e}. Not retried: it would fail the same way again.",
                          allow_retries=False) from e
    return compute


@asset(key="base_checkpoint", group_name="training", code_version=CODE_VERSIONS["base_checkpoint"],
       ins={"shards": AssetIn(key=["pretrain", "token_shards"])}, io_manager_key="handles", pool="accelerators",
       retry_policy=TRAIN_RETRY, kinds={"deepspeed", "pytorch"},
       check_specs=[AssetCheckSpec("loss_finite_and_decreasing", asset="base_checkpoint", blocking=True, description=LOSS_CHECK)],
       description="A causal LM pretrained from a preset with DeepSpeed (torchrun, ZeRO, activation checkpointing); a Hugging Face directory.")
@not_retried_when_deterministic
def base_checkpoint(context: AssetExecutionContext, config: BaseCheckpointConfig, storage: Storage,
                    launcher: TorchrunLauncher, trackers: TrackerSettings, shards: dict):
    if config.pretrained_model:
        yield from _import_base(context, config, storage, shards)
        return
    version = data_version(CODE_VERSIONS["base_checkpoint"], config.model_dump(exclude=NOT_VERSIONED), shards["data_version"],
                           launcher.nproc_per_node)
    out, summary, reused = _train(context, storage, launcher, trackers, "base_checkpoint", version, config,
                                  mode="pretrain", train_shards=shards["path"], tokenizer=shards["path"])
    write_card(context, storage, "base_model", Path(summary["output"]), version, shards, train_dir=out)
    if not reused:
        seal_training(out)
    yield _train_output(out, version, summary, config, reused)
    yield _loss_check(out / METRICS)


def _import_base(context: AssetExecutionContext, config: BaseCheckpointConfig, storage: Storage, shards: dict):
    """base_checkpoint from an existing local HF model: checked against the shards' tokenizer, copied as
    config.json + model.safetensors + tokenizer into ``<version>/model/``; no training, so the loss
    check passes vacuously with the reason in its metadata."""
    src = Path(config.pretrained_model)
    cache = DigestCache(storage.path("_cache", "digests", "pretrained_model.json"))
    content = tree_digest(src, cache)  # the files' names and bytes, not the directory's location or times
    cache.save()
    version = data_version(CODE_VERSIONS["base_checkpoint"], {"pretrained_model": content}, shards["data_version"])
    manifest = TokenShards(Path(shards["path"]), "train").manifest
    problem = tokenizer_mismatch(src, manifest, Path(shards["path"]))
    if problem:
        raise Failure(f"base_checkpoint imports {src}, but pretrain/token_shards do not use its tokenizer: {problem}. "
                      f"Set the tokenizer asset's pretrained_model to {src} and re-materialize the shards.",
                      allow_retries=False)
    positions = max_positions(src)
    if positions is not None and positions < manifest["seq_len"]:
        raise Failure(f"base_checkpoint imports {src}, whose max_position_embeddings is {positions}, but "
                      f"pretrain/token_shards hold sequences of seq_len={manifest['seq_len']} tokens: set the token_shards' "
                      f"seq_len to at most {positions} (both corpora) and re-materialize them. Not retried.",
                      allow_retries=False)

    def build(out: Path) -> dict:
        info = import_pretrained(src, out / "model")
        write_card(context, storage, "base_model", out / "model", version, shards,
                   imported={"from": str(src), "content_digest": content})
        return {**info, "imported_from": str(src), "imported_content_digest": content}

    path, stats, reused = build_or_reuse(context, storage, ["base_checkpoint"], version, build)
    stats["output"] = str(path / "model")
    yield asset_output(path, version, stats, config, reused, {"output": MetadataValue.path(stats["output"]),
                                                         "imported_from": MetadataValue.path(str(src)),
                                                         "imported_content_digest": content})
    yield AssetCheckResult(check_name="loss_finite_and_decreasing", passed=True,
                           metadata={"note": "imported pretrained model: no training run to check"})


@asset(key="lora_adapter", group_name="training", code_version=CODE_VERSIONS["lora_adapter"],
       ins={"base": AssetIn(key="base_checkpoint"), "shards": AssetIn(key=["domain", "token_shards"])},
       io_manager_key="handles", pool="accelerators", retry_policy=TRAIN_RETRY, kinds={"peft", "deepspeed"},
       check_specs=[AssetCheckSpec("loss_finite_and_decreasing", asset="lora_adapter", blocking=True, description=LOSS_CHECK)],
       description="A LoRA adapter (peft) on the base checkpoint, trained with DeepSpeed on the domain shards; a PEFT directory.")
@not_retried_when_deterministic
def lora_adapter(context: AssetExecutionContext, config: LoraAdapterConfig, storage: Storage,
                 launcher: TorchrunLauncher, trackers: TrackerSettings, base: dict, shards: dict):
    problem = tokenizer_mismatch(Path(base["stats"]["output"]), TokenShards(Path(shards["path"]), "train").manifest,
                                 Path(shards["path"]))
    if problem:
        raise Failure(f"domain shards {shards['path']} do not fit the base model {base['stats']['output']}: {problem}; "
                      f"re-materialize tokenizer and domain/token_shards", allow_retries=False)
    version = data_version(CODE_VERSIONS["lora_adapter"], config.model_dump(exclude=NOT_VERSIONED), base["data_version"],
                           shards["data_version"], launcher.nproc_per_node)
    out, summary, reused = _train(context, storage, launcher, trackers, "lora_adapter", version, config,
                                  mode="lora", train_shards=shards["path"], base_model=base["stats"]["output"])
    write_card(context, storage, "lora_adapter", Path(summary["output"]), version, shards, train_dir=out,
               base_model=Path(base["stats"]["output"]))
    if not reused:
        seal_training(out)
    output = _train_output(out, version, summary, config, reused)
    yield output.with_metadata({**output.metadata, **adapter_metadata(Path(summary["output"]))})
    yield _loss_check(out / METRICS)

