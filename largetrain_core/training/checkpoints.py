"""Checkpoints under ``<output_dir>/checkpoints/step-NNNNNN/``: save, mark complete, verify, find the
newest complete one, prune, and the RNG states they carry.

A checkpoint is DeepSpeed's ``save_checkpoint`` of every rank plus client state (step, consumed
samples, sampler seed and epoch, every rank's RNG states, config hash). It counts only once
``COMPLETE.json`` (every file and its size) is written, last, by rank 0 after a barrier, so a save
cut short by a crash is never resumed from. DeepSpeed loads these files with ``torch.load``: only
resume from checkpoints this project wrote.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np

from largetrain_core.launch import maybe_fault

MARKER = "COMPLETE.json"


def tag(step: int) -> str:
    return f"step-{step:06d}"


def _step_of(path: Path) -> int:
    return int(path.name.split("-")[1])


def verify(ckpt: Path) -> str | None:
    """Why ``ckpt`` is not a complete checkpoint, or None when ``COMPLETE.json`` is present and every
    file it lists exists with the recorded size."""
    marker = ckpt / MARKER
    if not marker.exists():
        return f"no {MARKER} (the save did not finish)"
    try:
        listed = json.loads(marker.read_text())["files"]
    except (ValueError, KeyError) as e:
        return f"unreadable {MARKER} ({e})"
    bad = [f for f, size in listed.items() if not (ckpt / f).exists() or (ckpt / f).stat().st_size != size]
    return f"files missing or of the wrong size: {bad[:3]}" if bad else None


def find_newest_complete(ckpt_root: Path) -> tuple[Path | None, list[str]]:
    """The newest complete checkpoint under ``ckpt_root`` (by step) and one message per newer incomplete one skipped."""
    skipped: list[str] = []
    if not ckpt_root.is_dir():
        return None, skipped
    candidates = sorted((p for p in ckpt_root.iterdir() if p.is_dir() and re.fullmatch(r"step-\d+", p.name)),
                        key=_step_of, reverse=True)
    for cand in candidates:
        problem = verify(cand)
        if problem is None:
            return cand, skipped
        skipped.append(f"skipped {cand}: {problem}")
    return None, skipped


def resume_point(setting: str, ckpt_root: Path) -> tuple[Path | None, list[str]]:
    """The checkpoint that ``resume_from_checkpoint`` names: ``auto`` the newest complete one (or None),
    ``never`` None, else that directory; plus the messages of skipped incomplete checkpoints."""
    if setting == "auto":
        return find_newest_complete(ckpt_root)
    return (None if setting == "never" else Path(setting)), []


def mark_complete(ckpt: Path, step: int) -> None:
    """Write ``COMPLETE.json`` (step and every file's size) atomically, after every rank's files are written."""
    files = {p.relative_to(ckpt).as_posix(): p.stat().st_size for p in sorted(ckpt.rglob("*")) if p.is_file()}
    tmp = ckpt / f".{MARKER}.tmp"
    tmp.write_text(json.dumps({"step": step, "files": files}, indent=1))
    os.replace(tmp, ckpt / MARKER)


def prune(ckpt_root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` complete checkpoints."""
    complete = sorted((p for p in ckpt_root.iterdir() if (p / MARKER).exists()), key=_step_of)
    for old in complete[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def rng_state() -> dict:
    """This process's python, numpy and torch (CPU) RNG states."""
    import torch

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save(engine, ckpt_root: Path, step: int, client: dict, keep: int, rank: int, world: int, dist) -> None:
    """``save_checkpoint`` on every rank with ``client`` state plus every rank's RNG states, then the
    completion marker (rank 0, after a barrier), then pruning to ``keep`` complete checkpoints."""
    gathered: list = [None] * world
    dist.all_gather_object(gathered, rng_state())
    engine.save_checkpoint(str(ckpt_root), tag=tag(step), client_state={**client, "step": step, "rng": gathered})
    maybe_fault("mid_save", step, rank)  # this rank's files written, the others' maybe not, no marker yet
    dist.barrier()
    if rank == 0:
        mark_complete(ckpt_root / tag(step), step)
        prune(ckpt_root, keep)
    dist.barrier()


def load(engine, ckpt: Path, rank: int) -> dict:
    """Load ``ckpt`` into ``engine`` (model, optimizer, scheduler, loss scaler), restore this rank's RNG
    states (rank 0's when the checkpoint has fewer ranks), and return the client state."""
    _, client = engine.load_checkpoint(str(ckpt.parent), tag=ckpt.name)
    rngs = client["rng"]
    set_rng_state(rngs[min(rank, len(rngs) - 1)] if isinstance(rngs, list) else rngs)
    return client
