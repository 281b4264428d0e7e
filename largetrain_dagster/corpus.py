"""Data preparation of one corpus chain, keyed ``<chain>/<asset>``:

    raw_corpus [partition] -> cleaned_text [partition] -> deduplicated_text (global)

The chains: one per corpus role (``pretrain``: the pretraining corpus, ``domain``: the corpus the
LoRA adapter specializes on), hash-partitioned (largetrain_dagster.partitions), and the landed chain
(largetrain_dagster.landing: one dynamic partition per landed file). A role with a mixture of named
corpora (LARGETRAIN_<ROLE>_CORPORA) has one partitioned chain per corpus, ``<role>/<corpus>/raw_corpus ->
<role>/<corpus>/cleaned_text``, and one ``<role>/deduplicated_text`` over all of them. Every chain runs the same core
stages (largetrain_core.stages) on the ``executor`` resource; the asset bodies only read
their config and resources and call one stage. Checks: ``accounting`` and ``no_source_wiped_out`` (in
deduplicated_text) and ``no_exact_duplicates`` (recounted from the kept files), all blocking.
"""

from dataclasses import dataclass
from typing import Callable, Optional

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetIn,
    Config,
    AutomationCondition,
    Failure,
    PartitionsDefinition,
    asset,
    asset_check,
)
from pydantic import Field

from largetrain_core.accounting import WARN_REMOVED
from largetrain_core.clean import QualityConfig
from largetrain_core.dedup import DedupConfig, VerifyConfig
from largetrain_core.dedup_report import MAX_SOURCE_REMOVED
from largetrain_core.readers import ReaderConfig
from largetrain_core.stages.base import Artifact
from largetrain_core.stages.cleaned_text import cleaned_text as clean_stage
from largetrain_core.stages.deduplicated_text import balance_settings, exact_duplicates_check
from largetrain_core.stages.deduplicated_text import deduplicated_text as dedup_stage
from largetrain_core.stages.raw_corpus import raw_corpus as raw_stage
from largetrain_dagster import partitions
from largetrain_dagster.artifacts import CODE_VERSIONS, materialize_stage, metadata_values, stage_run
from largetrain_dagster.configs import dagster_config
from largetrain_dagster.executor import DataExecutor
from largetrain_dagster.resources import Storage

ROLES = partitions.ROLES


RawCorpusConfig = dagster_config(
    ReaderConfig, "RawCorpusConfig", defaults={"path": ""}, exclude=("partition", "partitions", "id_prefix")
)


def _warn_removed_field(what: str):
    return Field(
        default=WARN_REMOVED,
        description=(
            f"Log a WARNING (and metadata removal_warning) when {what} removes more than this share of its input "
            "documents, with the top reasons and the setting that changes each. null: never. Not part of the data version."
        ),
    )


_QualitySettings = dagster_config(QualityConfig, "QualitySettings")


_MinHashSettings = dagster_config(DedupConfig, "MinHashSettings", exclude=("near",))
_MINHASH_FIELDS = tuple(_MinHashSettings.model_fields)


class CleanedTextConfig(_QualitySettings, _MinHashSettings):
    """The quality rules (largetrain_core.rules): each group's on/off switch and each rule's threshold;
    and the MinHash settings of the kept documents' signatures (largetrain_core.dedup), computed here per
    partition for deduplicated_text's exact and near-duplicate removal."""

    warn_removed_fraction: Optional[float] = _warn_removed_field("this partition's cleaning")

    def to_core(self) -> QualityConfig:
        return _QualitySettings(**self.model_dump(exclude={"warn_removed_fraction", *_MINHASH_FIELDS})).to_core()

    def dedup(self) -> DedupConfig:
        """The MinHash settings of the signatures (with the band hashes, whatever deduplicated_text's ``near``)."""
        return DedupConfig(near=True, **self.model_dump(include=set(_MINHASH_FIELDS)))


class DeduplicatedTextConfig(Config):
    """Exact + MinHash-LSH near-duplicate removal (largetrain_core.dedup) of the signatures cleaned_text
    computed, with its MinHash settings; then optional class balancing."""

    near: bool = Field(
        default=True,
        description=(
            "Also remove near duplicates (MinHash-LSH, of the signatures cleaned_text computed with its ngram, bands, "
            "rows and seed); else exact only."
        ),
    )

    verify_threshold: Optional[float] = Field(
        default=VerifyConfig().threshold,
        description=(
            "A near-duplicate candidate is removed only when the Jaccard similarity of its word 5-gram shingle set to "
            "a kept copy's reaches this (exact, measured on the candidates' texts; largetrain_core.dedup."
            "verify_assignment). null = remove whole connected components unverified (datatrove's behaviour)."
        ),
    )
    max_source_removed_fraction: Optional[float] = Field(
        default=MAX_SOURCE_REMOVED,
        description=(
            "Check no_source_wiped_out (blocking) fails when one source (a mixture's corpus, a top-level folder, a "
            "label class) loses more than this fraction of its documents to dedup (largetrain_core.dedup_report). "
            "Raise it when such a loss is intended; null = never check. Not part of the data version."
        ),
    )

    warn_removed_fraction: Optional[float] = _warn_removed_field(
        "the corpus's whole chain (rejected, filtered, duplicate, balanced away, over every partition)"
    )

    balance_target: Optional[dict[str, float]] = Field(
        default=None,
        description=(
            "Class balancing after dedup (largetrain_core.balance; needs raw_corpus label_field): target share per "
            "label (normalized; `<null>` names documents without a label; a class left out or at 0 is dropped). "
            "{} = uniform over the classes present. null = no balancing (with labels read, a WARNING gives the documents "
            "per class). With raw_corpus label_field null: no balancing, with a WARNING. With a label_field that no "
            "document has: the step fails before any work."
        ),
    )
    balance_mode: str = Field(
        default="downsample",
        description=(
            "downsample: sample every class without replacement, dropped documents count as filtered "
            "(balance_downsample); upsample: keep every document once and draw seeded extra copies of the minority "
            "classes, kept as a `copies` weight per document (never as rows, so they are not duplicates); "
            "token_shards repeats each document `copies` times in its train split."
        ),
    )
    balance_seed: int = Field(default=0, description="Seed of the balancing draw (numpy PCG64).")
    balance_max_repeats: Optional[int] = Field(
        default=None,
        description=(
            "upsample: the most copies of one document (its extra copies spread evenly over its class's documents, "
            "not drawn); a small class then stays below its target share instead of one document being trained on "
            "many times. null = no cap."
        ),
    )
    balance_temperature: Optional[float] = Field(
        default=None,
        description=(
            "With balance_target {}: target shares between the natural (1) and the uniform (.inf) ones, "
            "p_c proportional to n_c^(1/T) (temperature sampling, Conneau & Lample 2019; largetrain_core.balance."
            "temperature_target). null = the shares of balance_target."
        ),
    )

    def verify(self) -> Optional[VerifyConfig]:
        """The verification settings (None: unverified components)."""
        return None if self.verify_threshold is None else VerifyConfig(threshold=self.verify_threshold)

    def balancing(self) -> Optional[dict]:
        """The balance settings (largetrain_core.stages.deduplicated_text.balance_settings)."""
        return balance_settings(
            self.balance_target,
            self.balance_mode,
            self.balance_seed,
            self.balance_max_repeats,
            self.balance_temperature,
        )


@dataclass(frozen=True)
class Chain:
    """One corpus chain: its asset key prefix, group and partitions, and where a partition's files are.

    ``locate(storage, partition key, raw_corpus config) -> (corpus path, partition index, partitions)``;
    ``hash_partitioned``: the partitions are hash partitions of one corpus (partition i of n), else
    each is a corpus of its own read whole; ``automation``: the condition of cleaned_text and
    deduplicated_text (None: only when asked)."""

    prefix: str
    description: str
    partitions_def: PartitionsDefinition
    locate: Callable[[Storage, str, object], tuple[str, int, int]]
    raw_config: type = RawCorpusConfig
    hash_partitioned: bool = True
    automation: Optional[AutomationCondition] = None

    @property
    def key(self) -> list[str]:
        """The asset key prefix: ``[role]``, or ``[role, corpus]`` for one corpus of a mixture."""
        return self.prefix.split("/")

    @property
    def group(self) -> str:
        return f"{self.key[0]}_data"


def role_chain(role: str) -> Chain:
    """The chain of corpus role ``role``: its corpus at config ``path`` (default <root>/<the role's corpus>),
    in the deployment's hash partitions."""
    default_source, description = ROLES[role]

    def locate(storage: Storage, pk: str, config) -> tuple[str, int, int]:
        keys = partitions.DATA_PARTITIONS.get_partition_keys()
        return config.path or str(storage.location(default_source)), keys.index(pk), len(keys)

    return Chain(role, f"{description} One hash partition of its files", partitions.DATA_PARTITIONS, locate)


def mixture_chain(role: str, corpus: str) -> Chain:
    """The chain of corpus ``corpus`` of ``role``'s mixture (partitions.role_corpora): its files at config
    ``path`` (required: a mixture's corpora have no default), in the deployment's hash partitions."""

    def locate(storage: Storage, pk: str, config) -> tuple[str, int, int]:
        if not config.path:
            raise Failure(
                f"{role}/{corpus}/raw_corpus: set its config `path` (ops: {role}__{corpus}__raw_corpus) to "
                f"the files of corpus {corpus!r} of the {role} mixture",
                allow_retries=False,
            )
        keys = partitions.DATA_PARTITIONS.get_partition_keys()
        return config.path, keys.index(pk), len(keys)

    return Chain(
        f"{role}/{corpus}",
        f"Corpus {corpus!r} of the {role} mixture ({ROLES[role][1]}). One hash partition of its files",
        partitions.DATA_PARTITIONS,
        locate,
    )


def corpus_assets(chain: Chain | str) -> list:
    """raw_corpus and cleaned_text (partitioned) and deduplicated_text (global) of ``chain`` (or of the
    corpus role of that name), keyed ``<prefix>/<name>``. A role with a mixture of corpora
    (partitions.CORPORA) gets each corpus's raw_corpus and cleaned_text (``<role>/<corpus>/...``) and one
    deduplicated_text over all of them (:func:`mixture_dedup_asset`)."""
    if isinstance(chain, str) and partitions.CORPORA.get(chain):
        role = chain
        chains = [mixture_chain(role, c) for c in partitions.CORPORA[role]]
        return [a for c in chains for a in partition_assets(c)] + [mixture_dedup_asset(role, chains)]
    chain = role_chain(chain) if isinstance(chain, str) else chain
    return [*partition_assets(chain), dedup_asset(chain)]


def partition_assets(chain: Chain) -> list:
    """raw_corpus and cleaned_text of ``chain``, partitioned."""
    key, RawConfig = chain.key, chain.raw_config
    common = {"group_name": chain.group, "io_manager_key": "handles"}

    @asset(
        key=[*key, "raw_corpus"],
        code_version=CODE_VERSIONS["raw_corpus"],
        partitions_def=chain.partitions_def,
        kinds={"parquet"},
        description=f"{chain.description} read into Parquet {{doc_id, source, text}}.",
        **common,
    )
    def raw_corpus(context: AssetExecutionContext, config: RawConfig, storage: Storage, executor: DataExecutor):
        path, i, n = chain.locate(storage, context.partition_key, config)
        reader = config.to_core(path=path, partition=i, partitions=n, id_prefix=f"{key[1]}:" if len(key) > 1 else "")
        yield from materialize_stage(context, config, raw_stage, reader, stage_run(context, storage, executor))

    @asset(
        key=[*key, "cleaned_text"],
        ins={"raw": AssetIn(key=[*key, "raw_corpus"])},
        code_version=CODE_VERSIONS["cleaned_text"],
        partitions_def=chain.partitions_def,
        automation_condition=chain.automation,
        kinds={"parquet", "polars"},
        description="NFC, control characters and NUL removed, LF line endings; Gopher quality/repetition and C4 "
        "line rules with a reason code per removed document.",
        **common,
    )
    def cleaned_text(
        context: AssetExecutionContext, config: CleanedTextConfig, storage: Storage, executor: DataExecutor, raw: dict
    ):
        yield from materialize_stage(
            context,
            config,
            clean_stage,
            config.to_core(),
            Artifact.of(raw),
            stage_run(context, storage, executor),
            config.warn_removed_fraction,
            config.dedup(),
        )

    return [raw_corpus, cleaned_text]


def dedup_asset(chain: Chain):
    """deduplicated_text of ``chain``: global over its partitions."""
    prefix = chain.prefix
    common = {"group_name": chain.group, "io_manager_key": "handles"}

    @asset(
        key=[prefix, "deduplicated_text"],
        code_version=CODE_VERSIONS["deduplicated_text"],
        ins={"raw": AssetIn(key=[prefix, "raw_corpus"]), "cleaned": AssetIn(key=[prefix, "cleaned_text"])},
        automation_condition=chain.automation,
        kinds={"parquet"},
        check_specs=[
            AssetCheckSpec(
                "accounting",
                asset=[prefix, "deduplicated_text"],
                blocking=True,
                description="kept + filtered + duplicate + rejected == input, recounted from the files",
            ),
            AssetCheckSpec(
                "no_source_wiped_out",
                asset=[prefix, "deduplicated_text"],
                blocking=True,
                description="No source (mixture corpus, top-level folder, label class) lost more than "
                "max_source_removed_fraction of its documents to dedup",
            ),
        ],
        description="Global over every partition: exact (NFKC, case-folded, whitespace-collapsed key, format characters "
        "ignored) and MinHash-LSH near duplicates removed, each near duplicate verified against a kept copy (exact "
        "shingle Jaccard >= verify_threshold); the first copy in corpus order (partition, file, row) is kept.",
        **common,
    )
    def deduplicated_text(
        context: AssetExecutionContext,
        config: DeduplicatedTextConfig,
        storage: Storage,
        executor: DataExecutor,
        raw: dict,
        cleaned: dict,
    ):
        # raw and cleaned: {partition: handle} for every partition
        yield from materialize_stage(
            context,
            config,
            dedup_stage,
            config.near,
            {k: Artifact.of(h) for k, h in raw.items()},
            {k: Artifact.of(h) for k, h in cleaned.items()},
            stage_run(context, storage, executor),
            config.balancing(),
            config.warn_removed_fraction,
            chain.hash_partitioned,
            verify=config.verify(),
            max_source_removed_fraction=config.max_source_removed_fraction,
        )

    return deduplicated_text


def mixture_dedup_asset(role: str, chains: list[Chain]):
    """``<role>/deduplicated_text`` of a mixture: global over every partition of every corpus, so a document
    in two corpora is a duplicate like any other (the first copy in corpus order is kept: the corpora in
    LARGETRAIN_<ROLE>_CORPORA's order, then partition, file, row); the kept documents carry their corpus
    name in a ``corpus`` column, for the token shards' weights."""
    names = [c.key[1] for c in chains]
    ins = mixture_ins(role, names)

    @asset(
        key=[role, "deduplicated_text"],
        code_version=CODE_VERSIONS["deduplicated_text"],
        ins=ins,
        kinds={"parquet"},
        group_name=f"{role}_data",
        io_manager_key="handles",
        check_specs=[
            AssetCheckSpec(
                "accounting",
                asset=[role, "deduplicated_text"],
                blocking=True,
                description="kept + filtered + duplicate + rejected == input, recounted from the files",
            ),
            AssetCheckSpec(
                "no_source_wiped_out",
                asset=[role, "deduplicated_text"],
                blocking=True,
                description="No source (mixture corpus, top-level folder, label class) lost more than "
                "max_source_removed_fraction of its documents to dedup",
            ),
        ],
        description=f"Global over every partition of the corpora {', '.join(names)} of the {role} mixture: exact and "
        "MinHash-LSH near duplicates removed across them, the first copy in corpus order kept; each kept "
        "document carries its corpus's name (column corpus).",
    )
    def deduplicated_text(
        context: AssetExecutionContext,
        config: DeduplicatedTextConfig,
        storage: Storage,
        executor: DataExecutor,
        **handles,
    ):
        yield from materialize_stage(
            context,
            config,
            dedup_stage,
            config.near,
            by_corpus(handles, names, "raw"),
            by_corpus(handles, names, "cleaned"),
            stage_run(context, storage, executor),
            config.balancing(),
            config.warn_removed_fraction,
            True,
            names,
            verify=config.verify(),
            max_source_removed_fraction=config.max_source_removed_fraction,
        )

    return deduplicated_text


def mixture_ins(role: str, names) -> dict:
    """The inputs of a step over every partition of every corpus of ``role``'s mixture: ``raw__<corpus>``
    and ``cleaned__<corpus>`` (``<role>/<corpus>/raw_corpus`` and ``cleaned_text``)."""
    return {
        f"{kind}__{name}": AssetIn(key=[role, name, asset_name])
        for name in names
        for kind, asset_name in (("raw", "raw_corpus"), ("cleaned", "cleaned_text"))
    }


def by_corpus(handles: dict, names, kind: str) -> dict:
    """The artifacts of :func:`mixture_ins`'s ``<kind>__<corpus>`` inputs (each {partition: handle}), keyed
    ``<corpus>/<partition>``."""
    return {f"{n}/{k}": Artifact.of(h) for n in names for k, h in handles[f"{kind}__{n}"].items()}


def no_exact_duplicates_check(key: list[str]):
    """A blocking check on ``key`` (a deduplicated_text asset): no two kept documents share a dedup key."""

    @asset_check(
        asset=key,
        name="no_exact_duplicates",
        blocking=True,
        description="Recounted from the files: no two kept documents have the same dedup key (NFKC, case-folded, format characters ignored, "
        "whitespace-collapsed). Intended repetition (balancing's `copies` weight) is no duplicate: "
        "it is counted apart (intended_repeats).",
    )
    def _check(handle: dict) -> AssetCheckResult:
        check = exact_duplicates_check(Artifact.of(handle))
        return AssetCheckResult(passed=check.passed, metadata=metadata_values(check.metadata))

    return _check


def dedup_checks(prefixes) -> list:
    return [no_exact_duplicates_check([prefix, "deduplicated_text"]) for prefix in prefixes]
