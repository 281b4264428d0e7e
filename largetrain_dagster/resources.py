"""Resources: where artifacts live, the handle IO manager, the training launcher, the trackers' settings."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from dagster import (
    AssetCheckKey,
    AssetCheckSeverity,
    AssetKey,
    AssetRecordsFilter,
    ConfigurableIOManager,
    ConfigurableResource,
    DagsterEventType,
    Failure,
    InitResourceContext,
    InputContext,
    MetadataValue,
    OutputContext,
)
from pydantic import Field

from largetrain_core import fs
from largetrain_core.error_records import describe_failure, rank_errors
from largetrain_core.launch import ENTRY_MODULE, module_entry, rank_env, threads_per_rank, torchrun_command
from largetrain_core.processes import exit_status
from largetrain_core.storage import (
    NO_SPACE_MARGIN,
    ArtifactError,
    MissingArtifactError,
    free_bytes,
    mirror_path,
    read_json,
    relative_to_root,
    resolve_under,
    verify_manifest,
    write_json_atomic,
)
from largetrain_core.training.checkpoints import find_newest_complete
from largetrain_core.training.config import TrackingSettings
from largetrain_dagster import partitions
from largetrain_dagster.configs import RunConfigError, check_ops_keys, dagster_config
from largetrain_dagster.progress import ProgressReporter
from largetrain_dagster.runner import run_process


class Storage(ConfigurableResource):
    """The storage root (docs/ARCHITECTURE.md, Lineage): a local directory, or an object-store URL
    (``s3://bucket/prefix``, any fsspec URL: largetrain_core.fs). Artifacts go to
    ``<root>/<asset key path>/<data_version>/``.

    With a URL root, every step checks before its body runs that it can write there (one small object
    put and deleted): a missing bucket, wrong credentials or an unreachable endpoint fail the step
    before any work, naming the URL (credentials redacted) and the operation. Steps build locally and
    keep working copies under the local cache (largetrain_core.cache, LARGETRAIN_CACHE).

    Every asset of the lineage uses it, so its setup also holds the run config rule: before a step's
    body runs, every key under the run config's ``ops`` must name a step (configs.check_ops_keys), else
    the step fails with the valid names. ``dagster asset materialize -c`` would otherwise drop such a key
    without a word."""

    root: str = Field(
        default=".largetrain",
        description=(
            "Storage root: every artifact lies under <root>/<asset key path>/<data version>/. LARGETRAIN_ROOT "
            "(default .largetrain under the working directory)."
        ),
    )

    @property
    def is_url(self) -> bool:
        """Whether the root is an object-store URL."""
        return fs.is_url(self.root)

    def location(self, *parts: str) -> str | Path:
        """Where ``parts`` under the root are stored: an absolute Path for a local root, a URL for an
        object-store root."""
        if self.is_url:
            return fs.join(self.root, *parts)
        return Path(self.root).resolve().joinpath(*parts)

    def path(self, *parts: str) -> Path:
        """The local path of ``parts`` under the root: the location itself for a local root, its working
        copy in the local cache for an object-store root (storage.mirror_path)."""
        if self.is_url:
            return mirror_path(fs.join(self.root, *parts))
        return Path(self.root).resolve().joinpath(*parts)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        if self.is_url:
            try:
                fs.check_access(self.root, "write the storage root (LARGETRAIN_ROOT)", write=True)
            except fs.StorageAccessError as e:
                raise Failure(
                    f"{e}. Nothing was run: check the bucket, the endpoint (AWS_ENDPOINT_URL) and the "
                    "credentials (the standard chain: environment, profile, instance role).",
                    allow_retries=False,
                ) from None
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
        refuse_partitioned_global_steps(run.tags, selected)
        if unused and CONFIG_CHECKED_TAG not in (instance.get_run_by_id(run.run_id) or run).tags:
            instance.add_run_tags(run.run_id, {CONFIG_CHECKED_TAG: "true"})  # one log line per run, not per step
            context.log.info(
                f"run config for steps outside this run, not used by it: {', '.join(unused)} "
                f"(they apply to the runs that select those steps)"
            )


class CheckWaivers(ConfigurableResource):
    """Blocking checks a run may read past (resource ``checks``). A version whose blocking check failed is
    never an input of a later run (:class:`HandleIOManager` refuses it) unless the run config names the
    check here. The handle IO manager reads this setting from the run config
    (``resources: {checks: {config: {waive_failed_checks: [...]}}}``, :func:`waived_checks`)."""

    waive_failed_checks: list[str] = Field(
        default_factory=list,
        description=(
            "Blocking checks whose failure does not stop this run from reading the version they failed on, as "
            "`<asset key>:<check name>` (base_checkpoint:loss_finite_and_decreasing): a WARNING then names the "
            "version and the check. Empty (the default): a run refuses such an input, naming it."
        ),
    )


def waived_checks(run_config: dict | None) -> list[str]:
    """``waive_failed_checks`` of the ``checks`` resource in ``run_config`` ([] when not set)."""
    resource = (((run_config or {}).get("resources") or {}).get("checks") or {}).get("config") or {}
    return list(resource.get("waive_failed_checks") or [])


def failed_blocking_checks(instance, key: AssetKey) -> list[dict]:
    """The blocking checks (severity ERROR) that failed on the latest materialization of the unpartitioned
    asset ``key``: each ``{"check", "description", "run_id"}``, from the latest evaluation of every check
    evaluated in the run that made it (a check passed or evaluated again since, on a newer
    materialization, no longer counts). [] when the instance holds no materialization of ``key``."""
    if instance is None:
        return []
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=key), limit=1).records
    if not records:
        return []
    made = records[0]
    names = {
        e.dagster_event.event_specific_data.check_name
        for e in instance.all_logs(made.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
        if e.dagster_event.event_specific_data.asset_key == key
    }
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [AssetCheckKey(key, n) for n in sorted(names)]
    )
    failed = []
    for check_key, record in sorted(latest.items(), key=lambda e: e[0].name):
        event = record.event.dagster_event if record.event is not None else None
        evaluation = event.event_specific_data if event is not None else None
        target = getattr(evaluation, "target_materialization_data", None)
        if (
            evaluation is not None
            and hasattr(evaluation, "passed")
            and not evaluation.passed
            and evaluation.blocking
            and evaluation.severity == AssetCheckSeverity.ERROR
            and target is not None
            and target.storage_id == made.storage_id
        ):
            failed.append(
                {"check": check_key.name, "description": evaluation.description or "failed", "run_id": record.run_id}
            )
    return failed


CONFIG_CHECKED_TAG = "largetrain/run_config_checked"
PARTITION_TAGS = ("dagster/partition", "dagster/asset_partition_range_start")


def refuse_partitioned_global_steps(tags: dict, steps) -> None:
    """A run of one partition (``--partition``, or a partition chosen in the launchpad) that selects a
    global step (deduplicated_text and everything after it: they read every partition of their inputs)
    fails here, before any step's body runs, saying to run the global steps without ``--partition``.
    (Dagster would hand a global step that one partition's input alone.)"""
    partition = next((tags[t] for t in PARTITION_TAGS if t in tags), None)
    if partition is None:
        return
    steps = set(steps)
    glob = partitions.global_steps(steps)
    if not glob:
        return
    per_partition = sorted(steps - set(glob))
    raise Failure(
        f"this run is of partition {partition}, but it selects the global step(s) {', '.join(glob)}, which read "
        "every partition of their inputs and have no partition of their own: nothing was run. Materialize the "
        "per-partition steps (raw_corpus, cleaned_text) with --partition, one run per partition"
        + (f" ({', '.join(per_partition)} in this run)" if per_partition else "")
        + ", then the global steps in a run without --partition (README, quick start; in the web UI, "
        "materialize them without choosing a partition).",
        allow_retries=False,
    )


def run_steps(instance, run) -> tuple[set[str], set[str]]:
    """(the steps of ``run``, every step of the job it was selected from): node names from the run's job
    snapshot and its parent's (an asset selection of the CLI or the UI runs a subset of the code
    location's implicit asset job). Empty sets when the instance holds no snapshot."""

    def nodes(snapshot_id):
        snap = instance.get_job_snapshot(snapshot_id) if snapshot_id else None
        return (
            (snap, {n.node_name for n in snap.dep_structure_snapshot.node_invocation_snaps}) if snap else (None, set())
        )

    snap, selected = nodes(run.job_snapshot_id)
    lineage = snap.lineage_snapshot if snap else None
    known = nodes(lineage.parent_snapshot_id)[1] if lineage else set()
    return selected, known | selected


def _root(root: str | Path) -> str | Path:
    """The storage root as a location: a URL as it is, a local path made absolute."""
    return str(root).rstrip("/") if fs.is_url(root) else Path(root).resolve()


def handle_file(root: str | Path, key: AssetKey, partition: str | None = None) -> str | Path:
    """Where the handle of ``key`` (of ``partition``, for a partitioned asset) lies under the storage
    root: a Path under a local root, a URL under an object-store root."""
    name = f"{'/'.join(key.path)}/{partition}.json" if partition is not None else f"{'/'.join(key.path)}.json"
    root = _root(root)
    return fs.join(root, "_handles", name) if fs.is_url(root) else root / "_handles" / name


# An input's metadata key: the handle is read only for a model card's lineage (None when never
# materialized; not verified, no failed check refused), as AssetIn(..., metadata={LINEAGE_ONLY: True}).
LINEAGE_ONLY = "lineage_only"


def read_handle(root: str | Path, key: AssetKey, partition: str | None = None) -> dict | None:
    """The handle of ``key`` (see :class:`HandleIOManager`) with its paths resolved under ``root``, or
    None when it has not been materialized."""
    f = handle_file(root, key, partition)
    try:
        return resolve_under(
            read_json(f, f"handle of {key.to_user_string()} (JSON: path, data_version, stats)"), _root(root)
        )
    except MissingArtifactError:
        return None


# Which of `make demo` and the recipes (configs/*.yaml, docs/guides/your-data.md)
# materialize an artifact that later runs build on; the other assets come from every recipe that needs them.
MADE_BY = {
    "tokenizer": ("demo", 2, 3),
    "base_checkpoint": ("demo", 2, 3),
    "pretrain/raw_corpus": ("demo", 2),
    "pretrain/cleaned_text": ("demo", 2),
    "pretrain/deduplicated_text": ("demo", 2),
    "pretrain/token_shards": ("demo", 2, 3),
    "pretrain/filtered_text": ("demo", 2),
    "relevance_classifier": ("demo", 2),
    "evaluation_sets": ("demo", 2),
}
RECIPES = {2: "configs/pretrain_on_my_corpus.yaml", 3: "configs/import_hf_model.yaml"}
NOT_RETRIED = " Not retried: a retry would fail the same way."


def not_materialized(key: AssetKey, root: str | Path, partition: str | None = None) -> str:
    """Why an input is missing and what makes it: the asset (and partition) to materialize, with the
    CLI selection; for the artifacts that recipes build on (:data:`MADE_BY`), that `make demo` or
    which recipe builds them; the storage root looked in and the LARGETRAIN_ROOT that sets it."""
    name = key.to_user_string()
    f = handle_file(root, key, partition)
    env, root = os.environ.get("LARGETRAIN_ROOT"), _root(root)
    if env is None:
        origin = "LARGETRAIN_ROOT is unset" + (
            ": the default, .largetrain in the working directory" if root == Path(".largetrain").resolve() else ""
        )
    else:
        origin = "LARGETRAIN_ROOT" if _root(env) == root else f"not LARGETRAIN_ROOT={fs.redact(env)}: set by the caller"
    where = f"under the storage root {fs.redact(str(root))} ({origin}; no {fs.redact(str(f))})"
    what = f"partition {partition} of {name}" if partition is not None else name
    select = (f"--partition {partition} " if partition is not None else "") + f"--select '{name}'"
    msg = (
        f"{what} has not been materialized {where}. Materialize it first (`dagster asset materialize -m "
        f"largetrain_dagster.definitions -c <your config> {select}`, or select it in the same run), or set "
        "LARGETRAIN_ROOT to the storage root that holds it."
    )
    makers = MADE_BY.get(name)
    if makers:
        said = ["`make demo`" if m == "demo" else f"recipe {m} ({RECIPES[m]})" for m in makers]
        msg += (
            f" {said[0]} builds it"
            + (f", as {'does' if len(said) == 2 else 'do'} {' and '.join(said[1:])}" if len(said) > 1 else "")
            + "."
        )
    return msg


class HandleIOManager(ConfigurableIOManager):
    """Stores what an asset returns, a small JSON *handle* (output path, data version, counts), under
    ``<root>/_handles/<asset key path>.json``, or ``<root>/_handles/<asset key path>/<partition>.json``
    for a partitioned asset. The data itself never passes through the IO manager and nothing is pickled.
    Paths under the root are stored relative to it (storage.relative_to_root) and resolved under the
    root of the loading IO manager, so a copied or moved root reads its own files.

    The outputs of the steps inside a graph-backed asset (no asset key of their own) are JSON documents
    too, under ``<root>/_handles/_steps/<run id>/``.

    Loading: an unpartitioned input gives its handle (refused when that version failed a blocking check,
    :func:`failed_blocking_checks`, unless :class:`CheckWaivers` waives it); a partitioned input of a
    downstream asset of the same partitioning gives the handle of that partition; a partitioned input of an unpartitioned
    downstream asset (a global step) gives ``{partition: handle}`` for every partition, in partition
    order. Raises Failure naming the missing file when an input (or one partition of it) has not
    been materialized, the handle when it is damaged, and the files when the directory it points to
    no longer matches its manifest (largetrain_core.storage.verify_manifest)."""

    root: str = Field(
        default=".largetrain",
        description=("Storage root the assets' handles live under (<root>/_handles/); the storage resource's root."),
    )

    def _file(self, key: AssetKey, partition: str | None) -> str | Path:
        return handle_file(self.root, key, partition)

    def _read(self, f: str | Path, key: AssetKey, partition: str | None, what: str) -> dict:
        """A handle, after checking that the version it points to still matches its manifest
        (largetrain_core.storage.verify_manifest; one listing on an object store): a damaged input fails
        here, naming the files; a missing one names what makes it. Neither is retried (a step's
        RetryPolicy would fail the same way 5 s later): only materializing the input helps. An unreadable
        handle is retried on an object store (a read cut short), not on local disk."""
        try:
            handle = resolve_under(
                read_json(f, f"handle of {what} (JSON: path, data_version, stats)"), _root(self.root)
            )
        except MissingArtifactError:
            raise Failure(not_materialized(key, self.root, partition) + NOT_RETRIED, allow_retries=False) from None
        except ArtifactError as e:
            url = fs.is_url(str(self.root))
            raise Failure(f"{e}; re-materialize {what}" + ("" if url else NOT_RETRIED), allow_retries=url) from e
        problems = verify_manifest(handle["path"])
        if problems:
            raise Failure(
                f"{what} at {fs.redact(handle['path'])} was damaged after it was written: "
                + "; ".join(problems)
                + f". Re-materialize {what}: it is rebuilt."
                + NOT_RETRIED,
                allow_retries=False,
            )
        return handle

    def _refuse_failed_check(self, context: InputContext, key: AssetKey, handle: dict) -> None:
        """Fail (Failure, not retried) when the latest materialization of ``key``, the version ``handle``
        points to, failed a blocking check (:func:`failed_blocking_checks`), unless the run config's
        ``resources.checks`` waives it (:class:`CheckWaivers`): then a warning. (The partitioned assets
        have no checks.)"""
        failed = failed_blocking_checks(context.instance, key)
        if not failed:
            return
        name, version, downstream = key.to_user_string(), handle.get("data_version"), context.step_context.step.key
        waived = [f for f in failed if f"{name}:{f['check']}" in waived_checks(context.step_context.run_config)]
        for f in waived:
            context.log.warning(
                f"{name} version {version} failed its blocking check {f['check']} (run {f['run_id']}): "
                f"{f['description']}. Used by {downstream} all the same: the run config waives it "
                f"(resources checks waive_failed_checks {name}:{f['check']})"
            )
        refused = [f for f in failed if f not in waived]
        if refused:
            raise Failure(
                f"{name} version {version} (made by run {refused[0]['run_id']}) failed its blocking check"
                f"{'s' if len(refused) > 1 else ''} "
                + "; ".join(f"{f['check']}: {f['description']}" for f in refused)
                + f". {downstream} does not read a version whose blocking check failed: fix the cause and "
                f"materialize {name} again (it is used once its check passes), or waive the check in the run "
                "config: resources: {checks: {config: {waive_failed_checks: ["
                + ", ".join(f'"{name}:{f["check"]}"' for f in refused)
                + "]}}}.",
                allow_retries=False,
            )

    def _step_file(self, identifier: list[str]) -> str | Path:
        """Where the output of a step inside a graph-backed asset lies: ``<root>/_handles/_steps/<run id>/
        <step key>-<output>[-<mapping key>].json`` (small JSON, like a handle): a Path under a local
        root, a URL under an object-store root (where the steps' pods on other nodes read it)."""
        run_id, *rest = identifier
        root = _root(self.root)
        name = "-".join(rest) + ".json"
        return (
            fs.join(root, "_handles", "_steps", run_id, name)
            if fs.is_url(root)
            else root / "_handles" / "_steps" / run_id / name
        )

    def handle_output(self, context: OutputContext, obj: dict) -> None:
        if not context.has_asset_key:  # a step of a graph-backed asset (largetrain_dagster.shards)
            write_json_atomic(self._step_file(context.get_identifier()), relative_to_root(obj, _root(self.root)))
            return
        write_json_atomic(
            self._file(context.asset_key, context.partition_key if context.has_partition_key else None),
            relative_to_root(obj, _root(self.root)),
        )

    def load_input(self, context: InputContext):
        upstream = context.upstream_output
        if upstream is not None and not upstream.has_asset_key:
            f = self._step_file(upstream.get_identifier())
            return resolve_under(read_json(f, f"output of step {upstream.step_key}"), _root(self.root))
        key = context.asset_key
        if (context.definition_metadata or {}).get(LINEAGE_ONLY):
            return read_handle(self.root, key)
        if not context.has_asset_partitions:
            handle = self._read(self._file(key, None), key, None, key.to_user_string())
            self._refuse_failed_check(context, key, handle)
            return handle
        out = {
            pk: self._read(self._file(key, pk), key, pk, f"partition {pk} of {key.to_user_string()}")
            for pk in context.asset_partition_keys
        }
        if context.has_partition_key:  # partition -> the same partition: its one handle
            (handle,) = out.values()
            return handle
        return out


class TrackerSettings(
    dagster_config(
        TrackingSettings,
        "TrackerSettingsFields",
        base=ConfigurableResource,
        exclude=("run_name", "logging_steps", "peak_flops"),
    )
):
    """Where the training assets report their runs: TrainConfig's ``tracking`` section, its ``report_to``
    list and each tracker's settings, for the whole deployment (the asset names each run
    ``<asset>-<data version>`` and adds ``dagster_pipes``). The code location sets them from
    LARGETRAIN_REPORT_TO (``report_to``, comma-separated, default ``wandb``), LARGETRAIN_WANDB_MODE
    (``wandb.mode``) and MLFLOW_TRACKING_URI (``mlflow.tracking_uri``). W&B's API key (online mode) is
    read by wandb from WANDB_API_KEY, never logged."""


class TorchrunLauncher(ConfigurableResource):
    """Starts ``torchrun -m largetrain_core.training`` through Dagster Pipes in its own process group: the
    Pipes implementation of largetrain_core.launch.Launcher.

    ``nproc_per_node`` ranks on this host; ``threads_per_rank`` sets OMP_NUM_THREADS (0 = the
    OMP_NUM_THREADS this process was given, a share of a machine shared with other work, as torchrun
    itself honours it; unset, cores / ranks, so ranks x threads <= cores). Cancelling the run, or any
    error in the asset, sends SIGTERM and then SIGKILL to the whole process tree, so no rank survives
    (largetrain_dagster.runner). Every ``progress_seconds`` while it runs, when a new step was logged,
    the run log gets a progress line and the asset being materialized an AssetObservation with the
    same numbers (largetrain_dagster.progress.ProgressReporter).
    """

    nproc_per_node: int = Field(default=2, description="Training ranks on each node. LARGETRAIN_NPROC.")
    threads_per_rank: int = Field(
        default=0,
        description=(
            "OMP_NUM_THREADS of each rank; 0 = this process's OMP_NUM_THREADS when set, else the node's cores / "
            "nproc_per_node."
        ),
    )
    kill_grace_seconds: float = Field(
        default=10.0,
        description=(
            "Seconds between SIGTERM and SIGKILL to the process group of an ablation or a calibration when the run is "
            "cancelled or fails; a training's is its checkpointing.preemption_grace_seconds."
        ),
    )
    hosts: list[str] = Field(
        default=[],
        description=("Several nodes: every node's address, the first holds the rendezvous; [] = this host alone."),
    )
    node_rank: int = Field(
        default=0, description=("This node's position in hosts (one Dagster run per node starts its torchrun agent).")
    )
    master_port: int = Field(default=29500, description="Port of the rendezvous on the first host.")
    progress_seconds: float = Field(
        default=10.0,
        description=(
            "Seconds between the progress lines (step/total, loss, tokens/s, ETA) in the run log while training runs."
        ),
    )

    def command(self, config_path: Path, log_dir: Path | None = None, module: str = ENTRY_MODULE) -> list[str]:
        """This node's torchrun command of ``module`` (largetrain_core.launch.torchrun_command: standalone on
        one host, static rendezvous at ``hosts[0]:master_port`` on several); ``log_dir``: torchrun's --log-dir,
        where every rank's error file is written."""
        return torchrun_command(
            module_entry(module, config_path),
            self.nproc_per_node,
            rendezvous="static" if len(self.hosts) > 1 else "standalone",
            nnodes=max(1, len(self.hosts)),
            node_rank=self.node_rank,
            host=self.hosts[0] if self.hosts else None,
            port=self.master_port,
            log_dir=log_dir,
        )

    def run(
        self, context, config_path: Path, log_path: Path, module: str = ENTRY_MODULE, grace_seconds: float | None = None
    ) -> dict:
        """Run the training (or another entry point ``module``, such as the ablation) to completion
        (largetrain_dagster.runner.run_process); return the metadata rank 0 reported through Pipes.

        ``grace_seconds`` (default ``kill_grace_seconds``; a training's checkpointing.preemption_grace_seconds):
        when the run is cancelled or the asset fails, the seconds between SIGTERM and SIGKILL to the process
        group, and torchrun's own shutdown timeout (TORCH_ELASTIC_SHUTDOWN_TIMEOUT) before it SIGKILLs its
        ranks, so that SIGTERM'd ranks have that long for their preemption save.

        Every start gets a fresh torchrun log directory ``<dir of config_path>/torchelastic/<time>-*``,
        where each rank records its uncaught exception (largetrain_core.error_records.record) and torchrun its
        own (TORCHELASTIC_ERROR_FILE); removed again after a successful run. Raises
        :func:`training_failure` when the processes fail."""
        threads = threads_per_rank(self.nproc_per_node, self.threads_per_rank)
        logs = Path(config_path).parent / "torchelastic"
        logs.mkdir(parents=True, exist_ok=True)
        log_dir = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%dT%H%M%S-"), dir=logs))
        grace = self.kill_grace_seconds if grace_seconds is None else grace_seconds
        env = {**os.environ, **rank_env(threads, grace, log_dir)}
        space = space_problem(Path(config_path).parent)
        if space:
            raise Failure(space, allow_retries=False)
        cmd = self.command(config_path, log_dir, module)
        context.log.info(f"launching: {' '.join(cmd)} (OMP_NUM_THREADS={threads}); log: {log_path}")
        progress = ProgressReporter(context, Path(config_path).parent, self.progress_seconds)
        done = run_process(context, cmd, log_path, "the training", env=env, grace_seconds=grace, on_tick=progress.tick)
        if done.returncode != 0:
            raise training_failure(done.returncode, log_dir, log_path, Path(config_path).parent)
        if not any(p.is_file() for p in log_dir.rglob("*")):
            shutil.rmtree(log_dir, ignore_errors=True)  # a finished run leaves only torchrun's empty directories
        return done.metadata


def space_problem(output_dir: Path) -> str | None:
    """Why a training in ``output_dir`` cannot save its next checkpoint, checked before each start (a retry
    too): its file system has fewer free bytes than the newest complete checkpoint there takes (or than
    checkpoints.NO_SPACE_MARGIN without one). None when there is room."""
    ckpt, _ = find_newest_complete(output_dir / "checkpoints")
    taken = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file()) if ckpt else 0
    needed = max(taken, NO_SPACE_MARGIN)
    free = free_bytes(output_dir)
    if free >= needed:
        return None
    what = f"the newest checkpoint {ckpt} takes {needed:,}" if ckpt else f"under {NO_SPACE_MARGIN:,} bytes is full"
    return (
        f"No space left on device (ENOSPC) for the training in {output_dir}: its file system has {free:,} bytes "
        f"free, and {what}. Not started and not retried: free space there (or lower save_total_limit), then "
        "materialize again; it resumes from the newest complete checkpoint."
    )


def training_failure(returncode: int | None, log_dir: Path, log_path: Path, output_dir: Path | None = None) -> Failure:
    """The dagster.Failure of a failed torchrun: each rank's recorded error (full exception type,
    message, rank, the file it concerns; largetrain_core.error_records.describe_failure) in the description
    and as ``rank_errors`` metadata. ``allow_retries`` is False for a deterministic error (a rank raised
    one of its own: a bad config, data or file fails the same way again), so the RetryPolicy retries only
    a killed or preempted run. No rank's error recorded and the file system of ``output_dir`` without room
    for a checkpoint (:func:`space_problem`; a rank that hit a full disk may not have been able to write its
    error file): the failure says ENOSPC with the path and the free space, not retried."""
    errors = rank_errors(log_dir)
    text, retryable = describe_failure(returncode, errors)
    space = space_problem(output_dir) if output_dir is not None else None
    if space and not any(not e.get("transient") for e in errors):
        text, retryable = f"training stopped ({exit_status(returncode)} of torchrun). {space}", False
    shown = [{k: v for k, v in e.items() if k != "traceback"} for e in errors]
    return Failure(
        f"{text}\nTraining log: {log_path}; error files under {log_dir}",
        metadata={
            "rank_errors": MetadataValue.json(shown),
            "train_log": MetadataValue.path(str(log_path)),
            "error_files": MetadataValue.path(str(log_dir)),
            "torchrun_exit": exit_status(returncode),
            "retryable": retryable,
        },
        allow_retries=retryable,
    )
