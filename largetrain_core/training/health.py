"""Whether a finished training is healthy: :func:`judge` of its ``metrics.jsonl`` rows, the training
assets' blocking check, with the thresholds of ``TrainConfig.health`` (config.HealthSettings, where
each one's source is given); and :class:`RateLimitedWarnings`, how a rank's warnings about its steps
(skipped for a gradient overflow, a non-finite loss or gradient norm) reach the log, and through the
dagster_pipes tracker the Dagster run log, without flooding it.

A step is *skipped* when DeepSpeed found its gradients overflowed (not finite) and left the weights
as they were (``step_skipped`` in its metrics row): fp16's dynamic loss scaler does so, and so do the
ZeRO optimizers' overflow checks in any precision; elsewhere a non-finite gradient norm reaches the
weights. Both count against ``max_skipped_fraction``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from largetrain_core.storage import loading
from largetrain_core.training.config import HealthSettings
from largetrain_core.training.trackers import read_metrics


@dataclass(frozen=True)
class Verdict:
    """``passed``: no problem; ``problems``: each cause in words, naming the threshold it broke;
    ``numbers``: what was measured (counts of steps; losses in nats; fractions in [0, 1])."""

    passed: bool
    problems: list[str] = field(default_factory=list)
    numbers: dict = field(default_factory=dict)


def _finite(x) -> bool:
    return x is not None and math.isfinite(x)


def judge(rows: list[dict], vocab_size: int | None, settings: HealthSettings, collapsed: str | None = None) -> Verdict:
    """Judge a training from its metrics rows (one per optimizer step, ascending, as
    trackers.read_metrics gives them: ``loss`` in nats, ``grad_norm`` or None, ``step_skipped``).

    It fails when a loss is not finite; when more than ``max_skipped_fraction`` of the steps were
    skipped or had a non-finite gradient norm; when the mean loss of the last 10% of steps is not
    below that of the first 10% by ``min_loss_decrease`` (a fraction of the first; 0: any fall); when it
    is not at least ``min_nats_below_uniform`` nats below ln(``vocab_size``), the loss of a uniform
    prediction over the model's vocabulary (not judged when ``vocab_size`` is None, or when
    ``min_nats_below_uniform`` is 0: the documented smoke-test setting)."""
    n = len(rows)
    if not n:
        return Verdict(False, ["no training step was logged"], {"steps_logged": 0})
    losses = [r["loss"] for r in rows]
    skipped = [r["step"] for r in rows if r.get("step_skipped")]
    bad_norm = [r["step"] for r in rows if r.get("grad_norm") is not None and not math.isfinite(r["grad_norm"])]
    bad_loss = [r["step"] for r in rows if not _finite(r["loss"])]
    unhealthy = sorted(set(skipped) | set(bad_norm))
    k = max(1, n // 10)
    start, end = sum(losses[:k]) / k, sum(losses[-k:]) / k
    numbers = {
        "steps_logged": n,
        "skipped_steps": len(skipped),
        "nonfinite_grad_norm_steps": len(bad_norm),
        "nonfinite_loss_steps": len(bad_loss),
        "skipped_or_nonfinite_fraction": round(len(unhealthy) / n, 4),
        "mean_loss_first_10pct": start,
        "mean_loss_last_10pct": end,
    }
    problems = [collapsed] if collapsed else []
    numbers["collapsed"] = bool(collapsed)
    if bad_loss:
        problems.append(f"the loss is not finite at {len(bad_loss)} of {n} steps (first at step {bad_loss[0]})")
    if len(unhealthy) / n > settings.max_skipped_fraction:
        problems.append(
            f"{len(unhealthy)} of {n} steps ({len(unhealthy) / n:.0%}, from step {unhealthy[0]}) were skipped for a gradient "
            f"overflow ({len(skipped)}) or had a non-finite gradient norm ({len(bad_norm)}): more than "
            f"health.max_skipped_fraction {settings.max_skipped_fraction:g}; the training diverged (lower the learning rate)"
        )
    if math.isfinite(start) and math.isfinite(end):
        problems += _learning_problems(start, end, vocab_size, settings, numbers)
    return Verdict(not problems, problems, numbers)


def _learning_problems(
    start: float, end: float, vocab_size: int | None, settings: HealthSettings, numbers: dict
) -> list[str]:
    """:func:`judge`'s rules on a finite mean loss of the first (``start``) and last (``end``) 10% of steps, in
    nats: the fall by ``min_loss_decrease`` and the distance below ln(``vocab_size``); their figures go into
    ``numbers``. Returns the problems found."""
    problems = []
    numbers["loss_decrease_fraction"] = round((start - end) / start, 4) if start else None
    if not end < start * (1 - settings.min_loss_decrease):
        moved = "fell" if end < start else "rose"
        change = f"{moved} from {start:.4f} to {end:.4f} nats" if end != start else f"stayed at {end:.4f} nats"
        problems.append(
            f"the mean loss {change} (first and last 10% of steps, {(end - start) / start:+.1%}): not below "
            f"the first by health.min_loss_decrease {settings.min_loss_decrease:.0%}"
        )
    if vocab_size:
        uniform = math.log(vocab_size)
        numbers.update(vocab_size=vocab_size, uniform_loss=uniform, nats_below_uniform=uniform - end)
        # min_nats_below_uniform 0 switches the rule off (a smoke test's loss may still be above ln V)
        if settings.min_nats_below_uniform > 0 and not end < uniform - settings.min_nats_below_uniform:
            gap = uniform - end
            where = f"{gap:.4f} nats below" if gap >= 0 else f"{-gap:.4f} nats above"
            problems.append(
                f"the mean loss of the last 10% of steps, {end:.4f} nats, is {where} "
                f"ln(vocabulary size {vocab_size}) = {uniform:.4f}, the loss of predicting every token equally: "
                f"not the health.min_nats_below_uniform {settings.min_nats_below_uniform:g} below it that shows "
                "it learnt"
            )
    return problems


class CollapseWatch:
    """Whether a training has collapsed, step by step (``health.stop_after_collapsed_steps``): a step is
    collapsed when DeepSpeed skipped it for a gradient overflow, its loss or gradient norm is not finite,
    or, after ``warmup_steps``, its loss is within ``collapse_tolerance`` nats of ln(``vocab_size``) (a
    uniform prediction's loss; not judged when ``vocab_size`` is None). Every rank sees the same rows
    (the loss all-reduced, the overflow and the norm global), so every rank stops after the same step."""

    def __init__(self, settings: HealthSettings, vocab_size: int | None, warmup_steps: int = 0):
        self.limit, self.tolerance = settings.stop_after_collapsed_steps, settings.collapse_tolerance
        self.uniform = math.log(vocab_size) if vocab_size and vocab_size > 1 else None
        self.warmup_steps = warmup_steps
        self.run: list[tuple[int, str]] = []  # the current run of collapsed steps: (step, why)
        self.reason: str | None = None

    def why(self, step: int, row: dict) -> str | None:
        """Why step ``step`` (its metrics row) is collapsed, or None."""
        if row.get("step_skipped"):
            return "skipped (gradient overflow)"
        if not _finite(row.get("loss")):
            return "non-finite loss"
        if row.get("grad_norm") is not None and not math.isfinite(row["grad_norm"]):
            return "non-finite gradient norm"
        if self.uniform is not None and step > self.warmup_steps and abs(row["loss"] - self.uniform) <= self.tolerance:
            return f"loss {row['loss']:.4f} at ln(V) = {self.uniform:.4f}"
        return None

    def update(self, step: int, row: dict) -> bool:
        """Count step ``step``; True once ``stop_after_collapsed_steps`` consecutive steps collapsed
        (then :attr:`reason` says which and why)."""
        why = self.why(step, row)
        self.run = [*self.run, (step, why)] if why else []
        if self.limit is None or len(self.run) < self.limit:
            return False
        kinds: dict[str, int] = {}
        for _, w in self.run:
            kind = "loss at ln(V)" if w.startswith("loss ") else w
            kinds[kind] = kinds.get(kind, 0) + 1
        self.reason = (
            f"the training collapsed: steps {self.run[0][0]}-{step} in a row ("
            + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
            + f"), health.stop_after_collapsed_steps {self.limit}: stopped early at step {step}"
        )
        return True


def judge_metrics(
    metrics_file: Path, vocab_size: int | None, settings: HealthSettings, collapsed: str | None = None
) -> Verdict:
    """:func:`judge` of ``metrics_file`` (metrics.jsonl) read as trackers.read_metrics reads it: a step
    run again after a resume counts once, with its last row. Raises ArtifactError naming the file
    when it is missing or not JSON lines."""
    with loading(metrics_file, "training metrics (JSON lines with a step and a loss)"):
        rows = read_metrics(metrics_file)
    return judge(rows, vocab_size, settings, collapsed)


def step_counts(rows: list[dict]) -> dict:
    """``skipped_steps`` and ``nonfinite_grad_norm_steps`` of a run's metrics rows (read_metrics)."""
    return {
        "skipped_steps": sum(1 for r in rows if r.get("step_skipped")),
        "nonfinite_grad_norm_steps": sum(
            1 for r in rows if r.get("grad_norm") is not None and not math.isfinite(r["grad_norm"])
        ),
    }


class RateLimitedWarnings:
    """Warnings of one kind to ``logger``: the first ``first`` of each kind, then at most one per
    ``interval_s`` seconds, which says how many of its kind were held back since the last one shown;
    :meth:`flush` says how many were held back at the end. ``clock``: seconds (monotonic)."""

    def __init__(
        self, logger: logging.Logger, interval_s: float, first: int = 3, clock: Callable[[], float] = time.monotonic
    ):
        self.logger, self.interval_s, self.first, self.clock = logger, interval_s, first, clock
        self.seen: dict[str, int] = {}
        self.held: dict[str, int] = {}
        self.last_shown: dict[str, float] = {}

    def warn(self, kind: str, message: str) -> bool:
        """Log ``message`` (of ``kind``) unless held back; returns whether it was logged."""
        now = self.clock()
        self.seen[kind] = self.seen.get(kind, 0) + 1
        if self.seen[kind] > self.first and now - self.last_shown.get(kind, -math.inf) < self.interval_s:
            self.held[kind] = self.held.get(kind, 0) + 1
            return False
        held = self.held.pop(kind, 0)
        self.logger.warning(message + (f" ({held} more {kind} warnings held back since the last one)" if held else ""))
        self.last_shown[kind] = now
        return True

    def flush(self) -> None:
        """Say how many warnings of each kind were held back since the last one shown."""
        for kind, held in sorted(self.held.items()):
            self.logger.warning(f"{held} more {kind} warnings held back ({self.seen[kind]} in all)")
        self.held.clear()
