"""What a training learns (``TrainConfig.task``): ``causal_lm``, the next-token loss over the token
shards (pretraining and domain adaptation: largetrain_core.training.loss); ``classification``, a label
per record; ``chat``, the assistant turns of conversations. This module holds the examples of the two
fine-tuning tasks on disk, their loss, their model and their export; the trainer runs them as it runs
``causal_lm`` (the same sampler, DeepSpeed engine, checkpoints and resume).

Task examples (a directory, written once by :func:`write_classification` or :func:`write_chat`):

* ``manifest.json``: ``task``, ``seq_len``, ``pad_id``, ``eos_id``, ``vocab_size`` (the tokenizer's length), per split
  ``{"examples", "rows", "trained_tokens", "truncated"}``; classification also ``label_names`` (in label
  order) and the train split's ``label_counts``; chat ``added_token_ids`` (the chat template's special
  tokens added to the tokenizer), ``chat_template``, ``packing`` and ``group_size`` (:func:`write_chat`),
  and per split ``padding_fraction`` and, grouped by length, ``shard_sizes`` (the groups' rows);
* ``<split>.arrow`` (split ``train``, ``validation``, ``test``): one Arrow IPC file, memory-mapped when
  read, with fixed-size-list int32 columns of ``seq_len``: classification ``input_ids`` (right-padded
  with ``pad_id``) and int32 ``length`` and ``label``; chat ``input_ids``, ``labels`` (-100 where not
  trained) and ``position_ids`` (restarting at 0 for each packed example: largetrain_core.chat.pack, or
  one conversation per row, right-padded: largetrain_core.chat.pad_rows);
* the tokenizer (``tokenizer.json``, ``tokenizer_config.json``, with the chat template for chat).

Models (:func:`build_model`): classification is ``AutoModelForSequenceClassification`` on the base with
LoRA and a trained ``score`` head (largetrain_core.classification.build_classifier, PEFT
``task_type=SEQ_CLS``); chat is the base causal LM with LoRA and, when the chat template added special
tokens, the embedding resized and those rows trained (PEFT ``trainable_token_indices``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np


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
        self.split = split
        self.padded = self.task == "chat" and self.manifest.get("packing", True) is False
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
        """Rows per shard, in order: chat examples grouped by length (:func:`write_chat`) give one shard per
        group, so that the sampler's shuffle by windows of shards (``schedule.shuffle_window_shards`` 1)
        draws each micro-batch from one group; otherwise one shard, the whole split."""
        sizes = self.manifest["splits"].get(self.split, {}).get("shard_sizes")
        return list(sizes) if sizes else [len(self)]

    def follow(self, sampler, micro_batch: int, position) -> None:
        """Nothing to prefetch: the split is one local memory-mapped file."""

    def take(self, indices) -> dict[str, np.ndarray]:
        """The rows ``indices``; for chat examples written unpacked (one conversation a row, :func:`write_chat`
        ``packing=False``) cut to the longest conversation of the batch: the columns past it are padding in
        every row (:func:`row_lengths`), so the loss and each row's attention are those of the full rows."""
        idx = np.asarray(indices, dtype=np.int64)
        batch = {k: v[idx].astype(np.int64) for k, v in self.columns.items()}
        if self.padded and len(idx):
            longest = int(row_lengths(batch["position_ids"]).max())
            batch = {k: v[:, :longest] for k, v in batch.items()}
        return batch


def row_lengths(position_ids: np.ndarray) -> np.ndarray:
    """Tokens of the conversation in each unpacked chat row (int64, shape (rows,)): the first position
    after 0 where ``position_ids`` restart at 0 (the padding's, largetrain_core.chat.pad_rows), else the
    row's length."""
    restart = position_ids[:, 1:] == 0
    return np.where(restart.any(axis=1), restart.argmax(axis=1) + 1, position_ids.shape[1]).astype(np.int64)


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
    from largetrain_core.tokenizer import save_tokenizer

    save_tokenizer(tokenizer, out)
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


def _chat_rows(examples: list, seq_len: int, pad_id: int, packing: bool, group_size: int):
    """:func:`write_chat`'s rows of one split's rendered ``examples``: packed (largetrain_core.chat.pack), or
    one a row, padded, in length groups of ``group_size`` when it is > 0. Returns (the rows, the groups: lists
    of example indices, [] unless grouped)."""
    from largetrain_core import chat

    if packing:
        return chat.pack(examples, seq_len, pad_id), []
    lengths = [min(len(ids), seq_len) for ids, _ in examples]
    groups = chat.group_by_length(lengths, group_size) if group_size else []
    order = [i for g in groups for i in g] if groups else None
    return chat.pad_rows(examples, seq_len, pad_id, order), groups


def write_chat(
    out: Path,
    splits: dict[str, Sequence[Sequence[dict]]],
    tokenizer,
    seq_len: int,
    packing: bool = True,
    group_size: int = 0,
) -> dict:
    """Write chat examples into the directory ``out`` (module doc): each split's conversations (lists of
    messages, largetrain_core.chat) rendered under the tokenizer's chat template (ChatML added when it has
    none: largetrain_core.chat.add_chat_template), with the loss on trained assistant tokens only, and
    packed into rows of ``seq_len`` (largetrain_core.chat.pack). ``packing`` False: one conversation a row,
    right-padded (largetrain_core.chat.pad_rows; :meth:`TaskExamples.take` cuts a batch to its longest);
    then ``group_size`` > 0 orders the rows by length, longest first (largetrain_core.chat.group_by_length),
    in groups of ``group_size`` rows, each a shard (:attr:`TaskExamples.shard_sizes`), so that micro-batches
    hold conversations of similar lengths. Returns the manifest. Raises ValueError for group_size < 0 or
    set with packing, and as largetrain_core.chat.render (a message that spells a special token, a template
    it cannot read)."""
    from largetrain_core import chat

    if group_size < 0 or (group_size and packing):
        raise ValueError(f"group_size must be >= 0, and 0 with packing; got {group_size} (packing {packing})")
    out.mkdir(parents=True, exist_ok=True)
    added = chat.add_chat_template(tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    info = {}
    for split, conversations in splits.items():
        examples = [chat.render(tokenizer, messages) for messages in conversations]
        packed, groups = _chat_rows(examples, seq_len, pad_id, packing, group_size)
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
            **({"shard_sizes": [len(g) for g in groups]} if groups else {}),
        }
    manifest = {
        "task": "chat",
        "seq_len": seq_len,
        "pad_id": int(pad_id),
        "eos_id": tokenizer.eos_token_id,
        "vocab_size": len(tokenizer),
        "added_token_ids": added,
        "chat_template": tokenizer.chat_template,
        "packing": packing,
        "group_size": group_size,
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

    from largetrain_core.model import enable_activation_checkpointing, load_model
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
            enable_activation_checkpointing(model.get_base_model())
            model.enable_input_require_grads()
        return model, targets
    model = load_model(Path(cfg.model.base_model))
    added = data.manifest.get("added_token_ids") or []
    if data.manifest["vocab_size"] > model.config.vocab_size:
        torch.manual_seed(cfg.seed)
        model.resize_token_embeddings(data.manifest["vocab_size"], mean_resizing=False)
    if ckpt:
        enable_activation_checkpointing(model)
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

    from largetrain_core.tokenizer import save_tokenizer
    from largetrain_core.training.export import save_adapter

    save_adapter(module, cfg.lora.adapter_name, state, tmp)
    save_tokenizer(AutoTokenizer.from_pretrained(str(data.directory), local_files_only=True), tmp)
    if cfg.task == "classification":
        config = copy.deepcopy(module.get_base_model().config)
        config.architectures = [type(module.get_base_model()).__name__]
        config.use_cache = True
        config.save_pretrained(str(tmp))


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

    from largetrain_core.tokenizer import save_tokenizer
    from largetrain_core.training.export import MERGE_TOLERANCE, merge_into

    model, tok = load_chat_adapter(base_model, adapter)
    tmp = final.with_name(f".tmp-{final.name}")
    diff = merge_into(model, probe_ids, tmp)
    save_tokenizer(tok, tmp)
    if not diff <= MERGE_TOLERANCE:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ValueError(
            f"merged export of {adapter} on {base_model} refused: its logits differ from base + adapter by {diff:.3g} "
            f"(max relative), more than {MERGE_TOLERANCE:g}; load the adapter with PEFT instead"
        )
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)


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
