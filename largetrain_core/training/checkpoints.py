"""Checkpoints under ``<output_dir>/checkpoints/step-NNNNNN/``: save, mark complete, verify, find the
newest complete one, prune, and the RNG states they carry.

A checkpoint is DeepSpeed's ``save_checkpoint`` of every rank plus client state (step, consumed
samples, sampler seed and epoch, every rank's RNG states, config hash, world size, DeepSpeed's
``universal_checkpoint_info``). It counts only once ``COMPLETE.json`` (step, world size, ZeRO stage,
every file and its size) is written, last, by rank 0 after a barrier, so a save cut short by a crash
is never resumed from. DeepSpeed loads these files with ``torch.load``: only resume from checkpoints
this project wrote.

Resuming at another world size: ZeRO (stages 1-3) partitions the optimizer state by data-parallel
rank, and DeepSpeed refuses to load a partitioned checkpoint at another world size
(``ZeRORuntimeException``). :func:`universal` converts it with DeepSpeed's own
``deepspeed.checkpoint.ds_to_universal`` (one file per parameter: fp32 weights, Adam's moments and
step, under ``zero/<parameter name>/``), which DeepSpeed loads at any world size with
``"checkpoint": {"load_universal": true}`` (its "Universal Checkpointing", Lian et al. 2024).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np

from largetrain_core.error_records import concerning

SKIP_HINT = "set resume_from_checkpoint to an older checkpoint directory, or never, to skip it"

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
    candidates = sorted(
        (p for p in ckpt_root.iterdir() if p.is_dir() and re.fullmatch(r"step-\d+", p.name)), key=_step_of, reverse=True
    )
    for cand in candidates:
        problem = verify(cand)
        if problem is None:
            return cand, skipped
        skipped.append(f"skipped {cand}: {problem}")
    return None, skipped


def resume_point(setting: str, ckpt_root: Path) -> tuple[Path | None, list[str]]:
    """The checkpoint that ``resume_from_checkpoint`` names: ``auto`` the newest complete one (or None),
    ``never`` None, else that directory (ValueError when it is not a complete checkpoint); plus the
    messages of skipped incomplete checkpoints."""
    if setting == "auto":
        return find_newest_complete(ckpt_root)
    if setting == "never":
        return None, []
    problem = verify(Path(setting))
    if problem:
        raise ValueError(f"resume_from_checkpoint {setting} is not a complete checkpoint: {problem}")
    return Path(setting), []


def mark_complete(
    ckpt: Path,
    step: int,
    world_size: int,
    zero_stage: int,
    files: dict | None = None,
    before_replace=None,
) -> None:
    """Write ``COMPLETE.json`` (step, the world size and ZeRO stage that wrote it, every file's size)
    atomically, after every rank's files are written. ``files``: {relative path: size} when the
    checkpoint's files are not all local (every node's, from the bucket); default: the local files.
    ``before_replace()``: called with the new marker written as ``.COMPLETE.json.tmp``, before it
    replaces the local one (the upload of the marker to the bucket)."""
    if files is None:
        files = {p.relative_to(ckpt).as_posix(): p.stat().st_size for p in sorted(ckpt.rglob("*")) if p.is_file()}
    tmp = ckpt / f".{MARKER}.tmp"
    tmp.write_text(
        json.dumps({"step": step, "world_size": world_size, "zero_stage": zero_stage, "files": files}, indent=1)
    )
    if before_replace is not None:
        before_replace()
    os.replace(tmp, ckpt / MARKER)


def saved_topology(ckpt: Path) -> dict:
    """``{"world_size", "zero_stage"}`` of the run that wrote the complete checkpoint ``ckpt``, from its
    ``COMPLETE.json``. Raises ValueError naming the marker when it is missing, unreadable or lacks them."""
    marker = ckpt / MARKER
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{marker}: not a complete checkpoint's marker ({type(e).__name__}: {e})") from e
    try:
        return {"world_size": int(data["world_size"]), "zero_stage": int(data["zero_stage"])}
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(
            f"{marker}: records no world size and ZeRO stage (written by a pre-release largetrain), so it "
            f"cannot be resumed; {SKIP_HINT}"
        ) from e


def needs_universal(ckpt: Path, world_size: int) -> bool:
    """Whether resuming ``ckpt`` with ``world_size`` ranks needs the universal format: a ZeRO stage >= 1
    checkpoint (partitioned optimizer state) written by another number of ranks."""
    saved = saved_topology(ckpt)
    return saved["zero_stage"] >= 1 and saved["world_size"] != world_size


UNIVERSAL_MARKER = "UNIVERSAL.json"


def universal_dir(ckpt: Path, ckpt_root: Path) -> Path:
    """Where :func:`universal` puts the universal form of ``ckpt``: ``<ckpt_root>/universal/<tag>/``."""
    return ckpt_root / "universal" / ckpt.name


def universal(ckpt: Path, ckpt_root: Path) -> Path:
    """Convert the complete checkpoint ``ckpt`` to DeepSpeed's universal format in :func:`universal_dir`
    with ``ds_to_universal`` (in this process, one worker), into a temporary sibling renamed into
    place with ``UNIVERSAL.json`` (the source and its marker) written last; a finished conversion of
    the same source is reused. Returns the directory, to load with ``load_checkpoint(dir.parent,
    tag=dir.name)`` under ``"checkpoint": {"load_universal": true}``. One process converts."""
    import argparse

    from deepspeed.checkpoint import ds_to_universal

    final = universal_dir(ckpt, ckpt_root)
    source = {"source": str(ckpt.resolve()), "source_marker": json.loads((ckpt / MARKER).read_text())}
    done = final / UNIVERSAL_MARKER
    if done.exists() and json.loads(done.read_text()) == source:
        return final
    tmp = final.with_name(f".tmp-{ckpt.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    with concerning(ckpt, "loading the checkpoint", SKIP_HINT):
        ds_to_universal.main(
            argparse.Namespace(
                input_folder=str(ckpt),
                output_folder=str(tmp),
                num_extract_workers=1,
                num_merge_workers=1,
                keep_temp_folder=False,
                strict=True,
                inject_missing_state=False,
            )
        )
    (tmp / UNIVERSAL_MARKER).write_text(json.dumps(source, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def prune(ckpt_root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` complete checkpoints."""
    complete = sorted((p for p in ckpt_root.iterdir() if (p / MARKER).exists()), key=_step_of)
    for old in complete[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def prune_node_copies(ckpt_root: Path, keep: int, step: int) -> None:
    """Delete this node's local copies of the checkpoints older than the newest ``keep`` up to ``step`` (the one
    just saved, complete in the bucket). For the nodes other than rank 0's under an output_dir URL: their
    copies get no local COMPLETE.json (rank 0 writes it, and uploads it), so :func:`prune` would keep them
    all and fill the node's disk; the bucket holds the complete checkpoints. Newer directories (left by a
    run that crashed past ``step``) are kept: they are overwritten when their step is saved again."""
    if not ckpt_root.is_dir():
        return
    copies = sorted(
        (p for p in ckpt_root.iterdir() if p.is_dir() and re.fullmatch(r"step-\d+", p.name) and _step_of(p) <= step),
        key=_step_of,
    )
    for old in copies[:-keep]:
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


def save(
    engine, ckpt_root: Path, step: int, client: dict, keep: int, rank: int, world: int, dist, remote=None, mid_save=None
) -> None:
    """``save_checkpoint`` on every rank with ``client`` state plus every rank's RNG states, the world
    size and DeepSpeed's ``universal_checkpoint_info`` (what ``ds_to_universal`` requires of a client),
    then the completion marker (rank 0, after a barrier), then pruning to ``keep`` complete checkpoints.
    ``remote`` (largetrain_core.training.sync.RemoteOutput, for an output_dir URL): after the barrier every
    node's first rank uploads its node's files, and after another barrier rank 0 writes the marker from
    the bucket's listing, uploads it last, then writes it locally and prunes both; last, the other nodes'
    first ranks delete their older local copies (:func:`prune_node_copies`). ``mid_save()``: called on
    every rank once its own files are written, before the barrier and the marker (the trainer's hooks)."""
    from deepspeed.checkpoint.constants import (
        UNIVERSAL_CHECKPOINT_INFO,
        UNIVERSAL_CHECKPOINT_VERSION_KEY,
        UNIVERSAL_CHECKPOINT_VERSION_VALUE,
    )

    gathered: list = [None] * world
    dist.all_gather_object(gathered, rng_state())
    client = {
        **client,
        "step": step,
        "rng": gathered,
        "world_size": world,
        UNIVERSAL_CHECKPOINT_INFO: {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE},
    }
    engine.save_checkpoint(str(ckpt_root), tag=tag(step), client_state=client)
    if mid_save is not None:
        mid_save()  # this rank's files written, the others' maybe not, no marker yet
    dist.barrier()
    ckpt = ckpt_root / tag(step)
    from largetrain_core.training.sync import node_leader

    if remote is not None:
        if node_leader():
            remote.push_checkpoint(ckpt)
        dist.barrier()
    if rank == 0:
        files = remote.complete_files(ckpt) if remote is not None else None
        mark_complete(
            ckpt,
            step,
            world,
            engine.zero_optimization_stage(),
            files=files,
            before_replace=(lambda: remote.push_marker_from(ckpt)) if remote is not None else None,
        )
        prune(ckpt_root, keep)
        if remote is not None:
            remote.prune(keep)
    dist.barrier()
    if remote is not None and rank != 0 and node_leader():
        prune_node_copies(ckpt_root, keep, step)


class Checkpointer:
    """The training's checkpoints component (torchtitan's CheckpointManager in shape): when to save
    (:meth:`should_save`) and the save itself (:meth:`save`) under ``ckpt_root``.

    ``settings``: the config's ``checkpointing`` (``save_steps``, ``save_total_limit``); ``max_steps``: the
    run's last step; ``remote``: largetrain_core.training.sync.RemoteOutput for an output_dir URL, else None."""

    def __init__(self, ckpt_root: Path, settings, max_steps: int, remote=None):
        self.ckpt_root = Path(ckpt_root)
        self.save_steps = settings.save_steps
        self.keep = settings.save_total_limit
        self.max_steps = max_steps
        self.remote = remote

    def should_save(self, step: int, stopping: bool = False) -> bool:
        """Whether step ``step`` (1-based, just finished) is saved: every ``save_steps``-th step, the last
        (``max_steps``), and, with ``stopping``, a step after which the run ends early (early stopping, a
        collapse), so that its model is the one exported."""
        return step % self.save_steps == 0 or step == self.max_steps or stopping

    def save(self, engine, step: int, client: dict, rank: int, world: int, dist, mid_save=None) -> None:
        """:func:`save` of step ``step`` with ``client`` state, keeping ``save_total_limit`` complete
        checkpoints. A full disk raises ``OSError(ENOSPC)`` naming the checkpoint and the free space
        (:func:`no_space_error`); any other error is raised as it is."""
        try:
            save(engine, self.ckpt_root, step, client, self.keep, rank, world, dist, self.remote, mid_save)
        except Exception as e:
            full = no_space_error(e, self.ckpt_root / tag(step))
            if full is None:
                raise
            raise full from e


def no_space_error(exc: BaseException, ckpt: Path) -> OSError | None:
    """When ``exc``, raised while saving the checkpoint ``ckpt``, is its file system running out of space
    (largetrain_core.storage.is_disk_full: torch.save's zip writer reports a short write as a RuntimeError
    "file write failed", without errno): a ``DiskFullError`` (ENOSPC) that names ``ckpt`` and the free space
    left, after removing the incomplete ``ckpt`` (it has no marker, so it would never be resumed from;
    removed, the rank's error file can be written). Else None."""
    import errno

    from largetrain_core.storage import DiskFullError, free_bytes, is_disk_full

    if not is_disk_full(exc, ckpt):
        return None
    free = free_bytes(ckpt)
    shutil.rmtree(ckpt, ignore_errors=True)
    return DiskFullError(
        errno.ENOSPC,
        f"No space left on device (ENOSPC) while saving checkpoint {ckpt}: {free:,} bytes were free on its file "
        f"system ({free_bytes(ckpt):,} after removing the incomplete checkpoint); {type(exc).__name__}: {exc}. "
        "Free space there (or lower save_total_limit), then run again: it resumes from the newest complete "
        "checkpoint",
        str(ckpt),
    )


def load(engine, ckpt: Path, rank: int) -> dict:
    """Load ``ckpt`` (a checkpoint, or its :func:`universal` form) into ``engine`` (model, optimizer,
    scheduler, loss scaler), bring the CPU Adam kernel's step state to the loaded step
    (:func:`replay_cpu_adam_steps`), restore this rank's RNG states (the last saved rank's when the
    checkpoint has fewer ranks), and return the client state."""
    with concerning(ckpt, "loading the checkpoint", SKIP_HINT):
        _, client = engine.load_checkpoint(str(ckpt.parent), tag=ckpt.name)
    replay_cpu_adam_steps(engine.basic_optimizer)
    rngs = client["rng"]
    set_rng_state(rngs[min(rank, len(rngs) - 1)] if isinstance(rngs, list) else rngs)
    return client


def replay_cpu_adam_steps(optimizer) -> int:
    """Give DeepSpeed's C++ CPU Adam (``Adam_Optimizer`` of csrc/includes/cpu_adam.h, behind FusedAdam on
    the CPU accelerator and behind DeepSpeedCPUAdam under ``offload_optimizer``) the bias-correction
    state that an uninterrupted run has at the step ``optimizer`` was loaded at; returns that step (0:
    nothing to do: no state, or another optimizer or accelerator).

    The kernel keeps ``beta1**t`` and ``beta2**t`` in float32 in the process: from one step to the next
    it multiplies them by beta (``IncrementStep``), but after a jump in the step count, as the first step
    after a resume is, it recomputes them with ``pow(beta, t)``. The two differ in the last bits from
    step 6 on for beta2 0.95 (and at steps 9, 12, 14 for beta1 0.9), so every update after a resume
    from a later checkpoint differed from the uninterrupted run's (largetrain issue 42 item 9; the same
    step-state handling as deepspeedai/DeepSpeed#7819 and PR #7859, which keep the ``pow`` path for a
    jump). Replaying steps 1..t of the kernel on a one-element scratch tensor with the loaded betas
    (after a step 0 with betas 0, so that step 1 starts afresh whatever the kernel held) leaves it in the
    uninterrupted run's state; the model's tensors are untouched. Cost: t calls on one element, in one
    thread (0.6 s for 100,000 steps on this project's 2-core test host). CUDA's FusedAdam computes ``pow(beta, step)`` at every step and needs nothing."""
    import torch

    update = _cpu_adam_update(optimizer)
    if update is None:
        return 0
    # per parameter (ZeRO 0-2: the flat partitions) or per subgroup (ZeRO-3 offload); every one advances each step
    steps = [int(state["step"]) for state in optimizer.state.values() if "step" in state]
    if not steps or not optimizer.param_groups:
        return 0
    last, group = max(steps), optimizer.param_groups[0]
    scratch = tuple(torch.zeros(1) for _ in range(4))  # param, grad, exp_avg, exp_avg_sq
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one element: OpenMP's start of a parallel region would cost 50x the update
    try:
        # betas 0 at step 0 first: whatever the kernel held, step 1 then takes the pow path, as a fresh run's first
        update(0, {**group, "betas": (0.0, 0.0), "bias_correction": False}, scratch)
        for step in range(1, last + 1):
            update(step, group, scratch)
    finally:
        torch.set_num_threads(threads)
    return last


def _cpu_adam_update(optimizer):
    """One step of ``optimizer``'s C++ CPU Adam kernel on given tensors, ``update(step, group, (param, grad,
    exp_avg, exp_avg_sq))``, or None when the optimizer is not one (:func:`replay_cpu_adam_steps`)."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam

    if isinstance(optimizer, DeepSpeedCPUAdam):

        def update(step, group, tensors):
            optimizer.ds_opt_adam.adam_update(
                optimizer.opt_id,
                step,
                group["lr"],
                *group["betas"],
                group["eps"],
                group["weight_decay"],
                group["bias_correction"],
                *tensors,
            )

    elif isinstance(optimizer, FusedAdam) and not optimizer._dummy_overflow_buf.is_cuda:

        def update(step, group, tensors):
            param, grad, exp_avg, exp_avg_sq = ([t] for t in tensors)
            optimizer.multi_tensor_adam(
                1,
                optimizer._dummy_overflow_buf,
                [grad, param, exp_avg, exp_avg_sq],
                group["lr"],
                *group["betas"],
                group["eps"],
                step,
                optimizer.adam_w_mode,
                int(group["bias_correction"]),
                group["weight_decay"],
            )

    else:
        return None
    return update
