"""Before anything is launched: does a training config fit its inputs and this installation?

:func:`check` is what the training assets and the entry point run before the first rank trains:
the config's own validation (:meth:`TrainConfig.validate`), the trackers it names against the
registry (largetrain_core.training.trackers.TRACKERS), and its inputs: the shards' train split, a
named checkpoint, and in mode lora the base model (its positions and vocabulary against the shards,
and the LoRA targets, the discovered default included, largetrain_core.training.lora). It sits
above config, lora and trackers, which never import it.

Every problem says what to change; all of them are raised together as one ValueError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from largetrain_core.training.config import TrainConfig


def tracker_problems(cfg: TrainConfig) -> list[str]:
    """``report_to`` names that no tracker of the registry has."""
    from largetrain_core.training.trackers import TRACKERS

    unknown = [t for t in cfg.tracking.report_to if t not in TRACKERS]
    return (
        [f"report_to must list distinct trackers among {sorted(TRACKERS)}, not {cfg.tracking.report_to}"]
        if unknown
        else []
    )


def check_config(cfg: TrainConfig, cuda: Optional[bool] = None) -> None:
    """Raise ValueError for an invalid config (:meth:`TrainConfig.problems`) or an unknown tracker;
    ``cuda`` defaults to torch's view. Reads no file."""
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    p = cfg.problems(cuda) + tracker_problems(cfg)
    if p:
        raise ValueError("invalid training config: " + "; ".join(p))


def input_problems(cfg: TrainConfig) -> list[str]:
    """What makes ``cfg`` not fit its data or its base model: the shards' train split (present, not
    empty), their validation split (not empty unless eval_strategy is no), a named
    resume_from_checkpoint (complete), and in mode lora the base model (a causal LM unless the task is
    classification: an encoder has no language-model head; its ``max_position_embeddings`` at least the
    shards' ``seq_len``, its vocabulary covering the shards'
    ids, LoRA targets that exist, touch no tied weight, and, when discovered, are found at all).

    Reads the shards' manifest and memory-maps them, and builds the base model from its config.json on
    the meta device: no weights are read. Raises ShardError (a ValueError) when the shards are unreadable."""
    from largetrain_core.training.tasks import open_split

    def split(name: str):  # a local path or a URL: the manifest, no shard read
        return open_split(cfg, name)

    data = split("train")
    p = [] if len(data) else [f"{cfg.train_shards}: the train split holds no sequence"]
    if cfg.task != "causal_lm" and data.task != cfg.task:
        p.append(f"{cfg.train_shards} holds {data.task} examples, the config's task is {cfg.task}")
    if cfg.evaluation.eval_strategy != "no" and not len(split("validation")):
        p.append(
            f"{cfg.train_shards}: the validation split holds no sequence, so there is nothing to evaluate on; "
            "make the shards with validation_fraction > 0 or set eval_strategy 'no'"
        )
    resume = cfg.checkpointing.resume_from_checkpoint
    if resume not in ("auto", "never"):
        from largetrain_core.training.checkpoints import verify

        problem = verify(Path(resume))
        if problem:
            p.append(f"resume_from_checkpoint {resume} is not a complete checkpoint: {problem}")
    base = cfg.model.base_model
    if cfg.mode == "lora" and base:
        from largetrain_core.model import is_encoder, model_config
        from largetrain_core.storage import local_copy
        from largetrain_core.training.lora import meta_model, target_problems

        if cfg.task != "classification" and is_encoder(local_copy(base)):
            p.append(
                f"the base model {base} is an encoder ({', '.join(model_config(local_copy(base)).architectures)}: no "
                f"language-model head), which serves task classification only, not {cfg.task}: import or train a "
                "causal LM as base_checkpoint (materialize tokenizer and base_checkpoint without pretrained_model, or "
                "with a causal LM's directory)"
            )
            return p
        model = meta_model(local_copy(base))
        positions = getattr(model.config, "max_position_embeddings", None)
        if positions is not None and positions < data.seq_len:
            p.append(
                f"the base model {base} takes at most max_position_embeddings={positions} positions, "
                f"the shards {cfg.train_shards} hold sequences of seq_len={data.seq_len} tokens: "
                + (
                    f"re-materialize the token shards with seq_len <= {positions}"
                    if cfg.task == "causal_lm"
                    else f"set lora_adapter's task_data.seq_len to at most {positions}"
                )
                + ", or use a base model with longer positions"
            )
        if cfg.task != "chat" and model.config.vocab_size < data.manifest["vocab_size"]:
            p.append(
                f"{cfg.train_shards}: token ids up to {data.manifest['vocab_size'] - 1} do not fit the base "
                f"model's vocabulary of {model.config.vocab_size}: tokenize with the base model's tokenizer"
            )
        p += target_problems(model, cfg.lora)
    return p


def check(cfg: TrainConfig, cuda: Optional[bool] = None) -> None:
    """:func:`check_config`, then :func:`input_problems`; raises ValueError saying what to change."""
    check_config(cfg, cuda)
    p = input_problems(cfg)
    if p:
        raise ValueError("training config does not fit its inputs: " + "; ".join(p))
