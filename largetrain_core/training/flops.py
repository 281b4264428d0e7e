"""Model FLOPs per token, the job's peak FLOP/s (CUDA data sheets or this host's CPUs), and MFU.

MFU (model FLOPs utilization, Chowdhery et al. 2022, PaLM, appendix B) = achieved tokens/s x model
FLOPs per token / peak FLOP/s; activation recomputation is not counted.
"""

from __future__ import annotations

import os
import re

from largetrain_core.training.cpu import cpu_fields

# Dense fp16/bf16 tensor-core peak FLOP/s per device (vendor data sheets, without sparsity).
CUDA_PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12, "V100": 125e12}

FLOPS_SOURCES = (
    "6N + 12LHS: Chowdhery et al. 2022 (PaLM), appendix B; the backward pass as gradients with respect "
    "to the inputs plus to the weights, 2N FLOPs per token each: Narayanan et al. 2021 (Megatron-LM, SC21), "
    "FLOPs count"
)


def model_flops_per_token(
    n_params: int, n_layers: int, hidden: int, seq_len: int, n_trainable: int | None = None
) -> float:
    """Training FLOPs per token: 4 N + 2 N_trainable + 12 L H S.

    A weight matrix costs 2 FLOPs per parameter per token in the forward pass, 2 more for the
    gradient with respect to its input and 2 more for the gradient with respect to itself
    (Narayanan et al. 2021, Megatron-LM, their FLOPs count); a frozen weight (LoRA's base model) needs no weight
    gradient, so only the ``n_trainable`` parameters pay the last 2. The attention scores (QK^T and
    AV, no weights) cost 4 L H S forward and twice that backward, trained or frozen: 12 L H S.
    With every weight trained this is 6 N + 12 L H S (Chowdhery et al. 2022, PaLM, appendix B).
    Activation recomputation is not counted, as MFU prescribes.

    n_params: every parameter that takes part in the matmuls (for LoRA the base model and the
    adapter); n_trainable: those that get a weight gradient (None: all of them).
    """
    n_trainable = n_params if n_trainable is None else n_trainable
    return 4.0 * n_params + 2.0 * n_trainable + 12.0 * n_layers * hidden * seq_len


def flops_formula(n_params: int, n_trainable: int, n_layers: int, hidden: int, seq_len: int) -> str:
    """The FLOPs-per-token formula of :func:`model_flops_per_token` with its numbers and sources, for reports."""
    terms = (
        "6N + 12LHS" if n_trainable == n_params else "4N + 2N_trainable + 12LHS (frozen weights: no weight gradient)"
    )
    return (
        f"MFU = tokens/s x FLOPs/token / peak FLOP/s; FLOPs/token = {terms} with N = {n_params:,}, "
        f"N_trainable = {n_trainable:,}, L = {n_layers}, H = {hidden}, S = {seq_len} = "
        f"{model_flops_per_token(n_params, n_layers, hidden, seq_len, n_trainable):.4g} "
        f"(recomputation not counted; {FLOPS_SOURCES})"
    )


def cpu_peak_flops(cores: int | None = None, ghz: float | None = None, cpuinfo: str | None = None) -> tuple[float, str]:
    """fp32 peak FLOP/s of this host's CPUs: cores x clock x FLOPs per cycle per core, and how it was derived.

    FLOPs per cycle per core = 2 (a fused multiply-add is 2 FLOPs) x 2 FMA units x fp32 lanes per unit.
    Lanes: 16 with AVX-512 on Intel (two 512-bit FMA units on Xeon Scalable Gold/Platinum), 8 with
    AVX2/FMA and on AMD (Zen 2-4 execute on 256-bit FMA pipes; Zen 4 splits AVX-512 in two), 4 otherwise
    (SSE). cores: the CPUs this process may run on (sched_getaffinity); ghz: nominal clock from the
    model name ("@ 2.60GHz") else "cpu MHz" of /proc/cpuinfo (``cpuinfo``: its text instead;
    cpu.cpu_fields). Override with TrainConfig.peak_flops when the host's real figure is known (turbo,
    one FMA unit on some SKUs).
    """
    fields = cpu_fields(cpuinfo)
    cores = cores or len(os.sched_getaffinity(0))
    flags = set(fields.get("flags", "").split())
    amd = fields.get("vendor_id") == "AuthenticAMD"
    if ghz is None:
        nominal = re.search(r"@\s*([\d.]+)\s*GHz", fields.get("model name", ""))
        mhz = re.match(r"[\d.]+", fields.get("cpu MHz", ""))
        ghz = float(nominal.group(1)) if nominal else float(mhz.group(0)) / 1000 if mhz else 2.0
    lanes = 16 if "avx512f" in flags and not amd else 8 if ("avx2" in flags or "avx512f" in flags) else 4
    per_cycle = 2 * 2 * lanes
    how = (
        f"{cores} cores x {ghz:.2f} GHz x {per_cycle} fp32 FLOPs/cycle (2 per FMA x 2 FMA units x {lanes} lanes"
        f"{', AMD 256-bit pipes' if amd else ''}{', AVX-512' if lanes == 16 else ', AVX2' if lanes == 8 else ''})"
    )
    return cores * ghz * 1e9 * per_cycle, how


def job_peak_flops(configured: float | None, cuda: bool, world: int, local_world: int) -> tuple[float | None, str]:
    """Peak FLOP/s of the whole job (``world`` ranks, ``local_world`` per host) and its source: ``configured``
    (TrainConfig.peak_flops), the device table, the CPU derivation per host, or None (unknown)."""
    if configured:
        return configured, "peak_flops from config"
    if cuda:
        import torch

        name = torch.cuda.get_device_name()
        for key, flops in CUDA_PEAK_FLOPS.items():
            if key in name:
                return flops * world, f"{world} x {key} dense fp16/bf16 peak {flops:.3g} FLOP/s (data sheet)"
        return None, f"no peak known for {name}: set peak_flops"
    per_host, how = cpu_peak_flops()
    hosts = max(1, world // max(local_world, 1))
    return per_host * hosts, f"{hosts} host(s) x {how}"


def mfu(tokens_per_s: float | None, flops_per_token: float, peak: float | None) -> float | None:
    """Model FLOPs utilization in [0, 1] (more only when ``peak`` is understated); None without a peak or rate."""
    return tokens_per_s * flops_per_token / peak if tokens_per_s and peak else None
