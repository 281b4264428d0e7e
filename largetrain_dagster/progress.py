"""A running training's progress, read from its output directory: ``metrics.jsonl`` (one JSON row per
optimizer step, appended by rank 0: step, loss, tokens_per_s, ...; largetrain_core.train) and
``train_config.json`` (``schedule.max_steps``). What the run log and the asset's observations
(:class:`ProgressReporter`, used by the TorchrunLauncher) and the demo's terminal
(largetrain_dagster.demo) show while a training runs.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from dagster import AssetKey, AssetObservation


@dataclass(frozen=True)
class Progress:
    """One reading: optimizer ``step`` of ``total``; ``loss`` (nats per token) and ``tokens_per_s``
    of that step; ``eta_s``: seconds left at the step rate observed since the reader started
    (wall clock, so checkpoint saves count), None until two different steps were seen."""

    step: int
    total: int | None
    loss: float
    tokens_per_s: float
    eta_s: float | None

    def line(self) -> str:
        """``step 120/500 (24%), loss 6.123, 5,432 tokens/s, ETA 3 min 10 s``."""
        done = f"step {self.step}/{self.total} ({self.step / self.total:.0%})" if self.total else f"step {self.step}"
        running = self.eta_s is not None and (self.total is None or self.step < self.total)
        eta = f", ETA {duration(self.eta_s)}" if running else ""
        return f"{done}, loss {self.loss:.3f}, {self.tokens_per_s:,.0f} tokens/s{eta}"

    def metadata(self) -> dict[str, int | float]:
        """Numbers for an AssetObservation, which Dagster plots against time on the asset page: ``step``,
        ``total_steps`` and ``progress_percent`` (1 decimal) once the total is known, ``loss`` (nats per
        token, 3 decimals), ``tokens_per_s`` (integer), ``eta_s`` (seconds, 1 decimal) once known."""
        out: dict[str, int | float] = {"step": self.step}
        if self.total:
            out.update(total_steps=self.total, progress_percent=round(100 * self.step / self.total, 1))
        out.update(loss=round(self.loss, 3), tokens_per_s=round(self.tokens_per_s))
        if self.eta_s is not None:
            out["eta_s"] = round(self.eta_s, 1)
        return out


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 10 s``, ``1 h 05 min``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class TrainingProgress:
    """Follows ``out_dir/metrics.jsonl`` as it grows (reading only the new complete lines each poll)."""

    def __init__(self, out_dir: Path):
        self.out_dir = Path(out_dir)
        self._offset = 0
        self._last: dict | None = None
        self._first_seen: tuple[float, int] | None = None  # (monotonic time, step) of the first row read
        self._total: int | None = None

    def total(self) -> int | None:
        """``schedule.max_steps`` from train_config.json, once it exists."""
        if self._total is None:
            try:
                self._total = int(json.loads((self.out_dir / "train_config.json").read_text())["schedule"]["max_steps"])
            except (OSError, ValueError, KeyError, TypeError):
                return None
        return self._total

    def poll(self, now: float | None = None) -> Progress | None:
        """The newest step's progress, or None before the first step is logged."""
        now = time.monotonic() if now is None else now
        try:
            with open(self.out_dir / "metrics.jsonl", "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except OSError:
            return None
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next poll
        self._offset += len(complete)
        for line in complete.splitlines():
            row = json.loads(line) if line.strip() else {}
            if "loss" in row:  # a training step's row (other rows, e.g. evaluations, are not progress)
                self._last = row
        if self._last is None:
            return None
        step = int(self._last["step"])
        if self._first_seen is None:
            self._first_seen = (now, step)
        total = self.total()
        t0, s0 = self._first_seen
        eta = None
        if total is not None and step > s0 and now > t0:
            eta = max(0.0, (total - step) * (now - t0) / (step - s0))
        return Progress(step, total, float(self._last["loss"]), float(self._last.get("tokens_per_s") or 0.0), eta)


def progress_asset(context) -> tuple[AssetKey, str | None] | None:
    """(asset key, partition key or None) that a training's progress observations are about: the one
    asset the step materializes. None for an op's step, or a step materializing several assets (whose
    progress would be ambiguous): their progress is in the run log only.

    Dagster writes an observation to the event log when it is logged (DagsterEvent.from_step), so the
    asset page shows it while the step still runs, before the materialization."""
    if not getattr(context, "has_assets_def", False):
        return None
    keys = context.selected_asset_keys
    if len(keys) != 1:
        return None
    return next(iter(keys)), (context.partition_key if context.has_partition_key else None)


class ProgressReporter:
    """A training's progress in the step ``context``: :meth:`tick`, called often, reads ``out_dir``
    (:class:`TrainingProgress`) at most every ``every_seconds`` and, when a new step was logged, writes
    a progress line to the run log and an AssetObservation with the same numbers on the asset being
    materialized (:func:`progress_asset`), which its page lists and plots."""

    def __init__(self, context, out_dir: Path, every_seconds: float):
        self.context, self.every = context, every_seconds
        self.reader = TrainingProgress(out_dir)
        self.observed = progress_asset(context)
        self.next_at = time.monotonic() + every_seconds
        self.shown: int | None = None

    def tick(self) -> None:
        if time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + self.every
        p = self.reader.poll()
        if p is None or p.step == self.shown:
            return
        self.context.log.info(f"training progress: {p.line()}")
        if self.observed is not None:
            self.context.log_event(
                AssetObservation(
                    asset_key=self.observed[0],
                    partition=self.observed[1],
                    metadata=p.metadata(),
                    description=f"training progress: {p.line()} (loss in nats per token)",
                )
            )
        self.shown = p.step
