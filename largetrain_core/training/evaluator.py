"""The evaluation during training: the mean next-token cross-entropy (nats, loss.next_token_loss) on
the first ``eval_max_sequences`` sequences of the token shards' validation split (for a fine-tuning
task, its loss on the task examples' validation rows: largetrain_core.training.tasks.task_loss), strided over the
ranks (every rank a share, the same sequences every time). It runs in eval mode without gradients and
restores every RNG state it could touch, so the training's losses are the same with it and without it."""

from __future__ import annotations

import contextlib
import math
import time

import numpy as np
import torch
import torch.distributed as dist

from largetrain_core.training import checkpoints, tasks
from largetrain_core.training.loss import next_token_loss, targets


class Evaluator:
    """One rank's part of the validation loss of training config ``cfg`` (largetrain_core.training.config):
    the validation split of ``cfg.train_shards`` as the training reads its task's data (tasks.open_split),
    ``cfg.evaluation.eval_max_sequences`` of it in micro-batches of ``cfg.schedule.micro_batch_size``.
    Raises ValueError naming the shards when the validation split holds no sequence."""

    def __init__(self, cfg, rank: int, world: int):
        self.task = cfg.task
        self.validation = tasks.open_split(cfg, "validation")
        if len(self.validation) == 0:
            raise ValueError(
                f"{cfg.train_shards}: the validation split holds no sequence, so there is nothing to "
                "evaluate on; make the shards with validation_fraction > 0 or set eval_strategy 'no'"
            )
        n = min(len(self.validation), cfg.evaluation.eval_max_sequences)
        self.indices = np.arange(rank, n, world)
        self.micro_batch_size = cfg.schedule.micro_batch_size
        self.batches = math.ceil(math.ceil(n / world) / self.micro_batch_size)  # rank 0's, the most
        self.eval_steps, self.max_steps = cfg.evaluation.eval_steps, cfg.schedule.max_steps

    def should_evaluate(self, step: int) -> bool:
        """Whether the training evaluates after step ``step`` (1-based, just finished): every ``eval_steps``-th
        step and the last (``max_steps``)."""
        return step % self.eval_steps == 0 or step == self.max_steps

    def __call__(self, engine, device: torch.device) -> tuple[float, float]:
        """(mean loss in nats over every target token of every rank's sequences, seconds). Every rank
        must call it: each runs the same number of forward passes (ZeRO-3 gathers each layer's weights
        from all ranks), a rank short of sequences running sequence 0 without counting it."""
        t0 = time.perf_counter()
        mb = self.micro_batch_size
        sums = torch.zeros(2, dtype=torch.float64, device=device)  # nats, target tokens
        with _rng_preserved(device if device.type == "cuda" else None), torch.no_grad():
            engine.eval()
            try:
                for start in range(0, self.batches * mb, mb):
                    idx = self.indices[start : start + mb]
                    counted = len(idx) > 0
                    rows = self.validation.take(idx if counted else [0])
                    if self.task == "causal_lm":
                        batch = torch.from_numpy(rows.astype(np.int64)).to(device)
                        nats, n = next_token_loss(engine, batch, reduction="sum"), targets(batch)
                    else:
                        batch = {k: torch.from_numpy(v).to(device) for k, v in rows.items()}
                        nats = tasks.task_loss(self.task, engine, batch, reduction="sum")
                        n = tasks.counted(self.task, batch)
                    if counted:
                        sums[0] += nats.double()
                        sums[1] += n
            finally:
                engine.train()
        dist.all_reduce(sums)
        return float(sums[0] / sums[1]), time.perf_counter() - t0


@contextlib.contextmanager
def _rng_preserved(cuda_device: torch.device | None):
    """Restore python's, numpy's and torch's (CPU and ``cuda_device``) RNG states on exit."""
    state = checkpoints.rng_state()
    with torch.random.fork_rng(devices=[cuda_device] if cuda_device is not None else []):
        yield
    checkpoints.set_rng_state(state)
