"""Training health (issue 23 item 4), the core rules on small inputs: each cause of an unhealthy run
named with its threshold; metrics.jsonl read as trackers.read_metrics reads it (a step redone after a
resume counts once); the rank warnings rate-limited. Through Dagster and DeepSpeed:
tests/integration/test_training_health.py."""

import json
import logging
import math

from helpers import TESTS
from largetrain_core.training.config import HealthSettings, TrainConfig
from largetrain_core.training.health import CollapseWatch, RateLimitedWarnings, judge, judge_metrics

REDONE = TESTS / "data" / "training" / "metrics_redone_steps.jsonl"
SHORT_RUN = HealthSettings(min_loss_decrease=0.0, min_nats_below_uniform=0.0)


def rows(losses, grad_norms=None, skipped=()):
    return [
        {
            "step": i + 1,
            "loss": loss,
            "grad_norm": 1.0 if grad_norms is None else grad_norms[i],
            "step_skipped": i + 1 in skipped,
        }
        for i, loss in enumerate(losses)
    ]


def test_a_healthy_run_passes_and_each_cause_is_named():
    vocab = 512  # ln 512 = 6.238
    healthy = judge(rows([6.25 - 0.1 * i for i in range(20)]), vocab, HealthSettings())
    assert healthy.passed and healthy.problems == []
    assert healthy.numbers["skipped_steps"] == 0 and healthy.numbers["nats_below_uniform"] > 1.5

    # frozen at the uniform level, a hair under the first loss: what passed before
    frozen = judge(rows([6.245] + [math.log(vocab)] * 19), vocab, HealthSettings())
    assert not frozen.passed
    assert any(
        "is 0.0000 nats below ln(vocabulary size 512) = 6.2383" in p and "health.min_nats_below_uniform 0.5" in p
        for p in frozen.problems
    ), frozen.problems
    assert any("not below the first by health.min_loss_decrease 5%" in p for p in frozen.problems)

    skipping = judge(rows([6.25 - 0.1 * i for i in range(20)], skipped=range(4, 21)), vocab, HealthSettings())
    assert not skipping.passed and skipping.numbers["skipped_steps"] == 17
    assert skipping.problems == [
        (
            "17 of 20 steps (85%, from step 4) were skipped for a gradient overflow (17) or had a "
            "non-finite gradient norm (0): more than health.max_skipped_fraction 0.1; the training "
            "diverged (lower the learning rate)"
        )
    ]

    norms = [1.0] * 3 + [math.inf] * 17
    exploded = judge(rows([6.2, 6.1, 6.0] + [2e6] * 17, norms), vocab, HealthSettings())
    assert not exploded.passed and exploded.numbers["nonfinite_grad_norm_steps"] == 17
    assert "had a non-finite gradient norm (17)" in exploded.problems[0]
    assert "the mean loss rose from 6.1500 to 2000000.0000 nats" in exploded.problems[1]

    nan = judge(rows([6.2, 6.1, math.nan, 6.0]), vocab, SHORT_RUN)
    assert not nan.passed and nan.problems == ["the loss is not finite at 1 of 4 steps (first at step 3)"]
    assert not judge([], vocab, HealthSettings()).passed


def test_the_short_run_override_lowers_the_margins_not_the_rules():
    """A genuine 4-step run falls a little and stays near ln(V): refused by the default margins, passed
    with both at 0; a loss that does not fall at all, or skipped steps, still fail."""
    short = rows([6.24, 6.20, 6.15, 6.10])
    assert not judge(short, 512, HealthSettings()).passed
    assert judge(short, 512, SHORT_RUN).passed
    assert not judge(rows([6.2383] * 4), 512, SHORT_RUN).passed
    assert not judge(rows([6.24, 6.20, 6.15, 6.10], skipped={2, 3}), 512, SHORT_RUN).passed
    assert TrainConfig.from_dict(
        {"output_dir": "o", "train_shards": "s", "health": {"min_loss_decrease": 0}}
    ).health == HealthSettings(min_loss_decrease=0.0)
    flat = TrainConfig.from_dict({"output_dir": "o", "train_shards": "s", "min_nats_below_uniform": 0})
    assert flat.health.min_nats_below_uniform == 0


def test_the_smoke_test_setting_switches_the_ln_v_rule_off_and_the_messages_read_right():
    """Issue 42 item 11: a short run whose loss fell but is still above ln V (a fresh model starts a little
    above it) passes with both margins at 0; with the default margin the message says "above", never a
    negative "nats below"; a loss that rose says "rose", one that did not move "stayed"."""
    fell_above = rows([6.30, 6.27, 6.25, 6.242])  # ln 512 = 6.2383: the mean of the last step is 0.0037 above
    assert judge(fell_above, 512, SHORT_RUN).passed, judge(fell_above, 512, SHORT_RUN).problems
    strict = judge(fell_above, 512, HealthSettings(min_loss_decrease=0.0))
    (problem,) = strict.problems
    assert "6.2420 nats, is 0.0037 nats above ln(vocabulary size 512) = 6.2383" in problem
    assert "-0.0" not in problem and "health.min_nats_below_uniform 0.5" in problem
    rose = judge(rows([6.0, 6.1, 6.2, 6.3]), 512, SHORT_RUN)
    assert rose.problems == [
        "the mean loss rose from 6.0000 to 6.3000 nats (first and last 10% of steps, +5.0%): not below the first "
        "by health.min_loss_decrease 0%"
    ]
    flat = judge(rows([5.0] * 4), 512, SHORT_RUN)
    assert flat.problems and flat.problems[0].startswith("the mean loss stayed at 5.0000 nats")
    fell = judge(rows([6.2, 6.1, 6.0, 5.99]), 512, HealthSettings(min_loss_decrease=0.5, min_nats_below_uniform=0))
    assert fell.problems[0].startswith("the mean loss fell from 6.2000 to 5.9900 nats")


def test_a_collapsed_training_is_recognized_step_by_step():
    """health.CollapseWatch, the trainer's early stop: N consecutive steps skipped, non-finite, or (after
    the warmup) at ln V stop it; a healthy step in between starts the count again; a fresh model at
    ln V during the warmup is no collapse."""
    settings = HealthSettings(stop_after_collapsed_steps=3)
    uniform = math.log(512)

    def first_stop(watch, rs):
        return next((r["step"] for r in rs if watch.update(r["step"], r)), None)

    skipping = rows([6.2, 6.1, 6.0, 6.0, 6.0, 6.0, 6.0], skipped={4, 5, 6, 7})
    watch = CollapseWatch(settings, 512)
    assert first_stop(watch, skipping) == 6
    assert watch.reason == (
        "the training collapsed: steps 4-6 in a row (3 skipped (gradient overflow)), "
        "health.stop_after_collapsed_steps 3: stopped early at step 6"
    )
    flat = rows([uniform + 0.005, uniform, uniform - 0.001, uniform, uniform, uniform])
    watch = CollapseWatch(settings, 512, warmup_steps=2)
    assert first_stop(watch, flat) == 5 and "3 loss at ln(V)" in watch.reason
    broken = rows([6.2, 6.1, 6.0, uniform, 5.0, uniform, uniform], [1.0, 1.0, 1.0, math.inf, 1.0, 1.0, 1.0])
    assert first_stop(CollapseWatch(settings, 512), broken) is None  # step 5 learnt: the count starts again
    assert first_stop(CollapseWatch(HealthSettings(stop_after_collapsed_steps=None), 512), skipping) is None
    # the judge names the trainer's reason
    verdict = judge(skipping[:6], 512, SHORT_RUN, collapsed=watch.reason)
    assert not verdict.passed and verdict.problems[0] == watch.reason and verdict.numbers["collapsed"]
    assert "health.stop_after_collapsed_steps must be >= 1 or null, not 0" in TrainConfig(
        output_dir="o", train_shards="s", health=HealthSettings(stop_after_collapsed_steps=0)
    ).problems(False)


def test_health_settings_change_neither_the_config_hash_nor_the_data_version():
    cfg = TrainConfig(output_dir="o", train_shards="s")
    other = cfg.with_settings(min_loss_decrease=0.0, min_nats_below_uniform=0.0, max_skipped_fraction=0.5)
    assert other.config_hash() == cfg.config_hash()
    assert other.identity("artifact") == cfg.identity("artifact")
    problems = TrainConfig(
        output_dir="o", train_shards="s", health=HealthSettings(max_skipped_fraction=2, min_loss_decrease=-1)
    ).problems(False)
    assert "health.max_skipped_fraction must be in [0, 1], not 2" in problems
    assert "health.min_loss_decrease must be in [0, 1), not -1" in problems


def test_a_step_redone_after_a_resume_counts_once():
    """The file: steps 1-14 of a start whose steps 13 and 14 went NaN before it crashed, then steps 11-20
    of the start resumed from step 10's checkpoint. Read line by line, the check would count 24 steps
    and fail on the NaN losses that the resume replaced; read as trackers.read_metrics reads it, 20."""
    raw = [json.loads(line) for line in REDONE.read_text().splitlines()]
    assert len(raw) == 24 and sum(1 for r in raw if math.isnan(r["loss"])) == 2
    verdict = judge_metrics(REDONE, 512, HealthSettings())
    assert verdict.passed, verdict.problems
    assert verdict.numbers["steps_logged"] == 20 and verdict.numbers["nonfinite_loss_steps"] == 0
    assert not judge(raw, 512, HealthSettings()).passed  # what reading it raw gave


def test_rank_warnings_are_rate_limited(caplog):
    now = [0.0]
    log = logging.getLogger("largetrain.test_health")
    warnings = RateLimitedWarnings(log, interval_s=30, first=3, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger=log.name):
        shown = []
        for step in range(1, 11):  # ten overflows within a second: the first three shown
            now[0] = step / 10
            shown.append(warnings.warn("skipped-step", f"step {step} skipped"))
        assert shown == [True] * 3 + [False] * 7
        assert warnings.warn("non-finite-loss", "step 10: loss nan")  # another kind has its own count
        now[0] = 31.0
        assert warnings.warn("skipped-step", "step 11 skipped")
        assert warnings.warn("skipped-step", "step 12 skipped") is False
        warnings.flush()
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "step 1 skipped",
        "step 2 skipped",
        "step 3 skipped",
        "step 10: loss nan",
        "step 11 skipped (7 more skipped-step warnings held back since the last one)",
        "1 more skipped-step warnings held back (12 in all)",
    ]
