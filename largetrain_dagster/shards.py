"""Token shards of one corpus role: every document + EOS packed into ``seq_len + 1`` windows, Arrow IPC
shards + manifest.json, train/validation split by document (largetrain_core.shards); blocking check
``token_ids_below_vocab``."""

from pathlib import Path

from dagster import AssetCheckResult, AssetCheckSpec, AssetExecutionContext, AssetIn, Config, MetadataValue, asset
from pydantic import Field

from largetrain_core.shards import TokenShards, build_token_shards
from largetrain_core.storage import data_version
from largetrain_dagster.artefacts import CODE_VERSIONS, asset_output, build_or_reuse
from largetrain_dagster.resources import Storage


class TokenShardsConfig(Config):
    seq_len: int = Field(default=1024, description="Sequence length in tokens; windows hold seq_len + 1.")
    validation_fraction: float = Field(default=0.05, description=(
        "Share of documents held out for validation (the validation loss, the evaluation's perplexities); a split "
        "under 16 sequences is warned about: perplexity on it is noisy."))
    seed: int = Field(default=0, description="Seed of the document-id hash that picks the validation documents.")
    sequences_per_shard: int = Field(default=8192, description="Sequences per Arrow IPC shard file (the last one holds the rest).")


# Our own threshold, no paper's: held-out perplexity is a mean over the validation sequences, and under
# 16 of them it moves by several percent with which documents the split happens to hold.
MIN_VALIDATION_SEQUENCES = 16


def tiny_validation_warning(role: str, stats: dict, config: dict) -> str | None:
    """The warning when ``<role>/token_shards`` (its ``stats`` and ``config`` as recorded) holds fewer
    than :data:`MIN_VALIDATION_SEQUENCES` validation sequences: how many, their tokens and documents,
    and the setting (``validation_fraction``, with a value that would give about that many); else None."""
    n = stats.get("validation_sequences")
    if n is None or n >= MIN_VALIDATION_SEQUENCES:
        return None
    fraction = config.get("validation_fraction")
    hint = f"token_shards `validation_fraction` (now {fraction:g}) enlarges it" if fraction is not None else \
        "token_shards `validation_fraction` enlarges it"
    if n and fraction:
        hint += f": about {min(0.5, fraction * MIN_VALIDATION_SEQUENCES / n):.2g} for {MIN_VALIDATION_SEQUENCES} sequences"
    return (f"{role}/token_shards: the validation split is tiny: {n:,} sequences ({stats.get('validation_tokens', 0):,} "
            f"tokens, {stats.get('validation_documents', 0):,} documents), under {MIN_VALIDATION_SEQUENCES}; the "
            f"validation loss and held-out perplexity on it are noisy. {hint}; a smaller seq_len or a larger corpus too.")


def token_shards_asset(role: str):
    """``<role>/token_shards`` from ``<role>/deduplicated_text`` and the shared tokenizer."""
    group = f"{role}_data"

    @asset(key=[role, "token_shards"], group_name=group, code_version=CODE_VERSIONS["token_shards"],
           ins={"text": AssetIn(key=[role, "deduplicated_text"]), "tokenizer": AssetIn(key="tokenizer")},
           io_manager_key="handles", kinds={"arrow"},
           check_specs=[AssetCheckSpec("token_ids_below_vocab", asset=[role, "token_shards"], blocking=True,
                                       description="every id < vocab size; shard sizes and checksums match manifest.json")],
           description="EOS after every document, packed into seq_len+1 windows, Arrow IPC shards + manifest.json, train/validation split by document.")
    def token_shards(context: AssetExecutionContext, config: TokenShardsConfig, storage: Storage, text: dict, tokenizer: dict):
        version = data_version(CODE_VERSIONS["token_shards"], config.model_dump(), text["data_version"], tokenizer["data_version"])

        def build(out: Path) -> dict:
            m = build_token_shards(Path(text["path"]), Path(tokenizer["path"]), out, seq_len=config.seq_len,
                                   validation_fraction=config.validation_fraction, seed=config.seed,
                                   sequences_per_shard=config.sequences_per_shard, source_data_version=text["data_version"])
            return {"total_tokens": m["total_tokens"], "dtype": m["dtype"], "vocab_size": m["vocab_size"],
                    **{f"{s}_{k}": v for s, d in m["splits"].items() for k, v in d.items() if k != "shards"}}

        path, stats, reused = build_or_reuse(context, storage, [role, "token_shards"], version, build)
        warning = tiny_validation_warning(role, stats, config.model_dump())
        if warning:
            context.log.warning(warning)
        yield asset_output(path, version, stats, config, reused,
                           {"validation_warning": MetadataValue.text(warning)} if warning else None)
        max_id, vocab = -1, stats["vocab_size"]
        problems = []
        for split in ("train", "validation"):
            try:
                shards = TokenShards(path, split, verify_checksums=True)
            except ValueError as e:
                problems.append(str(e))
                continue
            for i in range(0, len(shards), 4096):
                max_id = max(max_id, int(shards.take(range(i, min(len(shards), i + 4096))).max()))
        yield AssetCheckResult(check_name="token_ids_below_vocab", passed=not problems and max_id < vocab,
                               metadata={"max_id": max_id, "vocab_size": vocab, "problems": MetadataValue.json(problems)})

    return token_shards
