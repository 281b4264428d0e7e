"""The optimization ablation as an asset: ``optimization_report`` runs short trainings of the chosen
variants (plain data parallel as the baseline, each ZeRO stage, activation checkpointing, fp16/bf16
where the hardware has them, LoRA) on the pretraining shards with the launcher's ranks, and shows a
table and a chart of tokens/s, peak memory, MFU and loss against the baseline
(largetrain_core.stages.optimization_report; wiring only here). Not part of the lineage: its own job, ``optimization_ablation``.
Every materialization measures anew (the run id is part of its data version)."""

from dagster import AssetExecutionContext, AssetIn, asset

from largetrain_core.stages.optimization_report import optimization_report as optimization_report_stage
from largetrain_core.stages.training import Launch
from largetrain_core.training.ablation import AblationConfig
from largetrain_dagster.artifacts import CODE_VERSIONS, materialize_stage, stage_run
from largetrain_dagster.configs import dagster_config
from largetrain_dagster.resources import Storage, TorchrunLauncher

OptimizationReportConfig = dagster_config(
    AblationConfig, "OptimizationReportConfig", exclude=("output_dir", "train_shards")
)


@asset(
    key="optimization_report",
    group_name="optimization",
    code_version=CODE_VERSIONS["optimization_report"],
    ins={"shards": AssetIn(key=["pretrain", "token_shards"])},
    io_manager_key="handles",
    pool="accelerators",
    kinds={"deepspeed", "pytorch"},
    description="Which training optimizations pay on this model and hardware: short runs of plain data parallel, "
    "each ZeRO stage, activation checkpointing, fp16/bf16 and LoRA, against the baseline (tokens/s, "
    "peak memory, MFU, loss). Launch with the optimization_ablation job.",
)
def optimization_report(
    context: AssetExecutionContext,
    config: OptimizationReportConfig,
    storage: Storage,
    launcher: TorchrunLauncher,
    shards: dict,
):
    yield from materialize_stage(
        context,
        config,
        optimization_report_stage,
        stage_run(context, storage),
        config.to_core(output_dir="-", train_shards="-"),
        Launch(launcher, launcher.nproc_per_node, context=context),
        shards,
        context.run_id,
    )
