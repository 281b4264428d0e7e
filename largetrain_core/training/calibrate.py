"""Calibration: a few steps of the real trainer on the real ranks before a training is launched, to
measure what the training plan (plan.py) can only estimate: tokens/s, each rank's memory, and the
time and size of one checkpoint.

``torchrun --nproc_per_node N -m largetrain_core.training.calibrate CALIBRATION.json`` (a JSON object:
``train``, the :class:`~largetrain_core.training.config.TrainConfig` to calibrate, and optionally
``steps``, ``profiled_steps``, ``measure_checkpoint``) runs, on every rank, the same
:class:`~largetrain_core.training.trainer.Trainer` the training runs: the same model, DeepSpeed config,
shards and sampler, from scratch (nothing is resumed, nothing is tracked, no evaluation), into the
``train`` config's ``output_dir``, a scratch directory. Rank 0 writes ``calibration.json`` there.

What is measured:

* Memory (:class:`AllocationTrace`): the bytes of live torch allocations on the rank's device, from
  before the model is built through ``profiled_steps`` optimizer steps. On CUDA this is the caching
  allocator's ``memory_allocated`` / ``max_memory_allocated``; on CPU the same quantity from the
  torch profiler's allocation events (``profile_memory=True``: every allocation and free of torch's
  CPU allocator with its size; DeepSpeed's buffers, the optimizer state and the activations are all
  torch tensors). Unlike the resident set (peak RSS), it does not count the interpreter and the
  libraries (~0.5 GiB), freed memory that malloc keeps, or pages a tensor never touched, and counts
  allocated-but-untouched buffers as CUDA does: the quantity the plan's formulas give.
  ``persistent_bytes``: live after the last profiled step (weights, optimizer state, the gradient
  buffers DeepSpeed keeps); ``peak_step_bytes``: the peak during the profiled steps;
  ``peak_setup_bytes``: the peak while the model is built and DeepSpeed set up. The busiest rank's.
* Time: ``steps`` further optimizer steps, outside the profiler (which slows them); the median step
  time and tokens/s = tokens per step / median step time (every rank's tokens).
* With ``measure_checkpoint``: one complete checkpoint saved as the training saves it, its bytes on
  disk and the seconds the save took; deleted afterwards.
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
import sys
import time
from pathlib import Path

log = logging.getLogger("largetrain.training.calibrate")

MODULE = "largetrain_core.training.calibrate"
CALIBRATION = "calibration.json"
STEPS, PROFILED_STEPS = 3, 2


class AllocationTrace:
    """Bytes of torch tensor storage on ``device`` allocated while the ``with`` block runs and still
    live, with named marks. After the block, ``live(name)`` is that figure at mark ``name`` and
    ``peak(after, before)`` the most between two marks (None: the block's start or end).

    CUDA: the caching allocator's ``memory_allocated`` / ``max_memory_allocated``. CPU: every storage
    that an ATen operator returns (seen through a ``TorchDispatchMode``, which sees the forward, the
    backward, the optimizer and the collectives alike) is counted from then until it is freed (a
    ``weakref.finalize`` on the storage object, which torch keeps for the storage's whole life, so it
    fires whichever thread drops the last reference); the peak is taken after every operator. Counted
    as CUDA counts it: a buffer from allocation to free, touched or not; not counted: the interpreter,
    the libraries, malloc's caching, and scratch memory that lives only inside one operator. (The
    resident set would count the first three and miss the untouched pages of DeepSpeed's buffers; the
    torch profiler's memory events miss frees made by threads it does not profile.)
    """

    def __init__(self, device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.marks: dict[str, tuple[int, int]] = {}  # name -> (live bytes at the mark, peak since the previous mark)
        self.total = self.high = 0
        self.seen: set[int] = set()

    def __enter__(self) -> "AllocationTrace":
        import torch

        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return self
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        trace = self

        class Storages(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in tree_leaves(out):
                    if isinstance(t, torch.Tensor):
                        trace._track(t)
                trace.high = max(trace.high, trace.total)
                return out

        self.mode = Storages()
        self.mode.__enter__()
        return self

    def _track(self, t) -> None:
        import weakref

        if t.device.type != "cpu" or t.layout != __import__("torch").strided:
            return
        storage = t.untyped_storage()
        key = id(storage)
        if key in self.seen:
            return
        nbytes = storage.nbytes()
        self.seen.add(key)
        self.total += nbytes
        weakref.finalize(storage, self._freed, key, nbytes)

    def _freed(self, key: int, nbytes: int) -> None:
        self.seen.discard(key)
        self.total -= nbytes

    def mark(self, name: str) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.marks[name] = (
                torch.cuda.memory_allocated(self.device) - self.base,
                torch.cuda.max_memory_allocated(self.device) - self.base,
            )
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            import gc

            gc.collect()  # what only a reference cycle keeps is garbage, not memory the training holds
            self.marks[name] = (self.total, max(self.high, self.total))
            self.high = self.total

    def __exit__(self, *exc) -> None:
        if not self.cuda:
            self.mode.__exit__(*exc)

    def live(self, name: str) -> int:
        return self.marks[name][0]

    def peak(self, after: str | None, before: str | None) -> int:
        names = list(self.marks)
        lo = names.index(after) + 1 if after else 0
        hi = names.index(before) + 1 if before else len(names)
        return max([self.marks[n][1] for n in names[lo:hi]] + [0])


def calibration_config(cfg, out: Path, steps: int):
    """``cfg`` as the calibration runs it: into ``out``, from scratch, ``steps`` optimizer steps, nothing
    tracked, evaluated or saved on its own (the learning-rate schedule is shortened to fit)."""
    return cfg.with_settings(
        output_dir=str(out),
        max_steps=steps,
        warmup_steps=min(cfg.schedule.warmup_steps, steps),
        resume_from_checkpoint="never",
        eval_strategy="no",
        early_stopping_patience=None,
        report_to=[],
        save_steps=10**9,
        run_name=None,
    )


def write_spec(cfg, scratch: Path, steps: int) -> Path:
    """The calibration's spec of ``cfg`` (module docstring), ``steps`` timed steps after
    ``PROFILED_STEPS`` profiled ones, measuring one checkpoint: written atomically to
    ``scratch/calibration_spec.json``, whose path is returned."""
    from largetrain_core.storage import write_json_atomic

    spec = scratch / "calibration_spec.json"
    write_json_atomic(
        spec,
        {
            "train": calibration_config(cfg, scratch, steps + PROFILED_STEPS).to_dict(),
            "steps": steps,
            "profiled_steps": PROFILED_STEPS,
            "measure_checkpoint": True,
        },
    )
    return spec


def launch(launcher, context, cfg, scratch: Path, steps: int) -> dict:
    """Calibrate ``cfg`` with ``launcher`` (a largetrain_core.launch.Launcher; ``context``: its caller's) into
    ``scratch`` (replaced): :func:`write_spec`, the run (its log ``scratch/calibration.log``); returns
    calibration.json. Raises what the launcher raises when the ranks fail, and ArtifactError naming
    calibration.json when it is missing or damaged."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    from largetrain_core.storage import read_json

    launcher.run(context, write_spec(cfg, scratch, steps), scratch / "calibration.log", module=MODULE)
    return read_json(scratch / CALIBRATION, "calibration result (calibration.json)")


def run(cfg, steps: int = STEPS, profiled_steps: int = PROFILED_STEPS, measure_checkpoint: bool = False) -> dict | None:
    """Every rank: calibrate ``cfg`` (already a :func:`calibration_config`); rank 0 writes and returns the
    result (other ranks return None). Keys: ``tokens_per_s``, ``step_time_s`` (median), ``step_times_s``,
    ``tokens_per_step``, ``persistent_bytes``, ``peak_step_bytes``, ``peak_setup_bytes`` (the busiest
    rank's), ``memory_measure``, ``world_size``, ``device``, ``seq_len``, ``parameters``,
    ``trainable_parameters``, ``precision``, and with ``measure_checkpoint`` ``checkpoint_bytes`` and
    ``checkpoint_save_s``."""
    import torch
    import torch.distributed as dist

    from largetrain_core.storage import write_json_atomic
    from largetrain_core.training.ablation import device_name
    from largetrain_core.training.trainer import Trainer

    trainer = Trainer(cfg)
    try:
        device = trainer.device
        with AllocationTrace(device) as trace:
            t0 = time.perf_counter()
            trainer.setup()
            setup_s = time.perf_counter() - t0  # under the trace, which slows it: an upper bound
            trace.mark("setup")
            for i in range(profiled_steps):
                trainer.train_step()
                trace.mark(f"step{i + 1}")
        last = f"step{profiled_steps}"
        mem = torch.tensor(
            [trace.live(last), trace.peak("setup", last), trace.peak(None, "setup")], dtype=torch.float64, device=device
        )
        dist.all_reduce(mem, op=dist.ReduceOp.MAX)
        times = [trainer.train_step()["step_time_s"] for _ in range(steps)]
        ckpt = {}
        if measure_checkpoint:
            t0 = time.perf_counter()
            trainer.save()
            save_s = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
            dist.all_reduce(save_s, op=dist.ReduceOp.MAX)
            if trainer.rank == 0:
                root = trainer.ckpt_root
                ckpt = {
                    "checkpoint_bytes": sum(f.stat().st_size for f in root.rglob("*") if f.is_file()),
                    "checkpoint_save_s": float(save_s),
                }
                shutil.rmtree(root, ignore_errors=True)
    finally:
        if hasattr(trainer, "engine"):
            trainer.engine.destroy()
    if trainer.rank != 0:
        return None
    step_time = statistics.median(times)
    result = {
        "tokens_per_s": trainer.tokens_per_step / step_time,
        "step_time_s": step_time,
        "step_times_s": times,
        "tokens_per_step": trainer.tokens_per_step,
        "persistent_bytes": int(mem[0]),
        "peak_step_bytes": int(mem[1]),
        "peak_setup_bytes": int(mem[2]),
        "memory_measure": (
            "CUDA caching allocator: memory_allocated / max_memory_allocated"
            if device.type == "cuda"
            else "live torch tensor storages, seen after every ATen operator"
        ),
        "world_size": trainer.world,
        "device": device_name(),
        "seq_len": trainer.data.seq_len,
        "parameters": trainer.n_params,
        "trainable_parameters": trainer.n_trainable,
        "precision": trainer.precision,
        "zero_stage": cfg.parallelism.zero_stage,
        "activation_checkpointing": cfg.parallelism.activation_checkpointing,
        "micro_batch_size": cfg.schedule.micro_batch_size,
        "profiled_steps": profiled_steps,
        "timed_steps": steps,
        "setup_s": setup_s,
        "device_memory_bytes": (
            torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
        ),
        **ckpt,
    }
    write_json_atomic(Path(cfg.output_dir) / CALIBRATION, result)
    return result


def _main(argv: list[str] | None = None) -> int:
    """``torchrun ... -m largetrain_core.training.calibrate CALIBRATION.json``; exit status 0 after the result."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(f"usage: torchrun --nproc_per_node N -m {MODULE} CALIBRATION.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from largetrain_core.rank_signals import finish_rank
    from largetrain_core.training import preflight
    from largetrain_core.training.__main__ import skip_mlflow_unless_used
    from largetrain_core.training.config import TrainConfig

    spec = json.loads(Path(argv[0]).read_text())
    cfg = TrainConfig.from_dict(spec["train"])
    skip_mlflow_unless_used(cfg)
    preflight.check(cfg)
    run(
        cfg, spec.get("steps", STEPS), spec.get("profiled_steps", PROFILED_STEPS), spec.get("measure_checkpoint", False)
    )
    finish_rank()


def main(argv: list[str] | None = None) -> int:
    """The entry point, its uncaught exception recorded in torchrun's per-rank error file (error_records.record)."""
    from largetrain_core.error_records import record

    return record(_main)(argv)


if __name__ == "__main__":
    sys.exit(main())
