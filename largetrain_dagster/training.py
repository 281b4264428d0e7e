"""Training: ``base_checkpoint`` (pretrained with DeepSpeed under torchrun, or imported from a local
Hugging Face directory) and ``lora_adapter`` (PEFT LoRA on the base, trained with DeepSpeed); each with
the blocking check ``loss_finite_and_decreasing``. The training runs in its own processes, started by
the launcher resource through Dagster Pipes (largetrain_dagster.resources)."""

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
from largetrain_core.model import import_pretrained, tokenizer_mismatch
from largetrain_core.shards import TokenShards
from largetrain_core.storage import data_version, relative_to_root, resolve_under, write_json_atomic
from largetrain_core.train import LoraSettings, TrainConfig
from largetrain_dagster.artefacts import CODE_VERSIONS, asset_output, build_or_reuse
from largetrain_dagster.model_cards import write_card
from largetrain_dagster.resources import Storage, TorchrunLauncher, WandbSettings


class TrainingConfig(Config):
    zero_stage: int = Field(default=2, description="DeepSpeed ZeRO stage 0-3.")
    offload_optimizer: bool = False
    precision: str = Field(default="auto", description="auto (fp16 on CUDA, fp32 on CPU), fp32, fp16 or bf16.")
    activation_checkpointing: bool = True
    micro_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    max_steps: int = 1000
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = 200
    keep_checkpoints: int = 2
    log_every: int = 10
    resume: str = Field(default="auto", description="auto (newest complete checkpoint), never, or a checkpoint directory.")
    peak_flops: Optional[float] = Field(default=None, description="Peak FLOP/s of the job's hardware for MFU; null = derive.")


class BaseCheckpointConfig(TrainingConfig):
    preset: str = Field(default="llama-20m", description="Model preset (largetrain_core.model.PRESETS).")
    pretrained_model: Optional[str] = Field(default=None, description=(
        "A local Hugging Face causal-LM directory (config.json, safetensors, tokenizer) to import instead of "
        "pretraining; the tokenizer asset must then take the same directory's tokenizer."))


class LoraAdapterConfig(TrainingConfig):
    max_steps: int = 300
    lr: float = 2e-3
    weight_decay: float = 0.0
    warmup_steps: int = 10
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_target_modules: Optional[list[str]] = Field(default=None, description="Default: every linear layer in the blocks.")
    lora_adapter_name: str = Field(default="default", description="The adapter's name inside the PEFT model.")
    lora_merge_export: bool = Field(default=False, description="Also write merged/: base + adapter merged (merge_and_unload).")



def _loss_check(metrics_file: Path) -> AssetCheckResult:
    losses = [json.loads(line)["loss"] for line in metrics_file.read_text().splitlines() if line.strip()]
    import math

    finite = bool(losses) and all(math.isfinite(x) for x in losses)
    k = max(1, len(losses) // 10)
    start, end = (sum(losses[:k]) / k, sum(losses[-k:]) / k) if losses else (float("nan"), float("nan"))
    return AssetCheckResult(check_name="loss_finite_and_decreasing", passed=finite and end < start,
                            metadata={"steps_logged": len(losses), "mean_loss_first_10pct": start, "mean_loss_last_10pct": end})


def _train(context: AssetExecutionContext, storage: Storage, launcher: TorchrunLauncher, wandb: WandbSettings,
           key: str, version: str, train_cfg: dict, config: Config) -> tuple[Path, dict, bool]:
    """Run (or resume, or reuse) one training under ``<root>/<key>/<version>/``."""
    out = storage.path(key, version)
    summary_file = out / "summary.json"
    final = out / ("model" if key == "base_checkpoint" else "adapter")
    if summary_file.exists() and final.exists():
        context.log.info(f"{key} {version} already trained at {out}: reusing it")
        return out, moved_summary(out), True
    out.mkdir(parents=True, exist_ok=True)
    cfg = TrainConfig.from_dict({**train_cfg, "output_dir": str(out), "wandb_mode": wandb.mode,
                                 "wandb_project": wandb.project, "wandb_entity": wandb.entity,
                                 "wandb_run_name": f"{key}-{version}"})
    cfg.validate()  # fail here, before any process starts
    cfg_path = out / "train_config.json"
    write_json_atomic(cfg_path, cfg.to_dict())
    reported = launcher.run(context, cfg_path, out / "train.log")
    context.log.info(f"rank 0 reported {sorted(reported)}")
    return out, json.loads(summary_file.read_text()), False


def moved_summary(out: Path) -> dict:
    """``out/summary.json`` with the paths that the training wrote under its output directory (named in
    ``train_config.json``) resolved under ``out``: a copied or moved root reads its own model files."""
    summary = json.loads((out / "summary.json").read_text())
    cfg = out / "train_config.json"
    written_in = json.loads(cfg.read_text()).get("output_dir") if cfg.exists() else None
    return resolve_under(relative_to_root(summary, written_in), out) if written_in else summary


def _trainasset_output(out: Path, version: str, summary: dict, config: Config, reused: bool) -> Output:
    import base64

    from largetrain_core.train import read_metrics

    rows = read_metrics(out / "metrics.jsonl")
    every = max(1, len(rows) // 20)
    curve = "\n".join(f"| {r['step']} | {r['loss']:.4f} | {r['lr']:.2e} | {r.get('mfu') or float('nan'):.3f} |"
                      for r in rows[::every])
    stats = {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    extra = {**stats, "loss_curve": MetadataValue.md(f"| step | loss | lr | MFU |\n|---|---|---|---|\n{curve}"),
             "precision": summary["precision"], "precision_reason": summary["precision_reason"],
             "peak_flops_source": str(summary.get("peak_flops_source")), "output": MetadataValue.path(summary["output"])}
    svg = Path(summary.get("loss_curve") or out / "loss_curve.svg")
    if svg.exists():
        extra["loss_curve_svg"] = MetadataValue.path(str(svg))
        b64 = base64.b64encode(svg.read_bytes()).decode()
        extra["loss_curve_plot"] = MetadataValue.md(f"![loss curve](data:image/svg+xml;base64,{b64})")
    return asset_output(out, version, {**summary}, config, reused, extra)


# Settings that do not change the trained weights stay out of the data version, so that changing them
# (e.g. resume: never after a bad checkpoint) reuses the same output directory and its checkpoints.
NOT_VERSIONED = {"resume", "peak_flops"}
TRAIN_RETRY = RetryPolicy(max_retries=1, delay=5, backoff=Backoff.LINEAR)


@asset(key="base_checkpoint", group_name="training", code_version=CODE_VERSIONS["base_checkpoint"],
       ins={"shards": AssetIn(key=["pretrain", "token_shards"])}, io_manager_key="handles", pool="accelerators",
       retry_policy=TRAIN_RETRY, kinds={"deepspeed", "pytorch"},
       check_specs=[AssetCheckSpec("loss_finite_and_decreasing", asset="base_checkpoint", blocking=True)],
       description="A causal LM pretrained from a preset with DeepSpeed (torchrun, ZeRO, activation checkpointing); a Hugging Face directory.")
def base_checkpoint(context: AssetExecutionContext, config: BaseCheckpointConfig, storage: Storage,
                    launcher: TorchrunLauncher, wandb: WandbSettings, shards: dict):
    if config.pretrained_model:
        yield from _import_base(context, config, storage, shards)
        return
    version = data_version(CODE_VERSIONS["base_checkpoint"], config.model_dump(exclude=NOT_VERSIONED), shards["data_version"],
                           launcher.nproc_per_node)
    train_cfg = {**config.model_dump(exclude={"pretrained_model"}), "mode": "pretrain", "train_shards": shards["path"],
                 "tokenizer": shards["path"]}
    out, summary, reused = _train(context, storage, launcher, wandb, "base_checkpoint", version, train_cfg, config)
    write_card(context, storage, "base_model", Path(summary["output"]), version, shards, train_dir=out)
    yield _trainasset_output(out, version, summary, config, reused)
    yield _loss_check(out / "metrics.jsonl")


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
                      f"Set the tokenizer asset's pretrained_model to {src} and re-materialize the shards.")

    def build(out: Path) -> dict:
        info = import_pretrained(src, out / "model")
        write_card(context, storage, "base_model", out / "model", version, shards,
                   imported={"from": str(src), "content_digest": content})
        return {**info, "imported_from": str(src), "imported_content_digest": content}

    path, stats, reused = build_or_reuse(context, storage, ["base_checkpoint"], version, build)
    stats["output"] = str(path / "model")
    yield asset_output(path, version, stats, config, reused, {"output": MetadataValue.path(stats["output"]),
                                                         "imported_from": MetadataValue.path(str(src))})
    yield AssetCheckResult(check_name="loss_finite_and_decreasing", passed=True,
                           metadata={"note": "imported pretrained model: no training run to check"})


@asset(key="lora_adapter", group_name="training", code_version=CODE_VERSIONS["lora_adapter"],
       ins={"base": AssetIn(key="base_checkpoint"), "shards": AssetIn(key=["domain", "token_shards"])},
       io_manager_key="handles", pool="accelerators", retry_policy=TRAIN_RETRY, kinds={"peft", "deepspeed"},
       check_specs=[AssetCheckSpec("loss_finite_and_decreasing", asset="lora_adapter", blocking=True)],
       description="A LoRA adapter (peft) on the base checkpoint, trained with DeepSpeed on the domain shards; a PEFT directory.")
def lora_adapter(context: AssetExecutionContext, config: LoraAdapterConfig, storage: Storage,
                 launcher: TorchrunLauncher, wandb: WandbSettings, base: dict, shards: dict):
    problem = tokenizer_mismatch(Path(base["stats"]["output"]), TokenShards(Path(shards["path"]), "train").manifest,
                                 Path(shards["path"]))
    if problem:
        raise Failure(f"domain shards {shards['path']} do not fit the base model {base['stats']['output']}: {problem}; "
                      f"re-materialize tokenizer and domain/token_shards")
    version = data_version(CODE_VERSIONS["lora_adapter"], config.model_dump(exclude=NOT_VERSIONED), base["data_version"],
                           shards["data_version"], launcher.nproc_per_node)
    fields = config.model_dump()
    lora = LoraSettings(rank=fields.pop("lora_rank"), alpha=fields.pop("lora_alpha"), dropout=fields.pop("lora_dropout"),
                        target_modules=fields.pop("lora_target_modules"), adapter_name=fields.pop("lora_adapter_name"),
                        merge_export=fields.pop("lora_merge_export"))
    train_cfg = {**fields, "mode": "lora", "train_shards": shards["path"], "base_model": base["stats"]["output"],
                 "lora": lora.__dict__}
    out, summary, reused = _train(context, storage, launcher, wandb, "lora_adapter", version, train_cfg, config)
    write_card(context, storage, "lora_adapter", Path(summary["output"]), version, shards, train_dir=out,
               base_model=Path(base["stats"]["output"]))
    yield _trainasset_output(out, version, summary, config, reused)
    yield _loss_check(out / "metrics.jsonl")

