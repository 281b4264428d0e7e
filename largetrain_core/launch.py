"""Launching a training: the one torchrun command builder, the ranks' environment, the ``Launcher``
protocol and its local implementation, and the commands for several nodes.

Every torchrun in the project is :func:`torchrun_command`'s: the local runs (:class:`LocalTorchrun`: the
ablation, the calibration), the Dagster launchers (largetrain_dagster.resources.TorchrunLauncher through
Pipes, largetrain_dagster.k8s.K8sTorchrunLauncher on Kubernetes), :func:`launch_commands` for the guide's
several-node commands, the benchmarks and the tests. A rank's signals are largetrain_core.rank_signals,
its error records largetrain_core.error_records; starting and stopping processes in general is
largetrain_core.processes.
"""

from __future__ import annotations

import math
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from largetrain_core.error_records import AGENT_ERROR_FILE
from largetrain_core.processes import exit_status, run_in_group

ENTRY_MODULE = "largetrain_core.training"

Rendezvous = Literal["standalone", "static", "c10d"]


def torchrun_command(
    entry: Sequence[str],
    nproc_per_node: int,
    *,
    rendezvous: Rendezvous = "standalone",
    nnodes: int = 1,
    node_rank: int = 0,
    host: str | None = None,
    port: int = 29500,
    rdzv_id: str = "largetrain",
    log_dir: str | Path | None = None,
    max_restarts: int | None = None,
    python: str = sys.executable,
) -> list[str]:
    """The argv of one node's torchrun (``python -m torch.distributed.run``): its options, then ``entry``,
    the program and its arguments (``["-m", module, config]``: :func:`module_entry`; or ``[script, ...]``).

    ``rendezvous``: "standalone" (one node, torchrun's own local rendezvous); "static" (fixed node ranks:
    ``--node_rank node_rank --master_addr host --master_port port``); "c10d" (elastic rendezvous at
    ``host:port`` with id ``rdzv_id``, node ranks assigned by it). ``log_dir``: torchrun's ``--log-dir``,
    where each rank's error file is written (error_records.rank_errors reads them); ``max_restarts``:
    torchrun's ``--max_restarts`` (None: torchrun's default, 0). Raises ValueError on ``nproc_per_node`` or
    ``nnodes`` < 1, an unknown rendezvous, or a several-node rendezvous without ``host``."""
    if nproc_per_node < 1 or nnodes < 1:
        raise ValueError(f"need nproc_per_node >= 1 and nnodes >= 1, not {nproc_per_node} and {nnodes}")
    if rendezvous == "standalone":
        if nnodes != 1:
            raise ValueError(f"a standalone rendezvous is one node, not {nnodes}")
        where = ["--standalone"]
    elif host is None:
        raise ValueError(f"the {rendezvous!r} rendezvous needs the host of node 0")
    elif rendezvous == "static":
        where = ["--nnodes", str(nnodes), "--node_rank", str(node_rank)]
        where += ["--master_addr", host, "--master_port", str(port)]
    elif rendezvous == "c10d":
        where = ["--nnodes", str(nnodes), "--rdzv_backend", "c10d", "--rdzv_endpoint", f"{host}:{port}"]
        where += ["--rdzv_id", rdzv_id]
    else:
        raise ValueError(f"rendezvous must be 'standalone', 'static' or 'c10d', not {rendezvous!r}")
    cmd = [python, "-m", "torch.distributed.run", *where, "--nproc_per_node", str(nproc_per_node)]
    cmd += ["--max_restarts", str(max_restarts)] if max_restarts is not None else []
    cmd += ["--log-dir", str(log_dir)] if log_dir else []
    return cmd + list(entry)


def module_entry(module: str, *args: str | Path) -> list[str]:
    """:func:`torchrun_command`'s ``entry`` for ``python -m module args...``."""
    return ["-m", module, *map(str, args)]


def threads_per_rank(nproc_per_node: int, threads: int = 0) -> int:
    """OMP_NUM_THREADS of each rank: ``threads`` when > 0, else this process's OMP_NUM_THREADS when set (a
    share of a machine shared with other work, as torchrun itself honours it), else the cores this process
    may use / ``nproc_per_node`` (at least 1), so that ranks x threads <= cores."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    return (
        threads
        or (int(given) if given.isdigit() and int(given) > 0 else 0)
        or max(1, len(os.sched_getaffinity(0)) // nproc_per_node)
    )


def rank_env(
    threads: int | None = None, grace_seconds: float | None = None, log_dir: str | Path | None = None
) -> dict[str, str]:
    """The variables a launcher adds to torchrun's environment: PYTHONUNBUFFERED=1 (the log follows the
    run); OMP_NUM_THREADS ``threads`` (None: inherited); TORCH_ELASTIC_SHUTDOWN_TIMEOUT ``grace_seconds``
    rounded up (torchrun's wait between SIGTERM and SIGKILL to its ranks: their preemption save); with
    ``log_dir``, TORCHELASTIC_ERROR_FILE, the torchrun agent's own error file there
    (error_records.AGENT_ERROR_FILE)."""
    env = {"PYTHONUNBUFFERED": "1"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    if grace_seconds is not None:
        env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(math.ceil(grace_seconds))
    if log_dir:
        env["TORCHELASTIC_ERROR_FILE"] = str(Path(log_dir) / AGENT_ERROR_FILE)
    return env


@runtime_checkable
class Launcher(Protocol):
    """What starts an entry point (``module``, by default the training) under torchrun on ``config_path``,
    waits for it and returns what rank 0 reported (a dict, {} when it reports through files only).
    Implementations: :class:`LocalTorchrun` (this host, no orchestrator), largetrain_dagster.resources.
    TorchrunLauncher (through Dagster Pipes, one or several hosts), largetrain_dagster.k8s.
    K8sTorchrunLauncher (pods). ``context`` is the caller's Dagster step context for the Dagster ones,
    unused by :class:`LocalTorchrun`. Each builds its command with :func:`torchrun_command`."""

    nproc_per_node: int

    def run(
        self,
        context: Any,
        config_path: Path,
        log_path: Path,
        module: str = ENTRY_MODULE,
        grace_seconds: float | None = None,
    ) -> dict: ...


@dataclass(frozen=True)
class LocalTorchrun:
    """torchrun on this host (standalone rendezvous) in a process group of its own
    (largetrain_core.processes.run_in_group: an interrupt stops every rank), for runs without an
    orchestrator: the ablation, the calibration, the planner's. ``threads``: OMP_NUM_THREADS of each rank
    (None: inherited); ``grace_seconds``: between SIGTERM and SIGKILL when it is stopped."""

    nproc_per_node: int
    threads: int | None = None
    grace_seconds: float = 10.0
    what: str = "the run"

    def command(self, config_path: str | Path, module: str = ENTRY_MODULE) -> list[str]:
        return torchrun_command(module_entry(module, config_path), self.nproc_per_node)

    def run(
        self,
        context: Any,
        config_path: Path,
        log_path: Path,
        module: str = ENTRY_MODULE,
        grace_seconds: float | None = None,
    ) -> dict:
        """Run ``module`` on ``config_path`` to its end, its output in ``log_path``; returns {} (the entry
        points here report through their files). Raises RuntimeError with the log's last 30 lines when the
        processes fail."""
        env = {**os.environ, **rank_env(self.threads)}
        grace = self.grace_seconds if grace_seconds is None else grace_seconds
        code = run_in_group(self.command(config_path, module), env, Path(log_path), grace_seconds=grace)
        if code != 0:
            tail = "\n".join(Path(log_path).read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"{self.what} ended with {exit_status(code)}; last lines of {log_path}:\n{tail}")
        return {}


def launch_commands(
    config_path: str,
    hosts: list[str],
    nproc_per_node: int,
    port: int = 29500,
    rdzv_backend: str = "static",
    python: str = "python",
    log_dir: str | None = None,
    module: str = ENTRY_MODULE,
) -> dict:
    """The commands that start ``module`` (the training; or the ablation,
    largetrain_core.training.ablation) with ``config_path`` on ``hosts`` (node rank = position in the
    list; the first host holds the rendezvous store), ``nproc_per_node`` ranks on each.

    Returns ``{"torchrun": [one shell command per node (:func:`torchrun_command`), to run on that node],
    "hostfile": DeepSpeed hostfile text ("host slots=N" lines), "deepspeed": the one command to run on
    hosts[0] with that hostfile (the deepspeed launcher reaches the other hosts by pdsh/ssh)}``.
    rdzv_backend "static": torchrun's fixed ranks; "c10d": elastic rendezvous at hosts[0]:port; one host:
    standalone. Raises ValueError on an empty host list or bad backend."""
    if not hosts or nproc_per_node < 1:
        raise ValueError("need at least one host and nproc_per_node >= 1")
    if rdzv_backend not in ("static", "c10d"):
        raise ValueError(f"rdzv_backend must be 'static' or 'c10d', not {rdzv_backend!r}")
    n = len(hosts)
    cmds = [
        shlex.join(
            torchrun_command(
                module_entry(module, config_path),
                nproc_per_node,
                rendezvous="standalone" if n == 1 else rdzv_backend,
                nnodes=n,
                node_rank=i,
                host=hosts[0],
                port=port,
                log_dir=log_dir,
                python=python,
            )
        )
        for i in range(n)
    ]
    hostfile = "".join(f"{h} slots={nproc_per_node}\n" for h in dict.fromkeys(hosts))
    ds = (
        f"deepspeed --hostfile hostfile --master_addr {hosts[0]} --master_port {port} "
        f"--module {module} {shlex.quote(str(config_path))}"
    )
    return {"torchrun": cmds, "hostfile": hostfile, "deepspeed": ds}
