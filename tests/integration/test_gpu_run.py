"""The GPU run's rehearsal on CPU (issue 44): the two commands of docs/measurements.md, "The GPU run", run as
written with a tiny preset and 2 steps (benchmarks/gpu_run.py: prepare without wheels, then run: one
torchrun of one rank that trains every figure and the resume through the training's entry point, with
the packages the GPU image lacks made unimportable). Precision auto is fp32 here, so there is no loss scale."""

import json
import os
import shlex
import subprocess
import sys

from helpers.docblocks import REPO, commands, section_blocks
from largetrain_core.training.config import TrainConfig

DOC, SECTION = "docs/measurements.md", "The GPU run"
TINY = ["--preset", "llama-tiny", "--seq-len", "32", "--vocab", "300", "--steps", "2", "--micro-batch", "2"]
FIGURES = ("fp16_zero2_ac", "bf16_zero2", "bf16_zero0")


def test_rehearsal(tmp_path):
    prepare, run = commands(section_blocks(DOC, SECTION, "sh")[0])
    assert prepare.split()[0] == "benchmarks/gpu_prepare.sh" and run.split()[:3] == [
        "python3",
        "benchmarks/gpu_run.py",
        "run",
    ]
    bundle, out, work = tmp_path / "bundle", tmp_path / "out", tmp_path / "work"
    # no demo corpus under this root: generated text
    env = {**os.environ, "PY": sys.executable, "LARGETRAIN_ROOT": str(tmp_path / "root"), "OUT": str(out)}
    p = subprocess.run(
        [*shlex.split(prepare), *TINY, "--max-chars", "40000", "--no-wheels", "--bundle", str(bundle)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "carried size:" in p.stdout
    info = json.loads((bundle / "bundle.json").read_text())
    assert info["wheels"] == [] and info["preset"] == "llama-tiny" and info["text"].startswith("generated")
    assert info["bytes"]["total"] > info["bytes"]["shards"] > 0
    configs = {c.stem: TrainConfig.from_dict(json.loads(c.read_text())) for c in (bundle / "configs").glob("*.json")}
    assert set(configs) == {*FIGURES, "fp16_resume"}
    assert (
        configs["fp16_zero2_ac"].precision.dtype == "auto"
        and configs["fp16_resume"].checkpointing.resume_from_checkpoint == "auto"
    )
    assert all(c.tracking.report_to == [] for c in configs.values())

    r = subprocess.run(
        [sys.executable, *shlex.split(run)[1:], "--bundle", str(bundle), "--work", str(work)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr + (out / "trainings.log").read_text()[-5000:]
    report = json.loads((out / "gpu_run.json").read_text())
    assert (out / "trainings.log").stat().st_size > 0 and (out / "gpu_run.log").stat().st_size > 0
    assert report["ok"] and report["failed"] == []
    # the trainings ran without what the image lacks, kept out of them here
    assert "polars" in report["image_check"]["blocked"] and report["image_check"]["imported"] == []
    assert set(report["peak_flops"]) == {"fp32", "bf16"} and all(v["flops"] > 0 for v in report["peak_flops"].values())
    expected = {"fp16_zero2_ac": ("fp32", 2, True), "bf16_zero2": ("bf16", 2, False), "bf16_zero0": ("bf16", 0, False)}
    assert set(report["runs"]) == set(FIGURES)
    for name, f in report["runs"].items():
        assert (f["precision"], f["zero_stage"], f["activation_checkpointing"]) == expected[name], name
        assert f["error"] is None and f["plan_error"] is None and f["steps"] == 2
        for key in (
            "tokens_per_s",
            "tokens_per_s_steady",
            "mfu",
            "mfu_steady",
            "peak_memory_gib",
            "plan_peak_memory_gib",
        ):
            assert f[key] > 0, (name, key)
        assert f["peak_flops"] == report["peak_flops"][f["precision"]]["flops"]
        assert f["tokens_per_step"] == 2 * 32
        assert [row["quantity"] for row in f["plan_vs_measured"]][0] == "peak memory per device"
        # fp32 and bf16: no loss scale; the keys are there for the fp16 run on CUDA
        assert f["loss_scale_history"] is None and f["skipped_steps"] is None
    assert report["faster_bf16_zero_stage"]["zero_stage"] in (0, 2)
    res = report["resume"]
    assert res["error"] is None and res["resumed_from_step"] == 1 and res["steps_compared"] == 1
    assert res["losses_equal"] is True  # the resumed step is the uninterrupted run's, bitwise (CPU)
    assert res["loss_scale_bitwise_equal"] is None and "no loss scale" in res["note"]
