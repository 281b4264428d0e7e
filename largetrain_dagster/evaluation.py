"""Evaluation (largetrain_core.stages.evaluation): held-out perplexity of the base on both corpora and of
base + adapter on the domain corpus, sample generations, benchmarks through lm-evaluation-harness (the
built-in cloze over the held-out domain documents, local task files); blocking check
``adapter_beats_base_on_domain``. The declared evaluation sets (``evaluation_sets``,
largetrain_core.stages.evaluation_sets) and the blocking lineage check
``no_evaluation_item_in_training_data``: no evaluation item in any corpus upstream of the evaluated models;
a set added later is checked without retraining (materialize evaluation_sets and evaluation)."""

from pathlib import Path

from dagster import AssetCheckResult, AssetCheckSpec, AssetExecutionContext, AssetIn, asset, asset_check

from largetrain_core.stages.base import Artifact
from largetrain_core.stages.evaluation import EvaluationSettings, generations_markdown  # noqa: F401 (generations_markdown: public)
from largetrain_core.stages.evaluation import evaluation as evaluation_stage
from largetrain_core.stages.evaluation_sets import EvaluationSetsSettings, contamination_check
from largetrain_core.stages.evaluation_sets import evaluation_sets as evaluation_sets_stage
from largetrain_dagster.artifacts import CODE_VERSIONS, materialize_stage, metadata_values, stage_run
from largetrain_dagster.configs import dagster_config
from largetrain_dagster.resources import Storage

EvaluationConfig = dagster_config(EvaluationSettings, "EvaluationConfig")
EvaluationSetsConfig = dagster_config(EvaluationSetsSettings, "EvaluationSetsConfig")


@asset(
    key="evaluation_sets",
    group_name="training",
    code_version=CODE_VERSIONS["evaluation_sets"],
    io_manager_key="handles",
    kinds={"parquet"},
    description="The declared benchmark files (JSONL of prompt and answer) as items and their hashed "
    "13-gram index, for the lineage check on evaluation; the validation splits are held "
    "out by construction.",
)
def evaluation_sets(context: AssetExecutionContext, config: EvaluationSetsConfig, storage: Storage):
    yield from materialize_stage(context, config, evaluation_sets_stage, config.to_core(), stage_run(context, storage))


@asset(
    key="evaluation",
    group_name="training",
    code_version=CODE_VERSIONS["evaluation"],
    io_manager_key="handles",
    ins={
        "base": AssetIn(key="base_checkpoint"),
        "adapter": AssetIn(key="lora_adapter"),
        "pretrain_shards": AssetIn(key=["pretrain", "token_shards"]),
        "domain_shards": AssetIn(key=["domain", "token_shards"]),
        "domain_text": AssetIn(key=["domain", "deduplicated_text"]),
    },
    check_specs=[
        AssetCheckSpec(
            "adapter_beats_base_on_domain",
            asset="evaluation",
            blocking=True,
            description="base + adapter has lower held-out domain perplexity than the base "
            "(blocking: a run whose adapter does not help fails)",
        )
    ],
    kinds={"pytorch"},
    description="Held-out perplexity (exp of the mean next-token cross-entropy over validation "
    "sequences): base on both corpora, base + adapter on the domain corpus; "
    "adapter_domain_perplexity_reduction_percent = 100 (1 - adapter / base); sample "
    "generations; lm-evaluation-harness scores (with stderr) of base and base + adapter "
    "on a cloze over held-out domain sentences and on local task files.",
)
def evaluation(
    context: AssetExecutionContext,
    config: EvaluationConfig,
    storage: Storage,
    base: dict,
    adapter: dict,
    pretrain_shards: dict,
    domain_shards: dict,
    domain_text: dict,
):
    yield from materialize_stage(
        context,
        config,
        evaluation_stage,
        config.to_core(),
        *map(Artifact.of, (base, adapter, pretrain_shards, domain_shards)),
        stage_run(context, storage),
        Artifact.of(domain_text),
    )


@asset_check(
    asset="evaluation",
    name="no_evaluation_item_in_training_data",
    blocking=True,
    additional_ins={
        "sets": AssetIn(key="evaluation_sets"),
        "base": AssetIn(key="base_checkpoint"),
        "adapter": AssetIn(key="lora_adapter"),
    },
    description="No item of the declared evaluation sets shares a 13-word n-gram with a document of any corpus "
    "upstream of the evaluated base model and adapter (their lineage); fails naming corpus, document "
    "and item. Runs again when a set is added, without retraining.",
)
def no_evaluation_item_in_training_data(storage: Storage, sets: dict, base: dict, adapter: dict) -> AssetCheckResult:
    check = contamination_check(Artifact.of(sets), [Artifact.of(base), Artifact.of(adapter)], Path(storage.root))
    return AssetCheckResult(
        passed=bool(check.passed),
        metadata=metadata_values(check.metadata),
        description=check.metadata.get("description") or None,
    )
