"""token_shards: every document + EOS packed into ``seq_len + 1`` windows, Arrow IPC shards +
manifest.json, train/validation split by document (largetrain_core.shards); check
``token_ids_below_vocab``.

Partitioned like the data steps: :func:`token_shard_partitions` says how many partitions (each a
contiguous range of the corpus's part files) and whether the shards are already complete;
:func:`token_shard_partition` tokenizes and packs one, on the run's executor, into
``<root>/<role>/token_shard_partitions/<i>-of-<n>/<version>/``; :func:`token_shards` is the global
step: the tails' windows and the manifest, which lists the partitions' shards where they lie. The
sequences and their order do not depend on the partitioning (largetrain_core.shards, Packing), so
neither does the data version.

Data version: the code version, the settings, the corpus's and the tokenizer's data versions (a
partition's: also its place, ``[i, n]``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import polars as pl

from largetrain_core import artifacts
from largetrain_core.artifacts import CODE_VERSIONS
from largetrain_core.relevance import SCORE, histogram_quantiles, score_histogram
from largetrain_core.executors.base import RECORD, load
from largetrain_core.shards import Packing, TokenShards, assemble_token_shards, build_token_shards, tokenizer_engines
from largetrain_core import fs
from largetrain_core.executors import steps
from largetrain_core.stages.base import Artifact, Check, Json, Markdown, StageError, StageResult, StageRun
from largetrain_core.storage import data_version, mirror_path, part_files, verify_manifest

# Repeated data (Muennighoff et al. 2023, "Scaling Data-Constrained Language Models", NeurIPS): up to about 4 epochs of
# repeated tokens train about as well as unique ones, and past about 16 the value of the repeated tokens decays to
# almost nothing. A mixture that repeats a corpus's sequences more than WARN_REPEATS times per pass is warned about;
# above max_repeats (default MAX_REPEATS) it is refused.
WARN_REPEATS = 4.0
MAX_REPEATS = 16.0

# Our own threshold, no paper's: held-out perplexity is a mean over the validation sequences, and under
# 16 of them it moves by several percent with which documents the split happens to hold.
MIN_VALIDATION_SEQUENCES = 16


@dataclass(frozen=True)
class TokenShardsSettings:
    """Packing of the tokenized documents into fixed-length training sequences."""

    seq_len: int = field(default=1024, metadata={"description": "Sequence length in tokens; windows hold seq_len + 1."})
    validation_fraction: float = field(
        default=0.05,
        metadata={
            "description": (
                "Share of documents held out for validation (the validation loss, the evaluation's perplexities); a split "
                "under 16 sequences is warned about: perplexity on it is noisy."
            )
        },
    )
    seed: int = field(
        default=0, metadata={"description": "Seed of the document-id hash that picks the validation documents."}
    )
    sequences_per_shard: int = field(
        default=8192, metadata={"description": ("Sequences per Arrow IPC shard file (the last one holds the rest).")}
    )
    mixture: Optional[dict[str, float]] = field(
        default=None,
        metadata={
            "description": (
                "A mixture's weight per corpus (its corpora: LARGETRAIN_<ROLE>_CORPORA), e.g. {kernel_docs: 0.7, plays: 0.3}; "
                "normalized to sum 1. It applies in tokens, after dedup and balancing: the train split keeps its size in "
                "sequences and each corpus gets weight x that many (up-sampled by repeating its sequences, down-sampled to "
                "an evenly spread subset; counted apart as mixture_repeat_sequences / mixture_downsampled_sequences). The "
                "validation split is unweighted. null = the corpora in their natural proportions (a mixture's shares are "
                "reported either way)."
            )
        },
    )
    max_repeats: Optional[float] = field(
        default=MAX_REPEATS,
        metadata={
            "description": (
                "The most times per pass a mixture may repeat a corpus's train sequences to reach its weight; a weight "
                "that needs more is refused, naming the corpus and its repeat factor (above 4 it is warned about; "
                "Muennighoff et al. 2023: repeated tokens lose their worth past about 16 epochs). null = no limit. "
                "Not part of the data version: it changes no sequence."
            )
        },
    )


def mixture_of(settings: TokenShardsSettings, text: Artifact, where: str) -> tuple[dict | None, bool]:
    """(the weights to pack ``text`` with, whether they are the natural proportions): None for a corpus
    that is no mixture (``text`` has no ``corpora`` stats, deduplicated_text of one corpus). Raises
    StageError when ``settings.mixture`` names a corpus the mixture does not have, or leaves one out."""
    corpora = list(text.stats.get("corpora") or {})
    if settings.mixture is None:
        return ({c: 1.0 for c in corpora}, True) if corpora else (None, False)
    unknown = sorted(set(settings.mixture) - set(corpora))
    if unknown or not corpora:
        have = (
            ("the corpora of this role are " + ", ".join(map(repr, corpora)))
            if corpora
            else "this role reads one corpus, not a mixture"
        )
        raise StageError(
            f"{where}: mixture names {', '.join(map(repr, unknown or sorted(settings.mixture)))}, but {have} "
            f"(LARGETRAIN_{where.split('/')[0].upper()}_CORPORA names them)"
        )
    missing = sorted(set(corpora) - set(settings.mixture))
    if missing:
        raise StageError(
            f"{where}: mixture gives no weight to {', '.join(map(repr, missing))}; give every corpus of "
            "the role a weight (0 leaves one out)"
        )
    return dict(settings.mixture), False


def _packing(settings: TokenShardsSettings, text: Artifact | None = None, where: str = "token_shards") -> Packing:
    mixture, natural = mixture_of(settings, text, where) if text is not None else (None, False)
    try:
        return Packing(
            settings.seq_len,
            settings.validation_fraction,
            settings.seed,
            settings.sequences_per_shard,
            mixture=mixture,
            natural=natural,
            max_repeats=settings.max_repeats,
        )
    except ValueError as e:
        raise StageError(f"{where}: {e}") from e


def _settings_version(settings: TokenShardsSettings) -> dict:
    """The settings as they enter the data version: without weights, as they were before mixtures."""
    cfg = dataclasses.asdict(settings)
    if cfg["mixture"] is None:
        del cfg["mixture"]
    del cfg["max_repeats"]  # it refuses a mixture or not, and changes no sequence
    return cfg


def _version(settings: TokenShardsSettings, text: Artifact, tokenizer: Artifact) -> str:
    return data_version(
        CODE_VERSIONS["token_shards"], _settings_version(settings), text.data_version, tokenizer.data_version
    )


def _stats(m: dict) -> dict:
    out = {
        "total_tokens": m["total_tokens"],
        "dtype": m["dtype"],
        "vocab_size": m["vocab_size"],
        **{f"{s}_{k}": v for s, d in m["splits"].items() for k, v in d.items() if k not in ("shards", "units")},
    }
    if m.get("mixture"):
        out["mixture"] = m["mixture"]
    return out


def intact(path: Path | str) -> bool:
    """Whether the token shards at ``path`` (a local path or a URL) are complete: their own files as
    their _manifest.json says, and every shard the manifest lists (the partitions' too) of the size it
    says."""
    if not fs.exists(path) or verify_manifest(path):
        return False
    try:
        for split in ("train", "validation"):
            if TokenShards(path, split).missing_files():
                return False
    except ValueError:
        return False
    return True


def token_shard_partitions(
    settings: TokenShardsSettings, text: Artifact, tokenizer: Artifact, run: StageRun, partitions: int
) -> int:
    """How many partitions tokenize ``text``: ``partitions`` (the data partitions), at most one per part
    file, at least one; 0 when the token shards of this version are complete already (nothing to do).
    Shards whose partition lost a file are not complete: the partitions run again, rebuild what is
    missing at the same version (the same bytes) and reuse the rest."""
    if intact(artifacts.location(run.root, run.key, _version(settings, text, tokenizer))):
        return 0
    return max(1, min(partitions, len(part_files(text.path))))


def token_shard_partition(
    settings: TokenShardsSettings, text: Artifact, tokenizer: Artifact, run: StageRun, partition: int, partitions: int
) -> StageResult:
    """Tokenize and pack partition ``partition`` of ``partitions`` of ``text`` (largetrain_core.shards.
    tokenize_partition) on ``run.executor`` (the local one when None; Spark: one task per run of part
    files) into ``<root>/<role>/token_shard_partitions/<i>-of-<n>/<version>/``. Stats: partition,
    partitions, parts, documents, sequences (its parts' full windows), tail_tokens, and the executor
    record. The executor is in no data version: the sequences do not depend on it."""
    version = data_version(
        CODE_VERSIONS["token_shards"],
        _settings_version(settings),
        text.data_version,
        tokenizer.data_version,
        [partition, partitions],
    )
    place = dataclasses.replace(
        run, asset=(run.asset[0], "token_shard_partitions"), partition=f"{partition:03d}-of-{partitions:03d}"
    )

    executor = run.executor or load("local")()

    def build(out: Path) -> dict:
        s = executor.run_global(
            steps.tokenize,
            out,
            in_dir=text.path,
            tokenizer_path=tokenizer.path,
            partition=partition,
            partitions=partitions,
            packing=_packing(settings, text, run.name),
        )
        keys = ("partition", "partitions", "first_part", "parts", "documents", "sequences", "tail_tokens", RECORD)
        return {k: s[k] for k in keys}

    return StageResult.built(place.build_or_reuse(version, build), version)


def token_shards(
    settings: TokenShardsSettings,
    text: Artifact,
    tokenizer: Artifact,
    run: StageRun,
    partitions: list[Artifact] | None = None,
) -> StageResult:
    """The token shards of the deduplicated corpus ``text`` with ``tokenizer`` in ``<root>/<asset>/<version>/``:
    from ``partitions`` (the :func:`token_shard_partition` results, in partition order) the global step
    (largetrain_core.shards.assemble_token_shards); without them (or when they are not given because
    the shards are complete, :func:`token_shard_partitions`) tokenized here in one process if not reused.
    Stats: total_tokens, dtype, vocab_size, per split its counts (``train_sequences``, ...),
    ``tokenizer_engine`` (tiktoken or tokenizers: which encoded the documents) and its ``_reason``,
    ``partitions`` and, from a text with relevance scores, ``relevance_score`` (their distribution,
    also in the manifest: :func:`relevance_record`). Warns (metadata ``validation_warning``) about a tiny validation split
    (:func:`tiny_validation_warning`)."""
    cfg = dataclasses.asdict(settings)
    version = _version(settings, text, tokenizer)
    final = artifacts.location(run.root, run.key, version)
    packing = _packing(settings, text, run.name)

    def build(out: Path) -> dict:
        extra = relevance_record(text.path)
        try:
            m = _write_shards(out, settings, packing, text, tokenizer, partitions, final, extra)
        except ValueError as e:
            if packing.mixture is None:
                raise
            raise StageError(f"{run.name}: {e}") from e  # a corpus weighted above 0 that has no train sequence
        engines = tokenizer_engines([p.path for p in partitions] if partitions else [out])
        return {**_stats(m), "partitions": len(partitions) if partitions else 1, **engines, **extra}

    result = StageResult.built(run.build_or_reuse(version, build), version)
    if SCORE in result.stats:  # the score distribution of what filtered_text kept
        result.metadata["relevance_score"] = Json(result.stats[SCORE])
    mix = result.stats.get("mixture")
    if mix:
        _report_mixture(result, mix)
    result.warn(tiny_validation_warning(run.asset[0], result.stats, cfg), key="validation_warning")
    result.warn(repeat_warning(run.asset[0], mix), key="repeat_warning")
    result.checks["token_ids_below_vocab"] = ids_below_vocab(result.path, result.stats["vocab_size"])
    return result


def _write_shards(
    out: Path,
    settings: TokenShardsSettings,
    packing: Packing,
    text: Artifact,
    tokenizer: Artifact,
    partitions: list[Artifact] | None,
    final,
    extra: dict,
) -> dict:
    """The shards in ``out``: assembled from ``partitions``, else tokenized here; the manifest."""
    if partitions:
        return assemble_token_shards(
            [p.path for p in partitions],
            text.path,
            tokenizer.path,
            out,
            packing,
            text.data_version,
            final_dir=mirror_path(final) if fs.is_url(final) else final,
            extra=extra,
        )
    return build_token_shards(
        text.path,
        tokenizer.path,
        out,
        seq_len=settings.seq_len,
        validation_fraction=settings.validation_fraction,
        seed=settings.seed,
        sequences_per_shard=settings.sequences_per_shard,
        source_data_version=text.data_version,
        mixture=packing.mixture,
        natural=packing.natural,
        extra=extra,
        max_repeats=packing.max_repeats,
    )


def _report_mixture(result: StageResult, mix: dict) -> None:
    """A mixture's record, shares table and each corpus's realised (and target) share in the metadata."""
    result.metadata["mixture"] = Json(mix)
    result.metadata["mixture_shares"] = Markdown(mixture_table(mix))
    for c, r in mix["corpora"].items():
        result.metadata[f"mixture_{c}_realised_share"] = r["realised_share"]
        if r.get("target_share") is not None:
            result.metadata[f"mixture_{c}_target_share"] = r["target_share"]


def repeat_factors(mix: dict | None) -> dict[str, float]:
    """Per corpus of a shard manifest's mixture record: how many times per pass its train sequences are
    repeated (sequences / sequences_packed), for the corpora up-sampled."""
    corpora = (mix or {}).get("corpora", {})
    return {
        c: r["sequences"] / r["sequences_packed"]
        for c, r in corpora.items()
        if r["sequences"] > r["sequences_packed"] > 0
    }


def repeat_warning(role: str, mix: dict | None) -> str | None:
    """The warning when a mixture repeats a corpus's train sequences more than :data:`WARN_REPEATS` times per
    pass: each such corpus with its repeat factor and the setting; else None."""
    over = {c: f for c, f in repeat_factors(mix).items() if f > WARN_REPEATS}
    if not over:
        return None
    return (
        f"{role}/token_shards: the mixture repeats "
        + ", ".join(f"corpus {c!r}'s train sequences {f:.1f} times per pass" for c, f in sorted(over.items()))
        + f" (more than {WARN_REPEATS:g}: repeated tokens train less than new ones, Muennighoff et al. 2023); lower "
        "its weight or add documents to it. token_shards `max_repeats` sets the factor above which it is refused."
    )


def mixture_table(mix: dict) -> str:
    """The mixture record of a shard manifest as a markdown table: per corpus its weight's target share,
    natural share and realised share of the train split's tokens, and the sequences repeated or left out."""
    rows = [
        "| corpus | target share | natural share | realised share | train sequences | repeated | left out |",
        "|---|---|---|---|---|---|---|",
    ]

    def pct(v):
        return "" if v is None else f"{100 * v:.1f} %"

    for c, r in mix["corpora"].items():
        rows.append(
            f"| {c} | {pct(r.get('target_share'))} | {pct(r['natural_share'])} | {pct(r['realised_share'])} | "
            f"{r['sequences']:,} | {r['repeat_sequences']:,} | {r['downsampled_sequences']:,} |"
        )
    return "\n".join(rows) + f"\n\n{mix['applies_to']}"


def relevance_record(text_dir: Path) -> dict:
    """The manifest's record of the documents' relevance scores when the text has a ``relevance_score``
    column (filtered_text's): ``{"relevance_score": histogram_quantiles of the documents'}`` (every
    document of both splits: what filtered_text kept); else {}."""
    parts = part_files(text_dir)
    if not parts or SCORE not in pl.read_parquet_schema(parts[0]):
        return {}
    return {SCORE: histogram_quantiles(score_histogram(parts))}


def ids_below_vocab(path: Path, vocab: int) -> Check:
    """Every id of both splits below ``vocab``, and the shards' sizes and checksums as manifest.json says."""
    max_id, problems = -1, []
    for split in ("train", "validation"):
        try:
            shards = TokenShards(path, split, verify_checksums=True)
        except ValueError as e:
            problems.append(str(e))
            continue
        for i in range(0, len(shards), 4096):
            max_id = max(max_id, int(shards.take(range(i, min(len(shards), i + 4096))).max()))
    return Check(not problems and max_id < vocab, {"max_id": max_id, "vocab_size": vocab, "problems": Json(problems)})


def tiny_validation_warning(role: str, stats: dict, config: dict) -> str | None:
    """The warning when ``<role>/token_shards`` (its ``stats`` and ``config`` as recorded) holds fewer
    than :data:`MIN_VALIDATION_SEQUENCES` validation sequences: how many, their tokens and documents,
    and the setting (``validation_fraction``, with a value that would give about that many); else None."""
    n = stats.get("validation_sequences")
    if n is None or n >= MIN_VALIDATION_SEQUENCES:
        return None
    fraction = config.get("validation_fraction")
    hint = (
        f"token_shards `validation_fraction` (now {fraction:g}) enlarges it"
        if fraction is not None
        else "token_shards `validation_fraction` enlarges it"
    )
    if n and fraction:
        hint += (
            f": about {min(0.5, fraction * MIN_VALIDATION_SEQUENCES / n):.2g} for {MIN_VALIDATION_SEQUENCES} sequences"
        )
    return (
        f"{role}/token_shards: the validation split is tiny: {n:,} sequences ({stats.get('validation_tokens', 0):,} "
        f"tokens, {stats.get('validation_documents', 0):,} documents), under {MIN_VALIDATION_SEQUENCES}; the "
        f"validation loss and held-out perplexity on it are noisy. {hint}; a smaller seq_len or a larger corpus too."
    )
