"""The training plan (largetrain_core.training.plan): its memory and checkpoint formulas against what the
real trainer measures on CPU (largetrain_core.training.calibrate, 2 ranks under torchrun, gloo), for
several presets and ZeRO stages; and its blocking check refusing a training over its memory, disk, time
or cost budget, saying what to change.

Tolerances (stated in plan.py's docstring): the planned peak per device within 10 % of the measured
peak, relative to the measured peak less DeepSpeed's reduce bucket (5 x 10^8 elements, 2 GB in fp32,
which dominates stages 1-3 on these small models and is counted on both sides); what stays allocated
between steps within 2 %; a checkpoint's bytes on disk within 5 % (the client state, RNG states and
file headers are not in the formula). Measured on CPU: no GPU figure here (no device in the test
environment); the plan's CUDA side is the same formulas with the dtype's bytes.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from helpers import REPO
from helpers.one_launch import launch_many
from largetrain_core.shards import build_token_shards
from largetrain_core.training.calibrate import calibration_config
from largetrain_core.training.config import TrainConfig
from largetrain_core.training.plan import GiB, PlanError, PlanSettings, Throughput, check, make_plan

VOCAB, SEQ_LEN = 2048, 128


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    """Token shards of random words over a word-level vocabulary of 2,048 ids (seq_len 128), and a
    llama-3m base model (random weights) with their tokenizer, for LoRA."""
    from largetrain_core.model import build_model
    from largetrain_core.tokenizer import load_tokenizer_info, save_hf_tokenizer

    root = tmp_path_factory.mktemp("plan_data")
    words = [f"w{i}" for i in range(VOCAB - 1)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|endoftext|>"])
    (root / "tok").mkdir()
    tok.save(str(root / "tok" / "tokenizer.json"))
    rng = np.random.default_rng(0)
    texts = [" ".join(words[j] for j in rng.integers(0, VOCAB - 1, 300)) for _ in range(200)]
    (root / "docs").mkdir()
    pl.DataFrame({"doc_id": [f"d{i}" for i in range(200)], "source": ["t"] * 200, "text": texts}).write_parquet(
        root / "docs" / "part-00000.parquet"
    )
    (root / "shards").mkdir()
    build_token_shards(root / "docs", root / "tok", root / "shards", seq_len=SEQ_LEN, validation_fraction=0.05)
    info = load_tokenizer_info(root / "tok")
    base = root / "base"
    build_model("llama-3m", info.vocab_size, SEQ_LEN, info.eos_id, info.bos_id).save_pretrained(base)
    save_hf_tokenizer(info, base)
    return {"shards": root / "shards", "base": base, "root": root}


def config(
    data: dict, out: Path, preset: str, stage: int, checkpointing: bool, micro_batch: int, mode: str = "pretrain"
) -> TrainConfig:
    return TrainConfig.from_settings(
        output_dir=str(out),
        train_shards=str(data["shards"]),
        preset=preset,
        mode=mode,
        base_model=str(data["base"]) if mode == "lora" else None,
        zero_stage=stage,
        precision="fp32",
        activation_checkpointing=checkpointing,
        micro_batch_size=micro_batch,
        max_steps=3,
        warmup_steps=1,
        report_to=[],
        eval_strategy="no",
    )


CASES = [  # preset, ZeRO stage, activation checkpointing, micro-batch, mode
    ("llama-tiny", 0, False, 4, "pretrain"),
    ("llama-3m", 1, False, 4, "pretrain"),
    ("llama-3m", 2, True, 4, "pretrain"),
    ("llama-3m", 3, False, 4, "pretrain"),
    ("llama-20m", 0, False, 2, "pretrain"),
    ("llama-20m", 3, True, 2, "pretrain"),
    ("llama-3m", 2, False, 4, "lora"),
]


@pytest.fixture(scope="module")
def calibrated(data, tmp_path_factory) -> list[tuple[TrainConfig, dict]]:
    """Every case calibrated on 2 ranks in one torchrun: (its TrainConfig, its calibration.json)."""
    root = tmp_path_factory.mktemp("calibrations")
    specs, cfgs = [], []
    for i, (preset, stage, ac, mb, mode) in enumerate(CASES):
        cfg = config(data, root / f"case{i}", preset, stage, ac, mb, mode)
        cal = calibration_config(cfg, root / f"case{i}" / "calibration", 3)
        cfgs.append(cfg)
        specs.append({"train": cal.to_dict(), "steps": 1, "profiled_steps": 2, "measure_checkpoint": True})
    launch_many(specs, root / "specs.json")
    return [
        (cfg, json.loads((root / f"case{i}" / "calibration" / "calibration.json").read_text()))
        for i, cfg in enumerate(cfgs)
    ]


@pytest.mark.parametrize("case", range(len(CASES)), ids=["-".join(map(str, c)) for c in CASES])
def test_memory_and_checkpoint_formulas_match_the_measured_training(calibrated, case, tmp_path):
    cfg, measured = calibrated[case]
    plan = make_plan(cfg, PlanSettings(), world_size=2, ranks_per_host=2, cuda=False, storage_root=tmp_path)
    m = plan.memory
    bucket = 5e8 * 4 if cfg.parallelism.zero_stage else 0
    assert measured["peak_step_bytes"] >= bucket
    beside = f"plan {m['peak'] / 1e6:.2f} MB, measured {measured['peak_step_bytes'] / 1e6:.2f} MB: {m['formulas']}"
    assert abs(m["peak"] - measured["peak_step_bytes"]) <= 0.10 * (measured["peak_step_bytes"] - bucket), beside
    assert abs(m["persistent"] - measured["persistent_bytes"]) <= 0.02 * measured["persistent_bytes"], beside
    assert abs(plan.disk["checkpoint"] - measured["checkpoint_bytes"]) <= 0.05 * measured["checkpoint_bytes"]
    assert plan.shape.parameters == measured["parameters"] and plan.shape.trainable == measured["trainable_parameters"]
    assert plan.tokens_per_step == measured["tokens_per_step"]


def test_plan_over_budget_is_refused_with_what_to_change(data, tmp_path):
    cfg = config(data, tmp_path / "run", "llama-3m", 0, False, 4)
    cfg = cfg.with_settings(max_steps=1000, save_steps=100)
    fits = make_plan(cfg, PlanSettings(), 2, 2, False, tmp_path)
    assert fits.problems() == []
    check(fits)

    # memory: 0.06 GiB x 0.9 usable is below the ~73 MiB peak; activation checkpointing alone brings it under
    tight = make_plan(cfg, PlanSettings(device_memory_gib=0.06), 2, 2, False, tmp_path)
    with pytest.raises(PlanError, match="memory: the planned peak per device") as e:
        check(tight)
    assert "Changes that fit: activation_checkpointing: true: peak" in str(e.value)
    assert (
        make_plan(
            cfg.with_settings(activation_checkpointing=True),
            PlanSettings(device_memory_gib=0.06),
            2,
            2,
            False,
            tmp_path,
        ).problems()
        == []
    )

    # disk: more checkpoints kept than the storage root's file system can hold
    with pytest.raises(PlanError, match="disk: the training needs .* Lower save_total_limit"):
        check(make_plan(cfg.with_settings(save_total_limit=10**7), PlanSettings(), 2, 2, False, tmp_path))
    assert make_plan(cfg.with_settings(save_total_limit=2), PlanSettings(), 2, 2, False, tmp_path).problems() == []

    # time and cost from a throughput of 1,000 tokens/s: 1,024 tokens per step -> 1,000 steps ~ 0.28 h
    slow = Throughput(1000.0, "calibration", "a test's throughput")
    over = make_plan(cfg, PlanSettings(max_hours=0.1), 2, 2, False, tmp_path, throughput=slow)
    with pytest.raises(PlanError, match=r"time: planned 0\.\d+ h .* Lower max_steps to about (\d+)") as e:
        check(over)
    steps = int(str(e.value).split("Lower max_steps to about ")[1].split()[0])
    assert 300 < steps < 400  # 0.1 h / 1.024 s per step = 351 steps, less evaluation time
    assert (
        make_plan(
            cfg.with_settings(max_steps=steps), PlanSettings(max_hours=0.1), 2, 2, False, tmp_path, throughput=slow
        ).problems()
        == []
    )
    costly = make_plan(
        cfg, PlanSettings(price_per_device_hour=2.0, max_cost=0.5), 2, 2, False, tmp_path, throughput=slow
    )
    assert costly.cost() == pytest.approx(costly.timing()["run_s"] / 3600 * 2 * 2.0)
    with pytest.raises(PlanError, match="cost: planned 1.1") as e:
        check(costly)
    steps = int(str(e.value).split("Lower max_steps to about ")[1].split()[0])  # the advice followed, either way
    for followed in (
        make_plan(
            cfg.with_settings(max_steps=steps),
            PlanSettings(price_per_device_hour=2.0, max_cost=0.5),
            2,
            2,
            False,
            tmp_path,
            throughput=slow,
        ),
        make_plan(cfg, PlanSettings(price_per_device_hour=2.0, max_cost=1.2), 2, 2, False, tmp_path, throughput=slow),
    ):
        assert followed.problems() == []

    # check: false computes and shows the plan, and refuses nothing
    check(make_plan(cfg, PlanSettings(device_memory_gib=0.01, check=False), 2, 2, False, tmp_path))
    with pytest.raises(ValueError, match="max_cost needs plan.price_per_device_hour"):
        make_plan(cfg, PlanSettings(max_cost=1.0), 2, 2, False, tmp_path)
    make_plan(cfg, PlanSettings(max_cost=1.0, price_per_device_hour=2.0), 2, 2, False, tmp_path)  # followed: accepted
    assert PlanSettings(max_hours=1.0, throughput="none").problems() == [
        "plan.max_hours and plan.max_cost need a throughput: set plan.throughput to auto or calibrate"
    ]
    assert (
        PlanSettings(max_hours=1.0, throughput="auto").problems()
        == PlanSettings(max_hours=1.0, throughput="calibrate").problems()
        == []
    )
    table = fits.table()
    assert "| peak memory per device |" in table and "Rajbhandari" in table and f"{fits.shape.parameters:,}" in table
    assert fits.to_dict()["tokens_per_parameter"] == pytest.approx(1000 * 1024 / fits.shape.parameters)
    assert fits.usable_memory > 0.5 * GiB  # this host's MemAvailable / 2 ranks


def test_plan_command_line_refuses_and_calibrates(data, tmp_path, capsys):
    """The plan's command line: its main() with the arguments of a refusal over the device memory (in this
    process), then ``python -m largetrain_core.training.plan --calibrate`` as typed, refusing over its time
    budget after a 2-rank calibration under torchrun."""
    from largetrain_core.training.plan import main

    cfg = config(data, tmp_path / "run", "llama-tiny", 2, True, 4)
    cfg_file = tmp_path / "train_config.json"
    cfg_file.write_text(json.dumps(cfg.to_dict()))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [str(cfg_file), "--ranks", "2"]
    # ZeRO-2's 2 GB reduce bucket does not fit 0.9 GiB; nothing smaller than stage 0 is suggested, so none fits alone
    assert main([*args, "--settings", '{"device_memory_gib": 1.0}']) == 1
    small = capsys.readouterr()
    assert "does not fit: memory: the planned peak per device is 1.8" in small.err
    assert "| DeepSpeed buffers per device | 1.863 GiB |" in small.out
    cmd = [sys.executable, "-m", "largetrain_core.training.plan", *args]
    slow = subprocess.run(
        [*cmd, "--calibrate", "--settings", '{"max_hours": 1e-6}'],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert slow.returncode == 1, slow.stdout + slow.stderr
    assert "does not fit: time: planned" in slow.stderr and "Not even one step fits the budget" in slow.stderr
    assert "calibration: median of 3 timed steps" in slow.stdout
    measured = json.loads((tmp_path / "run" / "calibration" / "calibration.json").read_text())
    assert measured["world_size"] == 2 and measured["checkpoint_bytes"] > 0 and measured["tokens_per_s"] > 0
