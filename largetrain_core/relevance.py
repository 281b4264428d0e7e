"""A relevance classifier trained on examples of the wanted text (DCLM, Li et al. 2024; FineWeb-Edu,
Penedo et al. 2024): positives (the domain corpus, or a file of examples) against negatives (a seeded
sample of the pretraining corpus, or a file), then every pretraining document scored and the least
relevant removed (reason ``relevance``).

Model: hashed word n-grams (scikit-learn's ``HashingVectorizer``: lower-cased ``\\w+`` words, 1- and
2-grams, 2**20 features, binary, L2-normalized rows; no vocabulary, so memory does not grow with the
corpus) and a logistic regression (``class_weight="balanced"``: the two sets need not be the same
size). A held-out share of both sets (stratified, seeded) gives precision, recall (at score 0.5)
and ROC AUC; the model saved is the one those numbers describe. The most informative features are
the n-grams of the training texts whose hashed feature has the largest weights, for and against.

Saved as ``model.json`` (the vectorizer's settings, the intercept, the metrics) and ``weights.npz``
(the non-zero weights: indices int64, values float32), read back by :func:`load` without pickle.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import polars as pl

from largetrain_core.storage import part_files, write_json_atomic

SCORE = "relevance_score"


@dataclass(frozen=True)
class RelevanceConfig:
    """How the relevance classifier is trained (the relevance_classifier settings)."""

    positives_file: str | None = field(
        default=None,
        metadata={
            "description": (
                'JSONL (one {"text": ...} per line) or text file (one example per line) of positive examples; null: the '
                "domain corpus (domain/deduplicated_text)."
            )
        },
    )
    negatives_file: str | None = field(
        default=None,
        metadata={
            "description": (
                "The same for negative examples; null: a seeded sample of the pretraining corpus (pretrain/deduplicated_text)."
            )
        },
    )
    max_examples: int = field(
        default=20_000,
        metadata={
            "description": ("At most this many examples of each class (a seeded sample of each when there are more).")
        },
    )
    negatives_per_positive: float = field(
        default=4.0,
        metadata={
            "description": (
                "With negatives from the pretraining corpus: sample this many per positive example (at most max_examples)."
            )
        },
    )
    held_out_fraction: float = field(
        default=0.2,
        metadata={
            "description": (
                "Share of each class held out for precision, recall and AUC (stratified; the model is trained on the rest)."
            )
        },
    )
    ngram_max: int = field(
        default=2, metadata={"description": "Longest word n-gram used as a feature (1: words only)."}
    )
    n_features: int = field(
        default=1 << 20, metadata={"description": "Hashed feature space (scikit-learn HashingVectorizer)."}
    )
    c: float = field(
        default=4.0, metadata={"description": "Inverse L2 regularization strength of the logistic regression."}
    )
    seed: int = field(default=0, metadata={"description": "Seed of the samples and the held-out split."})

    def __post_init__(self):
        if not 0.0 < self.held_out_fraction < 1.0:
            raise ValueError(f"held_out_fraction must be in (0, 1), got {self.held_out_fraction}")
        if self.ngram_max < 1 or self.max_examples < 2:
            raise ValueError("ngram_max must be >= 1 and max_examples >= 2")

    def to_dict(self) -> dict:
        return asdict(self)


def _vectorizer(n_features: int, ngram_max: int):
    from sklearn.feature_extraction.text import HashingVectorizer

    return HashingVectorizer(
        n_features=n_features,
        ngram_range=(1, ngram_max),
        token_pattern=r"(?u)\b\w+\b",
        lowercase=True,
        alternate_sign=False,
        binary=True,
        norm="l2",
    )


def read_examples(path: str | Path) -> list[str]:
    """The examples of a file: JSONL (``text`` of each record) when it ends in .jsonl, else one per
    non-empty line. Raises ValueError naming the file and line of a record without a text."""
    path = Path(path)
    out = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            if path.suffix == ".jsonl":
                try:
                    text = json.loads(line).get("text")
                except (json.JSONDecodeError, AttributeError) as e:
                    raise ValueError(f"{path}:{n}: not a JSON object: {e}") from e
                if not isinstance(text, str) or not text.strip():
                    raise ValueError(f'{path}:{n}: no non-empty "text" field')
                out.append(text)
            else:
                out.append(line.rstrip("\n"))
    if not out:
        raise ValueError(f"{path}: no examples")
    return out


def sample_texts(dirs: list[Path], n: int, seed: int, exclude: set[str] = frozenset()) -> list[str]:
    """A seeded sample of ``n`` texts from the part files of ``dirs`` (every text when there are fewer),
    in corpus order; texts in ``exclude`` (e.g. the positives) are never drawn. Reads the parts once
    for the count and once for the rows drawn."""
    parts = part_files(dirs)
    total = sum(pl.scan_parquet(p).select(pl.len()).collect().item() for p in parts)
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(total, size=min(n, total), replace=False)) if total else np.zeros(0, np.int64)
    out, start = [], 0
    for p in parts:
        df = pl.read_parquet(p, columns=["text"])
        mine = chosen[(chosen >= start) & (chosen < start + df.height)] - start
        out += [t for t in df["text"].gather(mine).to_list() if t not in exclude]
        start += df.height
    return out


@dataclass
class Model:
    """A trained classifier: :meth:`score` gives P(relevant) of each text."""

    n_features: int
    ngram_max: int
    intercept: float
    indices: np.ndarray
    weights: np.ndarray
    meta: dict

    def score(self, texts: list[str]) -> np.ndarray:
        """P(relevant) of each text: float32 array of shape (N,), in [0, 1]."""
        if not len(texts):
            return np.zeros(0, np.float32)
        X = _vectorizer(self.n_features, self.ngram_max).transform(texts)
        w = np.zeros(self.n_features, np.float64)
        w[self.indices] = self.weights
        z = X @ w + self.intercept
        return (1.0 / (1.0 + np.exp(-z))).astype(np.float32)

    def save(self, out_dir: Path) -> None:
        """``out_dir/weights.npz`` and ``out_dir/model.json``; the training's wall time is left out of the
        model (the stage's stats record it), so the same inputs save byte-identical files."""
        meta = dict(self.meta)
        if "metrics" in meta:
            meta["metrics"] = {k: v for k, v in meta["metrics"].items() if k != "train_seconds"}
        np.savez(Path(out_dir) / "weights.npz", indices=self.indices, weights=self.weights)
        write_json_atomic(
            Path(out_dir) / "model.json",
            {"n_features": self.n_features, "ngram_max": self.ngram_max, "intercept": self.intercept, **meta},
        )


def load(model_dir: Path) -> Model:
    """The Model saved in ``model_dir`` (model.json + weights.npz). Raises FileNotFoundError naming a missing file."""
    model_dir = Path(model_dir)
    for f in ("model.json", "weights.npz"):
        if not (model_dir / f).exists():
            raise FileNotFoundError(f"relevance classifier: {model_dir / f} is missing")
    meta = json.loads((model_dir / "model.json").read_text())
    w = np.load(model_dir / "weights.npz")
    return Model(meta.pop("n_features"), meta.pop("ngram_max"), meta.pop("intercept"), w["indices"], w["weights"], meta)


def _feature_names(texts: Iterable[str], wanted: np.ndarray, n_features: int, ngram_max: int) -> dict[int, list[str]]:
    """For each hashed feature index in ``wanted``: the n-grams of ``texts`` that hash to it (most frequent first)."""
    from sklearn.feature_extraction import FeatureHasher

    analyzer = _vectorizer(n_features, ngram_max).build_analyzer()
    counts: dict[str, int] = {}
    for t in texts:
        for g in analyzer(t):
            counts[g] = counts.get(g, 0) + 1
    grams = list(counts)
    if not grams:
        return {}
    idx = FeatureHasher(n_features, input_type="string", alternate_sign=False).transform([[g] for g in grams]).indices
    want = set(wanted.tolist())
    out: dict[int, list[str]] = {}
    for g, i in sorted(zip(grams, idx.tolist()), key=lambda e: -counts[e[0]]):
        if i in want:
            out.setdefault(i, []).append(g)
    return out


def train(
    positives: list[str], negatives: list[str], cfg: RelevanceConfig = RelevanceConfig(), top_features: int = 20
) -> Model:
    """Train on ``positives`` (label 1) and ``negatives`` (label 0), each sampled to ``cfg.max_examples``.

    Returns the Model; its ``meta`` holds ``metrics`` (held-out ``precision``, ``recall`` at 0.5,
    ``auc``, ``train``/``held_out`` counts per class, ``train_seconds``) and ``features`` (the
    ``top_features`` n-grams for and against, with their weights). Raises ValueError when a class
    has fewer than 2 examples (none could be held out)."""
    import time

    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import precision_score, recall_score, roc_auc_score
    from sklearn.model_selection import train_test_split

    rng = np.random.default_rng(cfg.seed)
    pos = [
        positives[i] for i in np.sort(rng.choice(len(positives), min(len(positives), cfg.max_examples), replace=False))
    ]
    neg = [
        negatives[i] for i in np.sort(rng.choice(len(negatives), min(len(negatives), cfg.max_examples), replace=False))
    ]
    if len(pos) < 2 or len(neg) < 2:
        raise ValueError(
            f"relevance classifier: {len(pos)} positive and {len(neg)} negative examples; each class needs 2 or more"
        )
    texts, y = pos + neg, np.r_[np.ones(len(pos), np.int8), np.zeros(len(neg), np.int8)]
    tr, te = train_test_split(np.arange(len(texts)), test_size=cfg.held_out_fraction, stratify=y, random_state=cfg.seed)
    vec = _vectorizer(cfg.n_features, cfg.ngram_max)
    t0 = time.perf_counter()
    X = vec.transform(texts)
    clf = LogisticRegression(C=cfg.c, class_weight="balanced", max_iter=1000, solver="liblinear")
    clf.fit(X[tr], y[tr])
    seconds = time.perf_counter() - t0
    p = clf.predict_proba(X[te])[:, 1]
    metrics = {
        "precision": float(precision_score(y[te], p >= 0.5, zero_division=0)),
        "recall": float(recall_score(y[te], p >= 0.5, zero_division=0)),
        "auc": float(roc_auc_score(y[te], p)) if len(set(y[te])) == 2 else None,
        "train": {"positive": int(y[tr].sum()), "negative": int((1 - y[tr]).sum())},
        "held_out": {"positive": int(y[te].sum()), "negative": int((1 - y[te]).sum())},
        "train_seconds": round(seconds, 3),
    }
    coef = clf.coef_.ravel()
    nz = np.flatnonzero(coef)
    order = nz[np.argsort(coef[nz])]
    best, worst = order[::-1][:top_features], order[:top_features]
    names = _feature_names([texts[i] for i in tr], np.r_[best, worst], cfg.n_features, cfg.ngram_max)
    feats = {
        side: [{"ngrams": names.get(int(i), [])[:3], "weight": round(float(coef[i]), 4)} for i in idx]
        for side, idx in (("relevant", best), ("irrelevant", worst))
    }
    return Model(
        cfg.n_features,
        cfg.ngram_max,
        float(clf.intercept_[0]),
        nz.astype(np.int64),
        coef[nz].astype(np.float32),
        {"metrics": metrics, "features": feats, "config": cfg.to_dict()},
    )


def score_parts(dirs: list[Path], model: Model, batch: int = 2048) -> Iterator[tuple[Path, pl.DataFrame, np.ndarray]]:
    """(part file, its documents, their scores) for every part file of ``dirs``, in corpus order."""
    for p in part_files(dirs):
        df = pl.read_parquet(p)
        scores = (
            np.concatenate([model.score(df["text"].slice(i, batch).to_list()) for i in range(0, df.height, batch)])
            if df.height
            else np.zeros(0, np.float32)
        )
        yield p, df, scores


BINS = (
    1 << 16
)  # histogram bins of the top-fraction threshold: the kept share is within one bin (1/65,536 of the score range)


def threshold_for_top(hist: np.ndarray, fraction: float) -> float:
    """The lowest bin edge of the [0, 1] score histogram ``hist`` at or above which lie at least
    ``fraction`` of the scores (1.0 keeps everything: 0.0); a score at the edge is kept
    (largetrain_core.stages.filtered_text keeps ``score >= threshold``)."""
    n = int(hist.sum())
    if fraction >= 1.0 or not n:
        return 0.0
    from_top = np.cumsum(hist[::-1])
    k = int(np.searchsorted(from_top, max(1, int(np.ceil(fraction * n)))))  # bins from the top needed
    return float((len(hist) - 1 - k) / len(hist))


def score_histogram(files: list[Path], exclude: frozenset = frozenset()) -> np.ndarray:
    """The histogram of the ``relevance_score`` column of Parquet ``files`` (rows whose doc_id is in
    ``exclude`` left out): int64 counts of :data:`BINS` equal bins over [0, 1], read one file at a time."""
    hist = np.zeros(BINS, np.int64)
    for f in files:
        df = pl.read_parquet(f, columns=["doc_id", SCORE])
        if exclude:
            df = df.filter(~pl.col("doc_id").is_in(pl.Series(sorted(exclude), dtype=pl.Utf8).implode()))
        s = df[SCORE].to_numpy()
        hist += np.bincount(np.minimum((s * BINS).astype(np.int64), BINS - 1), minlength=BINS)
    return hist


def histogram_quantiles(hist: np.ndarray) -> dict:
    """The score distribution read from a [0, 1] score histogram: count, min, p10, p25, p50, p75, p90,
    max, mean (each its bin's lower edge, to 4 digits)."""
    n = int(hist.sum())
    if not n:
        return {"count": 0}
    edges = np.arange(len(hist)) / len(hist)
    cum = np.cumsum(hist)
    at = lambda q: round(float(edges[int(np.searchsorted(cum, max(1, int(np.ceil(q * n)))))]), 4)  # noqa: E731
    nz = np.flatnonzero(hist)
    return {
        "count": n,
        "min": round(float(edges[nz[0]]), 4),
        "p10": at(0.1),
        "p25": at(0.25),
        "p50": at(0.5),
        "p75": at(0.75),
        "p90": at(0.9),
        "max": round(float(edges[nz[-1]]), 4),
        "mean": round(float((hist * edges).sum() / n), 4),
    }
