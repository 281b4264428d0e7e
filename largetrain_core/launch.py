"""Starting and stopping training processes: the launch commands for one or several nodes, the
Linux process tree (torchrun starts each rank in a session of its own), and the fault-injection hook
the tests use to crash a run the way a power cut would.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
from pathlib import Path

log = logging.getLogger("largetrain.launch")

ENTRY_MODULE = "largetrain_core.training"


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, process group id) of ``pid`` from Linux ``/proc/<pid>/stat``; None once it
    has ended. State ``Z`` is a zombie: dead, not yet reaped by its parent."""
    try:
        fields_ = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields_[0], int(fields_[1]), int(fields_[2])


def process_tree(root: int) -> list[int]:
    """``root`` and every descendant process (Linux ``/proc/<pid>/stat``), parents before children.

    Needed because torchrun starts each rank in a session of its own (``start_new_session=True`` in
    torch.distributed.elastic's SubprocessHandler): signalling the agent's process group misses the ranks.
    """
    children: dict[int, list[int]] = {}
    for d in Path("/proc").glob("[0-9]*"):
        st = proc_stat(int(d.name))
        if st is not None:  # else the process ended while we looked
            children.setdefault(st[1], []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo.extend(sorted(children.get(pid, [])))
    return out


def maybe_fault(point: str, step: int, rank: int) -> None:
    """LARGETRAIN_FAULT="after_step:N" (after step N's metrics row) or "mid_save:N" (after this rank's
    ``save_checkpoint`` of step N returned, before the barrier and the completion marker): rank 0
    SIGKILLs the torchrun agent, every rank and itself at once, as a crash or power cut would."""
    spec = os.environ.get("LARGETRAIN_FAULT", "")
    if rank == 0 and spec == f"{point}:{step}":
        import signal

        log.warning(f"LARGETRAIN_FAULT {spec}: SIGKILL to the torchrun agent and all ranks")
        for h in logging.getLogger().handlers:
            h.flush()
        me = os.getpid()
        for pid in process_tree(os.getppid()):
            if pid != me:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        os.kill(me, signal.SIGKILL)


def launch_commands(config_path: str, hosts: list[str], nproc_per_node: int, port: int = 29500,
                    rdzv_backend: str = "static", python: str = "python") -> dict:
    """The commands that start ``config_path`` on ``hosts`` (node rank = position in the list; the first
    host holds the rendezvous store), ``nproc_per_node`` ranks on each.

    Returns ``{"torchrun": [one command per node, to run on that node], "hostfile": DeepSpeed hostfile
    text ("host slots=N" lines), "deepspeed": the one command to run on hosts[0] with that hostfile
    (the deepspeed launcher reaches the other hosts by pdsh/ssh)}``. rdzv_backend "static": torchrun's
    fixed ranks (--node_rank, --master_addr/--master_port); "c10d": elastic rendezvous at hosts[0]:port,
    node ranks assigned by the rendezvous. Raises ValueError on an empty host list or bad backend.
    """
    if not hosts or nproc_per_node < 1:
        raise ValueError("need at least one host and nproc_per_node >= 1")
    if rdzv_backend not in ("static", "c10d"):
        raise ValueError(f"rdzv_backend must be 'static' or 'c10d', not {rdzv_backend!r}")
    n = len(hosts)
    cmds = []
    for i in range(n):
        if n == 1:
            where = "--standalone"
        elif rdzv_backend == "static":
            where = f"--nnodes {n} --node_rank {i} --master_addr {hosts[0]} --master_port {port}"
        else:
            where = f"--nnodes {n} --rdzv_backend c10d --rdzv_endpoint {hosts[0]}:{port} --rdzv_id largetrain"
        cmds.append(f"{shlex.quote(python)} -m torch.distributed.run {where} --nproc_per_node {nproc_per_node} "
                    f"-m {ENTRY_MODULE} {shlex.quote(str(config_path))}")
    hostfile = "".join(f"{h} slots={nproc_per_node}\n" for h in dict.fromkeys(hosts))
    ds = (f"deepspeed --hostfile hostfile --master_addr {hosts[0]} --master_port {port} "
          f"--module {ENTRY_MODULE} {shlex.quote(str(config_path))}")
    return {"torchrun": cmds, "hostfile": hostfile, "deepspeed": ds}
