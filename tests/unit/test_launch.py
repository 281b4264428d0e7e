"""The one torchrun command builder (largetrain_core.launch.torchrun_command): the local, Pipes and
Kubernetes launchers' commands are its, the several-node commands of the guide too, and no other module
assembles a torchrun command. The checkpoints component's schedule (checkpoints.Checkpointer)."""

import re
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import REPO
from largetrain_core.launch import (
    Launcher,
    LocalTorchrun,
    launch_commands,
    module_entry,
    rank_env,
    threads_per_rank,
    torchrun_command,
)
from largetrain_core.training.checkpoints import Checkpointer

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def test_local_and_pipes_launchers_run_the_builders_command():
    from largetrain_dagster.resources import TorchrunLauncher

    local = LocalTorchrun(2).command("/r/spec.json", "largetrain_core.training.calibrate")
    assert local == [*TORCHRUN, "--standalone", "--nproc_per_node", "2"] + [
        "-m",
        "largetrain_core.training.calibrate",
        "/r/spec.json",
    ]
    pipes = TorchrunLauncher(nproc_per_node=2).command(Path("/r/spec.json"), Path("/r/logs"))
    assert pipes == [*TORCHRUN, "--standalone", "--nproc_per_node", "2", "--log-dir", "/r/logs"] + [
        "-m",
        "largetrain_core.training",
        "/r/spec.json",
    ]
    # several hosts through Pipes: node 1's command is the guide's (launch_commands) with this python
    two = TorchrunLauncher(nproc_per_node=4, hosts=["n0", "n1"], node_rank=1, master_port=1234)
    guide = launch_commands("/r/c.json", ["n0", "n1"], 4, port=1234, python=sys.executable, log_dir="/r/logs")
    assert two.command(Path("/r/c.json"), Path("/r/logs")) == shlex.split(guide["torchrun"][1])
    assert guide["torchrun"][1].startswith(
        f"{sys.executable} -m torch.distributed.run --nnodes 2 --node_rank 1 --master_addr n0 --master_port 1234 "
    )


def test_k8s_pod_command_is_the_builders():
    from largetrain_dagster.k8s import K8sTorchrunLauncher

    k8s = K8sTorchrunLauncher(nnodes=3, nproc_per_node=8)
    pod = k8s.pod_manifest("/data/x/train_config.json", "run-1", "base_checkpoint", 2)
    prefix, service = k8s.names("run-1", "base_checkpoint")
    (container,) = pod["spec"]["containers"]
    assert container["command"] == torchrun_command(
        module_entry("largetrain_core.training", "/data/x/train_config.json"),
        8,
        rendezvous="c10d",
        nnodes=3,
        host=f"{prefix}-0.{service}.largetrain.svc.cluster.local",
        port=29400,
        rdzv_id="run-1",
        log_dir=k8s.log_dir("/data/x/train_config.json", "run-1", "base_checkpoint"),
        max_restarts=0,
        python="python",
    )
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["OMP_NUM_THREADS"] == "8" and env["PYTHONUNBUFFERED"] == "1"  # 64 CPUs / 8 ranks
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == str(int(k8s.kill_grace_seconds) + 20)


def test_the_three_launchers_are_launchers():
    from largetrain_dagster.k8s import K8sTorchrunLauncher
    from largetrain_dagster.resources import TorchrunLauncher

    for launcher in (LocalTorchrun(1), TorchrunLauncher(), K8sTorchrunLauncher()):
        assert isinstance(launcher, Launcher), type(launcher).__name__
    assert not isinstance(object(), Launcher)


def test_builder_refuses_what_torchrun_cannot_run():
    with pytest.raises(ValueError, match="standalone rendezvous is one node"):
        torchrun_command(["x.py"], 1, nnodes=2)
    with pytest.raises(ValueError, match="needs the host"):
        torchrun_command(["x.py"], 1, rendezvous="c10d", nnodes=2)
    with pytest.raises(ValueError, match="rendezvous must be"):
        torchrun_command(["x.py"], 1, rendezvous="etcd", nnodes=2, host="h")
    with pytest.raises(ValueError, match="nproc_per_node >= 1"):
        torchrun_command(["x.py"], 0)


def test_rank_env_and_threads(monkeypatch):
    assert rank_env() == {"PYTHONUNBUFFERED": "1"}
    env = rank_env(3, 12.5, "/r/logs")
    assert env["OMP_NUM_THREADS"] == "3" and env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "13"
    assert env["TORCHELASTIC_ERROR_FILE"] == "/r/logs/torchrun-error.json"
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert threads_per_rank(2) == 5 and threads_per_rank(2, 7) == 7
    monkeypatch.delenv("OMP_NUM_THREADS")
    import os

    assert threads_per_rank(2) == max(1, len(os.sched_getaffinity(0)) // 2)


def test_no_other_module_assembles_a_torchrun_command():
    """Goal 1 of issue 41: the argv ``-m torch.distributed.run`` is written in launch.py alone (the unit
    tests, which compare commands with it, aside)."""
    built = re.compile(r"""["']-m["']\s*,\s*["']torch\.distributed\.run["']|-m torch\.distributed\.run \{""")
    places = [
        str(f.relative_to(REPO))
        for top in ("largetrain_core", "largetrain_dagster", "benchmarks", "tests")
        for f in sorted((REPO / top).rglob("*.py"))
        if built.search(f.read_text()) and "tests/unit/" not in f.as_posix()
    ]
    assert places == ["largetrain_core/launch.py"]


def test_checkpointer_saves_every_save_steps_the_last_and_a_stopping_step():
    ck = Checkpointer(Path("/r/checkpoints"), SimpleNamespace(save_steps=4, save_total_limit=2), max_steps=10)
    assert [s for s in range(1, 11) if ck.should_save(s)] == [4, 8, 10]
    assert ck.should_save(3, stopping=True) and not ck.should_save(3)
