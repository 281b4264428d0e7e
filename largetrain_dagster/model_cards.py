"""The model cards of the training assets: the lineage of a base model or LoRA adapter, gathered
from the handles of the steps that made its shards, written by largetrain_core.model_card into the
exported directory (README.md and lineage.json).

A handle is the latest materialization of its asset, which need not be the one a model was trained
on: each is checked against the shards' manifest (the text they were made of, deduplicated_text or
filtered_text, by the manifest's ``source_data_version``, the tokenizer by its sha256) and left out of the card ("unknown") when it
does not match, with a warning in the run log.
"""

from pathlib import Path

from dagster import AssetExecutionContext, AssetKey

from largetrain_core.model_card import CARD, LINEAGE, TRAINING_KEYS, read_lineage, software_versions, write_model_card
from largetrain_core import fs
from largetrain_core.storage import read_json
from largetrain_core.training.config import TrainConfig
from largetrain_dagster.partitions import shards_text
from largetrain_dagster.resources import Storage, read_handle

ROLE = {"base_model": "pretrain", "lora_adapter": "domain"}


def corpus_lineage(context: AssetExecutionContext, root: Path, role: str, shards: dict) -> tuple[dict, dict]:
    """(the corpus entry of the card, the shards' manifest) for ``role``'s token_shards handle ``shards``."""
    manifest = read_json(fs.join(shards["path"], "manifest.json"), "token shard manifest (manifest.json)")
    splits = manifest.get("splits", {})
    entry = {
        "role": role,
        "source": None,
        "provenance": None,
        "content_digests": None,
        "documents": None,
        "data_versions": {},
        "shards": {
            "total_tokens": manifest.get("total_tokens"),
            "seq_len": manifest.get("seq_len"),
            "dtype": manifest.get("dtype"),
            **{f"{s}_sequences": splits.get(s, {}).get("sequences") for s in ("train", "validation")},
        },
    }
    text = shards_text(role)  # deduplicated_text, or filtered_text (which records the deduplicated_text it filtered)
    handle = read_handle(root, AssetKey([role, text]))
    if handle and handle["data_version"] == manifest.get("source_data_version"):
        corpus = handle["stats"].get("corpus") or {}
        entry.update(
            source=corpus.get("source"),
            provenance=corpus.get("provenance"),
            content_digests=corpus.get("content_digests"),
            documents=handle["stats"].get("documents"),
        )
        entry["data_versions"].update(corpus.get("data_versions") or {})
        if handle["stats"].get("deduplicated_text"):
            entry["data_versions"]["deduplicated_text"] = handle["stats"]["deduplicated_text"]
    else:
        context.log.warning(
            f"model card: {role}/{text} was re-materialized after these shards were made "
            f"(or never recorded its corpus): the card's {role} corpus section says unknown"
        )
    entry["data_versions"][text] = manifest.get("source_data_version")
    entry["data_versions"]["token_shards"] = shards["data_version"]
    return entry, manifest


def tokenizer_lineage(root: Path, manifest: dict) -> dict:
    """The tokenizer the shards were made with (from their manifest), with the tokenizer asset's data
    version when its latest handle is that tokenizer (same sha256)."""
    tok = {
        "vocab_size": manifest.get("vocab_size"),
        "eos_id": manifest.get("eos_id"),
        "sha256": manifest.get("tokenizer_sha256"),
        "data_version": None,
        "pretrained_model": None,
    }
    handle = read_handle(root, AssetKey("tokenizer"))
    if handle and handle["stats"].get("sha256") == tok["sha256"]:
        tok.update(data_version=handle["data_version"], pretrained_model=handle["stats"].get("pretrained_model"))
    return tok


def write_card(
    context: AssetExecutionContext,
    storage: Storage,
    kind: str,
    model_dir: Path,
    version: str,
    shards: dict,
    train_dir: Path | None = None,
    base_model: Path | None = None,
    imported: dict | None = None,
    task: dict | None = None,
) -> list[Path]:
    """Write README.md + lineage.json into ``model_dir`` (kind ``base_model`` or ``lora_adapter``) unless a
    card made by largetrain is already there (a reused artifact keeps the card of its first making).
    ``train_dir``: the training's output directory (train_config.json, summary.json); ``base_model``: the
    adapter's base model directory (its lineage.json); ``imported``: ``{from, content_digest}`` of an
    imported base model; ``task``: what a fine-tuned adapter does (largetrain_core.model_card's Task section).
    Returns the files written (none when the card was there)."""
    model_dir = Path(model_dir)
    if read_lineage(model_dir) is not None and (model_dir / CARD).exists():
        return []
    root = storage.location()
    corpus, manifest = corpus_lineage(context, root, ROLE[kind], shards)
    training = None
    if train_dir is not None:
        cfg = TrainConfig.from_dict(
            read_json(Path(train_dir) / "train_config.json", "training config (train_config.json)")
        ).settings()
        summary = read_json(Path(train_dir) / "summary.json", "training summary (summary.json)")
        training = {
            "config": {k: cfg[k] for k in TRAINING_KEYS if k in cfg},
            "results": {
                k: v
                for k, v in summary.items()
                if not isinstance(v, (dict, list)) and k not in ("output", "loss_curve", "resumed_from")
            },
        }
        training["config"]["seq_len"] = manifest.get("seq_len")
        peft_cfg = model_dir / "adapter_config.json"
        if peft_cfg.exists():
            a = read_json(peft_cfg, "PEFT adapter_config.json")
            training["adapter"] = {
                "r": a.get("r"),
                "lora_alpha": a.get("lora_alpha"),
                "target_modules": sorted(a.get("target_modules") or []),
            }
    lineage = {
        "kind": kind,
        "data_version": version,
        "corpora": [corpus],
        "tokenizer": tokenizer_lineage(root, manifest),
        "training": training,
        "software": software_versions(),
    }
    if imported:
        lineage["imported"] = imported
    if task:
        lineage["task"] = task
    if kind == "lora_adapter":
        lineage["base"] = read_lineage(base_model) if base_model else None
    card = write_model_card(model_dir, lineage)
    context.log.info(f"model card: {card}")
    return [Path(card), model_dir / LINEAGE]
