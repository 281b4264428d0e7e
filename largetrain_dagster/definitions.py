"""The code location: ``dagster dev`` (workspace.yaml) and the dagster CLI load ``defs`` from here. It only
assembles: each stage's assets and checks live in the module named after the stage (corpus, tokenizer,
shards, filtering, training, evaluation, landing).

LARGETRAIN_ROOT sets the storage root (default ``.largetrain`` under the working directory);
LARGETRAIN_NPROC the training ranks per node (default 2); LARGETRAIN_REPORT_TO the trackers of the
training runs, comma-separated (default ``wandb``; ``wandb,mlflow`` adds MLflow);
LARGETRAIN_WANDB_MODE offline/online/disabled; MLFLOW_TRACKING_URI MLflow's store (default
``sqlite:///<root>/mlruns.db``);
LARGETRAIN_DATA_PARTITIONS the number of hash partitions of raw_corpus and cleaned_text (default 4);
LARGETRAIN_EXECUTOR / LARGETRAIN_WORKERS / LARGETRAIN_SPARK_MASTER / LARGETRAIN_SPARK_CONF the data-prep executor (largetrain_dagster.executor;
LARGETRAIN_ENGINE, its former name, still works with a deprecation warning).

Jobs: ``prepare_partitions`` (raw_corpus + cleaned_text of both corpora, one run per partition: a
backfill over all partitions), ``lineage`` (everything after: the global dedup, tokenizer,
shards, training, evaluation) and ``optimization_ablation`` (the ``optimization_report`` asset, outside
the lineage: which training optimizations pay on this model and hardware). Their steps run in processes
forked from a server that imported this module once (:data:`STEP_EXECUTOR`).
"""

from __future__ import annotations

import os

from dagster import AssetSelection, Definitions, define_asset_job, multi_or_in_process_executor

from largetrain_dagster import partitions
from largetrain_dagster.corpus import corpus_assets, dedup_checks
from largetrain_dagster.executor import DataExecutor
from largetrain_dagster.evaluation import evaluation, evaluation_sets, no_evaluation_item_in_training_data
from largetrain_dagster.filtering import filtered_text_asset, relevance_classifier
from largetrain_dagster.landing import LANDED, LANDED_ASSETS, landed_automation, landing_sensor
from largetrain_dagster.optimization import optimization_report
from largetrain_dagster.partitions import PARTITION_STEPS, PARTITIONED_KEYS, ROLES  # noqa: F401 (PARTITIONED_KEYS: public)
from largetrain_dagster.resources import CheckWaivers, HandleIOManager, Storage, TorchrunLauncher, TrackerSettings
from largetrain_dagster.schedules import retrain_lora_adapter
from largetrain_dagster.shards import token_shards_asset
from largetrain_dagster.tokenizer import tokenizer
from largetrain_dagster.training import base_checkpoint, lora_adapter


def lineage_assets() -> list:
    """The lineage (both corpus chains, tokenizer, training, evaluation): what ``make demo``
    materializes, without the dynamically partitioned landed chain."""
    chains = [
        a
        for role in ROLES
        for a in [
            *corpus_assets(role),
            *([filtered_text_asset(role)] if partitions.filters_text(role) else []),
            *token_shards_asset(role),
        ]
    ]
    return chains + [tokenizer, relevance_classifier, base_checkpoint, lora_adapter, evaluation_sets, evaluation]


def _forkserver_unless_chosen(config: dict) -> dict:
    """The run config's ``execution.config`` with ``multiprocess.start_method`` set to forkserver where the
    run chose the multiprocess executor without a start method."""
    multiprocess = config.get("multiprocess")
    if multiprocess is not None and multiprocess.get("start_method") is None:
        return {**config, "multiprocess": {**multiprocess, "start_method": {"forkserver": {}}}}
    return config


# Dagster's default executor with the same run config (``execution: config: in_process: {}`` or
# ``multiprocess: ...``), but the multiprocess executor's steps forked from a forkserver that imported
# the code location once per run, instead of each step spawning an interpreter that imports it again:
# about 3.5 CPU s per step saved on a 2-core EPYC (Dagster's multiprocess_executor docs: start_method).
STEP_EXECUTOR = multi_or_in_process_executor.configured(
    _forkserver_unless_chosen,
    config_schema=multi_or_in_process_executor.config_schema.as_field(),
    name="multi_or_in_process_executor",
)


def build_definitions(
    root: str | None = None,
    nproc_per_node: int | None = None,
    wandb_mode: str | None = None,
    report_to: list[str] | None = None,
) -> Definitions:
    root = root or os.environ.get("LARGETRAIN_ROOT", ".largetrain")
    nproc = nproc_per_node or int(os.environ.get("LARGETRAIN_NPROC", "2"))
    assets = lineage_assets()
    # The landed chain (dynamically partitioned, largetrain_dagster.landing) is in neither job.
    prepare = define_asset_job(
        "prepare_partitions",
        selection=PARTITION_STEPS,
        partitions_def=partitions.DATA_PARTITIONS,
        description="raw corpus -> cleaned text of both corpora, one partition per run (backfill all partitions)",
    )
    lineage = define_asset_job(
        "lineage",
        selection=AssetSelection.all() - AssetSelection.groups("landed_data", "optimization") - PARTITION_STEPS,
        description="deduplicated text (all partitions) -> token shards -> base checkpoint -> LoRA adapter -> evaluation",
    )
    optimization = define_asset_job(
        "optimization_ablation",
        selection=AssetSelection.assets(optimization_report),
        description="short training runs of each optimization on this model and hardware "
        "against plain data parallel (needs pretrain/token_shards)",
    )
    return Definitions(
        assets=assets + LANDED_ASSETS + [optimization_report],
        asset_checks=[*dedup_checks([*ROLES, LANDED.prefix]), no_evaluation_item_in_training_data],
        jobs=[prepare, lineage, optimization],
        sensors=[landing_sensor, landed_automation],
        schedules=[retrain_lora_adapter],
        executor=STEP_EXECUTOR,
        resources={
            "storage": Storage(root=root),
            "handles": HandleIOManager(root=root),
            "checks": CheckWaivers(),
            "launcher": TorchrunLauncher(nproc_per_node=nproc),
            "trackers": TrackerSettings(
                report_to=report_to
                if report_to is not None
                else [t.strip() for t in os.environ.get("LARGETRAIN_REPORT_TO", "wandb").split(",") if t.strip()],
                wandb={"mode": wandb_mode or os.environ.get("LARGETRAIN_WANDB_MODE", "offline")},
                mlflow={"tracking_uri": os.environ.get("MLFLOW_TRACKING_URI")},
            ),
            "executor": DataExecutor.from_env(),
        },
    )


defs = build_definitions()
