"""Preemption (issue 22 item 2): a SIGTERM'd training finishes its step, its ranks save a complete
checkpoint of it together and end as preempted (retried); the resumed run's losses are bitwise those
of an uninterrupted run. Real torchrun, 2 ranks, CPU (gloo), ZeRO-2, the tiny preset."""

import json
import subprocess
from pathlib import Path

import torch
from safetensors.torch import load_file

from helpers.training import launch, metrics
from largetrain_core.error_records import describe_failure, rank_errors
from largetrain_core.training.checkpoints import resume_point
from largetrain_core.training.config import TrainConfig


def _cfg(out: Path, shards: Path) -> TrainConfig:
    """8 steps, checkpoints every 3 (3, 6, 8)."""
    return TrainConfig.from_settings(
        output_dir=str(out),
        train_shards=str(shards),
        preset="llama-tiny",
        zero_stage=2,
        precision="fp32",
        activation_checkpointing=False,
        micro_batch_size=2,
        max_steps=8,
        learning_rate=5e-3,
        warmup_steps=2,
        save_steps=3,
        save_total_limit=5,
        logging_steps=4,
        report_to=[],
        tokenizer=str(shards),
    )


def _torchrun(cfg: TrainConfig, fault: str | None = None) -> subprocess.CompletedProcess:
    """The entry point under torchrun (torchrun's --log-dir: <output_dir>/logs-<n>), LARGETRAIN_FAULT ``fault``."""
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out.parent / f"config-{out.name}.json"
    path.write_text(json.dumps(cfg.to_dict()))
    logs = out / f"logs-{len(list(out.glob('logs-*')))}"
    proc = launch(path, 2, fault, log_dir=logs)
    (logs / "torchrun.log").write_text(proc.stdout + proc.stderr)
    proc.logs = logs
    return proc


def _assert_bitwise(ref: Path, out: Path) -> None:
    """Every step's loss and gradient norm and the final weights bitwise those of ``ref`` (a resume at step 6
    too: checkpoints.replay_cpu_adam_steps)."""
    want, got = metrics(ref), metrics(out)
    assert sorted(got) == list(range(1, 9))
    for step in range(1, 9):  # the same floats, not merely close
        assert got[step]["loss"] == want[step]["loss"], (step, got[step]["loss"], want[step]["loss"])
        assert got[step]["grad_norm"] == want[step]["grad_norm"], step
    a, b = load_file(ref / "model" / "model.safetensors"), load_file(out / "model" / "model.safetensors")
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


def test_preempted_training_saves_the_step_it_reached_and_resumes_bitwise(shards, uninterrupted, tmp_path):
    """(a) SIGTERM to the torchrun agent and both ranks after step 4 (checkpoints so far: step 3), and a second
    SIGTERM to the ranks during the save: the ranks save a complete step-4 checkpoint and end as preempted
    (transient: retried). The second start resumes from step 4; SIGTERM'd after step 6, just checkpointed, it
    skips the preemption save and says so; the third finishes: every loss, gradient norm and the final weights
    equal an uninterrupted run's (the same settings but save_total_limit, which changes no step; the integration
    tier's ``uninterrupted``), bitwise. (b) SIGTERM after step 4, then SIGKILL during that save (the grace period
    over): step 4 has no marker, and a resume would skip it and start from step 3."""
    ref = uninterrupted

    out = tmp_path / "preempted"
    cfg = _cfg(out, shards)
    proc = _torchrun(cfg, fault="sigterm_after_step:4,sigterm_mid_save:4")
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert "preempted (SIGTERM) after step 4: saving checkpoint step-000004" in proc.stderr, proc.stderr[-3000:]
    assert max(metrics(out)) == 4
    complete = sorted(p.name for p in (out / "checkpoints").iterdir() if (p / "COMPLETE.json").exists())
    assert complete == ["step-000003", "step-000004"]
    assert json.loads((out / "checkpoints" / "step-000004" / "COMPLETE.json").read_text())["step"] == 4
    errors = rank_errors(proc.logs)
    assert {e["rank"] for e in errors if e.get("preempted")} == {0, 1}, errors
    text, retry = describe_failure(proc.returncode, errors)
    assert (
        retry
        and text.startswith("training preempted")
        and "stopped after step 4 and saved checkpoint step-000004" in text
    )

    proc = _torchrun(cfg, fault="sigterm_after_step:6")
    assert proc.returncode != 0
    assert "resumed from" in proc.stderr and "step-000004 at step 4" in proc.stderr
    assert (
        "preempted (SIGTERM) after step 6: preemption save skipped, checkpoint step-000006 is 0 step(s) old"
        in proc.stderr
    ), proc.stderr[-3000:]
    assert describe_failure(proc.returncode, rank_errors(proc.logs))[1]

    proc = _torchrun(cfg)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step-000006 at step 6" in proc.stderr
    _assert_bitwise(ref, out)

    cut = tmp_path / "cut_short"
    cfg = _cfg(cut, shards)
    assert _torchrun(cfg, fault="sigterm_after_step:4,mid_save:4").returncode == -9
    step4 = cut / "checkpoints" / "step-000004"
    assert any(step4.rglob("*.pt")) and not (step4 / "COMPLETE.json").exists()
    # what the next start resumes from (that such a resume is bitwise: test_train.py's SIGKILL mid-save test)
    assert resume_point("auto", cut / "checkpoints") == (
        cut / "checkpoints" / "step-000003",
        [f"skipped {step4}: no COMPLETE.json (the save did not finish)"],
    )


def test_preemption_settings_change_neither_the_config_hash_nor_the_data_version():
    """How a run stops changes no weight (the resume is bitwise): a retry with other preemption settings resumes
    from the same checkpoints (config hash) in the same output directory (data version)."""
    cfg = TrainConfig.from_settings(output_dir="o", train_shards="s")
    other = cfg.with_settings(preemption_save=False, preemption_min_new_steps=10, preemption_grace_seconds=120)
    assert other.config_hash() == cfg.config_hash() and other.to_dict() != cfg.to_dict()
    assert other.identity("artifact") == cfg.identity("artifact")
    assert cfg.with_settings(preemption_grace_seconds=0).problems(cuda=False) == [
        "checkpointing.preemption_grace_seconds must be > 0, not 0"
    ]


def test_a_disk_that_fills_during_a_save_is_named_not_retried_and_the_rerun_resumes_bitwise(
    shards, uninterrupted, tmp_path, request
):
    """The case built for real (shared/cases "disk full (build it)"): the output directory on a tmpfs that a
    filler file leaves room for one and a half checkpoints (the sizes of ``uninterrupted``'s step 3). The plan's
    space check passes (no checkpoint yet, more than checkpoints.NO_SPACE_MARGIN free); step 3 is saved, the
    save of step 6 hits the kernel's ENOSPC. Each rank's error names ENOSPC, the checkpoint and the free space;
    the failure is not retried nor called killed or preempted; the half-written step 6 is gone. With the
    filler deleted, the rerun resumes from step 3 and ends bitwise as the uninterrupted run."""
    from helpers.small_disk import can_mount, fill, rerun_in_mount_namespace, tmpfs
    from largetrain_dagster.resources import space_problem, training_failure

    if not can_mount():
        return rerun_in_mount_namespace(request.node.nodeid)
    ckpt_bytes = sum(f.stat().st_size for f in (uninterrupted / "checkpoints" / "step-000003").iterdir())
    with tmpfs(tmp_path / "small", 64 << 20) as disk:
        out = disk / "out"
        filler = fill(disk, ckpt_bytes * 3 // 2 + (256 << 10))  # the logs and error files too
        cfg = _cfg(out, shards)
        assert space_problem(out) is None  # the plan's check passed
        proc = _torchrun(cfg)
        assert proc.returncode != 0, proc.stderr[-3000:]
        assert max(metrics(out)) == 6, proc.stderr[-3000:]
        step6 = out / "checkpoints" / "step-000006"
        complete = sorted(p.name for p in (out / "checkpoints").iterdir() if (p / "COMPLETE.json").exists())
        assert complete == ["step-000003"] and not step6.exists()  # nothing half-written left to resume from
        errors = rank_errors(proc.logs)
        assert {e["rank"] for e in errors if not e.get("transient")} <= {0, 1} and errors, proc.stderr[-3000:]
        for e in (e for e in errors if not e.get("transient")):
            assert e["message"].startswith(
                f"[Errno 28] No space left on device (ENOSPC) while saving checkpoint {step6}: "
            ), e
            assert "bytes were free on its file system" in e["message"], e
        failure = training_failure(proc.returncode, proc.logs, proc.logs / "torchrun.log", out)
        assert failure.allow_retries is False
        assert "ENOSPC" in failure.description and str(step6) in failure.description
        assert "killed or preempted" not in failure.description

        filler.unlink()
        proc = _torchrun(cfg)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "step-000003 at step 3" in proc.stderr, proc.stderr[-3000:]
        _assert_bitwise(uninterrupted, out)
