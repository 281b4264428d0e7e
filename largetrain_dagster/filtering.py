"""Filtering of the training text (docs/guides/filtering.md): the relevance classifier
(largetrain_core.stages.relevance_classifier), trained on the domain corpus (or a file of examples)
against a seeded sample of the pretraining corpus (or a file), its held-out precision, recall, AUC and
most informative n-grams in the metadata; and ``<role>/filtered_text`` of the roles in
:data:`FILTERED_ROLES` (largetrain_core.stages.filtered_text), between deduplicated_text and
token_shards: decontamination against ``evaluation_sets`` (reason ``contaminated``) and the classifier's
score and threshold (reason ``relevance``), with its blocking check ``accounting`` over the whole chain."""

from typing import Optional

from dagster import AssetCheckSpec, AssetExecutionContext, AssetIn, asset

from largetrain_core.relevance import RelevanceConfig
from largetrain_core.stages.base import Artifact
from largetrain_core.stages.filtered_text import FilteredTextSettings
from largetrain_core.stages.filtered_text import filtered_text as filtered_stage
from largetrain_core.stages.relevance_classifier import relevance_classifier as relevance_stage
from largetrain_dagster.artifacts import CODE_VERSIONS, materialize_stage, stage_run
from largetrain_dagster.configs import dagster_config
from largetrain_dagster.corpus import _warn_removed_field, by_corpus, mixture_ins
from largetrain_dagster.executor import DataExecutor
from largetrain_dagster import partitions
from largetrain_dagster.partitions import FILTERED_ROLES  # noqa: F401 (the roles with a filtered_text step)
from largetrain_dagster.resources import Storage

RelevanceClassifierConfig = dagster_config(RelevanceConfig, "RelevanceClassifierConfig")
_FilteredTextSettings = dagster_config(FilteredTextSettings, "FilteredTextSettings")


class FilteredTextConfig(_FilteredTextSettings):
    """The relevance threshold (or top fraction) and what decontamination does (largetrain_core.stages.filtered_text)."""

    warn_removed_fraction: Optional[float] = _warn_removed_field(
        "the corpus's whole chain (rejected, filtered, duplicate, balanced away, relevance, contaminated)"
    )

    def to_core(self) -> FilteredTextSettings:
        return _FilteredTextSettings(**self.model_dump(exclude={"warn_removed_fraction"})).to_core()


@asset(
    key="relevance_classifier",
    group_name="pretrain_data",
    code_version=CODE_VERSIONS["relevance_classifier"],
    io_manager_key="handles",
    kinds={"scikitlearn"},
    ins={
        "domain": AssetIn(key=["domain", "deduplicated_text"]),
        "pretrain": AssetIn(key=["pretrain", "deduplicated_text"]),
    },
    description="A classifier of the wanted text (DCLM / FineWeb-Edu style): hashed word 1-2-grams and a logistic "
    "regression, the domain corpus (or a file) against a seeded sample of the pretraining corpus (or a "
    "file); held-out precision, recall, AUC and the most informative n-grams.",
)
def relevance_classifier(
    context: AssetExecutionContext, config: RelevanceClassifierConfig, storage: Storage, domain: dict, pretrain: dict
):
    yield from materialize_stage(
        context,
        config,
        relevance_stage,
        config.to_core(),
        Artifact.of(domain),
        Artifact.of(pretrain),
        stage_run(context, storage),
    )


_DESCRIPTION = (
    "The text the model is trained on: documents sharing a 13-word n-gram with a declared evaluation "
    "item removed (reason contaminated, reported with the item and the n-gram), every document scored "
    "by the relevance classifier (relevance_score) and those under the threshold or outside the top "
    "fraction removed (reason relevance)."
)


def _accounting_spec(key: list[str]) -> AssetCheckSpec:
    """The blocking check ``accounting`` of the filtered text ``key``."""
    return AssetCheckSpec(
        "accounting",
        asset=key,
        blocking=True,
        description="kept + filtered + duplicate + rejected == input over the whole chain "
        "(relevance and contaminated count as filtered), recounted from the files",
    )


def _keyed(handles: dict, names, kind: str) -> dict[str, Artifact]:
    """The ``kind`` (raw or cleaned) partitions of the asset's ``handles``: each {partition: handle}, for a
    mixture of corpora ``names`` raw__<corpus> and cleaned__<corpus>."""
    if names:
        return by_corpus(handles, names, kind)
    return {k: Artifact.of(h) for k, h in handles[kind].items()}


def filtered_text_asset(role: str):
    """``<role>/filtered_text``: ``<role>/deduplicated_text`` decontaminated against ``evaluation_sets`` and
    scored (and filtered) by ``relevance_classifier``; its blocking check ``accounting``. For a role made of
    a mixture of corpora (partitions.CORPORA), the accounting reads every partition of every corpus
    (``<role>/<corpus>/raw_corpus`` and ``cleaned_text``), as the mixture's deduplicated_text does."""
    key = [role, "filtered_text"]
    names = partitions.CORPORA.get(role) or ()
    chain = mixture_ins(role, names) or {
        "raw": AssetIn(key=[role, "raw_corpus"]),
        "cleaned": AssetIn(key=[role, "cleaned_text"]),
    }

    @asset(
        key=key,
        group_name=f"{role}_data",
        code_version=CODE_VERSIONS["filtered_text"],
        io_manager_key="handles",
        kinds={"parquet", "scikitlearn"},
        ins={
            "text": AssetIn(key=[role, "deduplicated_text"]),
            "classifier": AssetIn(key="relevance_classifier"),
            "sets": AssetIn(key="evaluation_sets"),
            **chain,
        },
        check_specs=[_accounting_spec(key)],
        description=_DESCRIPTION,
    )
    def filtered_text(
        context: AssetExecutionContext,
        config: FilteredTextConfig,
        storage: Storage,
        executor: DataExecutor,
        text: dict,
        classifier: dict,
        sets: dict,
        **handles,
    ):
        yield from materialize_stage(
            context,
            config,
            filtered_stage,
            config.to_core(),
            Artifact.of(text),
            Artifact.of(classifier),
            Artifact.of(sets),
            _keyed(handles, names, "raw"),
            _keyed(handles, names, "cleaned"),
            stage_run(context, storage, executor),
            config.warn_removed_fraction,
        )

    return filtered_text
