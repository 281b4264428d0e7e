"""Joining the torchrun job, for the trainer and the ablation alike: one process group (NCCL on CUDA,
gloo on CPU, through ``deepspeed.init_distributed``, which does nothing when it exists) and this
rank's device."""

from __future__ import annotations

import os

import deepspeed
import torch
import torch.distributed as dist


def setup() -> tuple[int, int, torch.device]:
    """(rank, world size, device): ``cuda:LOCAL_RANK`` (made the current device) when CUDA is
    available, else the CPU. RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from torchrun."""
    cuda = torch.cuda.is_available()
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    return dist.get_rank(), dist.get_world_size(), device
