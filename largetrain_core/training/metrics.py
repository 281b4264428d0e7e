"""What becomes of a training step's metrics row (:meth:`MetricsProcessor.process`): warnings of an
unhealthy step (rank 0, rate-limited: health.RateLimitedWarnings), the row to every tracker
(trackers.Trackers.log_metrics), and a progress line every ``logging_steps`` steps, after the last
step and after each evaluation."""

from __future__ import annotations

import logging
import math

from largetrain_core.training.config import TrainConfig
from largetrain_core.training.health import RateLimitedWarnings
from largetrain_core.training.trackers import Trackers


class MetricsProcessor:
    """One rank's metrics rows. ``row``: ``loss`` (nats), ``lr``, ``grad_norm`` (None when DeepSpeed
    gives none), ``tokens_per_s``, ``step_skipped``, ``loss_scale`` (fp16), and ``eval_loss`` after an
    evaluation."""

    def __init__(self, cfg: TrainConfig, rank: int, trackers: Trackers, logger: logging.Logger):
        self.cfg, self.rank, self.trackers, self.log = cfg, rank, trackers, logger
        self.warnings = RateLimitedWarnings(logger, cfg.health.warning_interval_s)

    def process(self, step: int, row: dict, seconds: float, steps_this_run: int) -> None:
        """Warn, track and report step ``step``'s ``row``; ``seconds``: wall time of this start's
        ``steps_this_run`` steps so far (for the ETA)."""
        self.warn_unhealthy(step, row)
        self.trackers.log_metrics(step, row)
        max_steps = self.cfg.schedule.max_steps
        if self.rank == 0 and (step % self.cfg.tracking.logging_steps == 0 or step == max_steps or "eval_loss" in row):
            left = seconds / steps_this_run * (max_steps - step)
            evaluated = f", validation loss {row['eval_loss']:.4f}" if "eval_loss" in row else ""
            self.log.info(
                f"step {step}/{max_steps} loss {row['loss']:.4f}{evaluated} lr {row['lr']:.2e} "
                f"{row['tokens_per_s']:.0f} tokens/s ETA {duration(left)}"
            )

    def warn_unhealthy(self, step: int, row: dict) -> None:
        """Rank 0 warns of a step skipped for a gradient overflow, a non-finite loss or a non-finite
        gradient norm; health.judge counts them after the run."""
        if self.rank != 0:
            return
        if row["step_skipped"]:
            scale = f", loss scale now {row['loss_scale']:g}" if "loss_scale" in row else ""
            self.warnings.warn(
                "skipped-step",
                f"step {step} skipped by DeepSpeed: the gradients overflowed "
                f"(not finite), the weights were not updated{scale}",
            )
        if not math.isfinite(row["loss"]):
            self.warnings.warn("non-finite-loss", f"step {step}: loss {row['loss']} is not finite")
        grad_norm = row.get("grad_norm")
        if grad_norm is not None and not math.isfinite(grad_norm) and not row["step_skipped"]:
            self.warnings.warn(
                "non-finite-gradient-norm",
                f"step {step}: gradient norm {grad_norm} is not "
                "finite; the update reached the weights (the training diverges: "
                "lower the learning rate)",
            )

    def flush(self) -> None:
        """Say how many warnings were held back (at the end of the run)."""
        self.warnings.flush()


def duration(seconds: float) -> str:
    """``seconds`` as h:mm:ss."""
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
