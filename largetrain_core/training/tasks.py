"""What a training learns (``TrainConfig.task``): ``causal_lm``, the next-token loss over the token
shards (pretraining and domain adaptation: largetrain_core.training.loss); ``classification``, a label
per record; ``chat``, the assistant turns of conversations. This module holds the examples of the two
fine-tuning tasks on disk, their loss, their model and their export; the trainer runs them as it runs
``causal_lm`` (the same sampler, DeepSpeed engine, checkpoints and resume).

Task examples (a directory, written once by :func:`write_classification` or :func:`write_chat`):

* ``manifest.json``: ``task``, ``seq_len``, ``pad_id``, ``eos_id``, ``vocab_size`` (the tokenizer's length), per split
  ``{"examples", "rows", "trained_tokens", "truncated"}``; classification also ``label_names`` (in label
  order) and the train split's ``label_counts``; chat ``added_token_ids`` (the chat template's special
  tokens added to the tokenizer) and ``chat_template``;
* ``<split>.arrow`` (split ``train``, ``validation``, ``test``): one Arrow IPC file, memory-mapped when
  read, with fixed-size-list int32 columns of ``seq_len``: classification ``input_ids`` (right-padded
  with ``pad_id``) and int32 ``length`` and ``label``; chat ``input_ids``, ``labels`` (-100 where not
  trained) and ``position_ids`` (restarting at 0 for each packed example: largetrain_core.chat.pack);
* the tokenizer (``tokenizer.json``, ``tokenizer_config.json``, with the chat template for chat).

Models (:func:`build_model`): classification is ``AutoModelForSequenceClassification`` on the base with
LoRA and a trained ``score`` head (largetrain_core.classification.build_classifier, PEFT
``task_type=SEQ_CLS``); chat is the base causal LM with LoRA and, when the chat template added special
tokens, the embedding resized and those rows trained (PEFT ``trainable_token_indices``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from largetrain_core.settings import described

TASKS = ("causal_lm", "classification", "chat")
FINE_TUNING = ("classification", "chat")
SPLITS = ("train", "validation", "test")
MANIFEST = "manifest.json"
COLUMNS = {"classification": ("input_ids", "length", "label"), "chat": ("input_ids", "labels", "position_ids")}
IGNORE_INDEX = -100


class TaskExamples:
    """One split of a task-examples directory (module doc), memory-mapped: ``len()`` examples (rows),
    ``take(indices)`` -> ``{column: array}`` (int64 arrays of shape (len(indices), seq_len), or
    (len(indices),) for ``length`` and ``label``). The trainer's interface of token shards:
    ``seq_len``, ``shard_sizes`` (one shard), ``manifest``, ``follow`` (nothing to prefetch). Raises
    ValueError naming the directory when its manifest is missing or names another task, or a split file
    is missing."""

    def __init__(self, directory: str | Path, split: str):
        from largetrain_core.storage import local_copy

        self.directory = local_copy(directory)
        manifest = self.directory / MANIFEST
        if not manifest.is_file():
            raise ValueError(
                f"{directory}: no {MANIFEST}: not a task-examples directory (largetrain_core.training.tasks)"
            )
        self.manifest = json.loads(manifest.read_text())
        self.task, self.seq_len = self.manifest["task"], int(self.manifest["seq_len"])
        if self.task not in FINE_TUNING:
            raise ValueError(f"{directory}: task {self.task!r} in {MANIFEST}; task examples are {FINE_TUNING}")
        path = self.directory / f"{split}.arrow"
        if not path.is_file():
            raise ValueError(f"{directory}: no {split}.arrow: the {split} split was not written")
        import pyarrow as pa

        table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
        self.columns = {}
        for name in COLUMNS[self.task]:
            col = table.column(name).combine_chunks()
            if pa.types.is_fixed_size_list(col.type):
                self.columns[name] = col.flatten().to_numpy().reshape(len(col), self.seq_len)
            else:
                self.columns[name] = col.to_numpy()

    def __len__(self) -> int:
        return len(self.columns["input_ids"])

    @property
    def shard_sizes(self) -> list[int]:
        return [len(self)]

    def follow(self, sampler, micro_batch: int, position) -> None:
        """Nothing to prefetch: the split is one local memory-mapped file."""

    def take(self, indices) -> dict[str, np.ndarray]:
        idx = np.asarray(indices, dtype=np.int64)
        return {k: v[idx].astype(np.int64) for k, v in self.columns.items()}


def open_split(cfg, split: str):
    """The ``split`` of ``cfg.train_shards`` as the training reads it: token shards
    (largetrain_core.shards.TokenShards) for task causal_lm, else :class:`TaskExamples`."""
    if cfg.task == "causal_lm":
        from largetrain_core.shards import TokenShards

        return TokenShards(cfg.train_shards, split)
    return TaskExamples(cfg.train_shards, split)


def _write_split(path: Path, columns: dict[str, np.ndarray], seq_len: int) -> None:
    """``columns`` as one Arrow IPC file at ``path`` (2-D arrays as fixed-size lists of ``seq_len`` int32)."""
    import pyarrow as pa

    arrays = {}
    for name, a in columns.items():
        a = np.ascontiguousarray(a, dtype=np.int32)
        arrays[name] = (
            pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1)), seq_len) if a.ndim == 2 else pa.array(a)
        )
    table = pa.table(arrays)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def _write_manifest(out: Path, manifest: dict, tokenizer) -> dict:
    tokenizer.save_pretrained(str(out))
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def write_classification(
    out: Path,
    splits: dict[str, tuple[Sequence[str], np.ndarray]],
    label_names: list[str],
    tokenizer,
    seq_len: int,
) -> dict:
    """Write classification examples into the directory ``out`` (module doc): for each split name ->
    (texts, label indices int (n,)), the texts encoded with ``tokenizer`` (a transformers tokenizer with
    a pad token: largetrain_core.classification.load_classifier_tokenizer), truncated to their first
    ``seq_len`` tokens and right-padded. Returns the manifest. Raises ValueError for a label index
    outside ``label_names`` or seq_len < 1."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    out.mkdir(parents=True, exist_ok=True)
    info = {}
    for split, (texts, labels) in splits.items():
        labels = np.asarray(labels, dtype=np.int64)
        if labels.size and (labels.min() < 0 or labels.max() >= len(label_names)):
            raise ValueError(f"{split}: label indices must be in 0..{len(label_names) - 1}")
        full = tokenizer(list(texts), add_special_tokens=True)["input_ids"] if len(texts) else []
        ids = np.full((len(full), seq_len), tokenizer.pad_token_id, dtype=np.int32)
        length = np.zeros(len(full), dtype=np.int32)
        for i, enc in enumerate(full):
            n = min(len(enc), seq_len)
            ids[i, :n], length[i] = enc[:n], n
        _write_split(out / f"{split}.arrow", {"input_ids": ids, "length": length, "label": labels}, seq_len)
        info[split] = {
            "examples": len(full),
            "rows": len(full),
            "trained_tokens": int(length.sum()),
            "truncated": int(sum(len(e) > seq_len for e in full)),
            "label_counts": {name: int((labels == i).sum()) for i, name in enumerate(label_names)},
        }
    manifest = {
        "task": "classification",
        "seq_len": seq_len,
        "pad_id": int(tokenizer.pad_token_id),
        "eos_id": tokenizer.eos_token_id,
        "vocab_size": len(tokenizer),
        "label_names": list(label_names),
        "splits": info,
    }
    return _write_manifest(out, manifest, tokenizer)


def write_chat(out: Path, splits: dict[str, Sequence[Sequence[dict]]], tokenizer, seq_len: int) -> dict:
    """Write chat examples into the directory ``out`` (module doc): each split's conversations (lists of
    messages, largetrain_core.chat) rendered under the tokenizer's chat template (ChatML added when it has
    none: largetrain_core.chat.add_chat_template), with the loss on trained assistant tokens only, and
    packed into rows of ``seq_len`` (largetrain_core.chat.pack). Returns the manifest. Raises ValueError
    as largetrain_core.chat.render (a message that spells a special token, a template it cannot read)."""
    from largetrain_core import chat

    out.mkdir(parents=True, exist_ok=True)
    added = chat.add_chat_template(tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    info = {}
    for split, conversations in splits.items():
        examples = [chat.render(tokenizer, messages) for messages in conversations]
        packed = chat.pack(examples, seq_len, pad_id)
        _write_split(
            out / f"{split}.arrow",
            {"input_ids": packed.input_ids, "labels": packed.labels, "position_ids": packed.position_ids},
            seq_len,
        )
        info[split] = {
            "examples": len(examples),
            "rows": len(packed.input_ids),
            "trained_tokens": int((packed.labels != IGNORE_INDEX).sum()),
            "truncated": packed.truncated,
            "padding_fraction": round(chat.padding_fraction(packed), 4),
        }
    manifest = {
        "task": "chat",
        "seq_len": seq_len,
        "pad_id": int(pad_id),
        "eos_id": tokenizer.eos_token_id,
        "vocab_size": len(tokenizer),
        "added_token_ids": added,
        "chat_template": tokenizer.chat_template,
        "splits": info,
    }
    return _write_manifest(out, manifest, tokenizer)


def task_loss(task: str, model, batch: dict, reduction: str = "mean", weights=None):
    """The loss (nats, a 0-d fp32 tensor) of ``model`` (or a DeepSpeed engine around it) on ``batch``
    (int64 tensors from :meth:`TaskExamples.take`):

    * classification: cross-entropy of the logits (the last non-pad token's, transformers'
      sequence classification) against ``label``, over the records;
    * chat: next-token cross-entropy on the tokens whose label is not -100 (the trained assistant
      tokens), position t predicted from positions < t (logits ``[:, :-1]`` against labels ``[:, 1:]``),
      attention kept within each packed example by its ``position_ids`` (largetrain_core.chat).

    ``reduction``: ``mean`` over the counted targets (0 when there is none), or ``sum``. ``weights``:
    classification's class weights (float32 tensor of shape (num_labels,); the weighted mean)."""
    import torch
    import torch.nn.functional as F

    if task == "classification":
        ids = batch["input_ids"]
        mask = (torch.arange(ids.shape[1], device=ids.device)[None, :] < batch["length"][:, None]).long()
        logits = model(input_ids=ids, attention_mask=mask).logits
        return F.cross_entropy(logits.float(), batch["label"], weight=weights, reduction=reduction)
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    targets = batch["labels"][:, 1:]
    total = F.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    if reduction == "sum":
        return total
    return total / (targets != IGNORE_INDEX).sum().clamp(min=1)


def counted(task: str, batch: dict) -> int:
    """How many targets :func:`task_loss` counts in ``batch``: records (classification) or trained tokens (chat)."""
    if task == "classification":
        return int(batch["label"].numel())
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def build_model(cfg, data: TaskExamples):
    """(the PEFT model to train for ``cfg.task`` on ``data``, the LoRA target modules) on
    ``cfg.model.base_model``, fp32, activation checkpointing per ``cfg.parallelism`` (module doc)."""
    import torch

    from largetrain_core.model import load_model
    from largetrain_core.training.lora import add_lora

    ckpt = cfg.parallelism.activation_checkpointing
    if cfg.task == "classification":
        from largetrain_core.classification import build_classifier

        lo = cfg.lora
        model, targets = build_classifier(
            cfg.model.base_model,
            data.manifest["label_names"],
            lo.r,
            lo.lora_alpha,
            lo.lora_dropout,
            lo.target_modules,
            seed=cfg.seed,
        )
        if ckpt:
            model.get_base_model().activation_checkpointing_enable(
                activation_checkpointing_kwargs={"use_reentrant": False}
            )
            model.enable_input_require_grads()
        return model, targets
    model = load_model(Path(cfg.model.base_model))
    added = data.manifest.get("added_token_ids") or []
    if data.manifest["vocab_size"] > model.config.vocab_size:
        torch.manual_seed(cfg.seed)
        model.resize_token_embeddings(data.manifest["vocab_size"], mean_resizing=False)
    if ckpt:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return add_lora(model, cfg.lora, ckpt, trainable_token_indices=added)


def export(module, cfg, data: TaskExamples, state: dict | None, tmp: Path) -> None:
    """Write the trained ``module`` (rank 0) into ``tmp``: the PEFT adapter (LoRA weights, and the
    ``score`` head or the trained token rows), the tokenizer of the examples (with the chat template for
    chat), and for classification the classifier's config.json (``num_labels``, ``id2label``,
    ``label2id``, ``pad_token_id``), so that the clients of the module doc of
    largetrain_core.classification, or for chat ``AutoTokenizer`` + ``resize_token_embeddings`` +
    ``PeftModel.from_pretrained`` (docs/guides/fine-tuning.md), load it."""
    import copy

    from transformers import AutoTokenizer

    from largetrain_core.training.export import save_adapter

    save_adapter(module, cfg.lora.adapter_name, state, tmp)
    AutoTokenizer.from_pretrained(str(data.directory), local_files_only=True).save_pretrained(str(tmp))
    if cfg.task == "classification":
        config = copy.deepcopy(module.get_base_model().config)
        config.architectures = [type(module.get_base_model()).__name__]
        config.use_cache = True
        config.save_pretrained(str(tmp))


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
        if self.labels is not None and (len(self.labels) < 2 or len(set(self.labels)) != len(self.labels)):
            p.append(f"task_data.labels must be at least 2 distinct labels or null, not {self.labels}")
        return p


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
    parts: list[Path], base_model: Path, settings: TaskDataSettings, seed: int, out: Path
) -> dict:
    """Write the classification examples of the labelled documents of ``parts`` (:func:`labelled_documents`)
    into ``out``: split by record, stratified by label (largetrain_core.classification.stratified_split with
    ``settings``' fractions and ``seed``), the train split's documents repeated by their ``copies`` (the
    balancing), encoded with the base model's tokenizer (:func:`write_classification`). Also writes
    ``records.json`` (per split the doc_ids, texts and labels, each record once: for the evaluation and the
    baselines, whose majority class is the natural train split's).
    Returns ``{"manifest", "left_out", "split"}`` (the split's counts, the classes too small, the held-out
    records whose text is also in train)."""
    from largetrain_core.classification import load_classifier_tokenizer, stratified_split

    docs, left_out = labelled_documents(parts, settings.labels)
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


def evaluate_classifier(base_model: Path, adapter: Path, examples: Path, out: Path, seed: int = 0) -> dict:
    """Evaluate a trained classifier (``adapter``, exported by :func:`export`, on ``base_model``) on the
    test split of ``examples`` (its ``records.json``), beside the baselines trained on the same train
    split: the majority class and TF-IDF + logistic regression (largetrain_core.classification). Writes
    ``out/evaluation.json`` (``{"lora", "majority", "tfidf_logreg"}``: each
    largetrain_core.classification.evaluate_predictions; ``validation_loss_per_class``: nats per class on
    the validation split) and ``out/confusion_matrix.png``; returns the dict."""
    from largetrain_core.classification import (
        confusion_matrix_png,
        evaluate_predictions,
        load_classifier,
        majority_baseline,
        per_class_loss,
        predict_logits,
        tfidf_logreg_baseline,
    )

    manifest = json.loads((examples / MANIFEST).read_text())
    names, seq_len = manifest["label_names"], manifest["seq_len"]
    records = json.loads((examples / "records.json").read_text())
    train, test, val = records["train"], records["test"], records["validation"]
    if not test["label"]:
        raise ValueError(f"{examples}: the test split holds no record: set task_data.test_fraction > 0")
    model, tok = load_classifier(base_model, adapter)
    y = np.array(test["label"], dtype=np.int64)
    result = {
        "lora": evaluate_predictions(y, predict_logits(model, tok, test["text"], seq_len).argmax(1), names),
        "majority": evaluate_predictions(y, majority_baseline(np.array(train["label"]), len(y)), names),
        "tfidf_logreg": evaluate_predictions(
            y, tfidf_logreg_baseline(train["text"], np.array(train["label"]), test["text"], seed=seed), names
        ),
        "label_names": names,
    }
    if val["label"]:
        loss = per_class_loss(predict_logits(model, tok, val["text"], seq_len), np.array(val["label"]))
        result["validation_loss_per_class"] = {
            n: (None if np.isnan(v) else round(float(v), 4)) for n, v in zip(names, loss)
        }
    confusion_matrix_png(
        result["lora"]["confusion"], names, out / "confusion_matrix.png", "Confusion matrix (test split)"
    )
    (out / "evaluation.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


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
    has none) and packed (:func:`write_chat`); ``records.json`` holds each split's doc_ids and messages.
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
    manifest = write_chat(out, {s: [conversations[i] for i in r] for s, r in rows.items()}, tokenizer, settings.seq_len)
    ids = df["doc_id"].to_list()
    records = {s: {"doc_id": [ids[i] for i in r], "messages": [conversations[i] for i in r]} for s, r in rows.items()}
    (out / "records.json").write_text(json.dumps(records, ensure_ascii=False))
    return {"manifest": manifest, "left_out": left_out, "split": {"counts": {s: len(r) for s, r in rows.items()}}}


def load_chat_adapter(base_model: Path, adapter: Path):
    """(model, tokenizer) of a chat adapter exported by :func:`export` on ``base_model``: the tokenizer
    (with its chat template) from ``adapter``, the base with its embedding resized to it
    (``resize_token_embeddings(len(tokenizer), mean_resizing=False)``: the template's rows come from the
    adapter), then ``PeftModel.from_pretrained``; fp32, eval mode, local files only."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(adapter), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        str(base_model), dtype=torch.float32, use_safetensors=True, local_files_only=True
    )
    if len(tok) > model.config.vocab_size:
        model.resize_token_embeddings(len(tok), mean_resizing=False)
    return PeftModel.from_pretrained(model, str(adapter)).eval(), tok


def evaluate_chat(
    base_model: Path, adapter: Path, examples: Path, out: Path, generations: int = 5, max_new_tokens: int = 48
) -> dict:
    """Evaluate a chat adapter on the held-out test conversations of ``examples``: the loss (nats) and
    perplexity on their trained assistant tokens only (:func:`task_loss` over the test rows, every
    trained token counted once), and greedy generations through the chat template for the first
    ``generations`` test conversations' last prompt, beside the reference answer. Writes
    ``out/evaluation.json`` and returns it: ``{"assistant_loss", "assistant_perplexity",
    "assistant_tokens", "generations": [{"doc_id", "prompt", "reference", "generated"}]}``."""
    import math

    import torch

    model, tok = load_chat_adapter(base_model, adapter)
    test = TaskExamples(examples, "test")
    nats, n = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(test), 8):
            batch = {k: torch.from_numpy(v) for k, v in test.take(np.arange(start, min(start + 8, len(test)))).items()}
            nats += float(task_loss("chat", model, batch, reduction="sum"))
            n += counted("chat", batch)
    records = json.loads((examples / "records.json").read_text())["test"]
    shown = []
    for doc_id, messages in list(zip(records["doc_id"], records["messages"]))[:generations]:
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        prompt = tok.apply_chat_template(
            messages[:last], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.no_grad():
            ids = model.generate(
                **prompt, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.eos_token_id
            )
        generated = tok.decode(ids[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
        shown.append(
            {
                "doc_id": doc_id,
                "prompt": messages[last - 1]["content"],
                "reference": messages[last]["content"],
                "generated": generated,
            }
        )
    loss = nats / n if n else float("nan")
    result = {
        "assistant_loss": loss,
        "assistant_perplexity": math.exp(loss) if n and loss < 700 else None,
        "assistant_tokens": n,
        "generations": shown,
    }
    (out / "evaluation.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return result


def probe(examples: str | Path, n: int = 2):
    """The first ``n`` validation rows' input_ids of chat ``examples`` (train rows when there is no
    validation row), int64 of shape (rows, seq_len): the probe batch of :func:`export_chat_merged`."""
    import torch

    directory = Path(examples)
    data = TaskExamples(directory, "validation") if (directory / "validation.arrow").is_file() else None
    if data is None or not len(data):
        data = TaskExamples(directory, "train")
    return torch.from_numpy(data.take(np.arange(min(n, len(data))))["input_ids"])


def export_chat_merged(base_model: Path, adapter: Path, final: Path, probe_ids) -> None:
    """``final``: a chat adapter folded into its base (the embedding resized, the template's rows and the
    LoRA updates merged: PEFT ``merge_and_unload``), a Hugging Face directory with the adapter's tokenizer
    and chat template, so that ``AutoModelForCausalLM`` and ``pipeline("text-generation")`` load it
    without PEFT. Verified as largetrain_core.training.export.export_merged verifies: loaded again it
    must give base + adapter's logits on ``probe_ids`` within MERGE_TOLERANCE relative, else nothing is
    written and ValueError says by how much they differ."""
    import shutil

    from largetrain_core.training.export import MERGE_TOLERANCE, merge_into

    model, tok = load_chat_adapter(base_model, adapter)
    tmp = final.with_name(f".tmp-{final.name}")
    diff = merge_into(model, probe_ids, tmp)
    tok.save_pretrained(str(tmp))
    if not diff <= MERGE_TOLERANCE:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ValueError(
            f"merged export of {adapter} on {base_model} refused: its logits differ from base + adapter by {diff:.3g} "
            f"(max relative), more than {MERGE_TOLERANCE:g}; load the adapter with PEFT instead"
        )
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
