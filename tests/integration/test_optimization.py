"""The optimization ablation: the variants and why some are skipped, and the ``optimization_ablation``
job run through Dagster on a tiny model with 2 ranks on CPU (every variant the hardware has, for real)."""

import base64
import json
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance

from largetrain_core.training.ablation import (
    BASELINE,
    VARIANT_NAMES,
    VARIANTS,
    AblationConfig,
    cpu_has_bf16,
    why_skipped,
)
from largetrain_dagster.definitions import build_definitions
from largetrain_dagster.resources import handle_file

V = {v.name: v for v in VARIANTS}


def test_variants_change_one_setting_and_say_why_they_cannot_run():
    assert VARIANT_NAMES[0] == BASELINE and V[BASELINE].changes == {}
    assert all(len(v.changes) == 1 for v in VARIANTS if v.name != BASELINE)
    # CPU, 2 ranks, no bf16 hardware
    skipped = {v.name: why_skipped(v, cuda=False, world=2, bf16=False) for v in VARIANTS}
    assert {k for k, r in skipped.items() if r} == {"fp16", "bf16"}
    assert "does not support fp16" in skipped["fp16"] and "AMX-BF16" in skipped["bf16"]
    # one rank: no ZeRO stage partitions anything
    one = {v.name for v in VARIANTS if why_skipped(v, cuda=True, world=1, bf16=True)}
    assert one == {"zero1", "zero2", "zero3"}
    assert not any(why_skipped(v, cuda=True, world=8, bf16=True) for v in VARIANTS)
    assert "compute capability" in why_skipped(V["bf16"], cuda=True, world=8, bf16=False)
    assert cpu_has_bf16("flags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n")
    assert not cpu_has_bf16("flags\t\t: fpu avx2 avx512f\n")
    with pytest.raises(ValueError, match=r"unknown variants \['zero4'\]"):
        AblationConfig(output_dir="o", train_shards="s", variants=["zero4"]).validate()


def test_optimization_ablation_job_runs_every_variant_the_hardware_has(tmp_path, tiny_shards):
    """The job as the UI launches it (llama-tiny, 1 + 2 steps, 2 ranks): the baseline, the three ZeRO
    stages, activation checkpointing and LoRA run; fp16 is skipped on CPU with the reason; bf16 runs
    where this CPU has bf16 hardware, else is skipped. Before any update every full-parameter variant
    and LoRA (whose B starts at zero) see the same first loss; the materialization shows the chart (an
    inline PNG) and the table with every variant against the baseline; the lineage job leaves it out."""
    root = tmp_path / "root"
    defs = build_definitions(root=str(root), nproc_per_node=2, wandb_mode="disabled")
    assert "optimization_report" not in {
        k.to_user_string() for k in defs.resolve_job_def("lineage").asset_layer.executable_asset_keys
    }
    upstream = handle_file(root, AssetKey(["pretrain", "token_shards"]))
    upstream.parent.mkdir(parents=True)
    upstream.write_text(json.dumps({"path": str(tiny_shards), "data_version": "tiny", "stats": {}}))
    run_config = {
        "ops": {
            "optimization_report": {
                "config": {
                    "preset": "llama-tiny",
                    "steps": 2,
                    "warmup_steps": 1,
                    "micro_batch_size": 2,
                    "lora": {"r": 4, "lora_alpha": 8.0},
                }
            }
        }
    }
    with DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def("optimization_ablation").execute_in_process(
            run_config=run_config, instance=instance
        )
        assert result.success
        md = {
            k: getattr(v, "value", v)
            for k, v in instance.get_latest_materialization_event(
                AssetKey("optimization_report")
            ).asset_materialization.metadata.items()
        }
        logged = [e.user_message for e in instance.all_logs(result.run_id)]
    n = len(VARIANT_NAMES)  # the run log follows the ablation variant by variant
    assert any(f"variant 1/{n} data_parallel:" in m and "tokens/s" in m for m in logged)
    assert any(f"variant {VARIANT_NAMES.index('fp16') + 1}/{n} fp16: skipped: CPU" in m for m in logged)

    report = json.loads(Path(md["report_json"]).read_text())
    status = {r["name"]: r["status"] for r in report["variants"]}
    bf16 = "ran" if cpu_has_bf16() else "skipped"
    assert status == {
        "data_parallel": "ran",
        "zero1": "ran",
        "zero2": "ran",
        "zero3": "ran",
        "activation_checkpointing": "ran",
        "fp16": "skipped",
        "bf16": bf16,
        "lora": "ran",
    }
    r = {x["name"]: x for x in report["variants"]}
    assert r["fp16"]["reason"] == "CPU: DeepSpeed's CPU accelerator does not support fp16"
    assert report["world_size"] == 2 and report["tokens_per_step"] == 2 * 2 * 32
    first = r[BASELINE]["losses"][0]
    for name in ("zero1", "zero2", "zero3", "activation_checkpointing", "lora"):
        assert r[name]["losses"][0] == pytest.approx(first, rel=1e-6), name
        assert len(r[name]["losses"]) == 3
    for name in ("zero1", "zero2", "zero3", "activation_checkpointing"):  # the same training, partitioned or recomputed
        assert r[name]["loss_after_steps"] == pytest.approx(r[BASELINE]["loss_after_steps"], abs=1e-4), name
    assert r["lora"]["trainable_parameters"] < 0.2 * r["lora"]["parameters"]
    assert r["lora"]["flops_per_token"] < r[BASELINE]["flops_per_token"]
    assert "4N + 2N_trainable" in md["lora_mfu_formula"] and "6N + 12LHS" in md["data_parallel_mfu_formula"]
    for name, x in r.items():
        if x["status"] == "ran":
            assert x["tokens_per_s"] > 0 and x["peak_memory_gib"] > 0
            assert x["vs_baseline"]["tokens_per_s"] == pytest.approx(x["tokens_per_s"] / r[BASELINE]["tokens_per_s"])
            assert md[f"{name}_tokens_per_s"] == round(x["tokens_per_s"])

    assert md["optimization_chart"].startswith("![") and "(data:image/png;base64," in md["optimization_chart"]
    png = base64.b64decode(md["optimization_chart"].split("base64,", 1)[1].rstrip(")"))
    assert png == Path(md["optimization_chart_png"]).read_bytes() and png[:8] == b"\x89PNG\r\n\x1a\n"
    table = md["optimization_table"].splitlines()
    assert table[0].startswith("| variant | tokens/s | vs baseline | peak memory (GiB)")
    assert [line.split("|")[1].strip() for line in table[2:]] == list(VARIANT_NAMES)
    assert "fp16** skipped: CPU" in md["not_run"]
    assert md["variants_ran"] == sum(s == "ran" for s in status.values())
    assert not (Path(md["report_json"]).parent / "runs").exists()  # scratch removed
