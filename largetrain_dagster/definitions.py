"""The code location: ``dagster dev`` (workspace.yaml) and the dagster CLI load ``defs`` from here.

LARGETRAIN_ROOT sets the storage root (default ``.largetrain`` under the working directory);
LARGETRAIN_NPROC the training ranks per node (default 2); LARGETRAIN_WANDB_MODE offline/online/disabled.
"""

from __future__ import annotations

import os

from dagster import AssetSelection, Definitions, define_asset_job

from largetrain_dagster.assets import ROLES, base_checkpoint, corpus_assets, evaluation, lora_adapter, tokenizer
from largetrain_dagster.checks import dedup_checks
from largetrain_dagster.landing import LANDED_ASSETS, PartitionedHandleIOManager, landing_sensor
from largetrain_dagster.resources import HandleIOManager, Storage, TorchrunLauncher, WandbSettings
from largetrain_dagster.schedules import retrain_lora_adapter


def lineage_assets() -> list:
    """The unpartitioned lineage (both corpus chains, tokenizer, training, evaluation): what the
    ``lineage`` job and ``make demo`` materialize, without the dynamically partitioned landed chain."""
    return [a for role in ROLES for a in corpus_assets(role)] + [tokenizer, base_checkpoint, lora_adapter, evaluation]


def build_definitions(root: str | None = None, nproc_per_node: int | None = None, wandb_mode: str | None = None) -> Definitions:
    root = root or os.environ.get("LARGETRAIN_ROOT", ".largetrain")
    nproc = nproc_per_node or int(os.environ.get("LARGETRAIN_NPROC", "2"))
    assets = lineage_assets()
    # The landed chain (dynamically partitioned, largetrain_dagster.landing) is not part of the lineage job.
    lineage = define_asset_job("lineage", selection=AssetSelection.all() - AssetSelection.groups("landed_data"),
                               description="raw corpus -> cleaned text -> token shards -> base checkpoint -> LoRA adapter -> evaluation")
    return Definitions(
        assets=assets + LANDED_ASSETS,
        asset_checks=dedup_checks(ROLES),
        jobs=[lineage],
        sensors=[landing_sensor],
        schedules=[retrain_lora_adapter],
        resources={
            "storage": Storage(root=root),
            "handles": HandleIOManager(root=root),
            "landed_handles": PartitionedHandleIOManager(root=root),
            "launcher": TorchrunLauncher(nproc_per_node=nproc),
            "wandb": WandbSettings(mode=wandb_mode or os.environ.get("LARGETRAIN_WANDB_MODE", "offline")),
        },
    )


defs = build_definitions()
