"""Training faults a user meets (issue 12 kinds 5 and 10, issue 15 item 3): the failure names its cause
(every rank's exception from torch's elastic error files) and is retried only when the processes were
killed; configurations that cannot work fail before any process starts; LoRA on tied weights; a ZeRO
checkpoint resumed at another world size; a resumed training says where it resumed from; a cancelled
training's MLflow run ends KILLED (issue 23 item 8c)."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dagster import AssetKey, DagsterInstance
from safetensors.torch import load_file
from torch.distributed.elastic.multiprocessing.api import SignalException

from largetrain_core.error_records import describe_failure, rank_errors
from largetrain_core.model import PRESETS, build_model
from largetrain_core.training import preflight
from largetrain_core.training.config import PRECISIONS, WANDB_MODES, ZERO_STAGES, TrainConfig
from largetrain_core.training.trackers import TRACKERS, TrackerError
from helpers import REPO
from helpers.lineage import step_events, step_failure
from helpers.training import assert_logged_with_card, launch, metrics, resume_config


def _tiny_base(directory: Path, vocab: int, max_positions: int = 64, eos_id: int = 0) -> Path:
    """A tiny Llama saved as a Hugging Face directory: the llama-tiny preset, tie_word_embeddings true
    (lm_head.weight is model.embed_tokens.weight)."""
    build_model("llama-tiny", vocab, max_positions, eos_id=eos_id, seed=3).save_pretrained(directory)
    return directory


# ------------------------------------------------------------------------------------------------
# issue 15 item 3: settings that cannot work, refused with the valid choices; the launchpad lists them


def test_config_errors_name_the_valid_choices():
    with pytest.raises(
        ValueError, match="preset must be one of llama-tiny, llama-3m, llama-20m, llama-125m, not 'llama-7b'"
    ):
        TrainConfig.from_settings(output_dir="o", train_shards="s", preset="llama-7b").validate(cuda=False)
    with pytest.raises(ValueError, match=r"max_steps \(20\) is below warmup_steps \(50;.*at most 20 \(e\.g\. 2"):
        TrainConfig.from_settings(output_dir="o", train_shards="s", max_steps=20, warmup_steps=50).validate(cuda=False)
    with pytest.raises(ValueError, match="precision must be one of auto, fp32, fp16, bf16, not 'fp8'"):
        TrainConfig.from_settings(output_dir="o", train_shards="s", precision="fp8").validate(cuda=False)
    with pytest.raises(ValueError, match="zero_stage must be one of 0, 1, 2, 3, not 4"):
        TrainConfig.from_settings(output_dir="o", train_shards="s", zero_stage=4).validate(cuda=False)


def test_launchpad_descriptions_list_the_valid_choices():
    """The descriptions Dagster's launchpad shows (the config schema of the training assets and the
    trackers resource) name every preset, precision, ZeRO stage, tracker and W&B mode."""
    from largetrain_dagster.resources import TrackerSettings
    from largetrain_dagster.training import BaseCheckpointConfig, LoraAdapterConfig

    def described(cls) -> dict:
        return {k: v.description or "" for k, v in cls.model_fields.items()}

    def section(cls, name) -> dict:
        return described(cls.model_fields[name].annotation)

    trackers = described(TrackerSettings)
    assert all(p in section(BaseCheckpointConfig, "model")["preset"] for p in PRESETS)
    for cls in (BaseCheckpointConfig, LoraAdapterConfig):
        assert all(p in section(cls, "precision")["dtype"] for p in PRECISIONS)
        assert all(str(z) in section(cls, "parallelism")["zero_stage"] for z in ZERO_STAGES)
        schedule = section(cls, "schedule")
        assert "warmup_steps" in schedule["max_steps"] and "max_steps" in schedule["warmup_steps"]
    assert all(t in trackers["report_to"] for t in TRACKERS)
    assert all(m in described(TrackerSettings.model_fields["wandb"].annotation)["mode"] for m in WANDB_MODES)


def test_inputs_that_cannot_work_are_refused_before_training(shards, tmp_path):
    """preflight.check reads the shards' manifest and the base model's config.json (meta device): a base
    model shorter than the shards' sequences, LoRA targets that match nothing (named with the model's
    linear layers, also GPT-2's Conv1D ones) or touch a tied weight (tests/cases: LoRA on tied weights), a
    named checkpoint that is not complete."""
    from largetrain_core.shards import TokenShards

    m = TokenShards(shards, "train").manifest
    short = _tiny_base(tmp_path / "short", 320, max_positions=16)
    base = _tiny_base(tmp_path / "base", 320)

    def lora(model, **settings) -> TrainConfig:
        return TrainConfig.from_settings(
            output_dir=str(tmp_path / "o"), train_shards=str(shards), mode="lora", base_model=str(model), lora=settings
        )

    with pytest.raises(
        ValueError,
        match=f"max_position_embeddings=16 positions, the shards .* seq_len={m['seq_len']} "
        "tokens: re-materialize the token shards with seq_len <= 16",
    ):
        preflight.check(lora(short), cuda=False)
    preflight.check(lora(base), cuda=False)  # the default targets (decoder linear layers) are fine
    with pytest.raises(
        ValueError, match=r"lm_head shares its weight with model\.embed_tokens\.weight.*Remove \['lm_head'\]"
    ):
        preflight.check(lora(base, target_modules=["q_proj", "lm_head"]), cuda=False)
    with pytest.raises(ValueError, match=r"model\.embed_tokens shares its weight with lm_head\.weight"):
        preflight.check(lora(base, target_modules=["embed_tokens"]), cuda=False)
    with pytest.raises(
        ValueError,
        match=r"\['qproj'\] match no module of the base model; its adaptable linear layers "
        r"are \['down_proj', 'gate_proj', 'k_proj'",
    ):
        preflight.check(lora(base, target_modules=["qproj", "v_proj"]), cuda=False)
    untied = tmp_path / "untied"
    model = build_model("llama-tiny", 320, 64, eos_id=0, seed=3)
    model.config.tie_word_embeddings = False
    type(model)(model.config).save_pretrained(untied)
    preflight.check(lora(untied, target_modules=["lm_head"]), cuda=False)  # an untied head can be adapted and merged
    # GPT-2 (transformers Conv1D layers, tests/cases: LoRA on GPT-2): the defaults are found; a name it lacks
    # is refused naming its layers, and following that advice is accepted
    from transformers import GPT2Config

    gpt2 = tmp_path / "gpt2"
    GPT2Config(
        vocab_size=320, n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
    ).save_pretrained(gpt2)
    preflight.check(lora(gpt2), cuda=False)
    with pytest.raises(
        ValueError,
        match=r"\['q_proj', 'v_proj'\] match no module of the base model; its adaptable linear layers "
        r"are \['c_attn', 'c_fc', 'c_proj'\]",
    ):
        preflight.check(lora(gpt2, target_modules=["q_proj", "v_proj"]), cuda=False)
    preflight.check(lora(gpt2, target_modules=["c_attn", "c_proj"]), cuda=False)
    half = tmp_path / "o" / "checkpoints" / "step-000002"
    half.mkdir(parents=True)
    cfg = TrainConfig.from_settings(
        output_dir=str(tmp_path / "o"), train_shards=str(shards), resume_from_checkpoint=str(half)
    )
    with pytest.raises(
        ValueError, match="resume_from_checkpoint .*step-000002 is not a complete checkpoint: no COMPLETE.json"
    ):
        preflight.check(cfg, cuda=False)


# ------------------------------------------------------------------------------------------------
# issue 12 kind 10 (a): the merged export is verified before it is written


def test_merged_export_is_verified_against_base_plus_adapter(shards, tmp_path):
    """An adapter on lm_head of a tied model (built with PEFT directly, as a config that bypassed the
    check would train it): export_merged measures the merged model against base + adapter on a probe
    batch of the shards and refuses, naming the tied weight; nothing is written. An adapter on q_proj/v_proj
    merges within 1e-5 and is written."""
    from peft import LoraConfig, get_peft_model

    from largetrain_core.model import load_adapter, load_model
    from largetrain_core.training.export import MERGE_TOLERANCE, export_merged, probe_batch

    base = _tiny_base(tmp_path / "base", 320)
    probe = probe_batch(shards)
    assert probe.shape == (2, 32) and probe.dtype == torch.int64
    for name, targets in (("tied", ["lm_head", "q_proj"]), ("plain", ["q_proj", "v_proj"])):
        model = get_peft_model(load_model(base), LoraConfig(r=4, lora_alpha=8, target_modules=targets))
        torch.manual_seed(0)
        for pname, p in model.named_parameters():
            if "lora_B" in pname:
                torch.nn.init.normal_(p, std=0.05)  # a trained adapter: lora_B no longer zero
        model.save_pretrained(tmp_path / name)
        final = tmp_path / f"merged-{name}"
        if name == "tied":
            with pytest.raises(
                ValueError,
                match=r"merged export of .* refused: its logits differ from base \+ adapter by "
                r"[0-9.e+-]+ \(max relative\) on a probe batch of 2 x 32 tokens, more than "
                r"1e-05; the adapter changes modules whose weight is tied to another's: "
                r"lm_head with model\.embed_tokens\.weight",
            ):
                export_merged(base, tmp_path / name, "default", final, probe)
            assert not final.exists() and not final.with_name(f".tmp-{final.name}").exists()
            # its advice, "load it with PEFT on the base model instead of merging", gives base + adapter
            with torch.no_grad():
                loaded = load_adapter(load_model(base), tmp_path / name).eval()(input_ids=probe).logits
                assert torch.equal(loaded, model.eval()(input_ids=probe).logits)
        else:
            export_merged(base, tmp_path / name, "default", final, probe)
            with torch.no_grad():
                want = model.eval()(input_ids=probe).logits
                got = load_model(final).eval()(input_ids=probe).logits
            assert float((got - want).abs().max() / want.abs().max()) <= MERGE_TOLERANCE
            assert (want - load_model(base)(input_ids=probe).logits).abs().max() > 1e-3  # the adapter matters


# ------------------------------------------------------------------------------------------------
# issue 12 kind 10 (b): a ZeRO checkpoint written by 2 ranks, resumed with 1


def _torchrun(config: dict, path: Path, nproc: int, log_dir: Path | None = None) -> subprocess.CompletedProcess:
    path.write_text(json.dumps(config))
    return launch(path, nproc, log_dir=log_dir)


def test_zero2_checkpoint_of_two_ranks_resumes_on_one_through_the_universal_format(shards, uninterrupted, tmp_path):
    """tests/cases, resume at another world size: the uninterrupted 2-rank run (helpers.training.resume_config:
    ZeRO-2, fp32, micro-batch 2, 8 steps with checkpoints at 3 and 6); COMPLETE.json records world size 2
    and stage 2. One rank with gradient accumulation 2 (the same 4 sequences per step, by the sampler's
    global positions) resumes from step 3: the checkpoint is converted by DeepSpeed's ds_to_universal and
    loaded with load_universal, and steps 4..8 give bitwise the losses and grad norms of the 2-rank run
    (the Adam moments were restored exactly); the summary says where it resumed from and at which world
    size that was written."""
    two = uninterrupted
    cfg = resume_config(two, shards).to_dict()
    step3 = two / "checkpoints" / "step-000003"
    marker = json.loads((step3 / "COMPLETE.json").read_text())
    assert (marker["world_size"], marker["zero_stage"]) == (2, 2)

    one = tmp_path / "one_rank"
    proc = _torchrun(
        {**cfg, "output_dir": str(one), "gradient_accumulation_steps": 2, "resume_from_checkpoint": str(step3)},
        tmp_path / "one.json",
        1,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{step3} was written by 2 ranks, this run has 1: loading it through DeepSpeed's universal" in proc.stderr
    universal = one / "checkpoints" / "universal" / "step-000003"
    assert json.loads((universal / "UNIVERSAL.json").read_text())["source"] == str(step3)
    assert (universal / "zero" / "model.layers.0.self_attn.q_proj.weight" / "exp_avg.pt").is_file()
    want, got = metrics(two), metrics(one)
    assert sorted(got) == list(range(4, 9))
    for step in range(4, 9):
        assert got[step]["loss"] == want[step]["loss"], (step, got[step]["loss"], want[step]["loss"])
        assert got[step]["grad_norm"] == want[step]["grad_norm"], step
        assert got[step]["consumed_samples"] == want[step]["consumed_samples"]
    summary = json.loads((one / "summary.json").read_text())
    assert summary["resumed_from"] == str(step3) and summary["resumed_from_step"] == 3
    assert summary["resumed_from_world_size"] == 2 and summary["world_size"] == 1 and summary["steps_this_run"] == 5
    a, b = load_file(two / "model" / "model.safetensors"), load_file(one / "model" / "model.safetensors")
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6)
    step6 = json.loads((one / "checkpoints" / "step-000006" / "COMPLETE.json").read_text())
    assert step6["world_size"] == 1  # what it writes from now on is a 1-rank checkpoint


# ------------------------------------------------------------------------------------------------
# issue 12 kind 5: every rank's exception reaches the user, through torch's elastic error files


def _damage(ckpt: Path, rank: int) -> Path:
    """Overwrite rank ``rank``'s ZeRO optimizer partition with garbage of the same size (bit rot: the
    size check of COMPLETE.json still passes)."""
    f = ckpt / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
    f.write_bytes(b"x" * f.stat().st_size)
    return f


def test_rank_errors_name_type_message_rank_and_file(shards, uninterrupted, tmp_path):
    """2 ranks resume a checkpoint whose rank-1 partition is garbage (a copy of the uninterrupted run's step 3):
    rank 1 raises ``_pickle.UnpicklingError`` (a dotted type, which the former log pattern missed) while
    loading it, rank 0 then fails in a collective (a consequence). Each rank's error file (torchrun
    --log-dir) holds the full type, message, rank and the checkpoint; describe_failure puts rank 1's first,
    marks rank 0's as a consequence and says: not retried. Its advice followed (resume_from_checkpoint
    never), the training runs."""
    out = tmp_path / "run"
    cfg = resume_config(out, shards, max_steps=4).to_dict()
    ckpt = out / "checkpoints" / "step-000003"
    shutil.copytree(uninterrupted / "checkpoints" / "step-000003", ckpt)
    _damage(ckpt, 1)
    logs = tmp_path / "logs"
    proc = _torchrun({**cfg, "resume_from_checkpoint": str(ckpt)}, tmp_path / "b.json", 2, logs)
    assert proc.returncode == 1
    errors = rank_errors(logs)
    own = [e for e in errors if not e["transient"]]
    assert [(e["rank"], e["type"], e["file"]) for e in own] == [(1, "_pickle.UnpicklingError", str(ckpt))]
    assert own[0]["message"] == "invalid load key, 'x'." and own[0]["world_size"] == 2
    assert "set resume_from_checkpoint to an older checkpoint directory, or never" in own[0]["notes"][0]
    assert Path(own[0]["error_file"]).parts[-2:] == ("1", "error.json") and "Traceback" in own[0]["traceback"]
    text, retryable = describe_failure(proc.returncode, errors)
    assert not retryable
    lines = text.splitlines()
    assert lines[0].startswith("training failed (exit code 1 of torchrun): 1 rank(s) raised an error. Not retried")
    assert lines[1].startswith("rank 1: _pickle.UnpicklingError: invalid load key, 'x'. while loading the checkpoint")
    assert f"[file: {ckpt}]" in lines[1]
    assert all("(a consequence of another process failing)" in line for line in lines[2:])
    # the advice followed (no checkpoint is older than this first one): resume_from_checkpoint never trains (on
    # one rank: starting afresh does not depend on the world size)
    done = _torchrun({**cfg, "resume_from_checkpoint": "never"}, tmp_path / "c.json", 1)
    assert done.returncode == 0 and sorted(metrics(out)) == [1, 2, 3, 4], done.stderr[-3000:]


def test_training_failures_through_dagster(pretrain_root, tmp_path):
    """Through Dagster, on the pretraining lineage of a tiny corpus slice (base_checkpoint has a RetryPolicy):
    an unknown preset and max_steps below warmup_steps fail in the asset, listing the valid choices, with
    no process started and no retry; an imported model that is not there, or shorter than the shards'
    sequences, likewise; a
    training whose rank fails loading a damaged checkpoint fails with the rank's full exception type,
    message and file in the failure, not retried; a training resumed from a checkpoint says so in its
    materialization metadata, and its W&B and MLflow runs hold the model directory with its model card and
    lineage.json. One rank: what reaches Dagster here does not depend on the world size (every rank's
    error, the consequences marked: test_rank_errors_name_type_message_rank_and_file)."""
    from largetrain_dagster.configs import deep_merge
    from largetrain_dagster.definitions import build_definitions, lineage_assets
    from largetrain_dagster.resources import read_handle
    from largetrain_dagster.training import base_checkpoint
    from helpers.lineage import materialize_lineage
    from helpers.corpora import CORPORA, tiny_run_config

    assert base_checkpoint.op.retry_policy is not None and base_checkpoint.op.retry_policy.max_retries >= 1
    root = pretrain_root
    defs = build_definitions(root=str(root), nproc_per_node=1, wandb_mode="offline", report_to=["wandb", "mlflow"])
    assets = lineage_assets()
    train = deep_merge(
        tiny_run_config(CORPORA)["ops"]["base_checkpoint"]["config"],
        {
            "schedule": {"max_steps": 4, "warmup_steps": 1},
            "checkpointing": {"save_steps": 2, "save_total_limit": 5},
            "tracking": {"logging_steps": 2},
        },
    )

    def base(instance, config: dict):
        return materialize_lineage(
            assets,
            defs.resources,
            instance,
            {"ops": {"base_checkpoint": {"config": config}}},
            ["base_checkpoint"],
            raise_on_error=False,
        )

    with DagsterInstance.ephemeral() as instance:
        for bad, expected in (
            (
                {"preset": "llama-7b"},
                "preset must be one of llama-tiny, llama-3m, llama-20m, llama-125m, not 'llama-7b'",
            ),
            ({"max_steps": 5, "warmup_steps": 50}, "max_steps (5) is below warmup_steps (50;"),
        ):
            result = base(instance, {**train, **bad})
            assert not result.success
            description, _ = step_failure(result)
            assert expected in description and "Nothing was launched; not retried" in description
            assert "STEP_UP_FOR_RETRY" not in step_events(instance, result.run_id, "base_checkpoint")
        assert not (root / "base_checkpoint").exists()  # nothing was written, no process started

        tok = Path(read_handle(root, AssetKey("tokenizer"))["path"])
        vocab = json.loads(
            (Path(read_handle(root, AssetKey(["pretrain", "token_shards"]))["path"]) / "manifest.json").read_text()
        )["vocab_size"]
        short = _tiny_base(tmp_path / "short_model", vocab, max_positions=16)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            if (tok / f).exists():
                (short / f).write_bytes((tok / f).read_bytes())
        result = base(instance, {"pretrained_model": str(tmp_path / "no_such_model")})
        description, _ = step_failure(result)
        assert f"MissingArtifactError: {tmp_path / 'no_such_model'}: missing" in description
        assert "Not retried" in description and "STEP_UP_FOR_RETRY" not in step_events(
            instance, result.run_id, "base_checkpoint"
        )
        result = base(instance, {"pretrained_model": str(short)})
        description, _ = step_failure(result)
        assert (
            "whose max_position_embeddings is 16, but pretrain/token_shards hold sequences of seq_len=64 tokens"
            in description
        )
        assert "STEP_UP_FOR_RETRY" not in step_events(instance, result.run_id, "base_checkpoint")
        assert not (root / "base_checkpoint").exists()

        first = base(instance, train)
        assert first.success
        md = first.asset_materializations_for_node("base_checkpoint")[0].metadata
        assert md["resumed_from"].value == "none: started from step 0"
        out = Path(md["path"].value)
        # the model directory reached W&B and MLflow with its model card and lineage.json (issue 23 item 8d)
        assert_logged_with_card(out / "model", json.loads((out / "trackers.json").read_text()), tmp_path / "logged")
        step2, step4 = out / "checkpoints" / "step-000002", out / "checkpoints" / "step-000004"

        # a longer training resumed from the finished run's step-4 checkpoint: its metadata says so
        resumed = base(instance, {**train, "max_steps": 6, "resume_from_checkpoint": str(step4)})
        assert resumed.success
        md = resumed.asset_materializations_for_node("base_checkpoint")[0].metadata
        assert md["resumed_from"].value == str(step4)
        assert (md["resumed_from_step"].value, md["steps_this_run"].value, md["steps"].value) == (4, 2, 6)
        assert md["resumed_from_world_size"].value == 1

        _damage(step2, 0)
        failed = base(instance, {**train, "max_steps": 8, "resume_from_checkpoint": str(step2)})
        assert not failed.success
        description, meta = step_failure(failed)
        assert "1 rank(s) raised an error. Not retried" in description
        assert (
            f"rank 0: _pickle.UnpicklingError: invalid load key, 'x'. while loading the checkpoint {step2}"
            in description
        )
        assert f"[file: {step2}]" in description
        assert meta["retryable"] is False and meta["torchrun_exit"] == "exit code 1"
        own = [e for e in meta["rank_errors"] if not e["transient"]]
        assert [(e["rank"], e["type"]) for e in own] == [(0, "_pickle.UnpicklingError")]
        events = step_events(instance, failed.run_id, "base_checkpoint")
        assert "STEP_UP_FOR_RETRY" not in events and events.count("STEP_FAILURE") == 1


@pytest.mark.parametrize("report_to", ["mlflow", "wandb,mlflow"])
def test_cancelled_training_ends_its_mlflow_run_killed(pretrain_root, tmp_path, report_to):
    """A pretraining started by `dagster asset materialize`, reporting to MLflow (alone, or after W&B offline,
    the README's way to add MLflow: the cancel's SIGTERM reaches W&B's wandb-core too), is cancelled while it trains,
    the way Dagster terminates a run (the run marked CANCELING, then SIGINT to the process running it,
    DefaultRunLauncher.terminate and its run worker): the launcher stops torchrun's process tree with
    SIGTERM, rank 0 unwinds (largetrain_core.rank_signals.raise_on_sigterm) and its MLflow run ends KILLED, read
    back with MlflowClient; the Dagster run ends CANCELED, its training step never up for a retry (a cancel is
    not a failure to retry, issue 23 item 4), Dagster Pipes is closed, and no training process is left."""
    import time

    import yaml
    from dagster import DagsterRunStatus
    from mlflow.tracking import MlflowClient

    from helpers.corpora import CORPORA, tiny_run_config
    from helpers.processes import processes_mentioning

    root, home = pretrain_root, tmp_path / "home"  # the shards: the CLI run reads them from the root's handles
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    train = {
        **tiny_run_config(CORPORA)["ops"]["base_checkpoint"]["config"],
        "max_steps": 1_000_000,
        "warmup_steps": 1,
        "save_steps": 1_000_000,
        "logging_steps": 1,
        "eval_strategy": "no",
    }
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"ops": {"base_checkpoint": {"config": train}}}))
    env = {
        **os.environ,
        "LARGETRAIN_ROOT": str(root),
        "DAGSTER_HOME": str(home),
        "LARGETRAIN_NPROC": "1",
        "LARGETRAIN_REPORT_TO": report_to,
        "LARGETRAIN_WANDB_MODE": "offline",
        "OMP_NUM_THREADS": "1",
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    dagster = str(Path(sys.executable).with_name("dagster"))
    log = tmp_path / "dagster.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                dagster,
                "asset",
                "materialize",
                "-m",
                "largetrain_dagster.definitions",
                "--select",
                "base_checkpoint",
                "-c",
                str(cfg),
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    marker = str(root / "base_checkpoint")  # in the command line of torchrun and of its rank
    try:
        deadline = time.monotonic() + 300
        metrics = []
        while proc.poll() is None and time.monotonic() < deadline:
            metrics = list(root.glob("base_checkpoint/*/metrics.jsonl"))
            if metrics and len(metrics[0].read_text().splitlines()) >= 2:
                break
            time.sleep(0.5)
        assert proc.poll() is None and metrics, log.read_text()[-3000:]
        out_dir = metrics[0].parent
        with DagsterInstance.from_config(str(home)) as instance:
            (run,) = instance.get_runs()
            assert run.status == DagsterRunStatus.STARTED
            instance.report_run_canceling(run)
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=120)
            assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.CANCELED, log.read_text()[-3000:]
            events = step_events(instance, run.run_id, "base_checkpoint")
            assert "STEP_UP_FOR_RETRY" not in events and "STEP_RESTARTED" not in events, events
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "stopping the training (process group" in log.read_text()
    # every tracker finished, W&B's failure notwithstanding: Dagster Pipes got its closed message
    assert "did not receive closed message" not in log.read_text()
    assert not processes_mentioning(marker)
    record = json.loads((out_dir / "trackers.json").read_text())["mlflow"]
    assert record["tracking_uri"] == f"sqlite:///{root / 'mlruns.db'}"
    ran = MlflowClient(tracking_uri=record["tracking_uri"]).get_run(record["run_id"])
    assert ran.info.status == "KILLED" and ran.info.end_time is not None
    assert len(MlflowClient(tracking_uri=record["tracking_uri"]).get_metric_history(record["run_id"], "loss")) >= 2


def test_k8s_pods_write_error_files_on_the_shared_volume():
    from largetrain_dagster.k8s import K8sTorchrunLauncher

    launcher = K8sTorchrunLauncher(nnodes=2)
    cmd = launcher.pod_manifest("/data/lora_adapter/v1/train_config.json", "abcdef123456", "lora_adapter", 1)["spec"][
        "containers"
    ][0]["command"]
    assert dict(zip(cmd, cmd[1:]))["--log-dir"] == "/data/lora_adapter/v1/torchelastic/lora-adapter-abcdef123456"
    assert cmd[-3:] == [
        "-m",
        "largetrain_core.training",
        "/data/lora_adapter/v1/train_config.json",
    ]  # a torchrun option


@pytest.mark.parametrize(
    "exc, transient",
    [
        (ValueError("bad"), False),
        (ConnectionResetError("peer"), True),
        (SignalException("stopped", sigval=signal.SIGTERM), True),
        (TrackerError("finish", [("wandb", ConnectionResetError("peer")), ("mlflow", ValueError("bad"))]), True),
        (TrackerError("finish", [("mlflow", ValueError("bad")), ("wandb", ConnectionResetError("peer"))]), False),
    ],
)
def test_transient_means_a_consequence(exc, transient):
    """Only errors that another process's end causes are transient, and a SIGTERM from outside
    (rank_signals.raise_on_sigterm); a ValueError never is; a tracker's failure is its first tracker's error."""
    from largetrain_core.error_records import error_record

    try:
        raise exc
    except Exception as e:
        assert error_record(e)["transient"] is transient
