"""Mixture weights and sampling (package doc, Mixture): the weights normalized, the windows per corpus, the systematic sample."""

from __future__ import annotations

import math

import numpy as np


CORPUS = "corpus"  # the column naming a document's corpus in a mixture


def mixture_weights(weights: dict[str, float]) -> dict[str, float]:
    """``weights`` normalized to sum 1. Raises ValueError for an empty mapping, a negative or non-finite
    weight, or weights that sum to 0."""
    if not weights:
        raise ValueError("mixture: name at least one corpus and its weight")
    bad = {k: v for k, v in weights.items() if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0)}
    if bad:
        raise ValueError(f"mixture weights must be finite numbers >= 0, not {bad}")
    total = float(sum(weights.values()))
    if total <= 0:
        raise ValueError(f"mixture weights sum to 0: {weights}")
    return {k: float(v) / total for k, v in sorted(weights.items())}


def mixture_targets(sequences: dict[str, int], weights: dict[str, float]) -> dict[str, int]:
    """Windows per corpus: ``weights`` (normalized) x the windows of every corpus together, rounded so that
    they sum to that total (largest remainders first, ties by name)."""
    total = sum(sequences.values())
    exact = {c: weights.get(c, 0.0) * total for c in sequences}
    out = {c: int(math.floor(v)) for c, v in exact.items()}
    short = total - sum(out.values())
    for c in sorted(exact, key=lambda c: (-(exact[c] - out[c]), c))[:short]:
        out[c] += 1
    return out


def systematic(start: int, count: int, fraction: float, offset: float) -> np.ndarray:
    """Boolean mask over window indices ``start .. start + count - 1``: selected when
    ``floor((i + 1) * fraction + offset) > floor(i * fraction + offset)`` (systematic sampling: the
    selected windows are evenly spread and number ``floor(n * fraction + offset)`` of the first n)."""
    i = np.arange(start, start + count, dtype=np.float64)
    return np.floor((i + 1) * fraction + offset) > np.floor(i * fraction + offset)
