"""The model card of a trained or imported model (a base model or a LoRA adapter): its lineage, from
the handles of the stage's inputs (the token shards, the text they were made of, the tokenizer),
written by largetrain_core.model_card into the exported directory (README.md and lineage.json).

A handle is ``{"path", "data_version", "stats"}`` (largetrain_core.stages.base.Artifact.handle). The
text and tokenizer handles are checked against the shards' manifest (the text by the manifest's
``source_data_version``, the tokenizer by its sha256): one that is not what the shards were made of
(re-materialized since) is left out of the card ("unknown"), with a warning in the run log.
"""

from __future__ import annotations

from pathlib import Path

from largetrain_core import fs
from largetrain_core.model_card import CARD, LINEAGE, TRAINING_KEYS, read_lineage, software_versions, write_model_card
from largetrain_core.storage import read_json
from largetrain_core.training.config import TrainConfig

ROLE = {"base_model": "pretrain", "lora_adapter": "domain"}


def corpus_lineage(log, role: str, shards: dict, text: dict | None, text_asset: str) -> tuple[dict, dict]:
    """(the corpus entry of the card, the shards' manifest) for ``role``'s token_shards handle ``shards``,
    made of the documents of ``text`` (the handle of ``role``/``text_asset``: deduplicated_text, or
    filtered_text, which records the deduplicated_text it filtered)."""
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
    if text and text["data_version"] == manifest.get("source_data_version"):
        corpus = text["stats"].get("corpus") or {}
        entry.update(
            source=corpus.get("source"),
            provenance=corpus.get("provenance"),
            content_digests=corpus.get("content_digests"),
            documents=text["stats"].get("documents"),
        )
        entry["data_versions"].update(corpus.get("data_versions") or {})
        if text["stats"].get("deduplicated_text"):
            entry["data_versions"]["deduplicated_text"] = text["stats"]["deduplicated_text"]
    else:
        log.warning(
            f"model card: {role}/{text_asset} was re-materialized after these shards were made "
            f"(or never recorded its corpus): the card's {role} corpus section says unknown"
        )
    entry["data_versions"][text_asset] = manifest.get("source_data_version")
    entry["data_versions"]["token_shards"] = shards["data_version"]
    return entry, manifest


def tokenizer_lineage(manifest: dict, tokenizer: dict | None) -> dict:
    """The tokenizer the shards were made with (from their manifest), with the tokenizer asset's data
    version when its handle ``tokenizer`` is that tokenizer (same sha256)."""
    tok = {
        "vocab_size": manifest.get("vocab_size"),
        "eos_id": manifest.get("eos_id"),
        "sha256": manifest.get("tokenizer_sha256"),
        "data_version": None,
        "pretrained_model": None,
    }
    if tokenizer and tokenizer["stats"].get("sha256") == tok["sha256"]:
        tok.update(data_version=tokenizer["data_version"], pretrained_model=tokenizer["stats"].get("pretrained_model"))
    return tok


def training_lineage(train_dir: Path, model_dir: Path, seq_len: int | None) -> dict:
    """The card's training section: the settings of TRAINING_KEYS (train_config.json), the results
    (summary.json's scalars), and the adapter's PEFT settings when ``model_dir`` holds one."""
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
    training["config"]["seq_len"] = seq_len
    peft_cfg = Path(model_dir) / "adapter_config.json"
    if peft_cfg.exists():
        a = read_json(peft_cfg, "PEFT adapter_config.json")
        training["adapter"] = {
            "r": a.get("r"),
            "lora_alpha": a.get("lora_alpha"),
            "target_modules": sorted(a.get("target_modules") or []),
        }
    return training


def write_card(
    log,
    kind: str,
    model_dir: Path,
    version: str,
    inputs: dict,
    train_dir: Path | None = None,
    base_model: Path | None = None,
    imported: dict | None = None,
    task: dict | None = None,
) -> list[Path]:
    """Write README.md + lineage.json into ``model_dir`` (kind ``base_model`` or ``lora_adapter``) unless a
    card made by largetrain is already there (a reused artifact keeps the card of its first making).
    ``inputs``: the handles ``shards``, ``text`` (or None), ``tokenizer`` (or None) and the name of
    the text asset ``text_asset``; ``train_dir``: the training's output directory (train_config.json,
    summary.json); ``base_model``: the adapter's base model directory (its lineage.json); ``imported``:
    ``{from, content_digest}`` of an imported base model; ``task``: what a fine-tuned adapter does
    (largetrain_core.model_card's Task section). Returns the files written (none when the card was there)."""
    model_dir = Path(model_dir)
    if read_lineage(model_dir) is not None and (model_dir / CARD).exists():
        return []
    corpus, manifest = corpus_lineage(log, ROLE[kind], inputs["shards"], inputs.get("text"), inputs["text_asset"])
    lineage = {
        "kind": kind,
        "data_version": version,
        "corpora": [corpus],
        "tokenizer": tokenizer_lineage(manifest, inputs.get("tokenizer")),
        "training": training_lineage(train_dir, model_dir, manifest.get("seq_len")) if train_dir is not None else None,
        "software": software_versions(),
    }
    if imported:
        lineage["imported"] = imported
    if task:
        lineage["task"] = task
    if kind == "lora_adapter":
        lineage["base"] = read_lineage(base_model) if base_model else None
    card = write_model_card(model_dir, lineage)
    log.info(f"model card: {card}")
    return [Path(card), model_dir / LINEAGE]
