"""The optimization ablation as an asset: ``optimization_report`` runs short trainings of the chosen
variants (plain data parallel as the baseline, each ZeRO stage, activation checkpointing, fp16/bf16
where the hardware has them, LoRA) on the pretraining shards with the launcher's ranks, and shows a
table and a chart of tokens/s, peak memory, MFU and loss against the baseline
(largetrain_core.training.ablation). Not part of the lineage: its own job, ``optimization_ablation``.
Every materialization measures anew (the run id is part of its data version)."""

import base64
import json
from pathlib import Path

from dagster import AssetExecutionContext, AssetIn, Failure, MetadataValue, asset

from largetrain_core.storage import data_version, write_json_atomic
from largetrain_core.training.ablation import CHART, MODULE, REPORT, AblationConfig
from largetrain_dagster.artifacts import CODE_VERSIONS, asset_output, build_or_reuse
from largetrain_dagster.configs import dagster_config
from largetrain_dagster.resources import Storage, TorchrunLauncher

OptimizationReportConfig = dagster_config(
    AblationConfig, "OptimizationReportConfig", exclude=("output_dir", "train_shards")
)


def report_numbers(report: dict) -> dict:
    """Per variant that ran: ``<variant>_tokens_per_s`` and ``<variant>_peak_memory_gib`` (rounded, numbers
    Dagster plots across materializations); the machine's load average, which moves these numbers."""
    out = {
        "variants_ran": sum(r["status"] == "ran" for r in report["variants"]),
        "variants_skipped": sum(r["status"] == "skipped" for r in report["variants"]),
        "variants_failed": sum(r["status"] == "failed" for r in report["variants"]),
        "world_size": report["world_size"],
        "tokens_per_step": report["tokens_per_step"],
        "loadavg_1min_before": round(report["machine"]["loadavg_before"][0], 2),
        "loadavg_1min_after": round(report["machine"]["loadavg_after"][0], 2),
        "wall_seconds": round(report["machine"]["wall_s"], 1),
    }
    for r in report["variants"]:
        if r["status"] == "ran":
            out[f"{r['name']}_tokens_per_s"] = int(round(r["tokens_per_s"]))
            out[f"{r['name']}_peak_memory_gib"] = round(r["peak_memory_gib"], 3)
    return out


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
    try:
        config.to_core(output_dir="-", train_shards=shards["path"]).validate()
    except ValueError as e:
        raise Failure(str(e)) from e
    version = data_version(
        CODE_VERSIONS["optimization_report"],
        config.model_dump(),
        shards["data_version"],
        launcher.nproc_per_node,
        context.run_id,
    )
    build = _ablation(context, config, launcher, shards)
    path, stats, reused = build_or_reuse(context, storage, ["optimization_report"], version, build)
    report = json.loads((path / REPORT).read_text())
    context.log.info("optimization report:\n" + report["table"])
    metadata = _report_metadata(path, report, stats)
    yield asset_output(path, version, stats, config, reused, metadata, stats_metadata=False)


def _ablation(context, config: OptimizationReportConfig, launcher: TorchrunLauncher, shards: dict):
    """The build of a report: the ablation launched like a training into ``tmp``; its numbers as stats."""

    def build(tmp: Path) -> dict:
        cfg = config.to_core(output_dir=str(tmp), train_shards=shards["path"])
        cfg_path = tmp / "ablation_config.json"
        write_json_atomic(cfg_path, cfg.to_dict())
        launcher.run(context, cfg_path, tmp / "ablation.log", module=MODULE)
        return report_numbers(json.loads((tmp / REPORT).read_text()))

    return build


def _report_metadata(path: Path, report: dict, stats: dict) -> dict:
    """The chart inline and as a path, the table, the variants not run and why, the MFU formulas, the files."""
    chart = path / CHART
    not_run = "\n".join(
        f"* **{r['name']}** {r['status']}: {r['reason']}" for r in report["variants"] if r["status"] != "ran"
    )
    ran = {r["name"]: r for r in report["variants"] if r["status"] == "ran"}
    return {
        "optimization_chart": MetadataValue.md(
            f"![tokens/s, peak memory, MFU and loss of each variant against the baseline]"
            f"(data:image/png;base64,{base64.b64encode(chart.read_bytes()).decode()})"
        ),
        "optimization_table": MetadataValue.md(report["table"]),
        **stats,
        "not_run": MetadataValue.md(not_run or "every chosen variant ran"),
        "device": report["device"],
        "peak_flops_source": str(report["peak_flops_source"]),
        **{
            f"{name}_mfu_formula": MetadataValue.text(ran[name]["mfu_formula"])
            for name in ("data_parallel", "lora")
            if name in ran
        },
        "optimization_chart_png": MetadataValue.path(str(chart)),
        "report_json": MetadataValue.path(str(path / REPORT)),
        "log": MetadataValue.path(str(path / "ablation.log")),
    }
