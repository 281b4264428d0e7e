"""What a checkpoint records of the run that wrote it, and what a resume with other settings is told.

A checkpoint's client state holds ``settings`` (:func:`run_identity`: the settings that change the
trained weights, with every input path replaced by its content's digest, and the train data's
``seq_len`` and sequence count) and ``config_hash`` (:func:`identity_hash` of them). A resume whose
identity differs names every setting that differs at WARNING (:func:`changed`), and refuses when the
train data differs (``train_shards``, ``seq_len``, ``train_sequences``) unless
``checkpointing.resume_across_data_change`` allows it: the sampler's position (consumed samples) means
other sequences in other data. A storage root copied or moved elsewhere keeps every digest, so it
resumes without a word.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

log = logging.getLogger("largetrain.training")

# the identity's names that are the train data: a resume across a change of one is refused unless allowed
DATA = ("train_shards", "seq_len", "train_sequences")
# the identity's names that are input paths (TrainConfig fields marked INPUT), recorded by content
PATHS = ("train_shards", "base_model", "tokenizer")


def data_digest(data, location: str) -> str:
    """The train data's content digest (32 hex digits): for token shards, sha256 of their manifest (canonical
    JSON), which lists every shard file by relative path with its size and xxh3-128 checksum; for another
    reader without shard checksums (TaskExamples: small files), :func:`largetrain_core.digest.tree_digest`
    of the local directory ``location``."""
    manifest = getattr(data, "manifest", None) or {}
    listed = any("xxh3_128" in e for split in manifest.get("splits", {}).values() for e in split.get("shards", []))
    if listed or not Path(location).is_dir():
        return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:32]
    from largetrain_core.digest import tree_digest

    return tree_digest(location)


def run_identity(cfg, data) -> dict:
    """``cfg.identity("weights")`` with the input paths (:data:`PATHS`) replaced by content digests: the train
    data's :func:`data_digest`; a local base model directory's storage.sampled_digest of its config.json and
    weights (large files sampled, as the manifests do); a tokenizer directory's (often the shards' own) tokenizer files; a URL kept as written.
    Plus the train data's ``seq_len`` and ``train_sequences``."""
    from largetrain_core.storage import sampled_digest
    from largetrain_core.training.sync import TOKENIZER_FILES

    ident = cfg.identity("weights")
    if not ident.get("tokenizer") and Path(cfg.train_shards).is_dir():
        ident["tokenizer"] = cfg.train_shards  # the shards' own, as the export takes it (and sync, for a bucket's)
    for name in PATHS:
        value = ident.get(name)
        if name == "train_shards":
            ident[name] = data_digest(data, cfg.train_shards)
        elif value and Path(value).is_dir():
            ident[name] = sampled_digest(value, TOKENIZER_FILES if name == "tokenizer" else _weight_files(Path(value)))
    ident["seq_len"] = int(data.seq_len)
    ident["train_sequences"] = int(len(data))
    return ident


def _weight_files(model_dir: Path) -> list[str]:
    """The files of a base model directory that make its weights: config.json and the safetensors files (not
    its model card or lineage.json, which name where the directory is stored)."""
    return ["config.json", *sorted(p.name for p in model_dir.glob("*.safetensors"))]


def identity_hash(identity: dict) -> str:
    """sha256 (16 hex digits) of ``identity`` as canonical JSON: a checkpoint's ``config_hash``."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def changed(saved: dict, now: dict) -> list[str]:
    """``"name old -> new"`` for every setting whose value differs between ``saved`` and ``now`` (one absent
    from either reads ``unset``), sorted by name."""
    out = []
    for name in sorted(set(saved) | set(now)):
        old, new = saved.get(name, "unset"), now.get(name, "unset")
        if old != new:
            out.append(f"{name} {json.dumps(old, default=str)} -> {json.dumps(new, default=str)}")
    return out


def check_resume(ckpt: Path, client: dict, now: dict, allow_data_change: bool, announce: bool = True) -> list[str]:
    """Compare the checkpoint ``ckpt``'s client state with this run's identity ``now``; returns the settings
    that differ (:func:`changed`). ``announce``: log them at WARNING (rank 0), first. Raises ValueError, naming the
    checkpoint, the data settings that differ and the setting that allows it, when the train data differs
    and ``allow_data_change`` is false. A checkpoint that records no settings (written before they were
    recorded) is compared by hash alone: a warning, never a refusal."""
    saved = client.get("settings")
    if saved is None:
        if client.get("config_hash") != identity_hash(now) and announce:
            log.warning(
                f"{ckpt} records no settings (an older checkpoint), only config hash {client.get('config_hash')}; "
                f"this run's is {identity_hash(now)}: the settings that differ cannot be named"
            )
        return []
    diffs = changed(saved, now)
    if diffs and announce:
        log.warning(f"{ckpt} was written with settings that differ from this run's: {'; '.join(diffs)}")
    data = [d for d in diffs if d.split(" ", 1)[0] in DATA]
    if data and not allow_data_change:
        raise ValueError(
            f"{ckpt} was trained on other data than this run's: {'; '.join(data)}. Resuming would continue the "
            "sampler's position in other sequences. Set checkpointing.resume_across_data_change: true to resume "
            "anyway, or resume_from_checkpoint: never to start afresh"
        )
    return diffs
