"""The training entry point: config validation, DeepSpeed config, checkpoint selection, and real
DeepSpeed runs under torchrun (CPU, gloo) for pretraining and LoRA: 2 ranks where what is tested spans
ranks (resume, ZeRO-3, evaluation shares, nodes), 1 elsewhere."""

import json
import re
import os
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from helpers import REPO
from helpers.corpora import SHORT_RUN
from helpers.one_launch import launch_many
from helpers.training import assert_logged_with_card, launch, metrics, resume_config, someones_tokenizer, torchrun
from largetrain_core import fs
from largetrain_core.shards import TokenShards, build_token_shards
from largetrain_core.storage import atomic_dir
from largetrain_core.training.checkpoints import find_newest_complete, mark_complete, saved_topology
from largetrain_core.training import preflight
from largetrain_core.training.config import TrainConfig, WandbSettings
from largetrain_core.training.deepspeed_config import deepspeed_config, resolve_precision
from largetrain_core.training.lora import lora_target_modules
from largetrain_core.training.resume_check import identity_hash


def test_validate_names_what_to_change():
    with pytest.raises(ValueError, match="fp16 needs CUDA.*use 'auto' or 'fp32'"):
        TrainConfig.from_settings(output_dir="o", train_shards="s", precision="fp16").validate(cuda=False)
    with pytest.raises(ValueError, match="needs model.base_model"):
        TrainConfig.from_settings(output_dir="o", train_shards="s", mode="lora").validate(cuda=False)
    with pytest.raises(ValueError, match="offload_optimizer needs zero_stage 1, 2 or 3"):
        TrainConfig.from_settings(output_dir="o", train_shards="s", zero_stage=0, offload_optimizer=True).validate(
            cuda=False
        )
    with pytest.raises(ValueError, match="zero_stage must be"):
        TrainConfig.from_settings(output_dir="o", train_shards="s", zero_stage=4).validate(cuda=False)
    TrainConfig.from_settings(output_dir="o", train_shards="s", precision="fp16").validate(cuda=True)
    with pytest.raises(ValueError, match="adapter_name must be an identifier"):
        TrainConfig.from_settings(
            output_dir="o", train_shards="s", mode="lora", base_model="b", lora={"adapter_name": "my adapter"}
        ).validate(cuda=False)
    with pytest.raises(ValueError, match="merge_export applies to mode 'lora' only"):
        TrainConfig.from_settings(output_dir="o", train_shards="s", lora={"merge_export": True}).validate(cuda=False)
    with pytest.raises(ValueError, match="peak_flops must be > 0"):
        TrainConfig.from_settings(output_dir="o", train_shards="s", peak_flops=0.0).validate(cuda=False)
    with pytest.raises(ValueError, match="unknown training config keys"):
        TrainConfig.from_dict({"output_dir": "o", "train_shards": "s", "zero": 2})


def test_precision_auto():
    assert resolve_precision("auto", cuda=True)[0] == "fp16"
    prec, reason = resolve_precision("auto", cuda=False)
    assert prec == "fp32" and "CPU" in reason
    cfg = TrainConfig.from_settings(output_dir="o", train_shards="s", micro_batch_size=3, gradient_accumulation_steps=5)
    ds = deepspeed_config(cfg, world_size=2, precision="fp16")
    assert ds["fp16"]["enabled"] and ds["fp16"]["loss_scale"] == 0  # 0 = dynamic loss scaling
    assert ds["train_batch_size"] == 3 * 5 * 2
    assert "fp16" not in deepspeed_config(cfg, 2, "fp32") and "bf16" not in deepspeed_config(cfg, 2, "fp32")


def test_resume_skips_truncated_checkpoint(tmp_path):
    """tests/cases: the newest checkpoint holds zero-byte files and no marker, as after a power cut."""
    root = tmp_path / "checkpoints"
    good = root / "step-000010"
    good.mkdir(parents=True)
    (good / "mp_rank_00_model_states.pt").write_bytes(b"x" * 100)
    mark_complete(good, 10, 1, 0)
    bad = root / "step-000020"
    bad.mkdir()
    (bad / "mp_rank_00_model_states.pt").write_bytes(b"")
    (root / "latest").write_text("step-000020")
    chosen, skipped = find_newest_complete(root)
    assert chosen == good
    assert len(skipped) == 1 and "step-000020" in skipped[0] and "COMPLETE.json" in skipped[0]
    # a marker whose files were truncated afterwards does not count either
    (good / "mp_rank_00_model_states.pt").write_bytes(b"")
    chosen, skipped = find_newest_complete(root)
    assert chosen is None and "wrong size" in skipped[-1]


def test_a_marker_without_world_size_and_zero_stage_is_refused_with_what_to_do(tmp_path):
    ckpt = tmp_path / "step-000004"
    ckpt.mkdir()
    (ckpt / "COMPLETE.json").write_text(json.dumps({"step": 4, "files": {}}))
    with pytest.raises(ValueError, match=r"COMPLETE.json: records no world size and ZeRO stage .*older checkpoint"):
        saved_topology(ckpt)
    mark_complete(ckpt, 4, 2, 1)
    assert saved_topology(ckpt) == {"world_size": 2, "zero_stage": 1}


def test_lora_targets_cover_attention_and_mlp():
    from largetrain_core.model import build_model

    model = build_model("llama-tiny", 300, 32, eos_id=0)
    assert lora_target_modules(model) == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


def test_pretrain_then_lora_with_deepspeed(shards, tmp_path):
    """1 rank, ZeRO-2, activation checkpointing: the base saves as a HF directory that transformers
    loads; LoRA (with checkpointing, the frozen-embedding trap) changes the adapter weights and saves
    a PEFT directory that peft loads; the loss goes down. Both in one launch, the LoRA run after the
    pretraining in the same rank (tests/helpers/one_launch.py)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_dir = tmp_path / "base"
    cfg = TrainConfig.from_settings(
        output_dir=str(base_dir),
        train_shards=str(shards),
        preset="llama-tiny",
        zero_stage=2,
        micro_batch_size=4,
        max_steps=30,
        learning_rate=5e-3,
        warmup_steps=3,
        save_steps=10,
        save_total_limit=2,
        logging_steps=10,
        report_to=[],
        tokenizer=str(shards),
    )
    lora_dir = tmp_path / "lora"
    lcfg = TrainConfig.from_settings(
        output_dir=str(lora_dir),
        train_shards=str(shards),
        mode="lora",
        base_model=str(base_dir / "model"),
        zero_stage=2,
        activation_checkpointing=True,
        micro_batch_size=4,
        max_steps=8,
        learning_rate=1e-2,
        warmup_steps=1,
        save_steps=4,
        logging_steps=4,
        report_to=[],
        lora={"r": 4, "lora_alpha": 8.0, "lora_dropout": 0.0, "target_modules": None, "adapter_name": "default"},
    )
    launch_many([{"train": cfg.to_dict()}, {"train": lcfg.to_dict()}], tmp_path / "specs.json", nproc=1)
    rows = [json.loads(x) for x in (base_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 31))
    assert all(np.isfinite(r["loss"]) for r in rows)
    assert np.mean([r["loss"] for r in rows[-5:]]) < np.mean([r["loss"] for r in rows[:5]]) - 0.5
    ckpts = sorted(p.name for p in (base_dir / "checkpoints").iterdir() if p.name.startswith("step-"))
    assert ckpts == ["step-000020", "step-000030"]  # save_total_limit=2
    assert all((base_dir / "checkpoints" / c / "COMPLETE.json").exists() for c in ckpts)
    summary = json.loads((base_dir / "summary.json").read_text())
    assert summary["precision"] == "fp32" and summary["world_size"] == 1 and summary["steps"] == 30

    model = AutoModelForCausalLM.from_pretrained(base_dir / "model")
    tok = AutoTokenizer.from_pretrained(base_dir / "model")
    ids = tok("the kernel schedules tasks", return_tensors="pt").input_ids
    assert torch.isfinite(model(ids).logits).all()
    assert tok.eos_token == "<|endoftext|>"

    weights = load_file(lora_dir / "adapter" / "adapter_model.safetensors")
    lora_b = {k: v for k, v in weights.items() if "lora_B" in k}
    assert len(lora_b) == 7 * 2  # 7 projections x 2 layers
    # PEFT initializes lora_B to zeros: non-zero now means gradients reached every adapted layer.
    assert all(v.abs().sum() > 0 for v in lora_b.values()), [k for k, v in lora_b.items() if v.abs().sum() == 0]
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir / "model"), lora_dir / "adapter")
    assert not torch.allclose(tuned(ids).logits, model(ids).logits)
    lsum = json.loads((lora_dir / "summary.json").read_text())
    assert lsum["trainable_parameters"] < 0.2 * lsum["parameters"]


@pytest.fixture
def launcher_wandb_service(tmp_path):
    """A live process that used wandb, as a launcher might be: its W&B service token (WANDB_SERVICE),
    which the processes it starts would inherit."""
    code = (
        "import os, sys, time, wandb; wandb.init(mode='offline', dir=sys.argv[1], project='launcher'); "
        "print(os.environ['WANDB_SERVICE'], flush=True); time.sleep(900)"
    )
    tmp = tmp_path / "launcher"
    tmp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 180)
        token = proc.stdout.readline().strip() if ready else ""
        assert token, "the launcher's wandb.init gave no service within 180 s"
        yield token
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_exact_resume_after_sigkill_mid_save(shards, uninterrupted, tmp_path, monkeypatch, launcher_wandb_service):
    """2 ranks, ZeRO-2, fp32 on CPU, 8 steps, checkpoints at 3, 6, 8. Uninterrupted run vs a run whose
    whole torchrun tree is SIGKILLed in the middle of the step-6 save (after step 6, rank 0's files
    written, no marker), resumed (from step 3, skipping step 6): every loss and grad norm of steps 4..8
    and the final weights are bitwise equal. The crashed run reports to W&B (offline) and MLflow (local
    SQLite): both starts continue the same run of each, although they are launched from a process whose
    own W&B service they would inherit (a killed rank's run ID stays in use in a shared service, and the
    resume would fail). A SIGKILL right after a step (``after_step``): the LoRA resume test below."""
    from mlflow.tracking import MlflowClient

    ref = uninterrupted
    out = tmp_path / "crashed"
    cfg = resume_config(out, shards, report_to=["wandb", "mlflow"])
    monkeypatch.setenv("WANDB_SERVICE", launcher_wandb_service)
    torchrun(cfg, tmp_path, fault="mid_save:6")
    assert max(metrics(out)) == 6
    assert (out / "checkpoints" / "step-000003" / "COMPLETE.json").exists()
    assert not (out / "model").exists()
    # client state, in DeepSpeed's model-states file (our own checkpoint: loading it with pickle is fine here)
    client = torch.load(out / "checkpoints" / "step-000003" / "mp_rank_00_model_states.pt", weights_only=False)
    assert client["step"] == 3 and client["consumed_samples"] == 3 * 2 * 2 and client["sampler_seed"] == 0
    assert client["sampler_epoch"] == 12 // len(TokenShards(shards, "train"))
    assert len(client["rng"]) == 2 and set(client["rng"][1]) == {"python", "numpy", "torch"}
    assert client["config_hash"] == identity_hash(client["settings"])
    assert client["settings"]["learning_rate"] == 5e-3 and client["settings"]["seq_len"] == 32

    step6 = out / "checkpoints" / "step-000006"
    assert step6.is_dir() and any(step6.rglob("*.pt")) and not (step6 / "COMPLETE.json").exists()

    proc = torchrun(cfg, tmp_path)
    assert f"skipped {step6}: no COMPLETE.json" in proc.stderr
    assert "resumed from" in proc.stderr and "step-000003 at step 3" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from"].endswith("step-000003") and summary["steps_this_run"] == 5

    want, got = metrics(ref), metrics(out)
    assert sorted(got) == list(range(1, 9))
    for step in range(1, 9):  # bitwise: the same floats, not merely close
        assert got[step]["loss"] == want[step]["loss"], (step, got[step]["loss"], want[step]["loss"])
        assert got[step]["grad_norm"] == want[step]["grad_norm"], step
        assert got[step]["consumed_samples"] == want[step]["consumed_samples"]
    a, b = load_file(ref / "model" / "model.safetensors"), load_file(out / "model" / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir() if (p / "COMPLETE.json").exists())
    assert ckpts == ["step-000003", "step-000006", "step-000008"]

    records = json.loads((out / "trackers.json").read_text())
    assert len(list((out / "wandb").glob(f"offline-run-*-{records['wandb']['run_id']}"))) == 2  # one per start
    ml = records["mlflow"]
    client = MlflowClient(tracking_uri=ml["tracking_uri"])
    assert [r.info.run_id for r in client.search_runs([ml["experiment_id"]])] == [ml["run_id"]]
    run = client.get_run(ml["run_id"])
    assert (
        run.info.status == "FINISHED"
        and run.info.run_name == "crashed"
        and run.data.params["checkpointing.save_steps"] == "3"
    )
    # steps 4-6 were logged again after the resume, with bitwise the same losses
    history = {(m.step, m.value) for m in client.get_metric_history(ml["run_id"], "loss")}
    assert history == {(step, got[step]["loss"]) for step in range(1, 9)}
    assert {a.path for a in client.list_artifacts(ml["run_id"])} == {
        "loss_curve.png",
        "model",
        "mlflow",
        "summary.json",
    }
    assert "mlflow/model/MLmodel" in {a.path for a in client.list_artifacts(ml["run_id"], "mlflow/model")}
    assert "model/model.safetensors" in {a.path for a in client.list_artifacts(ml["run_id"], "model")}


def _zero3_config(out: Path, shards: Path) -> TrainConfig:
    return TrainConfig.from_settings(
        output_dir=str(out),
        train_shards=str(shards),
        preset="llama-tiny",
        zero_stage=3,
        activation_checkpointing=True,
        micro_batch_size=2,
        max_steps=3,
        learning_rate=5e-3,
        warmup_steps=1,
        save_steps=3,
        save_total_limit=1,
        eval_steps=1,
        eval_max_sequences=5,
        report_to=[],
        tokenizer=str(shards),
    )


@pytest.fixture(scope="module")
def two_rank_runs(shards, uninterrupted, tmp_path_factory) -> dict:
    """Three 2-rank trainings in one torchrun, one after the other in the same ranks (tests/helpers/one_launch.py,
    as the ablation's variants run: the process start and the process group once, not three times): the
    uninterrupted run resumed from each of its complete checkpoints after its first and before its last (step 6)
    over a copy of its shards, first, in ranks that have run nothing yet, as every resume starts; micro-batch 1 x 2
    accumulation steps of the same run; ZeRO-3 with evaluation. Returns the finished process (``proc``: its stderr
    holds the ranks' log), the copied shards, the resumed checkpoints and each run's output directory."""
    tmp = tmp_path_factory.mktemp("two_rank_runs")
    copied = Path(shutil.copytree(shards, tmp / "copied_root" / "shards"))
    saved = sorted(p for p in (uninterrupted / "checkpoints").iterdir() if (p / "COMPLETE.json").exists())
    resumed = {ckpt: tmp / ckpt.name for ckpt in saved[1:-1]}
    specs = [
        {"train": resume_config(out, copied, resume_from_checkpoint=str(c)).to_dict()} for c, out in resumed.items()
    ]
    accumulated, z3 = tmp / "mb1-ga2", tmp / "z3"
    specs.append(
        {"train": resume_config(accumulated, shards, micro_batch_size=1, gradient_accumulation_steps=2).to_dict()}
    )
    specs.append({"train": _zero3_config(z3, shards).to_dict()})
    proc = launch_many(specs, tmp / "specs.json")
    return {"proc": proc, "copied": copied, "saved": saved, "resumed": resumed, "accumulated": accumulated, "z3": z3}


def test_resume_from_each_later_checkpoint_is_bitwise(shards, uninterrupted, two_rank_runs, tmp_path):
    """Issue 42 item 9: a resume from every complete checkpoint of the uninterrupted run (2 ranks, ZeRO-2,
    fp32 on CPU, 8 steps) after its first (step 3: test_exact_resume_after_sigkill_mid_save) and before its
    last (step 8, nothing left to train) -- step 6 -- in a fresh output directory gives bitwise the same
    loss, grad norm and learning rate at every later step and the same final weights. Before the fix of
    checkpoints.replay_cpu_adam_steps, steps 7 and 8 took the CPU Adam kernel's pow() path for beta2**t
    and 16 of the 20 weight tensors differed in the last bits (at most 6e-8). Item 10: the resume reads a
    copy of the shards elsewhere (a storage root copied): the same content, so no setting is named as
    changed; a resume with another learning rate and other shards names both at WARNING and is refused."""
    ref, proc, saved = uninterrupted, two_rank_runs["proc"], two_rank_runs["saved"]
    assert [p.name for p in saved] == ["step-000003", "step-000006", "step-000008"]
    assert list(two_rank_runs["resumed"]) == saved[1:-1]
    want, a = metrics(ref), load_file(ref / "model" / "model.safetensors")
    for ckpt, out in two_rank_runs["resumed"].items():
        at = int(ckpt.name.split("-")[1])
        assert f"resumed from {ckpt} at step {at}" in proc.stderr
        assert "differ from this run" not in proc.stderr and "records no settings" not in proc.stderr
        got = metrics(out)
        assert sorted(got) == list(range(at + 1, 9))
        for step in got:
            assert [got[step][k] for k in ("loss", "grad_norm", "lr")] == [
                want[step][k] for k in ("loss", "grad_norm", "lr")
            ], (ckpt.name, step)
        b = load_file(out / "model" / "model.safetensors")
        assert [k for k in a if not torch.equal(a[k], b[k])] == [], ckpt.name
    # item 10 through the trainer: another learning rate and other shards (seq_len 16): named at WARNING, refused
    other = tmp_path / "shards16"
    other.mkdir()
    build_token_shards(shards.parent / "docs", shards.parent / "tok", other, seq_len=16, validation_fraction=0.1)
    cfg = resume_config(tmp_path / "refused", other, learning_rate=1e-3, resume_from_checkpoint=str(saved[1]))
    (tmp_path / "refused.json").write_text(json.dumps(cfg.to_dict()))
    proc = launch(tmp_path / "refused.json", 2)
    assert proc.returncode != 0 and not (tmp_path / "refused" / "model").exists()
    assert not (tmp_path / "refused" / "metrics.jsonl").read_text().strip()  # no step trained
    assert f"{saved[1]} was written with settings that differ from this run's: " in proc.stderr
    assert "learning_rate 0.005 -> 0.001" in proc.stderr and "seq_len 32 -> 16" in proc.stderr
    assert f"{saved[1]} was trained on other data than this run's" in proc.stderr
    assert "checkpointing.resume_across_data_change: true" in proc.stderr


def test_gradient_accumulation_equals_larger_micro_batch(shards, uninterrupted, two_rank_runs):
    """2 ranks, ZeRO-2: micro-batch 1 x 2 accumulation steps gives the same losses and weights as micro-batch 2
    (the uninterrupted run of helpers.training.resume_config; same samples per step, by the sampler's
    global positions; DeepSpeed scales each micro-loss by 1/2). Equal within fp32 rounding of the
    summation order: 1e-6 relative on losses, 1e-6 absolute on weights."""
    out = two_rank_runs["accumulated"]
    m1, m2 = metrics(uninterrupted), metrics(out)
    for step in range(1, 9):
        assert m1[step]["loss"] == pytest.approx(m2[step]["loss"], rel=1e-6, abs=0)
        assert m1[step]["consumed_samples"] == m2[step]["consumed_samples"] == step * 4
    w1 = load_file(uninterrupted / "model" / "model.safetensors")
    w2 = load_file(out / "model" / "model.safetensors")
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], rtol=0, atol=1e-6)
    from largetrain_core.model import build_model

    m = _manifest(shards)
    init = build_model("llama-tiny", m["vocab_size"], m["seq_len"], m["eos_id"], m.get("bos_id")).state_dict()
    assert any((w1[k] - init[k]).abs().max() > 1e-3 for k in w1 if k in init)  # the steps did move the weights


def _manifest(shards: Path) -> dict:
    from largetrain_core.shards import TokenShards

    return TokenShards(shards, "train").manifest


def test_zero3_exports_consolidated_safetensors_and_evaluates_uneven_shares(shards, two_rank_runs):
    """ZeRO-3 on 2 ranks partitions every parameter; the export gathers them on rank 0 into one
    model.safetensors with full shapes, equal to the fp32 weights DeepSpeed's zero_to_fp32 rebuilds
    from the two ranks' partitions of the last checkpoint (the live model at that step).

    ZeRO-3 gathers a partitioned layer's weights from all ranks in each forward, so the ranks run as
    many evaluation forwards each: 5 validation sequences on 2 ranks at micro-batch 2 give rank 0 two
    batches and rank 1 one, plus one it does not count. The validation loss of the last step equals the
    mean cross-entropy of exactly those 5 sequences under the exported model. (llama-tiny's weights are
    all below DeepSpeed's stage3_param_persistence_threshold of 1e5 elements, so they stay whole on
    every rank and unequal forward counts would not hang here; the equal counts matter for real sizes.)"""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from transformers import AutoModelForCausalLM

    out = two_rank_runs["z3"]  # its config: _zero3_config
    saved = load_file(out / "model" / "model.safetensors")
    live = get_fp32_state_dict_from_zero_checkpoint(str(out / "checkpoints"), tag="step-000003")
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    expected = model.state_dict()
    for k, v in expected.items():
        assert k in live, k
        assert live[k].shape == v.shape and v.numel() > 0
        torch.testing.assert_close(v, live[k].float(), rtol=0, atol=0)
    assert set(saved) <= set(expected)
    m = _manifest(shards)
    assert model.get_input_embeddings().weight.shape == (m["vocab_size"], 64)

    rows = metrics(out)
    assert all("eval_loss" in rows[s] for s in (1, 2, 3))
    ids = torch.from_numpy(TokenShards(shards, "validation").take(np.arange(5)).astype(np.int64))
    with torch.no_grad():
        logits = model.eval()(input_ids=ids[:, :-1]).logits
    want = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).item()
    assert rows[3]["eval_loss"] == pytest.approx(want, rel=1e-5)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, shards) -> Path:
    """A stand-in for a model someone already has: a tiny Llama saved with save_pretrained next to its own
    tokenizer (:func:`someones_tokenizer`), its embedding padded past the tokenizer's vocabulary (320
    rows), as many released models are. No hub access."""
    from largetrain_core.model import build_model

    src = tmp_path_factory.mktemp("someones_model")
    bos, eos = someones_tokenizer(src)
    model = build_model("llama-tiny", 320, 64, eos_id=eos, bos_id=bos, seed=7)
    model.save_pretrained(src)
    return src


@pytest.fixture(scope="module")
def pretrained_gpt2(tmp_path_factory) -> Path:
    """The same as :func:`pretrained` as a tiny GPT-2 (transformers GPT2LMHeadModel, whose linear layers
    are transformers ``Conv1D``: c_attn, c_proj, c_fc), from ``GPT2Config``; no hub access."""
    from transformers import GPT2Config, GPT2LMHeadModel

    src = tmp_path_factory.mktemp("someones_gpt2")
    bos, eos = someones_tokenizer(src)
    torch.manual_seed(7)
    GPT2LMHeadModel(
        GPT2Config(vocab_size=320, n_positions=64, n_embd=64, n_layer=2, n_head=2, bos_token_id=bos, eos_token_id=eos)
    ).save_pretrained(src)
    return src


def test_import_pretrained_then_lora_resume_named_adapter_and_merged_export(pretrained, shards, tmp_path):
    """base_checkpoint imports an existing HF model; the domain data is tokenized with ITS tokenizer (its
    EOS/BOS, its vocabulary); a LoRA adapter named "shakespeare" trains on it with activation checkpointing
    under 2 ranks, is SIGKILLed after step 4 and resumed from step 3: step 4's loss equals the killed run's
    step 4 (computed before the crash), bitwise. The adapter loads with peft under its name; the merged
    export (merge_and_unload) gives the logits of base + adapter within 1e-5."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from largetrain_core.model import import_pretrained, tokenizer_mismatch
    from largetrain_core.shards import TokenShards

    base = tmp_path / "base" / "model"
    info = import_pretrained(pretrained, base)
    assert info["model_vocab_size"] == 320 and info["tokenizer_vocab_size"] == 300  # specials included
    assert AutoModelForCausalLM.from_pretrained(base).config.vocab_size == 320
    dom = tmp_path / "domain_shards"
    dom.mkdir()
    build_token_shards(shards.parent / "docs", base, dom, seq_len=32, validation_fraction=0.1)
    m = TokenShards(dom, "train").manifest
    assert (m["eos_id"], m["bos_id"], m["dtype"]) == (info["eos_id"], info["bos_id"], "uint16")
    assert tokenizer_mismatch(base, m, dom) is None
    assert "another vocabulary" in tokenizer_mismatch(base, TokenShards(shards, "train").manifest, shards)

    out = tmp_path / "lora"
    cfg = TrainConfig.from_settings(
        output_dir=str(out),
        train_shards=str(dom),
        mode="lora",
        base_model=str(base),
        zero_stage=2,
        activation_checkpointing=True,
        micro_batch_size=2,
        max_steps=6,
        learning_rate=1e-2,
        warmup_steps=1,
        save_steps=3,
        logging_steps=3,
        report_to=[],
        lora={"r": 4, "lora_alpha": 8.0, "adapter_name": "shakespeare", "merge_export": True},
    )
    cfg = TrainConfig.from_dict(cfg.to_dict())
    torchrun(cfg, tmp_path, fault="after_step:4")
    before_crash = metrics(out)[4]["loss"]
    proc = torchrun(cfg, tmp_path)
    assert "step-000003 at step 3" in proc.stderr
    rows = metrics(out)
    assert rows[4]["loss"] == before_crash and sorted(rows) == list(range(1, 7))

    adapter = out / "adapter"
    assert (adapter / "adapter_name.txt").read_text().strip() == "shakespeare"
    weights = load_file(adapter / "adapter_model.safetensors")
    lora_b = {k: v for k, v in weights.items() if "lora_B" in k}
    assert len(lora_b) == 7 * 2 and all(v.abs().sum() > 0 for v in lora_b.values())
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter, adapter_name="shakespeare")
    assert tuned.active_adapter == "shakespeare"
    merged = AutoModelForCausalLM.from_pretrained(out / "merged")
    ids = torch.from_numpy(TokenShards(dom, "validation").take(np.arange(2)).astype(np.int64))
    with torch.no_grad():
        want, got = tuned.eval()(input_ids=ids).logits, merged.eval()(input_ids=ids).logits
        plain = AutoModelForCausalLM.from_pretrained(base).eval()(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert (want - plain).abs().max() > 1e-3  # the adapter does change the output


def test_two_nodes_on_loopback(shards, tmp_path):
    """A 2-node job for real: two torchrun agents (--nnodes 2, node ranks 0 and 1, one rank each) on
    127.0.0.1, started from the commands launch_commands generates; the ranks meet over TCP, train and export."""
    import shlex
    import socket

    from largetrain_core.launch import launch_commands

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "two_nodes"
    out.mkdir()
    cfg = TrainConfig.from_settings(
        output_dir=str(out),
        train_shards=str(shards),
        preset="llama-tiny",
        zero_stage=2,
        activation_checkpointing=False,
        micro_batch_size=2,
        max_steps=4,
        learning_rate=5e-3,
        warmup_steps=1,
        save_steps=4,
        save_total_limit=1,
        report_to=[],
        tokenizer=str(shards),
    )
    path = out / "config.json"
    path.write_text(json.dumps(cfg.to_dict()))
    cmds = launch_commands(str(path), ["127.0.0.1", "127.0.0.1"], 1, port=port, python=sys.executable)
    assert cmds["hostfile"] == "127.0.0.1 slots=1\n"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("LARGETRAIN_FAULT", None)
    procs = [
        subprocess.Popen(
            shlex.split(c),
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for c in cmds["torchrun"]
    ]
    try:
        logs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 4
    assert summary["peak_flops_source"].startswith("2 host(s)")
    assert (out / "model" / "model.safetensors").exists()
    assert all(np.isfinite(r["loss"]) for r in metrics(out).values())


def test_launcher_stop_reaches_ranks_in_their_own_sessions(tmp_path):
    """torchrun starts every rank with start_new_session=True: a child outside the agent's process group
    must still be stopped by stop_process_group (here a stand-in agent with one such child)."""
    from largetrain_core.processes import stop_process_group

    code = (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True)\n"
        "print(c.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    agent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    child = int(agent.stdout.readline())
    assert os.getpgid(child) != os.getpgid(agent.pid)
    stop_process_group(agent, grace_seconds=5)
    assert agent.poll() is not None
    state = (
        Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if Path(f"/proc/{child}").exists()
        else "gone"
    )
    assert state in ("Z", "X", "gone"), state


def test_launch_commands_and_mfu_inputs():
    from largetrain_core.launch import launch_commands
    from largetrain_core.training.flops import cpu_peak_flops, model_flops_per_token

    c = launch_commands("cfg.json", ["n0", "n1", "n1"], 8, port=1234, rdzv_backend="c10d")
    assert c["torchrun"][2].startswith(
        "python -m torch.distributed.run --nnodes 3 --rdzv_backend c10d --rdzv_endpoint n0:1234"
    )
    assert c["hostfile"] == "n0 slots=8\nn1 slots=8\n"
    assert (
        "--hostfile hostfile --master_addr n0 --master_port 1234 --module largetrain_core.training cfg.json"
        in c["deepspeed"]
    )
    s = launch_commands("cfg.json", ["a", "b"], 4)["torchrun"]
    assert "--node_rank 1 --master_addr a --master_port 29500" in s[1]
    assert "--standalone" in launch_commands("cfg.json", ["a"], 2)["torchrun"][0]
    # PaLM appendix B: 6N + 12 L H S; frozen weights (LoRA) skip the weight gradient: 4N + 2N_trainable + 12 L H S
    assert model_flops_per_token(1000, 2, 64, 32) == 6 * 1000 + 12 * 2 * 64 * 32
    assert model_flops_per_token(1000, 2, 64, 32, n_trainable=10) == 4 * 1000 + 2 * 10 + 12 * 2 * 64 * 32
    assert model_flops_per_token(1000, 2, 64, 32, n_trainable=1000) == model_flops_per_token(1000, 2, 64, 32)
    intel = "model name\t: Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz\nflags\t\t: fpu avx2 fma avx512f\n"
    peak, how = cpu_peak_flops(cores=4, cpuinfo=intel)
    assert peak == pytest.approx(4 * 2.3e9 * 64) and "AVX-512" in how
    amd = "vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\ncpu MHz\t\t: 2600.000\nflags\t\t: avx2 fma avx512f\n"
    assert cpu_peak_flops(cores=2, cpuinfo=amd)[0] == pytest.approx(2 * 2.6e9 * 32)


def test_assets_import_pretrained_model_and_adapt_it(pretrained_gpt2, tmp_path):
    """Through Dagster, as recipe 3 (configs/import_hf_model.yaml) does: tokenizer and base_checkpoint take an
    existing local HF model, a GPT-2 (pretrained_model in their config); both corpora are tokenized with its
    tokenizer (its EOS </s>, its BOS <s>); no pretraining runs; the LoRA adapter trains on the imported model
    with the default targets, GPT-2's Conv1D layers c_attn, c_proj, c_fc (fan_in_fan_out; tests/cases: LoRA
    on GPT-2), every one of them trained, reporting to W&B (offline) and MLflow (the storage root's SQLite
    store), whose runs the metadata names and hold the adapter with its model card and lineage.json (not
    PEFT's template card); evaluation reports perplexities and generations."""
    pretrained = pretrained_gpt2
    import base64

    from dagster import AssetKey, DagsterInstance
    from mlflow.tracking import MlflowClient

    from largetrain_core.training.trackers import read_metrics
    from largetrain_dagster.definitions import build_definitions, lineage_assets
    from helpers.lineage import materialize_lineage

    corpora = Path(os.environ.get("LARGETRAIN_ROOT", REPO / ".largetrain")) / "corpora"
    if not (corpora / "shakespeare").is_dir() or not (corpora / "linux-doc").is_dir():
        pytest.fail(f"real corpora missing at {corpora}: run `make corpora`")
    lora = {
        "schedule": {"max_steps": 8, "warmup_steps": 1, "micro_batch_size": 2},
        "optimizer": {"learning_rate": 1e-2},
        "checkpointing": {"save_steps": 4},
        "tracking": {"logging_steps": 2},
        "lora": {"r": 4, "lora_alpha": 8.0},
        **SHORT_RUN,
    }
    run_config = {
        "ops": {
            "pretrain__raw_corpus": {
                "config": {"path": str(corpora / "linux-doc" / "admin-guide"), "max_documents": 3}
            },
            "domain__raw_corpus": {"config": {"path": str(corpora / "shakespeare" / "comedies"), "max_documents": 1}},
            "tokenizer": {"config": {"pretrained_model": str(pretrained)}},
            "pretrain__token_shards": {"config": {"seq_len": 32, "validation_fraction": 0.1}},
            "domain__token_shards": {"config": {"seq_len": 32, "validation_fraction": 0.1}},
            "base_checkpoint": {"config": {"pretrained_model": str(pretrained)}},
            "lora_adapter": {"config": lora},
            "evaluation": {"config": {"max_sequences": 4, "prompts": ["Good morrow"], "max_new_tokens": 4}},
        }
    }
    defs = build_definitions(
        root=str(tmp_path / "root"), nproc_per_node=1, wandb_mode="offline", report_to=["wandb", "mlflow"]
    )
    with DagsterInstance.ephemeral() as instance:
        result = materialize_lineage(lineage_assets(), defs.resources, instance, run_config)
        assert result.success

        def md(*key):
            ev = instance.get_latest_materialization_event(AssetKey(list(key)))
            return {k: getattr(v, "value", v) for k, v in ev.asset_materialization.metadata.items()}

        base = md("base_checkpoint")
        assert base["imported_from"] == str(pretrained) and base["model_vocab_size"] == 320
        assert not (Path(base["output"]).parent / "metrics.jsonl").exists()  # nothing was pretrained
        eos = json.loads((pretrained / "tokenizer.json").read_text())["added_tokens"][1]
        assert eos["content"] == "</s>"
        for role in ("pretrain", "domain"):
            assert md(role, "token_shards")["vocab_size"] == 300
            manifest = json.loads((Path(md(role, "token_shards")["path"]) / "manifest.json").read_text())
            assert manifest["eos_id"] == eos["id"]
        adapter = md("lora_adapter")
        assert adapter["steps"] == 8 and adapter["training_curves_png"].endswith("loss_curve.png")
        assert adapter["lora_target_modules"] == "c_attn, c_fc, c_proj"
        assert json.loads((Path(adapter["output"]) / "adapter_config.json").read_text())["fan_in_fan_out"] is True
        lora_b = {
            k: v for k, v in load_file(Path(adapter["output"]) / "adapter_model.safetensors").items() if "lora_B" in k
        }
        assert len(lora_b) == 4 * 2 and all(
            v.abs().sum() > 0 for v in lora_b.values()
        )  # attn c_attn, c_proj; mlp c_fc, c_proj
        # what an engineer reads first: the curves inline, then rounded numbers with their units
        png = Path(adapter["training_curves_png"]).read_bytes()
        assert (
            adapter["training_curves"]
            == f"![training and validation loss, learning rate](data:image/png;base64,{base64.b64encode(png).decode()})"
        )
        summary = json.loads((Path(adapter["path"]) / "summary.json").read_text())
        assert adapter["first_loss"] == round(summary["first_loss"], 3) and adapter["eval_loss"] == round(
            summary["eval_loss"], 3
        )
        assert adapter["mfu_percent"] == round(100 * summary["mfu"], 1)
        assert adapter["peak_tflops"] == round(summary["peak_flops"] / 1e12, 3)
        assert "mfu" not in adapter and "peak_flops" not in adapter  # only the rounded, unit-named numbers
        assert "4N + 2N_trainable + 12LHS" in adapter["mfu_formula"]
        table = adapter["loss_table"].splitlines()
        # the loss against the step as text on the page itself, 8 steps in 8 spans: one block per step
        spark = re.fullmatch(r"loss (\S+) → (\S+), steps 1-8: ([▁▂▃▄▅▆▇█]{8})", adapter["loss_curve"])
        assert spark and float(spark[1]) == round(summary["first_loss"], 3), adapter["loss_curve"]
        assert table[0].startswith("| step | training loss (nats) | validation loss (nats) |")
        assert table[-1].startswith("| 8 | ") and table[-1].split("|")[3].strip() == f"{summary['eval_loss']:.4f}"
        # each tracker's run in the metadata; MLflow's store under the storage root holds every step's loss
        out = Path(adapter["path"])
        assert adapter["wandb_run_id"] and adapter["wandb_sync_command"].startswith("`wandb sync --id ")
        assert adapter["mlflow_tracking_uri"] == f"sqlite:///{tmp_path / 'root' / 'mlruns.db'}"
        client = MlflowClient(tracking_uri=adapter["mlflow_tracking_uri"])
        run = client.get_run(adapter["mlflow_run_id"])
        assert run.info.status == "FINISHED" and run.info.run_name == f"lora_adapter-{adapter['data_version']}"
        assert run.data.params["mode"] == "lora" and run.data.params["lora.r"] == "4"
        assert sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")) == [
            (r["step"], r["loss"]) for r in read_metrics(out / "metrics.jsonl")
        ]
        # the plot's other series reach the tracker too: the learning rate and every evaluation
        for series in ("lr", "eval_loss", "eval_perplexity"):
            assert sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, series)) == [
                (r["step"], r[series]) for r in read_metrics(out / "metrics.jsonl") if series in r
            ], series
        assert [m.step for m in client.get_metric_history(run.info.run_id, "eval_loss")] == [
            8
        ]  # eval_steps 50 > 8 steps
        assert "adapter/adapter_model.safetensors" in {
            a.path for a in client.list_artifacts(run.info.run_id, "adapter")
        }
        assert_logged_with_card(
            Path(adapter["output"]), json.loads((out / "trackers.json").read_text()), tmp_path / "logged"
        )
        assert client.get_run(run.info.run_id).info.status == "FINISHED"  # again, after the adapter was logged to it
        ev = md("evaluation")
        assert ev["adapter_domain_perplexity"] > 1 and "Good morrow" in ev["sample_generations"]


def test_trackers_continue_their_runs_after_a_restart(tmp_path, monkeypatch, caplog):
    """Rank 0's trackers, W&B offline and MLflow on its default local SQLite store: a second start in
    the same output directory (a resume) continues the same W&B and MLflow runs; metrics.jsonl is
    appended to; MLflow holds the params, every step's metrics, the artifacts and the final status."""
    from mlflow.tracking import MlflowClient

    from largetrain_core.training.trackers import Trackers, read_metrics

    monkeypatch.delenv("DAGSTER_PIPES_CONTEXT", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    out.mkdir()
    (out / "model").mkdir()
    (out / "model" / "config.json").write_text("{}")
    cfg = TrainConfig.from_settings(
        output_dir=str(out),
        train_shards="-",
        report_to=["wandb", "mlflow", "dagster_pipes"],
        run_name="restarted",
        wandb=WandbSettings(project="p"),
    )
    cfg = TrainConfig.from_dict(cfg.to_dict())
    records = []
    for start, steps in ((1, (1, 2)), (2, (2, 3))):  # the second start redoes step 2, as after a crash
        trackers = Trackers(cfg, rank=0)
        records.append(trackers.start())
        for step in steps:
            trackers.log_metrics(step, {"loss": 1.0 / step + start, "lr": 1e-3, "grad_norm": None})
        if start == 2:
            trackers.log_artifact(out / "model")
        trackers.finish({"steps": 3, "last_loss": 1.0 / 3 + 2} if start == 2 else None)
    assert "not launched through Dagster Pipes" in caplog.text
    assert records[0] == records[1] == json.loads((out / "trackers.json").read_text())
    assert set(records[0]) == {"wandb", "mlflow"}
    wb, ml = records[0]["wandb"], records[0]["mlflow"]
    assert len(list((out / "wandb").glob(f"offline-run-*-{wb['run_id']}"))) == 2
    assert wb["sync_command"].startswith(f"wandb sync --id {wb['run_id']} ")
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3]

    assert ml["tracking_uri"] == f"sqlite:///{tmp_path / 'mlruns.db'}"
    client = MlflowClient(tracking_uri=ml["tracking_uri"])
    run = client.get_run(ml["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "restarted"
    assert run.data.params["optimizer.learning_rate"] == "0.001" and run.data.params["lora.r"] == "8"
    assert run.data.params["tracking.report_to"] == '["wandb", "mlflow", "dagster_pipes"]'
    history = [(m.step, m.value) for m in client.get_metric_history(ml["run_id"], "loss")]
    assert sorted(history) == [(1, 2.0), (2, 1.5), (2, 2.5), (3, 1.0 / 3 + 2)]
    assert client.get_metric_history(ml["run_id"], "grad_norm") == []  # None: not measured, not logged
    assert [a.path for a in client.list_artifacts(ml["run_id"])] == ["model", "summary.json"]
    assert [a.path for a in client.list_artifacts(ml["run_id"], "model")] == ["model/config.json"]
    assert Path(client.download_artifacts(ml["run_id"], "model/config.json", str(tmp_path))).read_text() == "{}"
    assert (tmp_path / "mlartifacts").is_dir() and not (tmp_path / "mlruns").exists()  # not MLflow's ./mlruns
    assert [r.info.run_id for r in client.search_runs([ml["experiment_id"]])] == [ml["run_id"]]


def test_unknown_tracker_is_refused():
    with pytest.raises(
        ValueError, match=r"report_to must list distinct trackers among \['dagster_pipes', 'mlflow', 'wandb'\]"
    ):
        preflight.check_config(
            TrainConfig.from_settings(output_dir="o", train_shards="s", report_to=["tensorboard"]), cuda=False
        )
    with pytest.raises(ValueError, match="unknown training config lora keys \\['rank'\\]"):
        TrainConfig.from_dict({"output_dir": "o", "train_shards": "s", "lora": {"rank": 4}})


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory, shards) -> Path:
    """A freshly initialized llama-tiny for the shards' vocabulary, saved as a Hugging Face directory."""
    from largetrain_core.model import build_model

    m = _manifest(shards)
    out = tmp_path_factory.mktemp("tiny_base")
    build_model("llama-tiny", m["vocab_size"], m["seq_len"], m["eos_id"], m.get("bos_id"), seed=3).save_pretrained(out)
    return out


def test_evaluation_during_training_leaves_the_training_bitwise_unchanged(shards, tiny_base, tmp_path):
    """2 ranks, ZeRO-2, LoRA with lora_dropout 0.2 (dropout draws from torch's RNG in every training
    forward): evaluating every 2 steps gives bitwise the same training losses, grad norms and adapter
    weights as not evaluating (the two runs one after the other in the same ranks, as the ablation's variants:
    a run that left state behind would show here too). The evaluations (steps 2, 4, 6 and the last, 7) report the mean
    cross-entropy over the first eval_max_sequences validation sequences (the ranks' shares together),
    recomputed here in one process, and its perplexity; the summary and the PNG carry them."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    outs, specs = {}, []
    for strategy in ("steps", "no"):
        out = tmp_path / f"eval-{strategy}"
        cfg = TrainConfig.from_settings(
            output_dir=str(out),
            train_shards=str(shards),
            mode="lora",
            base_model=str(tiny_base),
            zero_stage=2,
            activation_checkpointing=False,
            micro_batch_size=2,
            max_steps=7,
            learning_rate=1e-2,
            warmup_steps=1,
            save_steps=7,
            eval_strategy=strategy,
            eval_steps=2,
            eval_max_sequences=5,
            report_to=[],
            lora={"r": 4, "lora_alpha": 8.0, "lora_dropout": 0.2},
        )
        specs.append({"train": cfg.to_dict()})
        outs[strategy] = out
    launch_many(specs, tmp_path / "specs.json")  # the second run's ranks have run the first
    off, on = metrics(outs["no"]), metrics(outs["steps"])
    assert sorted(off) == sorted(on) == list(range(1, 8))
    for step in range(1, 8):
        assert on[step]["loss"] == off[step]["loss"], (step, on[step]["loss"], off[step]["loss"])
        assert on[step]["grad_norm"] == off[step]["grad_norm"], step
        assert "eval_loss" not in off[step]
    assert [s for s in on if "eval_loss" in on[s]] == [2, 4, 6, 7]
    a = load_file(outs["no"] / "adapter" / "adapter_model.safetensors")
    b = load_file(outs["steps"] / "adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    # the last evaluation, recomputed in one process from the exported adapter
    val = TokenShards(shards, "validation")
    assert len(val) >= 5
    ids = torch.from_numpy(val.take(np.arange(5)).astype(np.int64))
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_base), outs["steps"] / "adapter").eval()
    with torch.no_grad():
        logits = model(input_ids=ids[:, :-1]).logits
    want = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).item()
    assert on[7]["eval_loss"] == pytest.approx(want, rel=1e-5)
    assert on[7]["eval_perplexity"] == pytest.approx(np.exp(on[7]["eval_loss"]), rel=1e-12)
    summary = json.loads((outs["steps"] / "summary.json").read_text())
    assert summary["eval_loss"] == on[7]["eval_loss"] and summary["eval_step"] == 7 and not summary["stopped_early"]
    best = min((on[s]["eval_loss"], s) for s in (2, 4, 6, 7))
    assert (summary["best_eval_loss"], summary["best_eval_step"]) == best
    assert "eval_loss" not in json.loads((outs["no"] / "summary.json").read_text())
    # LoRA's MFU counts no weight gradient for the frozen base: 4N + 2N_trainable + 12LHS
    n, k = summary["parameters"], summary["trainable_parameters"]
    assert summary["flops_per_token"] == 4 * n + 2 * k + 12 * 2 * 64 * _manifest(shards)["seq_len"]
    assert summary["mfu_formula"].startswith(
        "MFU = tokens/s x FLOPs/token / peak FLOP/s; FLOPs/token = 4N + 2N_trainable"
    )
    png = Path(summary["loss_curve"])
    assert png.name == "loss_curve.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_early_stopping_ends_the_run_and_a_resume_keeps_it_ended(shards, tmp_path):
    """early_stopping_patience 2 with a threshold no decrease can reach (100 nats): the evaluations of
    steps 2 and 3 do not improve on step 1's by more, so the run stops after step 3 of 20 with a
    checkpoint there and the model exported; the best validation loss is still the lowest one. Started
    again (resume auto), it resumes the stopped state from that checkpoint and trains no further step."""
    out = tmp_path / "early"
    cfg = TrainConfig.from_settings(
        output_dir=str(out),
        train_shards=str(shards),
        preset="llama-tiny",
        zero_stage=2,
        activation_checkpointing=False,
        micro_batch_size=2,
        max_steps=20,
        learning_rate=5e-3,
        warmup_steps=1,
        save_steps=10,
        eval_steps=1,
        eval_max_sequences=4,
        early_stopping_patience=2,
        early_stopping_threshold=100.0,
        report_to=[],
        tokenizer=str(shards),
    )
    proc = torchrun(cfg, tmp_path)
    assert "early stopping at step 3" in proc.stderr
    rows = metrics(out)
    assert sorted(rows) == [1, 2, 3] and all("eval_loss" in r for r in rows.values())
    summary = json.loads((out / "summary.json").read_text())
    best = min(rows.values(), key=lambda r: r["eval_loss"])
    assert summary["stopped_early"] and summary["steps"] == 3
    assert (summary["best_eval_loss"], summary["best_eval_step"]) == (best["eval_loss"], best["step"])
    assert (out / "checkpoints" / "step-000003" / "COMPLETE.json").exists() and (
        out / "model" / "model.safetensors"
    ).exists()

    proc = torchrun(cfg, tmp_path)
    assert "step-000003 at step 3" in proc.stderr
    again = json.loads((out / "summary.json").read_text())
    assert again["steps"] == 3 and again["steps_this_run"] == 0 and again["stopped_early"]
    assert sorted(metrics(out)) == [1, 2, 3]


def test_evaluation_settings_are_checked():
    base = {"output_dir": "o", "train_shards": "s"}
    with pytest.raises(ValueError, match="eval_strategy must be one of steps, no, not 'epoch'"):
        TrainConfig.from_settings(**{**base, "eval_strategy": "epoch"}).validate(cuda=False)
    with pytest.raises(ValueError, match="early_stopping_patience must be null or >= 1 with eval_strategy 'steps'"):
        TrainConfig.from_settings(**{**base, "eval_strategy": "no", "early_stopping_patience": 2}).validate(cuda=False)
    with pytest.raises(ValueError, match="eval_steps and eval_max_sequences must be >= 1"):
        TrainConfig.from_settings(**{**base, "eval_steps": 0}).validate(cuda=False)
    # evaluation changes no weight unless early stopping acts on it
    plain = TrainConfig.from_settings(**base)
    assert (
        TrainConfig.from_settings(**{**base, "eval_steps": 7, "eval_strategy": "no"}).config_hash()
        == plain.config_hash()
    )
    assert TrainConfig.from_settings(**{**base, "early_stopping_patience": 3}).config_hash() != plain.config_hash()


# Training with its shards and its output directory in a bucket (a real S3 API server on 127.0.0.1,
# tests/conftest.py: s3_server): the shards streamed through the node's cache, checkpoints uploaded with
# COMPLETE.json last, a killed run resumed on a fresh node (an empty local cache) from the bucket's newest
# complete checkpoint, bitwise as on local disk.


def _torchrun_on_node(cfg, tmp: Path, cache: Path, fault: str | None = None) -> subprocess.CompletedProcess:
    """The entry point under torchrun (2 ranks) with the local cache ``cache`` (a node of its own)."""
    env = {"LARGETRAIN_CACHE": str(cache), "PYTHONPATH": str(REPO)}
    return torchrun(cfg, tmp, 2, fault, env=env, name=cache.name, timeout=900)


def test_a_training_in_a_bucket_resumes_on_a_fresh_node_bitwise(shards, uninterrupted, tmp_path, s3_bucket):
    shards_url = fs.join(s3_bucket, "root", "pretrain", "token_shards", "v1")
    with atomic_dir(shards_url) as tmp:  # the shards committed to the bucket, as the token_shards asset does
        shutil.copytree(shards, tmp, dirs_exist_ok=True)
    ref = uninterrupted  # the same run on local disk

    out = fs.join(s3_bucket, "root", "base_checkpoint", "v1")
    cfg = resume_config(Path("unused"), shards_url)
    cfg.output_dir, cfg.model.tokenizer = out, shards_url
    fsys, root = fs.filesystem(out)

    _torchrun_on_node(cfg, tmp_path, tmp_path / "cache-1", fault="mid_save:6")
    assert fsys.exists(f"{root}/checkpoints/step-000003/COMPLETE.json")  # in the bucket, after every rank's files
    assert not fsys.exists(f"{root}/checkpoints/step-000006/COMPLETE.json")  # never counts in the bucket
    assert not fsys.exists(f"{root}/model")
    # the streamed shards lie in the node's cache, not in a copy of the version
    assert list((tmp_path / "cache-1" / "shards").glob("*-train-*.arrow"))
    assert not (tmp_path / "cache-1" / "mirror" / "s3" / s3_bucket[5:] / "root" / "pretrain").exists()

    proc = _torchrun_on_node(cfg, tmp_path, tmp_path / "cache-2")  # a new node: nothing local
    assert "downloading checkpoint step-000003" in proc.stderr and "step-000003 at step 3" in proc.stderr
    done = tmp_path / "done"
    fsys.get(f"{root}/", str(done), recursive=True)
    assert (done / "model" / "model.safetensors").exists() and (done / "summary.json").exists()
    want, got = metrics(ref), metrics(done)
    assert sorted(got) == list(range(1, 9))
    for step in range(1, 9):  # bitwise: the same floats, not merely close
        assert got[step]["loss"] == want[step]["loss"], (step, got[step]["loss"], want[step]["loss"])
        assert got[step]["grad_norm"] == want[step]["grad_norm"], step
    a, b = load_file(ref / "model" / "model.safetensors"), load_file(done / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    complete = sorted(p.parent.name for p in (done / "checkpoints").glob("*/COMPLETE.json"))
    assert complete == ["step-000003", "step-000006", "step-000008"]  # save_total_limit 3, in the bucket too


def test_two_nodes_in_a_bucket_keep_only_save_total_limit_checkpoints_on_each_node(
    shards, tmp_path, s3_bucket, monkeypatch
):
    """Two torchrun agents on 127.0.0.1 (--nnodes 2, one rank each), each a node with a local cache of its own,
    output_dir in the bucket, ZeRO-2, a checkpoint at every one of 4 steps, save_total_limit 1: every node
    uploads its own files (rank 1's optimizer partition comes from node 1), and each node keeps locally only
    the newest checkpoint, the other node's copies included (they get no local COMPLETE.json)."""
    import shlex
    import socket

    from largetrain_core.launch import launch_commands
    from largetrain_core.storage import mirror_path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = fs.join(s3_bucket, "root", "base_checkpoint", "v1")
    cfg = TrainConfig.from_settings(
        output_dir=out,
        train_shards=str(shards),
        preset="llama-tiny",
        zero_stage=2,
        activation_checkpointing=False,
        micro_batch_size=2,
        max_steps=4,
        learning_rate=5e-3,
        warmup_steps=1,
        save_steps=1,
        save_total_limit=1,
        report_to=[],
        tokenizer=str(shards),
    )
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg.to_dict()))
    cmds = launch_commands(str(path), ["127.0.0.1", "127.0.0.1"], 1, port=port, python=sys.executable)
    caches = [tmp_path / "node0", tmp_path / "node1"]
    procs = []
    for cmd, cache in zip(cmds["torchrun"], caches):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "LARGETRAIN_CACHE": str(cache), "PYTHONPATH": str(REPO)}
        env.pop("LARGETRAIN_FAULT", None)
        procs.append(
            subprocess.Popen(
                shlex.split(cmd),
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    try:
        logs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    fsys, root = fs.filesystem(out)
    marker = json.loads(fsys.cat_file(f"{root}/checkpoints/step-000004/COMPLETE.json"))
    assert marker["world_size"] == 2 and any(f.startswith("zero_pp_rank_1_") for f in marker["files"])
    assert [p.rsplit("/", 1)[1] for p in fsys.ls(f"{root}/checkpoints", detail=False)] == ["step-000004"]
    for node, cache in enumerate(caches):
        monkeypatch.setenv("LARGETRAIN_CACHE", str(cache))  # where that node's work directory lies
        local = mirror_path(out) / "checkpoints"
        kept = sorted(p.name for p in local.iterdir() if p.name.startswith("step-"))
        assert kept == ["step-000004"], (node, kept)
        files = {p.name for p in (local / "step-000004").rglob("*") if p.is_file()}
        assert any(f.startswith(f"zero_pp_rank_{node}_") for f in files), (node, files)
