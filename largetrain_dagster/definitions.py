"""The code location: ``dagster dev`` (workspace.yaml) and the dagster CLI load ``defs`` from here.

LARGETRAIN_ROOT sets the storage root (default ``.largetrain`` under the working directory);
LARGETRAIN_NPROC the training ranks per node (default 2); LARGETRAIN_WANDB_MODE offline/online/disabled;
LARGETRAIN_DATA_PARTITIONS the number of hash partitions of raw_corpus and cleaned_text (default 4).

Jobs: ``prepare_partitions`` (raw_corpus + cleaned_text of both corpora, one run per partition: a
backfill over all partitions) and ``lineage`` (everything after: the global dedup, tokenizer,
shards, training, evaluation).
"""

from __future__ import annotations

import os

from dagster import AssetKey, AssetSelection, Definitions, define_asset_job

from largetrain_dagster.assets import DATA_PARTITIONS, ROLES, base_checkpoint, corpus_assets, evaluation, lora_adapter, tokenizer
from largetrain_dagster.checks import dedup_checks
from largetrain_dagster.landing import LANDED_ASSETS, landing_sensor
from largetrain_dagster.resources import HandleIOManager, Storage, TorchrunLauncher, WandbSettings
from largetrain_dagster.schedules import retrain_lora_adapter


def lineage_assets() -> list:
    """The lineage (both corpus chains, tokenizer, training, evaluation): what ``make demo``
    materializes, without the dynamically partitioned landed chain."""
    return [a for role in ROLES for a in corpus_assets(role)] + [tokenizer, base_checkpoint, lora_adapter, evaluation]


# the partitioned per-document steps of both chains (DATA_PARTITIONS)
PARTITIONED_KEYS = [AssetKey([role, name]) for role in ROLES for name in ("raw_corpus", "cleaned_text")]
PARTITION_STEPS = AssetSelection.assets(*PARTITIONED_KEYS)


def build_definitions(root: str | None = None, nproc_per_node: int | None = None, wandb_mode: str | None = None) -> Definitions:
    root = root or os.environ.get("LARGETRAIN_ROOT", ".largetrain")
    nproc = nproc_per_node or int(os.environ.get("LARGETRAIN_NPROC", "2"))
    assets = lineage_assets()
    # The landed chain (dynamically partitioned, largetrain_dagster.landing) is in neither job.
    prepare = define_asset_job("prepare_partitions", selection=PARTITION_STEPS, partitions_def=DATA_PARTITIONS,
                               description="raw corpus -> cleaned text of both corpora, one partition per run (backfill all partitions)")
    lineage = define_asset_job("lineage", selection=AssetSelection.all() - AssetSelection.groups("landed_data") - PARTITION_STEPS,
                               description="deduplicated text (all partitions) -> token shards -> base checkpoint -> LoRA adapter -> evaluation")
    return Definitions(
        assets=assets + LANDED_ASSETS,
        asset_checks=dedup_checks(ROLES),
        jobs=[prepare, lineage],
        sensors=[landing_sensor],
        schedules=[retrain_lora_adapter],
        resources={
            "storage": Storage(root=root),
            "handles": HandleIOManager(root=root),
            "launcher": TorchrunLauncher(nproc_per_node=nproc),
            "wandb": WandbSettings(mode=wandb_mode or os.environ.get("LARGETRAIN_WANDB_MODE", "offline")),
        },
    )


defs = build_definitions()
