"""Resources: where artefacts live, the handle IO manager, the training launcher, the trackers' settings."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path

from dagster import (
    AssetKey,
    AssetObservation,
    ConfigurableIOManager,
    ConfigurableResource,
    Failure,
    InitResourceContext,
    InputContext,
    MetadataValue,
    OutputContext,
    PipesTempFileContextInjector,
    PipesTempFileMessageReader,
    open_pipes_session,
)

from largetrain_core.launch import (
    AGENT_ERROR_FILE,
    ENTRY_MODULE,
    describe_failure,
    exit_status,
    launch_commands,
    proc_stat,
    process_tree,
    rank_errors,
)
from largetrain_core.storage import ArtefactError, read_json, relative_to_root, resolve_under, verify_manifest, write_json_atomic
from largetrain_core.training.config import TRACKING, TrainConfig
from largetrain_dagster.configs import RunConfigError, check_ops_keys, dagster_config
from largetrain_dagster.progress import TrainingProgress


class Storage(ConfigurableResource):
    """The storage root (docs/ARCHITECTURE.md, Lineage). Artefacts go to ``<root>/<asset key path>/<data_version>/``.

    Every asset of the lineage uses it, so its setup also holds the run config rule: before a step's
    body runs, every key under the run config's ``ops`` must name a step (configs.check_ops_keys), else
    the step fails with the valid names. ``dagster asset materialize -c`` would otherwise drop such a key
    without a word."""

    root: str = ".largetrain"

    def path(self, *parts: str) -> Path:
        return Path(self.root).resolve().joinpath(*parts)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        run, instance = context.dagster_run, context.instance
        if run is None or instance is None:  # built outside a run (a test, a sensor): no run config to check
            return
        selected, known = run_steps(instance, run)
        if not selected:
            return
        try:
            unused = check_ops_keys(run.run_config, selected, known)
        except RunConfigError as e:
            raise Failure(str(e)) from None
        if unused and CONFIG_CHECKED_TAG not in (instance.get_run_by_id(run.run_id) or run).tags:
            instance.add_run_tags(run.run_id, {CONFIG_CHECKED_TAG: "true"})  # one log line per run, not per step
            context.log.info(f"run config for steps outside this run, not used by it: {', '.join(unused)} "
                             f"(they apply to the runs that select those steps)")


CONFIG_CHECKED_TAG = "largetrain/run_config_checked"


def run_steps(instance, run) -> tuple[set[str], set[str]]:
    """(the steps of ``run``, every step of the job it was selected from): node names from the run's job
    snapshot and its parent's (an asset selection of the CLI or the UI runs a subset of the code
    location's implicit asset job). Empty sets when the instance holds no snapshot."""
    def nodes(snapshot_id):
        snap = instance.get_job_snapshot(snapshot_id) if snapshot_id else None
        return (snap, {n.node_name for n in snap.dep_structure_snapshot.node_invocation_snaps}) if snap else (None, set())

    snap, selected = nodes(run.job_snapshot_id)
    lineage = snap.lineage_snapshot if snap else None
    known = nodes(lineage.parent_snapshot_id)[1] if lineage else set()
    return selected, known | selected


def handle_file(root: str | Path, key: AssetKey, partition: str | None = None) -> Path:
    """Where the handle of ``key`` (of ``partition``, for a partitioned asset) lies under the storage root."""
    base = Path(root).resolve() / "_handles" / "/".join(key.path)
    return base / f"{partition}.json" if partition is not None else base.with_suffix(".json")


def read_handle(root: str | Path, key: AssetKey, partition: str | None = None) -> dict | None:
    """The handle of ``key`` (see :class:`HandleIOManager`) with its paths resolved under ``root``, or
    None when it has not been materialized."""
    f = handle_file(root, key, partition)
    return resolve_under(read_json(f, f"handle of {key.to_user_string()} (JSON: path, data_version, stats)"), Path(root).resolve()) if f.exists() else None


# Which of `make demo` and the README's recipes (configs/*.yaml, section "Your own data and model")
# materialize an artefact that later runs build on; the other assets come from every recipe that needs them.
MADE_BY = {
    "tokenizer": ("demo", 2, 3), "base_checkpoint": ("demo", 2, 3),
    "pretrain/raw_corpus": ("demo", 2), "pretrain/cleaned_text": ("demo", 2), "pretrain/deduplicated_text": ("demo", 2),
    "pretrain/token_shards": ("demo", 2, 3),
}
RECIPES = {2: "configs/pretrain_on_my_corpus.yaml", 3: "configs/import_hf_model.yaml"}


def not_materialized(key: AssetKey, root: str | Path, partition: str | None = None) -> str:
    """Why an input is missing and what makes it: the asset (and partition) to materialize, with the
    CLI selection; for the artefacts that recipes build on (:data:`MADE_BY`), that `make demo` or
    which recipe builds them; the storage root looked in and the LARGETRAIN_ROOT that sets it."""
    name = key.to_user_string()
    f = handle_file(root, key, partition)
    env, root = os.environ.get("LARGETRAIN_ROOT"), Path(root).resolve()
    if env is None:
        origin = "LARGETRAIN_ROOT is unset" + (": the default, .largetrain in the working directory"
                                               if root == Path(".largetrain").resolve() else "")
    else:
        origin = "LARGETRAIN_ROOT" if Path(env).resolve() == root else f"not LARGETRAIN_ROOT={env}: set by the caller"
    where = f"under the storage root {root} ({origin}; no {f})"
    what = f"partition {partition} of {name}" if partition is not None else name
    select = (f"--partition {partition} " if partition is not None else "") + f"--select '{name}'"
    msg = (f"{what} has not been materialized {where}. Materialize it first (`dagster asset materialize -m "
           f"largetrain_dagster.definitions -c <your config> {select}`, or select it in the same run), or set "
           "LARGETRAIN_ROOT to the storage root that holds it.")
    makers = MADE_BY.get(name)
    if makers:
        said = ["`make demo`" if m == "demo" else f"recipe {m} ({RECIPES[m]})" for m in makers]
        msg += f" {said[0]} builds it" + (f", as {'does' if len(said) == 2 else 'do'} {' and '.join(said[1:])}" if len(said) > 1 else "") + "."
    return msg


class HandleIOManager(ConfigurableIOManager):
    """Stores what an asset returns, a small JSON *handle* (output path, data version, counts), under
    ``<root>/_handles/<asset key path>.json``, or ``<root>/_handles/<asset key path>/<partition>.json``
    for a partitioned asset. The data itself never passes through the IO manager and nothing is pickled.
    Paths under the root are stored relative to it (storage.relative_to_root) and resolved under the
    root of the loading IO manager, so a copied or moved root reads its own files.

    Loading: an unpartitioned input gives its handle; a partitioned input of a downstream asset of the
    same partitioning gives the handle of that partition; a partitioned input of an unpartitioned
    downstream asset (a global step) gives ``{partition: handle}`` for every partition, in partition
    order. Raises Failure naming the missing file when an input (or one partition of it) has not
    been materialized, the handle when it is damaged, and the files when the directory it points to
    no longer matches its manifest (largetrain_core.storage.verify_manifest)."""

    root: str = ".largetrain"

    def _file(self, key: AssetKey, partition: str | None) -> Path:
        return handle_file(self.root, key, partition)

    def _read(self, f: Path, what: str) -> dict:
        """A handle, after checking that the directory it points to still matches its manifest
        (largetrain_core.storage.verify_manifest): a damaged input fails here, naming the files."""
        try:
            handle = resolve_under(read_json(f, f"handle of {what} (JSON: path, data_version, stats)"), Path(self.root).resolve())
        except ArtefactError as e:
            raise Failure(f"{e}; re-materialize {what}") from e
        problems = verify_manifest(Path(handle["path"]))
        if problems:
            raise Failure(f"{what} at {handle['path']} was damaged after it was written: " + "; ".join(problems)
                          + f". Re-materialize {what}: it is rebuilt.")
        return handle

    def handle_output(self, context: OutputContext, obj: dict) -> None:
        write_json_atomic(self._file(context.asset_key, context.partition_key if context.has_partition_key else None),
                          relative_to_root(obj, Path(self.root).resolve()))

    def load_input(self, context: InputContext):
        key = context.asset_key
        if not context.has_asset_partitions:
            f = self._file(key, None)
            if not f.exists():
                raise Failure(not_materialized(key, self.root))
            return self._read(f, key.to_user_string())
        out = {}
        for pk in context.asset_partition_keys:
            f = self._file(key, pk)
            if not f.exists():
                raise Failure(not_materialized(key, self.root, pk))
            out[pk] = self._read(f, f"partition {pk} of {key.to_user_string()}")
        if context.has_partition_key:  # partition -> the same partition: its one handle
            (handle,) = out.values()
            return handle
        return out


class TrackerSettings(dagster_config(TrainConfig, "TrackerSettingsFields", base=ConfigurableResource,
                                    exclude=tuple(f.name for f in fields(TrainConfig)
                                                  if f.name not in TRACKING or f.name == "run_name"))):
    """Where the training assets report their runs: TrainConfig's ``report_to`` list and each tracker's
    settings, for the whole deployment (the asset names each run ``<asset>-<data version>`` and adds
    ``dagster_pipes``). W&B's API key (online mode) is read by wandb from WANDB_API_KEY, never logged."""


class TorchrunLauncher(ConfigurableResource):
    """Starts ``torchrun -m largetrain_core.training`` through Dagster Pipes in its own process group.

    ``nproc_per_node`` ranks on this host; ``threads_per_rank`` sets OMP_NUM_THREADS (0 = cores /
    ranks, so ranks x threads <= cores). Cancelling the run, or any error in the asset, sends
    SIGTERM and then SIGKILL to the whole process group, so no rank survives. Every
    ``progress_seconds`` while it runs, when a new step was logged, the run log gets a progress line
    (step/total, loss, tokens/s, ETA; largetrain_dagster.progress) and the asset being materialized an
    AssetObservation with the same numbers (:func:`progress_asset`), which its page lists and plots.
    """

    nproc_per_node: int = 2
    threads_per_rank: int = 0
    kill_grace_seconds: float = 10.0
    hosts: list[str] = []  # several nodes: every node's address, the first holds the rendezvous; [] = this host alone
    node_rank: int = 0  # this node's position in hosts (one Dagster run per node starts its torchrun agent)
    master_port: int = 29500
    progress_seconds: float = 10.0

    def command(self, config_path: Path, log_dir: Path | None = None, module: str = ENTRY_MODULE) -> list[str]:
        """This node's torchrun command of ``module`` (largetrain_core.launch.launch_commands, static
        rendezvous); ``log_dir``: torchrun's --log-dir, where every rank's error file is written."""
        cmds = launch_commands(str(config_path), self.hosts or ["localhost"], self.nproc_per_node, self.master_port,
                               python=sys.executable, log_dir=str(log_dir) if log_dir else None, module=module)["torchrun"]
        return shlex.split(cmds[self.node_rank])

    def run(self, context, config_path: Path, log_path: Path, module: str = ENTRY_MODULE) -> dict:
        """Run the training (or another entry point ``module``, such as the ablation) to completion;
        return the metadata rank 0 reported through Pipes.

        Every start gets a fresh torchrun log directory ``<dir of config_path>/torchelastic/<time>-*``,
        where each rank records its uncaught exception (largetrain_core.launch.record) and torchrun its
        own (TORCHELASTIC_ERROR_FILE); removed again after a successful run. Raises
        :func:`training_failure` when the processes fail."""
        threads = self.threads_per_rank or max(1, (os.cpu_count() or 1) // self.nproc_per_node)
        logs = Path(config_path).parent / "torchelastic"
        logs.mkdir(parents=True, exist_ok=True)
        log_dir = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%dT%H%M%S-"), dir=logs))
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
               "TORCHELASTIC_ERROR_FILE": str(log_dir / AGENT_ERROR_FILE)}
        cmd = self.command(config_path, log_dir, module)
        context.log.info(f"launching: {' '.join(cmd)} (OMP_NUM_THREADS={threads}); log: {log_path}")
        metadata: dict = {}
        with open_pipes_session(context=context, context_injector=PipesTempFileContextInjector(),
                                message_reader=PipesTempFileMessageReader()) as session:
            env.update(session.get_bootstrap_env_vars())
            with open(log_path, "ab") as logf:
                proc = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
                progress, shown = TrainingProgress(config_path.parent), None
                observed = progress_asset(context)
                next_report = time.monotonic() + self.progress_seconds
                try:
                    while proc.poll() is None:
                        time.sleep(0.5)
                        if time.monotonic() >= next_report:
                            next_report = time.monotonic() + self.progress_seconds
                            p = progress.poll()
                            if p is not None and p.step != shown:
                                context.log.info(f"training progress: {p.line()}")
                                if observed is not None:
                                    context.log_event(AssetObservation(
                                        asset_key=observed[0], partition=observed[1], metadata=p.metadata(),
                                        description=f"training progress: {p.line()} (loss in nats per token)"))
                                shown = p.step
                finally:
                    if proc.poll() is None:
                        context.log.warning(f"stopping training process group {proc.pid}")
                    stop_process_group(proc, self.kill_grace_seconds)
            if proc.returncode != 0:
                raise training_failure(proc.returncode, log_dir, log_path)
            if not any(p.is_file() for p in log_dir.rglob("*")):
                shutil.rmtree(log_dir, ignore_errors=True)  # a finished run leaves only torchrun's empty directories
            for result in session.get_results():
                metadata.update(result.metadata or {})
        return metadata


def progress_asset(context) -> tuple[AssetKey, str | None] | None:
    """(asset key, partition key or None) that a training's progress observations are about: the one
    asset the step materializes. None for an op's step, or a step materializing several assets (whose
    progress would be ambiguous): their progress is in the run log only.

    Dagster writes an observation to the event log when it is logged (DagsterEvent.from_step), so the
    asset page shows it while the step still runs, before the materialization."""
    if not getattr(context, "has_assets_def", False):
        return None
    keys = context.selected_asset_keys
    if len(keys) != 1:
        return None
    return next(iter(keys)), (context.partition_key if context.has_partition_key else None)


def training_failure(returncode: int | None, log_dir: Path, log_path: Path) -> Failure:
    """The dagster.Failure of a failed torchrun: each rank's recorded error (full exception type,
    message, rank, the file it concerns; largetrain_core.launch.describe_failure) in the description
    and as ``rank_errors`` metadata. ``allow_retries`` is False for a deterministic error (a rank raised
    one of its own: a bad config, data or file fails the same way again), so the RetryPolicy retries only
    a killed or preempted run."""
    errors = rank_errors(log_dir)
    text, retryable = describe_failure(returncode, errors)
    shown = [{k: v for k, v in e.items() if k != "traceback"} for e in errors]
    return Failure(f"{text}\nTraining log: {log_path}; error files under {log_dir}",
                   metadata={"rank_errors": MetadataValue.json(shown), "train_log": MetadataValue.path(str(log_path)),
                             "error_files": MetadataValue.path(str(log_dir)),
                             "torchrun_exit": exit_status(returncode), "retryable": retryable},
                   allow_retries=retryable)


def stop_process_group(proc: subprocess.Popen, grace_seconds: float) -> None:
    """SIGTERM the process group led by ``proc`` and every descendant (torchrun starts each rank in a
    session of its own, out of the group), wait up to ``grace_seconds``, then SIGKILL what is left."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = proc.pid
    tree = set(process_tree(proc.pid))  # before any signal: orphaned ranks can no longer be found from the agent
    for sig, wait in ((signal.SIGTERM, grace_seconds), (signal.SIGKILL, 5.0)):
        tree |= set(process_tree(proc.pid)) if proc.poll() is None else set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        for pid in tree - {proc.pid}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.time() + wait
        while time.time() < deadline and (_group_alive(pgid) or _any_alive(tree - {proc.pid})):
            proc.poll()  # reap the leader, or a zombie keeps the group "alive"
            time.sleep(0.1)
        proc.poll()
        if not _group_alive(pgid) and not _any_alive(tree - {proc.pid}):
            break
    if proc.poll() is None:
        proc.wait(timeout=5)


def _any_alive(pids) -> bool:
    """Whether any of ``pids`` still runs (a zombie, dead but not yet reaped by its parent, does not count)."""
    return any((st := proc_stat(pid)) is not None and st[0] not in ("Z", "X") for pid in pids)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
