"""The language-modelling loss, one definition for training, evaluation during training and the
held-out perplexity of a saved model: next-token cross-entropy in nats.

A sequence of ``seq_len + 1`` token ids gives ``seq_len`` predictions: the model reads ids ``[:-1]``
and is scored on ids ``[1:]``. The logits are cast to fp32 before the softmax (as Megatron and
torchtitan do), so fp16/bf16 runs compute the loss in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy (nats) of ``logits`` (batch, positions, vocabulary; any float dtype) against
    ``targets`` (batch, positions; int64), over every position: ``mean`` or ``sum`` (``reduction``)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction=reduction)


def next_token_loss(model, batch: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """The next-token cross-entropy (nats) of ``model`` (a causal LM, or a DeepSpeed engine around one)
    on ``batch``: int64 token ids of shape (batch, seq_len + 1). ``reduction`` ``mean`` (the training
    loss) or ``sum`` (to pool over batches: divide by :func:`targets` of each); a 0-d fp32 tensor."""
    logits = model(input_ids=batch[:, :-1]).logits
    return cross_entropy(logits, batch[:, 1:], reduction)


def targets(batch: torch.Tensor) -> int:
    """The number of scored positions of ``batch`` (batch x seq_len)."""
    return batch[:, 1:].numel()
