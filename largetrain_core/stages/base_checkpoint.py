"""``base_checkpoint``: a causal LM pretrained from a preset on the pretraining shards (largetrain_core.stages.training),
or imported from an existing Hugging Face directory (:func:`import_base`)."""

from __future__ import annotations

from pathlib import Path

from largetrain_core.artifacts import CODE_VERSIONS
from largetrain_core.digest import DigestCache, tree_digest
from largetrain_core.model import embedding_overflow, import_pretrained, max_positions, tokenizer_mismatch
from largetrain_core.shards import TokenShards
from largetrain_core.stages.base import Check, StageError, StageResult, StageRun
from largetrain_core.stages.training import Launch, trained, train_config, training_version
from largetrain_core.storage import data_version, fetch_tree, local_files, stored_location
from largetrain_core.training.lineage import write_card
from largetrain_core.training.plan import PlanSettings
from largetrain_core.training.sync import TOKENIZER_FILES


def base_checkpoint(
    run: StageRun,
    settings: dict,
    plan: PlanSettings,
    launch: Launch,
    shards: dict,
    text: dict | None = None,
    tokenizer: dict | None = None,
    text_asset: str = "deduplicated_text",
    pretrained_model: str | None = None,
) -> StageResult:
    """Pretrain (task causal_lm, mode pretrain) on the ``shards`` handle with the run config ``settings``
    (largetrain_core.training.config.TrainConfig, as the run config writes it), or import
    ``pretrained_model``. ``text`` and ``tokenizer``: the handles of what the shards were made of (the
    asset ``text_asset`` and the tokenizer), for the model card's lineage. Handles are
    ``{"path", "data_version", "stats"}``. Raises StageError for a setting or an import that cannot work."""
    card = {"shards": shards, "text": text, "tokenizer": tokenizer, "text_asset": text_asset}
    if pretrained_model:
        return import_base(run, pretrained_model, shards, card)
    set_by_stage = {"mode": "pretrain", "train_shards": shards["path"], "model": {"tokenizer": shards["path"]}}
    cfg = train_config(run, settings, launch, **set_by_stage)
    version = training_version(
        "base_checkpoint", cfg, shards["data_version"], ranks=launch.ranks_per_node, pretrained_model=None
    )
    return trained(run, version, cfg, plan, launch, card)


def import_base(run: StageRun, pretrained_model: str, shards: dict, card: dict) -> StageResult:
    """base_checkpoint from an existing Hugging Face model (a local directory or a URL, downloaded into
    the local cache): checked against the shards' tokenizer and sequence length, copied as config.json +
    model.safetensors + tokenizer into ``<version>/model/``; its data version is that of the files' names
    and bytes (not their location or times). No training, so the loss check passes with the reason in
    its metadata. Raises StageError (not retryable) for a model that cannot take these shards."""
    src = fetch_tree(pretrained_model)
    cache = DigestCache(run.cache_file("digests", "pretrained_model.json"))
    content = tree_digest(src, cache)
    cache.save()
    version = data_version(CODE_VERSIONS["base_checkpoint"], {"pretrained_model": content}, shards["data_version"])
    manifest = TokenShards(shards["path"], "train").manifest
    overflow = embedding_overflow(src)  # the directory itself is unusable: no tokenizer setting helps
    if overflow:
        raise StageError(
            f"base_checkpoint cannot import {overflow}; then materialize base_checkpoint again. Not retried."
        )
    problem = tokenizer_mismatch(src, manifest, local_files(shards["path"], TOKENIZER_FILES))
    if problem:
        raise StageError(
            f"base_checkpoint imports {src}, but pretrain/token_shards do not use its tokenizer: {problem}. "
            f"Set the tokenizer asset's pretrained_model to {src} and re-materialize the shards."
        )
    positions = max_positions(src)
    if positions is not None and positions < manifest["seq_len"]:
        raise StageError(
            f"base_checkpoint imports {src}, whose max_position_embeddings is {positions}, but "
            f"pretrain/token_shards hold sequences of seq_len={manifest['seq_len']} tokens: set the token_shards' "
            f"seq_len to at most {positions} (both corpora) and re-materialize them. Not retried."
        )

    def build(out: Path) -> dict:
        info = import_pretrained(src, out / "model")
        imported = {"from": str(src), "content_digest": content}
        write_card(run.log, "base_model", out / "model", version, card, imported=imported)
        return {**info, "imported_from": str(src), "imported_content_digest": content}

    built = run.build_or_reuse(version, build)
    stats = {**built.stats, "output": stored_location(built.path / "model")}
    return StageResult(
        built.path,
        version,
        stats,
        built.reused,
        metadata={"output": built.path / "model", "imported_from": Path(src), "imported_content_digest": content},
        checks={
            "loss_finite_and_decreasing": Check(True, {"note": "imported pretrained model: no training run to check"})
        },
    )
