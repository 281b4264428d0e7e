"""Early stopping on the validation loss, Hugging Face's ``EarlyStoppingCallback`` rule: the best
evaluation is the lowest ``eval_loss``; an evaluation that is not below the best by more than
``threshold`` nats counts against ``patience``, and the run stops after ``patience`` of them in a row.
Its state travels in the checkpoints' client state, so a resumed run keeps counting (and a run that
stopped stays stopped)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class EarlyStopping:
    """``patience``: evaluations without improvement before stopping (None: never stop);
    ``threshold``: the improvement that counts, in nats."""

    patience: int | None
    threshold: float
    best_eval_loss: float | None = None
    best_eval_step: int | None = None
    bad_evals: int = 0
    stopped: bool = False

    def update(self, loss: float, step: int) -> None:
        """Count the evaluation of ``step`` (its mean validation loss in nats)."""
        enough = self.best_eval_loss is None or loss < self.best_eval_loss - self.threshold
        self.bad_evals = 0 if enough else self.bad_evals + 1
        if self.best_eval_loss is None or loss < self.best_eval_loss:
            self.best_eval_loss, self.best_eval_step = loss, step
        if self.patience is not None and self.bad_evals >= self.patience:
            self.stopped = True

    def state(self) -> dict:
        """The counters, for a checkpoint's client state."""
        return {k: v for k, v in asdict(self).items() if k not in ("patience", "threshold")}

    def load(self, state: dict) -> None:
        """Continue from :meth:`state` of a checkpoint."""
        for k in ("best_eval_loss", "best_eval_step", "bad_evals", "stopped"):
            if k in state:
                setattr(self, k, state[k])

    def reason(self, step: int) -> str:
        """Why the run stopped at ``step``, for the log."""
        return (
            f"early stopping at step {step}: no validation loss below {self.best_eval_loss:.4f} (step "
            f"{self.best_eval_step}) by more than {self.threshold} nats in {self.patience} evaluations"
        )
