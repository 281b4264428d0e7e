"""``lora_adapter``: a LoRA adapter (PEFT) on the base checkpoint, trained on the domain shards (task
causal_lm), or on task examples made from the domain's deduplicated_text (tasks classification and chat:
largetrain_core.stages.training.fine_tuning_examples)."""

from __future__ import annotations

from dataclasses import asdict

from largetrain_core.model import tokenizer_mismatch
from largetrain_core.shards import TokenShards
from largetrain_core.stages.base import StageError, StageResult, StageRun
from largetrain_core.stages.training import Launch, fine_tuning_examples, trained, train_config, training_version
from largetrain_core.storage import local_copy, local_files
from largetrain_core.training.plan import PlanSettings
from largetrain_core.training.sync import TOKENIZER_FILES
from largetrain_core.training.task_data import TaskDataSettings


def lora_adapter(
    run: StageRun,
    settings: dict,
    plan: PlanSettings,
    task_data: TaskDataSettings,
    launch: Launch,
    base: dict,
    shards: dict,
    text: dict,
    tokenizer: dict | None = None,
) -> StageResult:
    """Train the adapter of the run config ``settings`` (largetrain_core.training.config.TrainConfig, as
    the run config writes it) on the ``base`` handle: on the domain ``shards`` (task causal_lm; ``text``
    and ``tokenizer``, what they were made of, for the model card), or on the examples of its task made
    from ``text`` with ``task_data`` (part of the data version for those tasks only). Handles are
    ``{"path", "data_version", "stats"}``. Raises StageError (not retryable) when the shards were not
    tokenized with the base model's tokenizer, or for a setting that cannot work."""
    check_shards_fit_base(base, shards)
    set_by_stage = {"mode": "lora", "train_shards": shards["path"], "model": {"base_model": base["stats"]["output"]}}
    cfg = train_config(run, settings, launch, **set_by_stage)
    card = {"shards": shards, "text": text, "tokenizer": tokenizer, "text_asset": "deduplicated_text"}
    ranks = launch.ranks_per_node
    if cfg.task == "causal_lm":
        version = training_version("lora_adapter", cfg, base["data_version"], shards["data_version"], ranks=ranks)
        return trained(run, version, cfg, plan, launch, card, base)
    version = training_version(
        "lora_adapter", cfg, base["data_version"], text["data_version"], ranks=ranks, task_data=asdict(task_data)
    )
    cfg, report = fine_tuning_examples(
        run,
        version,
        cfg,
        local_copy(text["path"]),
        task_data,
        corpus_labels=(text["stats"].get("corpus") or {}).get("labels"),
    )
    report["balancing"] = text["stats"].get("balance")
    return trained(run, version, cfg, plan, launch, card, base, report)


def check_shards_fit_base(base: dict, shards: dict) -> None:
    """Raise StageError (not retryable) when the domain shards were not tokenized with the base model's tokenizer."""
    problem = tokenizer_mismatch(
        local_files(base["stats"]["output"], (*TOKENIZER_FILES, "config.json")),
        TokenShards(shards["path"], "train").manifest,
        local_files(shards["path"], TOKENIZER_FILES),
    )
    if problem:
        raise StageError(
            f"domain shards {shards['path']} do not fit the base model {base['stats']['output']}: {problem}. "
            f"Tokenize the domain corpus with the base model's tokenizer: materialize tokenizer with "
            f"pretrained_model {base['stats']['output']}, then domain/token_shards. Not retried."
        )
