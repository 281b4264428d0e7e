"""The training plan: what a training will need and take, computed before anything is launched, and
the blocking check that refuses a training that cannot fit.

:func:`make_plan` gives, for a :class:`~largetrain_core.training.config.TrainConfig` on ``world_size``
ranks: parameters (all, trainable), tokens per step, memory per device (model states, DeepSpeed's
buffers, activations, the peak), the checkpoint size on disk, time per step and for the run from a
measured throughput (:class:`Throughput`: a calibration, :mod:`largetrain_core.training.calibrate`, or
the ``optimization_report``'s figures for the same model and hardware), tokens per parameter, and the
cost from a price per device-hour. :meth:`Plan.problems` says what does not fit (device memory, the
storage root's disk, ``max_hours``, ``max_cost``) and what to change; :func:`check` raises
:class:`PlanError` with it. :func:`plan_vs_measured` sets the plan beside what a finished run measured.

Memory per device, in bytes (Ψ parameters, Ψ_t of them trained, N_d data-parallel ranks; w bytes per
weight and g per gradient in the training dtype: 4 in fp32, 2 in fp16/bf16):

* Model states, Rajbhandari et al. 2020 (ZeRO), section 3 and Figure 1: mixed-precision Adam keeps
  wΨ weights, gΨ_t gradients and KΨ_t optimizer state, K = 12 (fp32 weights, momentum, variance).
  DeepSpeed keeps that fp32 copy also when training in fp32 (the ZeRO optimizers step on an fp32
  partition of their own), so K = 12 for every stage >= 1; without ZeRO in fp32 the optimizer steps
  the weights themselves, K = 8. Stage 1 divides the optimizer state by N_d, stage 2 also the
  gradients, stage 3 also the weights, except the parameters DeepSpeed keeps whole on every rank
  (fewer elements than ``stage3_param_persistence_threshold``, default 10^5).
* DeepSpeed's buffers (its ZeRO config defaults, deepspeed.runtime.zero.config): the gradient
  reduction bucket of ``reduce_bucket_size`` elements (5 x 10^8) in the training dtype, allocated
  during each backward pass under stages 1-2 (two with ``overlap_comm``) and kept under stage 3; under
  stage 3 also the gathered weights of the partitioned parameters in use (at most the largest module
  plus ``stage3_prefetch_bucket_size``).
* Activations per micro-batch of b sequences of s tokens (T = b·s), d bytes per activation (the
  training dtype), h hidden size, h_kv the key/value width, i the MLP width, a heads, L layers, V the
  vocabulary: every tensor autograd saves for the backward pass, counted as Korthikanti et al. 2022
  ("Reducing Activation Recomputation in Large Transformer Models"), section 4.1, count them for GPT,
  here for transformers' Llama decoder block with memory-efficient attention (SDPA: no a·s² term),
  per token and layer ``2(4 + d)h + d(4h + 2h_kv) + 4di + 4a + 8`` (the two RMSNorms keep their fp32
  input and normalized output; attention its normed input, rotated q and k, v, output and o_proj
  input; the SwiGLU MLP gate, SiLU(gate), up and their product; the attention's fp32 log-sum-exp and
  the norms' fp32 reciprocal RMS). The coefficients were counted with
  ``torch.autograd.graph.saved_tensors_hooks`` on transformers 5's LlamaDecoderLayer in fp32 and bf16.
  The output head keeps ``(4 + 2d)h + 4V`` per token (the final norm, the head's input and the fp32
  log-softmax of the logits: the logits themselves are saved by no backward function and are freed once
  training/loss.py returns the loss), and the loss's backward pass adds ``8V`` (the fp32 gradients
  of the log-softmax and of its input). With activation checkpointing each block keeps only its input
  (d·h per token) and the backward pass recomputes one block at a time: the peak is then during the
  backward pass of the last block, with its recomputed activations, its own gradients in flight
  (d(3i + 2h) per token) and the output head's weight gradient.
* Peak per device = weights + optimizer state + what the backward pass adds, which depends on the
  stage (DeepSpeed 0.19's order of allocations, measured here): stage 0, max(activation peak, 2 x
  gradients: the all-reduce flattens them into one buffer at the end of the backward pass); stages
  1-2, max(activation peak, reduce bucket + the activations left once the output head's backward is
  done, when the first gradient fills the bucket); stage 3, gradient partition + reduce bucket +
  gathered weights + activation peak + the gathered weights' full gradients (made before their
  reduce-scatter).

A LoRA adapter adds its A output (d·r per token per adapted module) to the activations; its base
weights are frozen (no gradient, no optimizer state). In mode lora the trainer's activation
checkpointing was measured to save nothing under DeepSpeed (the same peak as without it, on CPU), so
the plan counts the activations without it there. Other model types than Llama are estimated with
the same count (stated in the plan). Tested (tests/integration/test_plan.py) against the calibration's measured
memory on CPU for several presets and stages: within 10 % of the peak (the reduce bucket aside).
"""

from largetrain_core.training.plan.settings import GiB, PLAN, PLAN_TABLE, PlanError, PlanSettings, THROUGHPUT_SOURCES
from largetrain_core.training.plan.memory import (
    ModelShape,
    activations,
    bytes_under,
    checkpoint_bytes,
    device_memory,
    free_disk,
    memory,
    model_shape,
    zero_settings,
)
from largetrain_core.training.plan.throughput import Throughput, calibrate_here, from_calibration, from_report
from largetrain_core.training.plan.report import Plan, plan_numbers, plan_vs_measured
from largetrain_core.training.plan.build import alternatives, check, make_plan, plan_before_launch
from largetrain_core.training.plan.cli import main

__all__ = [
    "GiB",
    "PLAN",
    "PLAN_TABLE",
    "PlanError",
    "PlanSettings",
    "THROUGHPUT_SOURCES",
    "ModelShape",
    "activations",
    "bytes_under",
    "checkpoint_bytes",
    "device_memory",
    "free_disk",
    "memory",
    "model_shape",
    "zero_settings",
    "Throughput",
    "calibrate_here",
    "from_calibration",
    "from_report",
    "Plan",
    "plan_numbers",
    "plan_vs_measured",
    "alternatives",
    "check",
    "make_plan",
    "plan_before_launch",
    "main",
]
