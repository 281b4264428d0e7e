"""Joining the torchrun job, for the trainer and the ablation alike: one process group (NCCL on CUDA,
gloo on CPU, through ``deepspeed.init_distributed``, which does nothing when it exists) and this
rank's device; and where DeepSpeed builds its ops."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist

from largetrain_core.training.cpu import cpu_fields


def setup() -> tuple[int, int, torch.device]:
    """(rank, world size, device): ``cuda:LOCAL_RANK`` (made the current device) when CUDA is
    available, else the CPU. RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from torchrun.
    DeepSpeed's ops are prepared first (:func:`prepare_op_builds`)."""
    prepare_op_builds()
    cuda = torch.cuda.is_available()
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    return dist.get_rank(), dist.get_world_size(), device


def prepare_op_builds() -> None:
    """Where and how DeepSpeed JIT-builds its ops (the fused Adam; the shared-memory comm op on CPU).

    - TORCH_EXTENSIONS_DIR defaults to ``<virtualenv>/torch_extensions``: the default,
      ~/.cache/torch_extensions, is shared by every virtualenv of the user, and two checkouts would
      rebuild the ops in turn (about 45 s each time).
    - Each op builder takes its compiler flags (``-march``, the SIMD width) from py-cpuinfo's
      ``get_cpu_info()``, twice per op and rank at every start. That call starts a Python interpreter
      which measures the CPU: 1.2 CPU s and 1.3 s each on a 2-core EPYC, 2.5 s of every rank's start. On
      x86-64 Linux :func:`cpu_info` answers from /proc/cpuinfo instead, with the fields DeepSpeed reads;
      the flags, and so the cached build, are the same (tests/unit/test_startup.py compares them).
      Elsewhere py-cpuinfo answers as before.
    """
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    info = cpu_info()
    if info is not None:
        import cpuinfo

        cpuinfo.get_cpu_info = lambda: dict(info)


# The DeepSpeed ops a training loads on the CPU: the fused Adam and the shared-memory collectives of
# deepspeed.comm (deepspeed/comm/torch.py: build_shm_op)
CPU_OPS = ("FusedAdamBuilder", "ShareMemCommBuilder")


def build_ops() -> list[str]:
    """JIT-build (or find built) the ops a training loads on this machine's accelerator, into
    TORCH_EXTENSIONS_DIR (:func:`prepare_op_builds`), so that the first training does not compile them in
    its ranks: about 4 CPU min of g++ once per virtualenv on a 2-core machine. ``make install`` calls it.
    Returns the builders' names. Only the CPU's ops: on CUDA, DeepSpeed builds its ops when a training
    first loads them, as it does without this (nvcc is not needed to install).

    Raises RuntimeError (torch.utils.cpp_extension) when the compiler fails."""
    from deepspeed.accelerator import get_accelerator

    prepare_op_builds()
    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        return []
    for name in CPU_OPS:
        accelerator.create_op_builder(name).load()
    return list(CPU_OPS)


def cpu_info(text: str | None = None, machine: str | None = None) -> dict | None:
    """What DeepSpeed's op builders and CPU optimizers read of py-cpuinfo's ``get_cpu_info()``, in its
    spelling: ``arch`` ("X86_64"), ``bits``, ``flags`` (sorted list of str), ``vendor_id_raw`` and
    ``brand_raw``, from ``text`` (default /proc/cpuinfo) on ``machine`` (default platform.machine()).
    None where that is not x86-64 Linux or the file has no flags line."""
    if (machine or platform.machine()).lower() not in ("x86_64", "amd64"):
        return None
    first = cpu_fields(text)
    if "flags" not in first:
        return None
    return {
        "arch": "X86_64",
        "bits": 64,
        "flags": sorted(set(first["flags"].split())),
        "vendor_id_raw": first.get("vendor_id", ""),
        "brand_raw": first.get("model name", ""),
    }
