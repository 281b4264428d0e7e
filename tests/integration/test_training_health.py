"""Training health for real (issue 23 item 4): a diverged pretraining stops early as collapsed and
fails its blocking check through Dagster, naming the cause, with its non-finite steps counted in the
metadata and warned of, rate-limited, in the Dagster log, and a later lora_adapter run refuses it
(issue 42 item 7); a healthy short pretraining passes with the default thresholds; a
genuine 4-step run fails them and passes with the short-run override (the model reused, not trained
again); a LoRA on a model that predicts every token equally (its final norm zeroed) trains at exactly
ln(vocabulary size) and fails even with the override.

fp16 (DeepSpeed's "OVERFLOW! Skipping step") needs CUDA: on CPU the divergence is a learning rate far
too high in fp32, whose gradient norms are infinite from the 4th step on; ZeRO-2's overflow check
skips those steps as fp16's loss scaler would.
"""

import json
import math
import os
import subprocess

import pytest
import torch
from dagster import DagsterInstance

from helpers import REPO
from helpers.corpora import CORPORA, SHORT_RUN, tiny_run_config
from helpers.lineage import materialize_lineage
from largetrain_core.launch import ENTRY_MODULE, module_entry, torchrun_command
from largetrain_core.model import build_model
from largetrain_core.training.config import HealthSettings, TrainConfig
from largetrain_core.training.health import judge_metrics
from largetrain_dagster.configs import deep_merge
from largetrain_dagster.definitions import build_definitions, lineage_assets

CHECK = "loss_finite_and_decreasing"


def _check(result):
    (evaluation,) = [e for e in result.get_asset_check_evaluations() if e.check_name == CHECK]
    return (
        evaluation.passed,
        evaluation.description or "",
        {k: getattr(v, "value", v) for k, v in evaluation.metadata.items()},
    )


def _messages(instance, result) -> list[str]:
    return [e.user_message for e in instance.all_logs(result.run_id) if e.step_key == "base_checkpoint"]


def test_training_health_through_dagster(pretrain_root):
    root = pretrain_root
    defs = build_definitions(root=str(root), nproc_per_node=1, wandb_mode="disabled", report_to=[])
    assets = lineage_assets()
    tiny = {k: v for k, v in tiny_run_config(CORPORA)["ops"]["base_checkpoint"]["config"].items() if k != "health"}

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
        # a learning rate far too high: the gradient norms are infinite from the 4th step on, and the training
        # stops early after 4 such steps in a row (issue 42 item 7) instead of running its 12
        # (the warnings of a kind after the first three held back for an hour: at most three shown)
        diverged = base(
            instance,
            deep_merge(
                tiny,
                {
                    "optimizer": {"learning_rate": 1000.0},
                    "health": {"warning_interval_s": 3600, "stop_after_collapsed_steps": 4},
                },
            ),
        )
        assert not diverged.success
        passed, description, md = _check(diverged)
        assert not passed
        assert "had a non-finite gradient norm" in description and "health.max_skipped_fraction 0.1" in description
        # ZeRO-2's overflow check skips each of those steps in fp32 too
        assert md["skipped_steps"] == md["nonfinite_grad_norm_steps"] == 4
        assert md["steps_logged"] < 12 and md["collapsed"]
        first = md["steps_logged"] - 3
        assert md["problems"][0] == (
            f"the training collapsed: steps {first}-{md['steps_logged']} in a row (4 skipped (gradient overflow)), "
            f"health.stop_after_collapsed_steps 4: stopped early at step {md['steps_logged']}"
        )
        assert any("lower the learning rate" in p for p in md["problems"])
        (materialized,) = diverged.asset_materializations_for_node("base_checkpoint")
        assert materialized.metadata["nonfinite_grad_norm_steps"].value == md["nonfinite_grad_norm_steps"]
        assert materialized.metadata["vocab_size"].value == 512
        assert materialized.metadata["stopped_early"].value is True
        assert materialized.metadata["steps"].value == md["steps_logged"]
        logged = _messages(instance, diverged)
        skips = [m for m in logged if "skipped by DeepSpeed: the gradients overflowed" in m]
        assert len(skips) == 3, skips  # the first three, then held back ...
        held = [m for m in logged if "more skipped-step warnings held back" in m]
        assert held and f"({md['skipped_steps']} in all)" in held[-1]  # ... and counted at the end
        assert any(m.startswith("training health of base_checkpoint:") and "failed:" in m for m in logged)
        assert any(m.startswith(md["problems"][0] + "; its checkpoint and model are written") for m in logged)

        # a later run of lora_adapter refuses the diverged version before any work, naming it and its check
        dead = materialized.metadata["data_version"].value
        lora = materialize_lineage(assets, defs.resources, instance, {}, ["lora_adapter"], raise_on_error=False)
        assert not lora.success and not lora.asset_materializations_for_node("lora_adapter")
        (failure,) = [e for e in lora.last.all_events if e.is_step_failure]
        message = failure.event_specific_data.error.message
        assert f"base_checkpoint version {dead} (made by run {diverged.run_id})" in message, message
        assert "failed its blocking check loss_finite_and_decreasing: the training collapsed" in message
        assert 'waive_failed_checks: ["base_checkpoint:loss_finite_and_decreasing"]' in message

        # the tiny pretraining (12 steps) passes the default thresholds
        healthy = base(instance, tiny)
        assert healthy.success
        passed, _, md = _check(healthy)
        assert passed and md["nonfinite_grad_norm_steps"] == 0 and md["problems"] == []
        assert md["loss_decrease_fraction"] > 0.05 and md["nats_below_uniform"] > 0.5
        assert md["uniform_loss"] == pytest.approx(math.log(512))

        # a genuine 4-step run: its loss falls too little for the defaults; the override lets it pass,
        # judging the same trained model again (the thresholds are not part of the data version)
        short = deep_merge(tiny, {"schedule": {"max_steps": 4, "warmup_steps": 1}, "checkpointing": {"save_steps": 4}})
        refused = base(instance, short)
        assert not refused.success
        passed, description, _ = _check(refused)
        assert not passed and (
            "health.min_loss_decrease" in description or "health.min_nats_below_uniform" in description
        )
        accepted = base(instance, deep_merge(short, SHORT_RUN))
        assert accepted.success and _check(accepted)[0]
        (materialized,) = accepted.asset_materializations_for_node("base_checkpoint")
        assert materialized.metadata["reused"].value is True


def test_uniform_prediction_fails_even_as_a_short_run(shards, tmp_path):
    """The base model's final RMSNorm weight zeroed: every logit is 0, every token equally likely, and
    no LoRA update reaches the output, so the loss is ln(vocabulary size) at every step."""
    m = json.loads((shards / "manifest.json").read_text())
    vocab = m["vocab_size"]
    model = build_model("llama-tiny", vocab, m["seq_len"], m["eos_id"], m.get("bos_id"), seed=3)
    with torch.no_grad():
        model.model.norm.weight.zero_()
    model.save_pretrained(tmp_path / "flat_base")
    out = tmp_path / "lora"
    cfg = TrainConfig.from_dict(
        {
            "output_dir": str(out),
            "train_shards": str(shards),
            "mode": "lora",
            "model": {"base_model": str(tmp_path / "flat_base")},
            "schedule": {"max_steps": 4, "warmup_steps": 1, "micro_batch_size": 2},
            "optimizer": {"learning_rate": 1e-2},
            "checkpointing": {"save_steps": 4},
            "evaluation": {"eval_strategy": "no"},
            "tracking": {"report_to": []},
            "lora": {"r": 2, "lora_alpha": 4.0},
        }
    )
    config = tmp_path / "lora.json"
    config.write_text(json.dumps(cfg.to_dict()))
    done = subprocess.run(
        torchrun_command(module_entry(ENTRY_MODULE, config), 1),
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["vocab_size"] == vocab and summary["skipped_steps"] == 0
    for settings in (HealthSettings(), HealthSettings(**SHORT_RUN["health"])):
        verdict = judge_metrics(out / "metrics.jsonl", summary["vocab_size"], settings)
        assert not verdict.passed
        assert verdict.numbers["mean_loss_last_10pct"] == pytest.approx(math.log(vocab), abs=1e-4)
        assert (
            any(f"below ln(vocabulary size {vocab})" in p for p in verdict.problems)
            or settings.min_nats_below_uniform == 0
        )
        assert any("not below the first by health.min_loss_decrease" in p for p in verdict.problems)
