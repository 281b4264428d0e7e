"""How a fine-tuning task's examples are made from the domain corpus's deduplicated text, in the
lora_adapter stage (largetrain_core.stages.training.fine_tuning_examples): the settings
(:class:`TaskDataSettings`), the labelled documents and their stratified split for classification,
the conversations and their split by record for chat; written as task examples by
largetrain_core.training.tasks."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from largetrain_core.settings import described
from largetrain_core.training.tasks import MANIFEST, write_chat, write_classification


@dataclass
class TaskDataSettings:
    """How a fine-tuning task's examples are made from the domain corpus's deduplicated text (the
    lora_adapter stage, tasks classification and chat)."""

    seq_len: int = field(
        default=128,
        metadata=described(
            "Tokens of a record (classification: longer records are truncated to their first seq_len tokens, "
            "shorter ones right-padded) or of a packed row of conversations (chat: a longer conversation is cut "
            "to its first seq_len tokens, counted); at most the base model's max_position_embeddings."
        ),
    )
    validation_fraction: float = field(
        default=0.1,
        metadata=described(
            "Share of the records (of each class, for classification) held out for the validation loss."
        ),
    )
    test_fraction: float = field(
        default=0.1,
        metadata=described(
            "Share of the records held out for the evaluation after training: classification (stratified) accuracy, "
            "macro-F1, per-class precision/recall/F1, confusion matrix, beside the majority and TF-IDF baselines; "
            "chat the assistant tokens' perplexity and generations beside the reference answers."
        ),
    )
    class_weights: bool = field(
        default=False,
        metadata=described(
            "Classification: weight each class's loss by n / (k n_c) over the train split (scikit-learn's "
            "'balanced'), the other way to balance than deduplicated_text's up- or down-sampling; use one of them."
        ),
    )
    packing: bool = field(
        default=True,
        metadata=described(
            "Chat: pack several conversations into each row of seq_len tokens, each attending only to itself "
            "(largetrain_core.chat.pack). false: one conversation a row, a micro-batch padded to its longest "
            "conversation (largetrain_core.training.tasks.write_chat), more compute on padding; the losses are the same."
        ),
    )
    group_by_length: int = field(
        default=0,
        metadata=described(
            "Chat with packing false: rows per length group (0: none). The conversations are ordered by length, "
            "longest first, in groups of this many, each a shard of the examples; with schedule.shuffle_window_shards "
            "1 the sampler draws each micro-batch from one group (a multiple of micro_batch_size x ranks keeps every "
            "micro-batch inside one), so a micro-batch pads to a similar length (Hugging Face Trainer's "
            "group_by_length)."
        ),
    )
    labels: Optional[list[str]] = field(
        default=None,
        metadata=described(
            "Classification: the label set, in label order (id2label). null: the labels found, sorted. A document "
            "whose label is missing or not in the set is not trained on; each is named (source, position) in the "
            "metadata."
        ),
    )

    def problems(self) -> list[str]:
        p = [] if self.seq_len >= 1 else [f"task_data.seq_len must be >= 1, not {self.seq_len}"]
        v, t = self.validation_fraction, self.test_fraction
        if not (0 <= v < 1 and 0 <= t < 1 and v + t < 1):
            p.append(f"task_data.validation_fraction and test_fraction must be in [0, 1) with a sum < 1, not {v}, {t}")
        if self.group_by_length < 0 or (self.group_by_length and self.packing):
            p.append(f"task_data.group_by_length must be >= 0, and 0 with packing true, not {self.group_by_length}")
        if self.labels is not None and (len(self.labels) < 2 or len(set(self.labels)) != len(self.labels)):
            p.append(f"task_data.labels must be at least 2 distinct labels or null, not {self.labels}")
        return p


def label_set(task_labels: list[str] | None, corpus_labels: list[str] | None) -> list[str] | None:
    """The one declared label set of a classification lineage: raw_corpus's ``labels`` (``corpus_labels``,
    the set its reader checked every record against) and lora_adapter's ``task_data.labels``
    (``task_labels``, which also fixes the label order, id2label). Either alone is the set; both must name
    the same labels (task_labels may reorder them); neither: None (the labels found, sorted). Raises
    ValueError naming both sets and the labels in one only, when they differ."""
    if task_labels is None or corpus_labels is None:
        return list(task_labels or corpus_labels) if (task_labels or corpus_labels) else None
    if set(task_labels) != set(corpus_labels):
        only_task = [x for x in task_labels if x not in corpus_labels]
        only_corpus = [x for x in corpus_labels if x not in task_labels]
        raise ValueError(
            f"lora_adapter task_data.labels {list(task_labels)} and raw_corpus labels {list(corpus_labels)} differ "
            f"(only in task_data.labels: {only_task}; only in raw_corpus labels: {only_corpus}): declare one label set, "
            "in raw_corpus labels, and leave task_data.labels null or set it to the same labels in the order wanted"
        )
    return list(task_labels)


def labelled_documents(parts: list[Path], declared: list[str] | None) -> tuple[dict, list[dict]]:
    """The documents of deduplicated_text part files ``parts`` that have a label in the set:
    ``({"doc_id", "source", "text", "label": int64 indices, "copies": int64, "label_names"}, left_out)``;
    ``left_out``: ``{"doc_id", "source", "reason"}`` of each document without a label or with one outside
    the declared set (``source``: the file and line or row the reader read it from). ``copies``: the
    balancing's intended repeats (largetrain_core.balance; 1 without). Raises ValueError when no part
    has a ``label`` column (no raw_corpus label_field) or no document is labelled."""
    import polars as pl

    frames = [pl.read_parquet(p) for p in parts]
    if not frames or any("label" not in f.columns for f in frames):
        raise ValueError(
            "task classification needs labelled documents: set raw_corpus label_field to the field holding the "
            "class and re-materialize the domain corpus"
        )
    df = pl.concat(
        [f.select(c for c in ("doc_id", "source", "text", "label", "copies") if c in f.columns) for f in frames],
        how="diagonal",
    )
    labels = df["label"].to_list()
    names = list(declared) if declared else sorted({x for x in labels if x is not None})
    index = {n: i for i, n in enumerate(names)}
    keep = [x in index for x in labels]
    left_out = [
        {
            "doc_id": d,
            "source": s,
            "reason": "no label" if x is None else f"label {x!r} is not in the label set {names}",
        }
        for d, s, x, k in zip(df["doc_id"].to_list(), df["source"].to_list(), labels, keep)
        if not k
    ]
    kept = df.filter(pl.Series(keep))
    if kept.height == 0:
        raise ValueError(f"no document has a label in the set {names}")
    copies = (
        kept["copies"].fill_null(1).to_numpy().astype(np.int64)
        if "copies" in kept.columns
        else np.ones(kept.height, np.int64)
    )
    docs = {
        "doc_id": kept["doc_id"].to_list(),
        "source": kept["source"].to_list(),
        "text": kept["text"].to_list(),
        "label": np.array([index[x] for x in kept["label"].to_list()], dtype=np.int64),
        "copies": copies,
        "label_names": names,
    }
    return docs, left_out


def classification_examples(
    parts: list[Path],
    base_model: Path,
    settings: TaskDataSettings,
    seed: int,
    out: Path,
    corpus_labels: list[str] | None = None,
) -> dict:
    """Write the classification examples of the labelled documents of ``parts`` (:func:`labelled_documents`)
    into ``out``: split by record, stratified by label (largetrain_core.classification.stratified_split with
    ``settings``' fractions and ``seed``), the train split's documents repeated by their ``copies`` (the
    balancing), encoded with the base model's tokenizer (:func:`write_classification`). Also writes
    ``records.json`` (per split the doc_ids, texts and labels, each record once: for the evaluation and the
    baselines, whose majority class is the natural train split's). The label set: :func:`label_set` of
    ``settings.labels`` and ``corpus_labels`` (raw_corpus's declared labels).
    Returns ``{"manifest", "left_out", "split"}`` (the split's counts, the classes too small, the held-out
    records whose text is also in train)."""
    from largetrain_core.classification import load_classifier_tokenizer, stratified_split

    docs, left_out = labelled_documents(parts, label_set(settings.labels, corpus_labels))
    names = docs["label_names"]
    fractions = (
        1 - settings.validation_fraction - settings.test_fraction,
        settings.validation_fraction,
        settings.test_fraction,
    )
    split = stratified_split(docs["label"], names, fractions, seed=seed, texts=docs["text"])
    train = np.repeat(split.train, docs["copies"][split.train])
    rows = {"train": train, "validation": split.validation, "test": split.test}
    tokenizer = load_classifier_tokenizer(base_model)
    manifest = write_classification(
        out,
        {s: ([docs["text"][i] for i in r], docs["label"][r]) for s, r in rows.items()},
        names,
        tokenizer,
        settings.seq_len,
    )
    if settings.class_weights:
        from largetrain_core.classification import class_weights

        manifest["class_weights"] = [round(float(w), 6) for w in class_weights(docs["label"][split.train], len(names))]
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    records = {
        s: {
            "doc_id": [docs["doc_id"][i] for i in r],
            "text": [docs["text"][i] for i in r],
            "label": docs["label"][r].tolist(),
        }
        for s, r in {"train": split.train, "validation": split.validation, "test": split.test}.items()
    }
    (out / "records.json").write_text(json.dumps(records))
    return {
        "manifest": manifest,
        "left_out": left_out,
        "split": {"counts": split.counts, "too_small": split.too_small, "in_train": split.in_train},
    }


def split_records(n: int, validation_fraction: float, test_fraction: float, seed: int) -> dict[str, np.ndarray]:
    """Record indices (int64, ascending) of the train, validation and test splits of ``n`` records: a
    numpy PCG64 permutation seeded with ``seed``, validation the first ``round(n * validation_fraction)``
    (at least 1 when the fraction is positive and n >= 3), test the next likewise, train the rest. Whole
    records only: a conversation is never cut between splits."""
    order = np.random.default_rng(seed).permutation(n)
    sizes = [max(1, round(n * f)) if f > 0 and n >= 3 else 0 for f in (validation_fraction, test_fraction)]
    v, t = sizes
    return {
        "train": np.sort(order[v + t :]).astype(np.int64),
        "validation": np.sort(order[:v]).astype(np.int64),
        "test": np.sort(order[v : v + t]).astype(np.int64),
    }


def chat_examples(parts: list[Path], base_model: Path, settings: TaskDataSettings, seed: int, out: Path) -> dict:
    """Write the chat examples of the conversations in deduplicated_text part files ``parts`` (their
    ``messages`` column: largetrain_core.readers format chat) into ``out``: split by record
    (:func:`split_records`), rendered with the base model's tokenizer and chat template (ChatML when it
    has none) and packed, or padded and grouped by length, per ``settings`` (:func:`write_chat`); ``records.json`` holds each split's doc_ids and messages.
    Returns ``{"manifest", "left_out", "split"}``. Raises ValueError when no part has a ``messages``
    column (raw_corpus read without format chat) or no conversation is left."""
    import polars as pl
    from transformers import AutoTokenizer

    from largetrain_core.readers import MESSAGES

    frames = [pl.read_parquet(p) for p in parts]
    if not frames or any(MESSAGES not in f.columns for f in frames):
        raise ValueError(
            "task chat needs conversations: set raw_corpus format: chat and re-materialize the domain corpus"
        )
    df = pl.concat([f.select("doc_id", "source", MESSAGES) for f in frames])
    left_out = [
        {"doc_id": d, "source": s, "reason": "no messages"}
        for d, s, m in zip(df["doc_id"].to_list(), df["source"].to_list(), df[MESSAGES].to_list())
        if m is None
    ]
    df = df.filter(pl.col(MESSAGES).is_not_null())
    if df.height == 0:
        raise ValueError("no conversation to train on")
    conversations = [json.loads(m) for m in df[MESSAGES].to_list()]
    rows = split_records(len(conversations), settings.validation_fraction, settings.test_fraction, seed)
    tokenizer = AutoTokenizer.from_pretrained(str(base_model), local_files_only=True)
    manifest = write_chat(
        out,
        {s: [conversations[i] for i in r] for s, r in rows.items()},
        tokenizer,
        settings.seq_len,
        packing=settings.packing,
        group_size=settings.group_by_length,
    )
    ids = df["doc_id"].to_list()
    records = {s: {"doc_id": [ids[i] for i in r], "messages": [conversations[i] for i in r]} for s, r in rows.items()}
    (out / "records.json").write_text(json.dumps(records, ensure_ascii=False))
    return {"manifest": manifest, "left_out": left_out, "split": {"counts": {s: len(r) for s, r in rows.items()}}}
