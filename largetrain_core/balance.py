"""Class histograms and seeded class balancing for corpora with a label column.

The label column comes from the reader (``ReaderConfig.label_field``); :func:`balance_parts` balances
the part files of a deduplicated_text directory in place. Plain re-sampling (as imbalanced-learn's RandomUnderSampler / RandomOverSampler):

* ``mode="down"``: every class is sampled *without* replacement to ``n_c = floor(N * p_c)`` rows with
  ``N = min_c(count_c / p_c)``, the largest total the scarcest class (relative to its target share)
  allows; no row appears twice.
* ``mode="up"``: every original row is kept and class ``c`` gets ``n_c - count_c`` extra rows drawn
  *with* replacement from its own rows, ``n_c = max(count_c, round(N * p_c))`` with
  ``N = max_c(count_c / p_c)``.

``p`` is the target distribution (default: uniform over the classes present); a class with target 0
is dropped. :func:`temperature_target` gives the shares between the natural and the uniform ones.
``max_repeats`` (up mode) caps how often one document appears: a class is filled to at most
``max_repeats * count_c`` rows, its extra copies spread evenly over its documents instead of drawn with
replacement (each document gets ``floor(e / count_c)`` or one more extra copies, the ones with one
more drawn without replacement), so no document appears more than ``max_repeats`` times. The draw uses numpy's PCG64 seeded with ``seed``, classes in sorted order, so the result
is a pure function of (frame, label column, target, mode, seed). Output rows keep input order
(extra up-sampled copies follow their original).

Intended repetition is a weight, never a copy in the data: :func:`balance_parts` keeps each
up-sampled document once and writes how often it is to be trained on in the column ``copies``
(UInt32, >= 1), so that the deduplicated corpus still holds distinct documents (its
``no_exact_duplicates`` check and the accounting see no copies) and an accidental duplicate is never
mistaken for an intended one. The token shards repeat a document ``copies`` times in the train split
(largetrain_core.shards); any other data-mixing weight in whole copies can use the same column.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from largetrain_core.storage import part_files

NULL_LABEL = "<null>"


def class_histogram(labels: pl.Series) -> dict[str, int]:
    """Documents per class, classes sorted by name; a null label counts as ``"<null>"``."""
    counts = labels.cast(pl.Utf8).fill_null(NULL_LABEL).value_counts(sort=False)
    return dict(sorted(zip(counts[counts.columns[0]].to_list(), counts["count"].to_list())))


def label_histogram(directories: list[Path]) -> dict[str, int] | None:
    """Documents per class over the ``part-*.parquet`` files of ``directories`` (:func:`class_histogram`
    of their ``label`` column), or None when no part has a ``label`` column (no label_field was read).
    Memory: the label column of every part."""
    parts = [p for d in directories for p in part_files(Path(d)) if "label" in pl.read_parquet_schema(p)]
    if not parts:
        return None
    return class_histogram(pl.concat([pl.read_parquet(p, columns=["label"]) for p in parts])["label"])


def balance(
    df: pl.DataFrame,
    label: str,
    target: dict[str, float] | None = None,
    mode: str = "down",
    seed: int = 0,
    max_repeats: int | None = None,
) -> tuple[pl.DataFrame, dict]:
    """Re-sample ``df`` so that column ``label`` follows ``target`` (see module docstring).

    Returns ``(sample, metadata)`` with metadata ``{"before": histogram, "after": histogram,
    "target": shares, "mode": mode, "seed": seed}``, plus ``"max_repeats"`` when it is set. Raises
    ValueError on an unknown mode, a negative or all-zero target, a target class missing from the data,
    an empty frame, or a ``max_repeats`` below 1.
    """
    if mode not in ("down", "up"):
        raise ValueError(f"mode must be 'down' or 'up', got {mode!r}")
    if max_repeats is not None and max_repeats < 1:
        raise ValueError(f"max_repeats must be >= 1 (a document appears at least once), got {max_repeats}")
    if df.height == 0:
        raise ValueError("cannot balance an empty frame")
    labels = df[label].cast(pl.Utf8).fill_null(NULL_LABEL)
    before = class_histogram(df[label])
    if target is None:
        target = {c: 1.0 for c in before}
    if any(v < 0 for v in target.values()) or sum(target.values()) <= 0:
        raise ValueError(f"target shares must be >= 0 and not all 0, got {target}")
    missing = [c for c, v in target.items() if v > 0 and c not in before]
    if missing:
        raise ValueError(f"target classes absent from the data: {missing}")
    total = sum(target.values())
    p = {c: target.get(c, 0.0) / total for c in before}
    live = [c for c in before if p[c] > 0]
    ratios = [before[c] / p[c] for c in live]
    rng = np.random.default_rng(seed)
    lab = labels.to_numpy()
    take: list[np.ndarray] = []
    if mode == "down":
        n_total = min(ratios)
        for c in live:
            rows = np.flatnonzero(lab == c)
            n = min(before[c], int(np.floor(n_total * p[c] + 1e-9)))
            take.append(np.sort(rng.choice(rows, size=n, replace=False)))
    else:
        n_total = max(ratios)
        for c in live:
            rows = np.flatnonzero(lab == c)
            n = max(before[c], int(round(n_total * p[c])))
            if max_repeats is None:
                extra = rng.choice(rows, size=n - before[c], replace=True)
            else:
                extra = _even_copies(rows, min(n, before[c] * max_repeats) - before[c], rng)
            take.append(np.sort(np.concatenate([rows, extra])))
    idx = np.sort(np.concatenate(take), kind="stable") if take else np.zeros(0, np.int64)
    out = df[idx]
    meta = {"before": before, "after": class_histogram(out[label]), "target": p, "mode": mode, "seed": seed}
    return out, meta if max_repeats is None else {**meta, "max_repeats": max_repeats}


def _even_copies(rows: np.ndarray, extra: int, rng: np.random.Generator) -> np.ndarray:
    """``extra`` copies of ``rows`` spread evenly: every row ``extra // len(rows)`` times, and
    ``extra % len(rows)`` rows drawn without replacement once more."""
    whole, rest = divmod(extra, len(rows))
    return np.concatenate([np.tile(rows, whole), rng.choice(rows, size=rest, replace=False)])


def temperature_target(histogram: dict[str, int], temperature: float) -> dict[str, float]:
    """Target shares between the natural and the uniform distribution: ``p_c = n_c^(1/T) / sum_k n_k^(1/T)``.

    ``temperature`` ``T`` = 1 gives the natural shares ``n_c / n``, ``T`` = ``math.inf`` the uniform
    ones; in between, the small classes gain at the large ones' expense. This is the exponentially
    smoothed sampling of multilingual BERT and XLM (Conneau & Lample 2019, "Cross-lingual Language Model
    Pretraining": ``q_i = p_i^alpha / sum_j p_j^alpha`` with ``alpha = 1/T``) and the temperature-based
    sampling of Arivazhagan et al. 2019 ("Massively Multilingual Neural Machine Translation in the
    Wild": ``p_l^(1/T)``). A class with 0 documents gets share 0. Returns the shares (float,
    summing to 1) keyed as ``histogram``. Raises ValueError when ``temperature`` < 1 (that would sharpen
    the imbalance) or every count is 0.
    """
    if not temperature >= 1:
        raise ValueError(f"temperature must be >= 1 (1: natural shares, inf: uniform), got {temperature}")
    live = {c: n for c, n in histogram.items() if n > 0}
    if not live:
        raise ValueError(f"no class has a document: {histogram}")
    alpha = 1.0 / temperature
    weights = {c: float(n) ** alpha for c, n in live.items()}
    total = sum(weights.values())
    return {c: weights.get(c, 0.0) / total for c in histogram}


BALANCE_DROPPED = "balance_dropped.parquet"
COPIES = "copies"  # the column of intended repetition: how many times the train split holds the document
_ROW_SCHEMA = {"doc_id": pl.Utf8, "source": pl.Utf8, "label": pl.Utf8}


def balance_parts(
    directory: Path,
    target: dict[str, float] | None = None,
    mode: str = "down",
    seed: int = 0,
    max_repeats: int | None = None,
    temperature: float | None = None,
) -> dict:
    """Balance the ``part-*.parquet`` files of ``directory`` (columns doc_id, source, text, label) in place.

    The class histogram is taken over all parts together (global row order = sorted part files,
    rows in order) and :func:`balance` picks the rows, so the result equals balancing the
    concatenated corpus. Down-sampling rewrites each part with its chosen rows and writes
    ``balance_dropped.parquet`` (doc_id, source, label, reason ``"balance_downsample"``: one row per
    document left out, an outcome *filtered* in the accounting). Up-sampling keeps every row once and
    adds the column ``copies`` (UInt32: 1 + the extra copies drawn; see the module docstring), so the
    parts still hold distinct documents. Returns ``{"before", "after" (counting copies), "target",
    "mode", "seed", "balance_dropped", "balance_repeats" (extra copies, the sum of copies - 1),
    "repeated_documents" (documents with copies > 1)}``. ``max_repeats``: :func:`balance`'s cap on one
    document's copies; ``temperature``: the target is :func:`temperature_target` of the classes' counts
    (``target`` is then not used). Raises ValueError when the parts have no ``label`` column and as
    :func:`balance`.
    """
    directory = Path(directory)
    parts = part_files(directory)
    if not parts or any("label" not in pl.read_parquet_schema(p) for p in parts):
        raise ValueError(f"{directory}: no label column to balance on (set the reader's label_field)")
    labels = pl.concat([pl.read_parquet(p, columns=["label"]) for p in parts]).with_row_index("row")
    if temperature is not None:  # shares between the natural and the uniform ones (temperature_target)
        target = temperature_target(class_histogram(labels["label"]), temperature)
    chosen, meta = balance(labels, "label", target, mode, seed, max_repeats=max_repeats)
    if temperature is not None:
        meta["temperature"] = temperature
    picks = chosen["row"].to_numpy()
    dropped, start, repeats, repeated = [], 0, 0, 0
    for p in parts:
        df = pl.read_parquet(p)
        mine = picks[(picks >= start) & (picks < start + df.height)] - start
        copies = np.bincount(mine, minlength=df.height).astype(np.uint32)
        if mode == "up":
            df.with_columns(pl.Series(COPIES, copies, dtype=pl.UInt32)).write_parquet(p)
        else:
            df.filter(pl.Series(copies > 0)).write_parquet(p)
        dropped.append(df.filter(pl.Series(copies == 0)).select("doc_id", "source", "label"))
        repeats += int(np.maximum(copies.astype(np.int64) - 1, 0).sum())
        repeated += int((copies > 1).sum())
        start += df.height
    drop = pl.concat(dropped).cast(_ROW_SCHEMA).with_columns(reason=pl.lit("balance_downsample", pl.Utf8))
    drop.write_parquet(directory / BALANCE_DROPPED)
    return {**meta, "balance_dropped": drop.height, "balance_repeats": repeats, "repeated_documents": repeated}


def repeat_counts(directory: Path) -> tuple[int, int]:
    """(documents with ``copies`` > 1, extra copies = sum of ``copies`` - 1) over the part files of
    ``directory``; (0, 0) when they have no ``copies`` column. Raises ValueError naming the part file
    when a value is null or below 1."""
    documents = extra = 0
    for p in part_files(directory):
        if COPIES not in pl.read_parquet_schema(p):
            continue
        c = pl.read_parquet(p, columns=[COPIES])[COPIES]
        if c.null_count() or (c < 1).any():
            raise ValueError(
                f"{p}: column {COPIES!r} must be >= 1 in every row (how many times the document is trained on)"
            )
        documents += int((c > 1).sum())
        extra += int((c - 1).sum())
    return documents, extra


def histogram_markdown(before: dict[str, int], after: dict[str, int]) -> str:
    """| class | before | after | as markdown, classes sorted, with a total row; class names in code
    spans, so that ``<null>`` is not read as an HTML tag by the Dagster UI."""
    rows = [f"| `{c}` | {before.get(c, 0)} | {after.get(c, 0)} |" for c in sorted(set(before) | set(after))]
    return "\n".join(
        [
            "| class | before | after |",
            "|---|---|---|",
            *rows,
            f"| **total** | **{sum(before.values())}** | **{sum(after.values())}** |",
        ]
    )
