"""A training whose locations are URLs (an object-store storage root): what each rank reads and writes
locally, and what goes to the bucket when.

* :func:`localize`: the ranks work on local paths. An ``output_dir`` URL gets a local work directory
  (its working copy, largetrain_core.storage.mirror_path, in the local cache); a ``base_model``,
  ``tokenizer`` or ``resume_from_checkpoint`` URL is downloaded there once per node (the node's first
  rank fetches, the others wait at a barrier and find it).
* Checkpoints (:class:`RemoteOutput`): written locally by DeepSpeed, then every node's first rank
  uploads its node's files of the checkpoint; after a barrier (every rank's files are in the
  bucket) rank 0 writes ``COMPLETE.json`` from one listing of the uploaded checkpoint and uploads it
  last, so a checkpoint counts in the bucket only once all of it is there. ``resume_from_checkpoint:
  auto`` takes the newest complete checkpoint in the bucket, downloaded when the local copy is not
  that one; older complete checkpoints beyond ``save_total_limit`` are deleted in the bucket too.
* At the end rank 0 uploads the outputs (everything in the work directory but the checkpoints and the
  launcher's log); the training asset then writes the model cards and commits the directory
  (storage.publish).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

from largetrain_core import fs
from largetrain_core.storage import local_copy, local_files, mirror_path

log = logging.getLogger("largetrain.training")

MARKER = "COMPLETE.json"  # as largetrain_core.training.checkpoints.MARKER
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")  # a tokenizer directory, beside the shards too
# Not uploaded with the outputs: the checkpoints go their own way; the launcher's log and torchrun's error
# files are written by the launcher while this runs.
NOT_OUTPUTS = ("checkpoints", "train.log", "torchelastic")
# What a start writes that the next start continues: the metrics (appended) and the trackers' run records
# (trackers.METRICS, trackers.RECORDS)
RECORDS = ("metrics.jsonl", "trackers.json")


def node_leader() -> bool:
    """Whether this rank is its node's first (LOCAL_RANK 0, as torchrun sets it)."""
    return int(os.environ.get("LOCAL_RANK", "0")) == 0


def localize(cfg, barrier=None):
    """(``cfg`` with every location made local, the :class:`RemoteOutput` of a URL ``output_dir`` or None).

    Inputs at URLs (``model.base_model``, the ``model.tokenizer``'s files) are downloaded into the local cache by
    the node's first rank, checked against their manifests (storage.local_copy, local_files);
    ``barrier()`` (every rank calls it) makes the others wait for it. ``train_shards`` stays a URL:
    the shards are streamed (largetrain_core.shards.TokenShards).
    ``cfg`` is a TrainConfig; a config without URLs is returned as it is."""
    remote = RemoteOutput(cfg.output_dir) if fs.is_url(cfg.output_dir) else None
    inputs = {
        k: getattr(cfg.model, k)
        for k in ("base_model", "tokenizer")
        if isinstance(getattr(cfg.model, k), str) and fs.is_url(getattr(cfg.model, k))
    }
    if cfg.model.tokenizer is None and fs.is_url(cfg.train_shards):  # the export takes the tokenizer beside the shards
        inputs["tokenizer"] = cfg.train_shards
    if fs.is_url(cfg.checkpointing.resume_from_checkpoint):
        raise ValueError(
            f"resume_from_checkpoint {fs.redact(cfg.checkpointing.resume_from_checkpoint)}: a URL is not taken; use "
            "auto (the newest complete checkpoint under output_dir, in the bucket too), never, or a local directory"
        )

    def fetch() -> dict:
        if remote is not None:
            remote.local.mkdir(parents=True, exist_ok=True)
            remote.pull_records()
        return {
            k: str(local_files(v, TOKENIZER_FILES) if k == "tokenizer" else local_copy(v)) for k, v in inputs.items()
        }

    changes = fetch() if node_leader() else {}
    if barrier is not None and inputs:
        barrier()
    if not node_leader():
        changes = fetch()  # the node's copies are there now: checked, not downloaded again
    if remote is not None:
        changes["output_dir"] = str(remote.local)
    return (cfg.with_settings(**changes) if changes else cfg), remote


class RemoteOutput:
    """A training's output directory at a URL and its local work directory (module docstring)."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.local = mirror_path(self.url)
        self.fsys, self.root = fs.filesystem(self.url)
        self.root = self.root.rstrip("/")

    def _ckpt(self, name: str = "") -> str:
        return f"{self.root}/checkpoints" + (f"/{name}" if name else "")

    # -------------------------------------------------------------------------------------- checkpoints

    def push_checkpoint(self, ckpt: Path) -> None:
        """Upload this node's files of the local checkpoint ``ckpt`` (all but COMPLETE.json); call on
        every node's first rank, after every local rank's ``save_checkpoint`` returned."""
        files = sorted(p for p in ckpt.rglob("*") if p.is_file() and p.name != MARKER and not p.name.startswith("."))
        if files:
            self.fsys.put(
                [str(p) for p in files], [self._ckpt(f"{ckpt.name}/{p.relative_to(ckpt).as_posix()}") for p in files]
            )

    def complete_files(self, ckpt: Path) -> dict:
        """{relative path: size} of every uploaded file of checkpoint ``ckpt``: one listing of the bucket,
        after a barrier behind every node's :meth:`push_checkpoint`."""
        base = self._ckpt(ckpt.name)
        return {
            p[len(base) + 1 :]: int(info["size"])
            for p, info in sorted(self.fsys.find(base, detail=True).items())
            if not p.endswith(f"/{MARKER}")
        }

    def push_marker_from(self, ckpt: Path) -> None:
        """Upload ``ckpt``'s new COMPLETE.json (written as ``.COMPLETE.json.tmp`` by
        checkpoints.mark_complete, before it replaces the local one): last, so the checkpoint counts in
        the bucket only now, and locally only once it does in the bucket. Then the run's records so far
        (:data:`RECORDS`: the metrics and the trackers' run ids), which a start on another node
        continues (:meth:`pull_records`)."""
        self.fsys.put_file(str(ckpt / f".{MARKER}.tmp"), self._ckpt(f"{ckpt.name}/{MARKER}"))
        present = [name for name in RECORDS if (self.local / name).exists()]
        if present:
            self.fsys.put([str(self.local / n) for n in present], [f"{self.root}/{n}" for n in present])

    def pull_records(self) -> None:
        """Download the run's records (:data:`RECORDS`) from the bucket when this node has none: a start
        on a new node appends to the metrics of the starts before it and continues their tracker runs."""
        for name in RECORDS:
            if not (self.local / name).exists():
                try:
                    self.fsys.get_file(f"{self.root}/{name}", str(self.local / name))
                except FileNotFoundError:
                    pass

    def _complete(self) -> list[tuple[int, str, dict]]:
        """(step, name, marker) of every checkpoint in the bucket whose COMPLETE.json is there and whose
        files are all there with their recorded sizes, newest first."""
        found = []
        try:
            names = [p.rsplit("/", 1)[1] for p in self.fsys.ls(self._ckpt(), detail=False)]
        except FileNotFoundError:
            return []
        for name in sorted(
            (n for n in names if re.fullmatch(r"step-\d+", n)), key=lambda n: int(n.split("-")[1]), reverse=True
        ):
            try:
                marker = json.loads(self.fsys.cat_file(self._ckpt(f"{name}/{MARKER}")))
            except (FileNotFoundError, ValueError):
                continue
            sizes = self.complete_files(Path(name))
            if all(sizes.get(f) == size for f, size in marker.get("files", {}).items()):
                found.append((int(name.split("-")[1]), name, marker))
        return found

    def pull_newest_checkpoint(self, ckpt_root: Path) -> str | None:
        """Make the newest complete checkpoint of the bucket a local complete checkpoint under
        ``ckpt_root`` (downloaded unless the local copy carries the same COMPLETE.json); call on every
        node's first rank before resuming, then a barrier. Returns its name, or None when the bucket holds none."""
        complete = self._complete()
        if not complete:
            return None
        _, name, marker = complete[0]
        local = ckpt_root / name
        mine = local / MARKER
        if (
            mine.exists()
            and json.loads(mine.read_text()) == marker
            and all((local / f).exists() and (local / f).stat().st_size == s for f, s in marker["files"].items())
        ):
            return name
        log.info(f"downloading checkpoint {name} from {fs.redact(self.url)}")
        tmp = ckpt_root / f".download-{name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        rels = sorted(marker["files"])
        for r in rels:
            (tmp / r).parent.mkdir(parents=True, exist_ok=True)
        self.fsys.get([self._ckpt(f"{name}/{r}") for r in rels], [str(tmp / r) for r in rels])
        (tmp / MARKER).write_text(json.dumps(marker, indent=1))
        shutil.rmtree(local, ignore_errors=True)
        os.replace(tmp, local)
        return name

    def prune(self, keep: int) -> None:
        """Delete, in the bucket, every checkpoint older than the newest ``keep`` complete ones (rank 0)."""
        complete = self._complete()
        if len(complete) <= keep:
            return
        oldest_kept = complete[keep - 1][0]
        try:
            names = [p.rsplit("/", 1)[1] for p in self.fsys.ls(self._ckpt(), detail=False)]
        except FileNotFoundError:
            return
        for name in names:
            if re.fullmatch(r"step-\d+", name) and int(name.split("-")[1]) < oldest_kept:
                self.fsys.rm(self._ckpt(name), recursive=True)

    # -------------------------------------------------------------------------------------- outputs

    def push_outputs(self) -> list[str]:
        """Upload everything under the work directory but :data:`NOT_OUTPUTS` (the exported model or
        adapter, metrics, summary, curves, trackers' files) to the output URL (rank 0, at the end).
        Returns the relative paths uploaded."""
        files = sorted(
            p
            for p in self.local.rglob("*")
            if p.is_file() and p.relative_to(self.local).parts[0] not in NOT_OUTPUTS and not p.name.startswith(".tmp")
        )
        rels = [p.relative_to(self.local).as_posix() for p in files]
        if files:
            self.fsys.put([str(p) for p in files], [f"{self.root}/{r}" for r in rels])
        return rels
