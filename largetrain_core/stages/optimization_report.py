"""``optimization_report``: short trainings of the chosen variants (plain data parallel as the
baseline, each ZeRO stage, activation checkpointing, fp16/bf16 where the hardware has them, LoRA) on the
pretraining shards with the launcher's ranks, and a table and a chart of tokens/s, peak memory, MFU and
loss against the baseline (largetrain_core.training.ablation). Every run measures anew: the run's id
is part of the data version."""

from __future__ import annotations

import base64
import json
from dataclasses import asdict, replace
from pathlib import Path

from largetrain_core.artifacts import CODE_VERSIONS
from largetrain_core.stages.base import Markdown, StageError, StageResult, StageRun, Text
from largetrain_core.stages.training import Launch
from largetrain_core.storage import data_version, write_json_atomic
from largetrain_core.training.ablation import CHART, MODULE, REPORT, AblationConfig


def optimization_report(
    run: StageRun, settings: AblationConfig, launch: Launch, shards: dict, run_id: str
) -> StageResult:
    """Run the ablation ``settings`` (its paths set here) on the ``shards`` handle
    (``{"path", "data_version", "stats"}``) with ``launch.launcher``, as a training is launched, into
    ``<root>/optimization_report/<version>/``; ``run_id``: the orchestrator's run, part of the version.
    Raises StageError (not retryable) for invalid settings: nothing has been launched."""
    try:
        replace(settings, output_dir="-", train_shards=shards["path"]).validate()
    except ValueError as e:
        raise StageError(str(e)) from e
    identity = {k: v for k, v in asdict(settings).items() if k not in ("output_dir", "train_shards")}
    version = data_version(
        CODE_VERSIONS["optimization_report"], identity, shards["data_version"], launch.ranks_per_node, run_id
    )

    def build(tmp: Path) -> dict:
        cfg = replace(settings, output_dir=str(tmp), train_shards=shards["path"])
        cfg_path = tmp / "ablation_config.json"
        write_json_atomic(cfg_path, cfg.to_dict())
        launch.run(cfg_path, tmp / "ablation.log", module=MODULE)
        return report_numbers(json.loads((tmp / REPORT).read_text()))

    built = run.build_or_reuse(version, build)
    report = json.loads((built.path / REPORT).read_text())
    run.log.info("optimization report:\n" + report["table"])
    return StageResult(
        built.path,
        version,
        built.stats,
        built.reused,
        metadata=report_metadata(built.path, report, built.stats),
        show_stats=False,
    )


def report_numbers(report: dict) -> dict:
    """Per variant that ran: ``<variant>_tokens_per_s`` and ``<variant>_peak_memory_gib`` (rounded, numbers
    plotted across materializations); the machine's load average, which moves these numbers."""
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


def report_metadata(path: Path, report: dict, stats: dict) -> dict:
    """The chart inline and as a path, the table, the variants not run and why, the MFU formulas, the files."""
    chart = path / CHART
    not_run = "\n".join(
        f"* **{r['name']}** {r['status']}: {r['reason']}" for r in report["variants"] if r["status"] != "ran"
    )
    ran = {r["name"]: r for r in report["variants"] if r["status"] == "ran"}
    return {
        "optimization_chart": Markdown(
            f"![tokens/s, peak memory, MFU and loss of each variant against the baseline]"
            f"(data:image/png;base64,{base64.b64encode(chart.read_bytes()).decode()})"
        ),
        "optimization_table": Markdown(report["table"]),
        **stats,
        "not_run": Markdown(not_run or "every chosen variant ran"),
        "device": report["device"],
        "peak_flops_source": str(report["peak_flops_source"]),
        **{f"{name}_mfu_formula": Text(ran[name]["mfu_formula"]) for name in ("data_parallel", "lora") if name in ran},
        "optimization_chart_png": chart,
        "report_json": path / REPORT,
        "log": path / "ablation.log",
    }
