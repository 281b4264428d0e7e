"""The training loop: :func:`run` trains one :class:`TrainConfig` under torchrun (RANK, WORLD_SIZE,
MASTER_ADDR set by the launcher), for pretraining a preset or a LoRA adapter on a base model.

Each rank reads its own slice of the token shards through
:class:`largetrain_core.shards.DistributedSampler`; DeepSpeed runs ZeRO (stage 0-3), AdamW, the
warmup + cosine schedule and, on CUDA, fp16 with dynamic loss scaling. Outputs under ``output_dir``:
``checkpoints/`` (checkpoints.py), ``model/`` / ``adapter/`` / ``merged/`` (export.py),
``metrics.jsonl`` and ``trackers.json`` (trackers.py), ``summary.json`` and ``loss_curve.png``
(training and validation loss and learning rate against step, plots.py).

The loss, in training, in the evaluation during training and in the held-out perplexity
(largetrain_core.evaluate), is one function: loss.next_token_loss.

Evaluation during training (``eval_strategy: steps``, evaluator.py): every ``eval_steps`` steps and
after the last one, the mean next-token cross-entropy (nats) and perplexity on the first
``eval_max_sequences`` sequences of the shards' validation split, divided among the ranks; logged as
``eval_loss`` and ``eval_perplexity`` in the step's metrics, the training's losses bitwise the same
with it and without it (tested on CPU). Optional early stopping (``early_stopping_patience``,
early_stopping.py) ends the run after that many evaluations without improvement; a collapsed training
(``health.stop_after_collapsed_steps`` steps in a row skipped, non-finite or at ln V: health.CollapseWatch)
ends after the last of them, ``collapsed`` in its summary saying why. The loop asks its components when to act:
Evaluator.should_evaluate and checkpoints.Checkpointer.should_save. Fault injection
(LARGETRAIN_FAULT) is a hook outside the loop (rank_signals.FaultInjection, :class:`Trainer`'s ``hooks``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import time
from pathlib import Path

import deepspeed
import numpy as np
import torch
import torch.distributed as dist

from largetrain_core.error_records import concerning
from largetrain_core.rank_signals import FaultInjection, defer_sigterm, preempted, raise_on_sigterm, terminated
from largetrain_core.model import build_model, enable_activation_checkpointing, load_model, parameter_count
from largetrain_core.shards import DistributedSampler
from largetrain_core.storage import write_json_atomic
from largetrain_core.training import checkpoints, distributed, preflight, resume_check, sync, tasks
from largetrain_core.training.config import TrainConfig
from largetrain_core.training.deepspeed_config import deepspeed_config, resolve_precision
from largetrain_core.training.early_stopping import EarlyStopping
from largetrain_core.training.evaluator import Evaluator
from largetrain_core.training.export import export
from largetrain_core.training.flops import flops_formula, job_peak_flops, mfu, model_flops_per_token
from largetrain_core.training.health import CollapseWatch, step_counts
from largetrain_core.training.lora import add_lora
from largetrain_core.training.metrics import MetricsProcessor
from largetrain_core.training.loss import next_token_loss
from largetrain_core.training.plots import training_curves_png
from largetrain_core.training.trackers import METRICS, TrackerError, Trackers, read_metrics

log = logging.getLogger("largetrain.training")


def run(cfg: TrainConfig) -> dict:
    """Train ``cfg`` to ``max_steps`` (resuming per ``resume_from_checkpoint``), export, and return the
    summary (also ``summary.json``). Raises ValueError for an invalid config or unusable shards.
    LARGETRAIN_FAULT set: its faults are injected (rank_signals.FaultInjection), for the fault tests."""
    trainer = Trainer(cfg, hooks=[FaultInjection()] if os.environ.get("LARGETRAIN_FAULT") else [])
    try:
        return trainer.fit()
    except BaseException:
        try:
            trainer.trackers.finish(None, killed=terminated())
        except TrackerError as e:  # already logged per tracker; the training's own error is the one raised
            log.error(f"after the training failed: {e}")
        raise


class Trainer:
    """One rank's part of a run. Rank 0 alone writes the outputs that are not per rank and tracks.

    ``hooks``: objects called at points of the loop, each method optional: ``after_step(step, rank)``
    (after a step's metrics are logged) and ``mid_save(step, rank)`` (a rank's checkpoint files
    written, before the marker)."""

    def __init__(self, cfg: TrainConfig, hooks=()):
        self.cfg = cfg
        self.hooks = list(hooks)
        self.cuda = torch.cuda.is_available()
        preflight.check_config(cfg, self.cuda)
        self.rank, self.world, self.device = distributed.setup()
        # URLs (an object-store root): the ranks work on local copies; checkpoints and outputs are uploaded (sync.py)
        self.cfg, self.remote = cfg, None
        with concerning(cfg.output_dir, "fetching the training's inputs from the object store"):
            self.cfg, self.remote = sync.localize(cfg, dist.barrier)
        cfg = self.cfg
        self.out = Path(cfg.output_dir)
        self.ckpt_root = self.out / "checkpoints"
        if self.rank == 0:
            self.ckpt_root.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        self.trackers = Trackers(cfg, self.rank)
        self.checkpointer = checkpoints.Checkpointer(
            self.ckpt_root, cfg.checkpointing, cfg.schedule.max_steps, self.remote
        )
        self.step = self.consumed = self.steps_this_run = 0
        self.first_loss = self.last_loss = None
        self.collapsed: str | None = None  # why the run stopped early as collapsed (health.CollapseWatch)
        self.evaluator = None  # None: no evaluation during training
        self.eval_seconds = 0.0
        self.metrics = MetricsProcessor(cfg, self.rank, self.trackers, log)
        self.early = EarlyStopping(cfg.evaluation.early_stopping_patience, cfg.evaluation.early_stopping_threshold)

    def call_hooks(self, point: str) -> None:
        """Every hook's method ``point`` (if it has one) with the step and this rank."""
        for hook in self.hooks:
            method = getattr(hook, point, None)
            if method is not None:
                method(self.step, self.rank)

    def info(self, msg: str) -> None:
        if self.rank == 0:
            log.info(msg)

    def fit(self) -> dict:
        """The run: set up, then step, evaluate, log and checkpoint until ``max_steps``; then export."""
        cfg = self.cfg
        self.trackers.start()
        self.setup()
        t_run = time.perf_counter()
        self.saved_step = self.step if self.resumed_from is not None else None  # the newest complete checkpoint's
        if cfg.checkpointing.preemption_save:
            defer_sigterm()  # a SIGTERM now ends the run after its step and a checkpoint of it (stop_if_preempted)
        collapse = CollapseWatch(cfg.health, self.vocab_size, cfg.schedule.warmup_steps)
        while self.step < cfg.schedule.max_steps and not self.early.stopped and self.collapsed is None:
            row = self.train_step()
            row.update(self.evaluate())
            self.metrics.process(self.step, row, time.perf_counter() - t_run, self.steps_this_run)
            self.call_hooks("after_step")
            if self.early.stopped:
                self.info(self.early.reason(self.step))
            if collapse.update(self.step, row):  # every rank sees the same row: all stop after this step
                self.collapsed = collapse.reason
                if self.rank == 0:
                    log.warning(
                        f"{self.collapsed}; its checkpoint and model are written, and its health check fails it"
                    )
            if self.checkpointer.should_save(self.step, stopping=self.early.stopped or self.collapsed is not None):
                self.save()
            if cfg.checkpointing.preemption_save:
                self.stop_if_preempted()
        if cfg.checkpointing.preemption_save:
            raise_on_sigterm()  # the export: a SIGTERM stops it at once (the last step's checkpoint is complete)
        return self.finish(time.perf_counter() - t_run)

    # ------------------------------------------------------------------------------------------
    # setup

    def setup(self) -> None:
        """Seed, open the shards, build the model, start DeepSpeed, resume, and size the step for MFU."""
        cfg = self.cfg
        self.precision, self.precision_reason = resolve_precision(cfg.precision.dtype, self.cuda)
        self.info(f"precision {self.precision}: {self.precision_reason}")
        self.info(
            f"world size {self.world}, device {self.device.type}, ZeRO stage {cfg.parallelism.zero_stage}, "
            f"activation checkpointing {'on' if cfg.parallelism.activation_checkpointing else 'off'}, "
            f"torch threads per rank {torch.get_num_threads()}"
        )
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        with concerning(cfg.train_shards, "opening the token shards"):
            self.data = tasks.open_split(cfg, "train")  # token shards at a URL: streamed through the node's cache
        if len(self.data) == 0:
            raise ValueError(f"{cfg.train_shards}: the train split holds no sequence")
        weights = self.data.manifest.get("class_weights")  # classification: the loss's class weights, if any
        self.class_weights = torch.tensor(weights, dtype=torch.float32, device=self.device) if weights else None
        if cfg.evaluation.eval_strategy != "no":
            self.evaluator = Evaluator(cfg, self.rank, self.world)
        model = self.build_model()
        self.n_params, self.n_trainable = parameter_count(model), parameter_count(model, trainable_only=True)
        self.info(f"parameters {self.n_params:,}, trainable {self.n_trainable:,}")
        self.identity = resume_check.run_identity(cfg, self.data)  # what checkpoints record and resumes compare
        self.resumed_from, load_from = self.resume_point()
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=deepspeed_config(cfg, self.world, self.precision, load_universal=load_from != self.resumed_from),
        )
        self.resume(load_from)
        self.sampler = DistributedSampler(
            len(self.data),
            seed=cfg.seed,
            rank=self.rank,
            world_size=self.world,
            shard_sizes=tuple(self.data.shard_sizes),
            window_shards=cfg.schedule.shuffle_window_shards,
        )
        self.data.follow(
            self.sampler, cfg.schedule.micro_batch_size, lambda: self.consumed
        )  # streamed shards: prefetch
        self.tokens_per_step = (
            cfg.schedule.micro_batch_size * cfg.schedule.gradient_accumulation_steps * self.world * self.data.seq_len
        )
        mcfg = (model.get_base_model() if cfg.mode == "lora" else model).config
        # the logits' width: a uniform prediction's loss is ln of it
        self.vocab_size = mcfg.num_labels if cfg.task == "classification" else mcfg.vocab_size
        shape = (mcfg.num_hidden_layers, mcfg.hidden_size, self.data.seq_len)
        self.flops_per_token = model_flops_per_token(self.n_params, *shape, n_trainable=self.n_trainable)
        self.mfu_formula = flops_formula(self.n_params, self.n_trainable, *shape)
        self.peak, self.peak_source = job_peak_flops(
            cfg.tracking.peak_flops, self.cuda, self.world, int(os.environ.get("LOCAL_WORLD_SIZE", self.world))
        )
        self.info(f"{self.mfu_formula}; peak {self.peak or float('nan'):.3g} FLOP/s: {self.peak_source}")

    def build_model(self):
        """The preset built from scratch (pretrain), the base model with a fresh LoRA adapter (lora), or
        the fine-tuning task's model on the base (largetrain_core.training.tasks.build_model)."""
        cfg, m = self.cfg, self.data.manifest
        if cfg.task != "causal_lm":
            with concerning(cfg.model.base_model, "loading the base model"):
                model, targets = tasks.build_model(cfg, self.data)
            self.info(f"{cfg.task}: LoRA r={cfg.lora.r} lora_alpha={cfg.lora.lora_alpha} on {targets}")
            return model
        if cfg.mode == "pretrain":
            model = build_model(
                cfg.model.preset, m["vocab_size"], self.data.seq_len, m["eos_id"], m.get("bos_id"), seed=cfg.seed
            )
        else:
            with concerning(cfg.model.base_model, "loading the base model"):
                model = load_model(Path(cfg.model.base_model))
            if model.config.vocab_size < m["vocab_size"]:
                raise ValueError(
                    f"{cfg.train_shards}: token ids up to {m['vocab_size'] - 1} "
                    f"do not fit the base model's vocabulary of {model.config.vocab_size}"
                )
        if cfg.parallelism.activation_checkpointing:
            enable_activation_checkpointing(model)
        if cfg.mode == "lora":
            model, targets = add_lora(model, cfg.lora, cfg.parallelism.activation_checkpointing)
            self.info(f"LoRA r={cfg.lora.r} lora_alpha={cfg.lora.lora_alpha} on {targets}")
        return model

    def resume_point(self) -> tuple[Path | None, Path | None]:
        """(the checkpoint ``resume_from_checkpoint`` names, what to load for it): the checkpoint itself,
        or, when it was written by another number of ranks under ZeRO, its universal form, converted
        by rank 0 (checkpoints.universal)."""
        if self.remote is not None and self.cfg.checkpointing.resume_from_checkpoint == "auto":
            if sync.node_leader():  # the newest complete checkpoint in the bucket, local on every node
                self.remote.pull_newest_checkpoint(self.ckpt_root)
            dist.barrier()
        ckpt, skipped = checkpoints.resume_point(self.cfg.checkpointing.resume_from_checkpoint, self.ckpt_root)
        for s in skipped:
            self.info(s)
        self.resumed_world = checkpoints.saved_topology(ckpt)["world_size"] if ckpt else None
        if ckpt is None or not checkpoints.needs_universal(ckpt, self.world):
            return ckpt, ckpt
        self.info(
            f"{ckpt} was written by {self.resumed_world} ranks, this run has {self.world}: "
            "loading it through DeepSpeed's universal checkpoint format"
        )
        if self.rank == 0:
            checkpoints.universal(ckpt, self.ckpt_root)
        dist.barrier()
        return ckpt, checkpoints.universal_dir(ckpt, self.ckpt_root)

    def resume(self, load_from: Path | None) -> None:
        """Load ``load_from`` (engine state, step, samples, RNG), if any."""
        cfg = self.cfg
        if self.resumed_from is None:
            self.info("starting from scratch" if cfg.mode == "pretrain" else f"starting LoRA on {cfg.model.base_model}")
            return
        client = checkpoints.load(self.engine, load_from, self.rank)
        resume_check.check_resume(
            self.resumed_from,
            client,
            self.identity,
            cfg.checkpointing.resume_across_data_change,
            announce=self.rank == 0,
        )
        self.step, self.consumed = client["step"], client["consumed_samples"]
        self.early.load(client.get("early_stopping", {}))
        self.info(f"resumed from {self.resumed_from} at step {self.step}, {self.consumed} samples consumed")

    # ------------------------------------------------------------------------------------------
    # step, evaluate, save

    def train_step(self) -> dict:
        """One optimizer step: ``gradient_accumulation_steps`` micro-batches on every rank; returns the
        step's metrics (loss = mean next-token cross-entropy in nats over every rank's micro-batches)."""
        mb, ga = self.cfg.schedule.micro_batch_size, self.cfg.schedule.gradient_accumulation_steps
        t0 = time.perf_counter()
        skipped_before = int(self.engine.skipped_steps)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        for micro in range(ga):
            idx = self.sampler.indices(self.consumed + micro * mb * self.world, mb)
            if self.cfg.task == "causal_lm":
                batch = torch.from_numpy(self.data.take(idx).astype(np.int64)).to(self.device)
                loss = next_token_loss(self.engine, batch)
            else:
                batch = {k: torch.from_numpy(v).to(self.device) for k, v in self.data.take(idx).items()}
                loss = tasks.task_loss(self.cfg.task, self.engine, batch, weights=self.class_weights)
            self.engine.backward(loss)
            self.engine.step()
            loss_sum += loss.detach().double()
        self.consumed += mb * ga * self.world
        self.step += 1
        self.steps_this_run += 1
        dist.all_reduce(loss_sum)
        step_loss = float(loss_sum) / (ga * self.world)
        self.first_loss = step_loss if self.first_loss is None else self.first_loss
        self.last_loss = step_loss
        row = self.step_metrics(step_loss, time.perf_counter() - t0)
        row["step_skipped"] = int(self.engine.skipped_steps) > skipped_before
        return row

    def step_metrics(self, loss: float, dt: float) -> dict:
        """loss, lr, grad_norm, tokens_per_s, step_time_s (s), consumed_samples, mfu; loss_scale and
        skipped_steps (DeepSpeed's count, kept in checkpoints) in fp16; peak_memory_gib (CUDA allocator) or peak_rss_gib (CPU, this rank)."""
        grad_norm = self.engine.get_global_grad_norm()
        row = {
            "loss": loss,
            "lr": self.scheduler.get_last_lr()[0] if self.scheduler else self.cfg.optimizer.learning_rate,
            "grad_norm": float(grad_norm) if grad_norm is not None else None,
            "tokens_per_s": self.tokens_per_step / dt,
            "step_time_s": dt,
            "consumed_samples": self.consumed,
            "mfu": mfu(self.tokens_per_step / dt, self.flops_per_token, self.peak),
        }
        if self.precision == "fp16":
            opt = self.optimizer
            row["loss_scale"] = float(getattr(opt, "cur_scale", getattr(opt, "loss_scale", float("nan"))))
            row["skipped_steps"] = int(self.engine.skipped_steps)
        row["peak_memory_gib" if self.cuda else "peak_rss_gib"] = peak_memory_gib(self.device)
        return row

    def evaluate(self) -> dict:
        """When the :class:`Evaluator` says so (``eval_strategy: steps``; Evaluator.should_evaluate): ``eval_loss``
        (the :class:`Evaluator`'s mean next-token cross-entropy in nats over every rank's validation
        sequences), ``eval_perplexity`` (exp of it) and ``eval_seconds``; else {}. Every rank takes
        part. Updates the early stopping."""
        if self.evaluator is None or not self.evaluator.should_evaluate(self.step):
            return {}
        loss, seconds = self.evaluator(self.engine, self.device)
        self.eval_seconds += seconds
        self.early.update(loss, self.step)
        return {
            "eval_loss": loss,
            "eval_perplexity": math.exp(loss) if loss < 700 else math.inf,
            "eval_seconds": seconds,
        }

    def stop_if_preempted(self) -> None:
        """After a step: whether any rank got SIGTERM (rank_signals.defer_sigterm), agreed by an all_reduce (MAX)
        of every rank's flag, so that all ranks stop after the same step however far apart their signals
        came. If so, save a complete checkpoint of this step (unless the newest is fewer than
        ``preemption_min_new_steps`` steps older, said in the log) and raise rank_signals.preempted's
        SignalException: transient, the run is retried and resumes from it."""
        flag = torch.tensor([1.0 if terminated() else 0.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if not flag.item():
            return
        ck = self.cfg.checkpointing
        age = None if self.saved_step is None else self.step - self.saved_step
        if age is None or age >= ck.preemption_min_new_steps:
            self.info(
                f"preempted (SIGTERM) after step {self.step}: saving checkpoint {checkpoints.tag(self.step)} "
                f"within preemption_grace_seconds {ck.preemption_grace_seconds:g}"
            )
            self.save()
            saved = f"saved checkpoint {checkpoints.tag(self.step)}"
        else:
            saved = f"kept checkpoint {checkpoints.tag(self.saved_step)}"
            self.info(
                f"preempted (SIGTERM) after step {self.step}: preemption save skipped, checkpoint "
                f"{checkpoints.tag(self.saved_step)} is {age} step(s) old (< preemption_min_new_steps "
                f"{ck.preemption_min_new_steps})"
            )
        raise preempted(f"preempted: SIGTERM, stopped after step {self.step} and {saved}")

    def save(self) -> None:
        """A complete checkpoint of the current step (checkpoints.save), with the sampler's position. A full
        disk raises ``OSError(ENOSPC)`` naming the checkpoint and the free space (checkpoints.no_space_error)."""
        client = {
            "consumed_samples": self.consumed,
            "sampler_seed": self.cfg.seed,
            "sampler_epoch": self.consumed // len(self.data),
            "config_hash": resume_check.identity_hash(self.identity),
            "settings": self.identity,
            "early_stopping": self.early.state(),
        }
        self.checkpointer.save(
            self.engine, self.step, client, self.rank, self.world, dist, mid_save=lambda: self.call_hooks("mid_save")
        )
        self.saved_step = self.step
        self.info(f"checkpoint {checkpoints.tag(self.step)} complete")

    # ------------------------------------------------------------------------------------------
    # the end

    def finish(self, elapsed: float) -> dict:
        """Export, release DeepSpeed, write ``summary.json`` and the curves, hand both to the trackers."""
        export_dir = export(self.engine, self.cfg, self.out, self.rank, dist)
        # Release DeepSpeed's hooks and background state (ZeRO-3 parameter coordinator) on every rank
        # before the process group goes away: without it a ZeRO-3 rank could abort at interpreter exit
        # ("terminate called without an active exception", about 1 run in 4 here).
        self.engine.destroy()
        dist.barrier()
        summary = self.summary(export_dir, elapsed)
        if self.rank == 0:
            self.metrics.flush()
            rows = read_metrics(self.out / METRICS)
            summary.update(step_counts(rows))  # every start's steps, a redone step once
            summary["mean_mfu"] = (
                (sum(r["mfu"] for r in rows if r.get("mfu")) / len(rows)) if self.peak and rows else None
            )
            evals = [r for r in rows if r.get("eval_loss") is not None]  # every start's, a resumed run's too
            if evals:
                best = min(evals, key=lambda r: r["eval_loss"])
                summary.update(
                    eval_loss=evals[-1]["eval_loss"],
                    eval_perplexity=evals[-1]["eval_perplexity"],
                    eval_step=evals[-1]["step"],
                    best_eval_loss=best["eval_loss"],
                    best_eval_step=best["step"],
                )
            title = {"pretrain": "pretraining", "lora": "LoRA adapter"}[self.cfg.mode]
            title += "" if self.cfg.task == "causal_lm" else f" ({self.cfg.task})"
            summary["loss_curve"] = str(training_curves_png(rows, self.out / "loss_curve.png", title))
            write_json_atomic(self.out / "summary.json", summary)
            # Under Dagster (dagster_pipes) the asset logs the exported directories once it has written
            # their model card and lineage.json into them (trackers.log_outputs); run alone, the training does.
            dirs = [] if "dagster_pipes" in self.cfg.tracking.report_to else [export_dir, self.out / "merged"]
            for path in (Path(summary["loss_curve"]), *dirs):
                if path.exists():
                    self.trackers.log_artifact(path)
        failed = None
        try:
            self.trackers.finish({k: v for k, v in summary.items() if v is not None})
        except TrackerError as e:  # raised after every other tracker finished: the outputs are pushed all the same
            failed = e
        if self.remote is not None and self.rank == 0:
            self.remote.push_outputs()
        if failed is not None:
            raise failed
        return summary

    def summary(self, export_dir: Path, elapsed: float) -> dict:
        """The run's totals; tokens/s and MFU over this start's wall time less its evaluations."""
        train_s = elapsed - self.eval_seconds
        tps = (self.steps_this_run * self.tokens_per_step / train_s) if self.steps_this_run else None
        return {
            "steps": self.step,
            "steps_this_run": self.steps_this_run,
            "first_loss": self.first_loss,
            "last_loss": self.last_loss,
            "tokens_per_s": tps,
            "mfu": mfu(tps, self.flops_per_token, self.peak),
            "peak_flops": self.peak,
            "peak_flops_source": self.peak_source,
            "flops_per_token": self.flops_per_token,
            "mfu_formula": self.mfu_formula,
            "stopped_early": self.early.stopped or self.collapsed is not None,
            "collapsed": self.collapsed,
            "eval_seconds": self.eval_seconds,
            "resumed_from": str(self.resumed_from) if self.resumed_from else None,
            "resumed_from_step": self.step - self.steps_this_run if self.resumed_from else None,
            "resumed_from_world_size": self.resumed_world,
            "tokens_seen": self.consumed * self.data.seq_len,
            "precision": self.precision,
            "precision_reason": self.precision_reason,
            "world_size": self.world,
            "zero_stage": self.cfg.parallelism.zero_stage,
            "task": self.cfg.task,
            "parameters": self.n_params,
            "trainable_parameters": self.n_trainable,
            "vocab_size": self.vocab_size,
            "output": str(export_dir),
            "train_seconds": elapsed,
        }


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory since the start or the last :func:`reset_peak_memory`, GiB: the CUDA caching
    allocator's peak allocation on ``device``, or on CPU this process's peak resident set (VmHWM of
    /proc/self/status; ru_maxrss where there is no /proc)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20  # kB
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def reset_peak_memory(device: torch.device) -> None:
    """Start :func:`peak_memory_gib` afresh: ``torch.cuda.reset_peak_memory_stats``, or on Linux "5" to
    /proc/self/clear_refs, which resets VmHWM to the current resident set (proc(5)). Elsewhere a no-op."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
