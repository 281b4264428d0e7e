"""Where a run's params, per-step metrics and artifacts go: one small :class:`Tracker` interface and
its implementations, chosen by ``TrainConfig.report_to``; rank 0 alone tracks.

* ``metrics.jsonl`` (:class:`JsonlTracker`) is always written: the summary, the loss curve and the
  Dagster loss check read it.
* ``wandb``: Weights & Biases, offline by default (runs land in ``<output_dir>/wandb/``).
* ``mlflow``: MLflow, a local SQLite store beside the output directory by default.
* ``dagster_pipes``: the log lines and the final summary, back to the Dagster asset that launched the run.

A tracker's :meth:`Tracker.start` returns its run record (``run_id`` and where to find the run),
kept in ``<output_dir>/trackers.json``; a resumed run passes the recorded ``run_id`` back, so W&B and
MLflow continue the same run. So does :func:`log_outputs`, which logs the exported directories after
the training, once the Dagster asset has written their model card and lineage.json. Adding a tracker: a subclass here, registered in :data:`TRACKERS`,
plus its settings dataclass in config.py when it has any.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

from largetrain_core.storage import stored_location, write_json_atomic
from largetrain_core.training.config import TrainConfig

log = logging.getLogger("largetrain.training")

RECORDS = "trackers.json"
METRICS = "metrics.jsonl"


class Tracker:
    """The interface. ``start`` is called once per process start (a resume starts again), then
    ``log_metrics`` once per optimizer step, ``log_artifact`` per output file or directory, and
    ``finish`` once: with the summary after success, with None after a failure (``killed``: the
    process was stopped from outside, a cancelled run)."""

    name = ""

    def start(self, config: TrainConfig, resume_run_id: str | None) -> dict | None:
        """Open (or, with ``resume_run_id``, continue) the run; return its record (``run_id``, location) or None."""
        return None

    def log_metrics(self, step: int, metrics: dict) -> None:
        """``metrics``: name -> number (None where not measured), for optimizer step ``step``."""

    def log_artifact(self, path: Path) -> None:
        """A file or a directory (logged as a whole) of the run's outputs."""

    def finish(self, summary: dict | None, killed: bool = False) -> None:
        """Close the run: succeeded with ``summary`` (the run's totals), or failed (None), or, with
        ``killed``, stopped from outside (SIGTERM: the run cancelled, its pod or node stopped)."""


class JsonlTracker(Tracker):
    """``<output_dir>/metrics.jsonl``: one JSON object per optimizer step, appended (a resumed run adds
    the steps it redoes again; :func:`read_metrics` keeps the last row per step)."""

    name = "jsonl"

    def __init__(self):
        self.file = None

    def start(self, config, resume_run_id):
        self.file = open(Path(config.output_dir) / METRICS, "a")
        return None

    def log_metrics(self, step, metrics):
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        self.file.flush()

    def finish(self, summary, killed=False):
        if self.file:
            self.file.close()


def read_metrics(metrics_file: Path) -> list[dict]:
    """metrics.jsonl rows by step, ascending; where a step ran twice (work lost after a crash and redone
    after the resume), the last row wins."""
    rows = {}
    for line in Path(metrics_file).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            rows[r["step"]] = r
    return [rows[k] for k in sorted(rows)]


class WandbTracker(Tracker):
    """Weights & Biases (``config.tracking.wandb``): the config as the run's config, metrics per step, artifacts as
    W&B artifacts (directories by reference, not copied). Offline runs are uploaded later with the
    record's ``sync_command``. ``mode: disabled`` tracks nothing."""

    name = "wandb"

    def __init__(self):
        self.run = None

    def start(self, config, resume_run_id):
        s = config.tracking.wandb
        if s.mode == "disabled":
            return None
        import wandb

        run_id = resume_run_id or uuid.uuid4().hex[:8]
        self.run = wandb.init(
            project=s.project,
            entity=s.entity,
            name=config.tracking.run_name,
            mode=s.mode,
            id=run_id,
            resume="allow",
            dir=config.output_dir,
            config=config.to_dict(),
        )
        record = {"run_id": run_id, "project": s.project, "mode": s.mode}
        if s.mode == "offline":
            runs = Path(config.output_dir).resolve() / "wandb"
            record["dir"] = str(runs)  # one offline-run-<time>-<run_id> directory per start
            record["sync_command"] = f"wandb sync --id {run_id} {runs}/offline-run-*-{run_id}"
        else:
            record["url"] = self.run.url
        return record

    def log_metrics(self, step, metrics):
        if self.run:
            self.run.log(metrics, step=step)

    def log_artifact(self, path):
        if not self.run:
            return
        import wandb

        path = Path(path).resolve()
        art = wandb.Artifact(f"{self.run.id}-{path.name}", type="model" if path.is_dir() else "file")
        if path.is_dir():
            art.add_reference(path.as_uri())
        else:
            art.add_file(str(path))
        self.run.log_artifact(art)

    def finish(self, summary, killed=False):
        if self.run:
            if summary:
                self.run.summary.update(summary)
            # 128 + 15: the shell's exit status of a process ended by SIGTERM
            self.run.finish(exit_code=0 if summary is not None else 143 if killed else 1)


def mlflow_location(config: TrainConfig) -> tuple[str, str | None]:
    """(tracking URI, artifact location for a new experiment). The URI: ``config.tracking.mlflow.tracking_uri``,
    else ``sqlite:///<output_dir>/../mlruns.db``. A SQLite store keeps its artifacts in
    ``mlartifacts/`` beside the database file (MLflow's default would be ``./mlruns`` under the
    working directory); for a database in the local working copy of an object-store root (the
    default there: the database needs a local file) at that URL, ``<root URL>/mlartifacts``; for
    other stores the server decides (None)."""
    uri = config.tracking.mlflow.tracking_uri or f"sqlite:///{Path(config.output_dir).resolve().parent / 'mlruns.db'}"
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///") :])
        db.parent.mkdir(parents=True, exist_ok=True)
        artifacts = stored_location(db.parent / "mlartifacts")  # a database in an object-store root's working copy:
        return uri, artifacts if "://" in artifacts else (
            db.parent / "mlartifacts"
        ).as_uri()  # its artifacts go to the bucket
    return uri, None


class MlflowTracker(Tracker):
    """MLflow (``config.tracking.mlflow``): the config as params (nested keys joined by '.'), metrics per step,
    artifacts copied into the run's artifact store (a directory under its own name), the summary as
    ``summary.json``; the run ends FINISHED, FAILED, or KILLED when the process was stopped from outside
    (a cancelled run), and is reopened (RUNNING) by a resume."""

    name = "mlflow"

    def __init__(self):
        self.client = self.run_id = None
        self.log_artifacts = True

    def start(self, config, resume_run_id):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri, artifacts = mlflow_location(config)
        self.client = MlflowClient(tracking_uri=uri)
        exp_id = self._experiment(config.tracking.mlflow.experiment_name, artifacts)
        run = self._reopen(resume_run_id, exp_id)
        if run is None:
            run = self.client.create_run(exp_id, run_name=config.tracking.run_name)
        self.run_id = run.info.run_id
        if _outside(run.info.artifact_uri, artifacts):
            # MLflow records a run's artifact location as an absolute URI: after the storage root holding a
            # SQLite store was copied or moved, the run's artifacts would go to the old root
            self.log_artifacts = False
            log.warning(
                f"MLflow run {self.run_id} keeps its artifacts at {run.info.artifact_uri}, outside this store's "
                f"{artifacts} (the storage root was copied or moved since the training): its metrics are logged "
                "here, its artifacts are not"
            )
        logged = run.data.params  # MLflow params are immutable: a resumed run logs only the new ones
        params = [Param(k, v) for k, v in _flat_params(config.to_dict()).items() if k not in logged]
        for i in range(0, len(params), 100):  # log_batch takes at most 100 params
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        return {
            "run_id": self.run_id,
            "tracking_uri": uri,
            "experiment_id": exp_id,
            "experiment_name": config.tracking.mlflow.experiment_name,
            "artifact_uri": run.info.artifact_uri,
            "ui_command": ui_command(uri),
        }

    def _experiment(self, name: str, artifacts: str | None) -> str:
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        try:
            return self.client.create_experiment(name, artifact_location=artifacts)
        except MlflowException:  # created meanwhile by another process
            return self.client.get_experiment_by_name(name).experiment_id

    def _reopen(self, run_id: str | None, exp_id: str):
        from mlflow.exceptions import MlflowException

        if run_id is None:
            return None
        try:
            run = self.client.get_run(run_id)
        except MlflowException:
            log.warning(f"MLflow run {run_id} of the previous start is not in this store: starting a new run")
            return None
        if run.info.experiment_id != exp_id:
            log.warning(
                f"MLflow run {run_id} belongs to experiment {run.info.experiment_id}, not {exp_id}: starting a new run"
            )
            return None
        self.client.update_run(run_id, status="RUNNING")
        return run

    def log_metrics(self, step, metrics):
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [
            Metric(k, float(v), now, step)
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        ]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def log_artifact(self, path):
        path = Path(path)
        if not self.log_artifacts:
            return
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path=path.name)
            if is_causal_lm_dir(path):
                self.log_model(path)
        else:
            self.client.log_artifact(self.run_id, str(path))

    def log_model(self, path: Path) -> str:
        """Log the causal LM directory ``path`` also as an MLflow model (the transformers flavor: an
        ``MLmodel`` file, the weights, the tokenizer, a text-generation pipeline) at the artifact path
        ``mlflow/<name>``, so that ``mlflow.transformers.load_model("runs:/<run_id>/mlflow/<name>")`` and
        ``mlflow.register_model`` take it; the plain copy stays at ``<name>``, byte for byte. The model
        is saved from a ``pipeline`` object: MLflow 3's save from a checkpoint path fails under
        transformers 5. The requirements are stated (transformers, torch, safetensors) rather than
        inferred, which would import every optional package. Returns the model's ``runs:/`` URI."""
        import tempfile

        import mlflow.transformers
        from transformers import pipeline

        generator = pipeline("text-generation", model=str(path), device="cpu")
        with tempfile.TemporaryDirectory() as tmp:
            saved = Path(tmp) / path.name
            requirements = ["transformers", "torch", "safetensors"]
            mlflow.transformers.save_model(generator, str(saved), pip_requirements=requirements)
            self.client.log_artifacts(self.run_id, str(saved), artifact_path=f"mlflow/{path.name}")
        uri = f"runs:/{self.run_id}/mlflow/{path.name}"
        self.client.set_tag(self.run_id, f"mlflow_model.{path.name}", uri)
        return uri

    def finish(self, summary, killed=False):
        if self.run_id is None:
            return
        if summary is not None and self.log_artifacts:
            self.client.log_dict(self.run_id, summary, "summary.json")
        self.client.set_terminated(self.run_id, "FINISHED" if summary is not None else "KILLED" if killed else "FAILED")


def ui_command(uri: str) -> str:
    """How to see the runs of the tracking ``uri``: a tracking server (http, https) serves its own UI at
    that address; a local store (sqlite, a file directory) is opened with ``mlflow ui --backend-store-uri``."""
    if uri.startswith(("http://", "https://")):
        return uri
    return f"mlflow ui --backend-store-uri {uri}"


def is_causal_lm_dir(path: Path) -> bool:
    """Whether ``path`` is a Hugging Face causal LM directory (config.json naming a ``...ForCausalLM``
    architecture, safetensors weights, a tokenizer.json): a ``model/`` or ``merged/`` export, not an
    adapter or a classifier."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return (
        any(str(a).endswith("ForCausalLM") for a in config.get("architectures") or [])
        and any(path.glob("*.safetensors"))
        and (path / "tokenizer.json").is_file()
    )


def _outside(artifact_uri: str, location: str | None) -> bool:
    """Whether a run's local artifact directory (``file://`` URI) lies outside the store's local
    artifact ``location``; False for any other kind of location (a bucket, a tracking server's)."""
    if not (location and artifact_uri.startswith("file:") and location.startswith("file:")):
        return False
    return not Path(urlparse(artifact_uri).path).resolve().is_relative_to(Path(urlparse(location).path).resolve())


def _flat_params(d: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat_params(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, str) else json.dumps(v)
    return out


class DagsterPipesTracker(Tracker):
    """Dagster Pipes, when the run was launched by a Dagster asset: every log line of
    ``largetrain.training`` goes to the Dagster run log, and the summary (values that are not None)
    is reported as the asset's materialization metadata. Outside Dagster it warns and does nothing."""

    name = "dagster_pipes"

    def __init__(self):
        self.pipes = self.handler = None

    def start(self, config, resume_run_id):
        if not os.environ.get("DAGSTER_PIPES_CONTEXT"):
            log.warning(
                "report_to lists dagster_pipes, but this process was not launched through Dagster Pipes "
                "(no DAGSTER_PIPES_CONTEXT): nothing is reported to Dagster"
            )
            return None
        from dagster_pipes import open_dagster_pipes

        self.pipes = open_dagster_pipes()
        self.handler = _PipesLogHandler(self.pipes)
        log.addHandler(self.handler)
        return None

    def finish(self, summary, killed=False):
        if self.pipes is None:
            return
        log.removeHandler(self.handler)
        if summary is not None:
            self.pipes.report_asset_materialization(metadata={k: v for k, v in summary.items() if v is not None})
        self.pipes.close()


class _PipesLogHandler(logging.Handler):
    def __init__(self, pipes):
        super().__init__(logging.INFO)
        self.pipes = pipes

    def emit(self, record: logging.LogRecord) -> None:
        level = "warning" if record.levelno >= logging.WARNING else "info"
        getattr(self.pipes.log, level)(record.getMessage())


TRACKERS: dict[str, type[Tracker]] = {t.name: t for t in (WandbTracker, MlflowTracker, DagsterPipesTracker)}


def moved_to(config: TrainConfig, out: Path) -> TrainConfig:
    """``config``, as a training recorded it, for the training directory ``out`` it is read from now. A
    storage root can be copied or moved after the training (a copied root reads its own files): then
    ``output_dir`` is ``out``, and a SQLite MLflow store (``sqlite:///<path>``) that lay under the old
    root is the same file under the new one. The root is what the two directories' paths differ in
    (``/old/root/base_checkpoint/<version>`` and ``/new/root/base_checkpoint/<version>``: the root
    holds both the training and, by default, ``mlruns.db``). A store elsewhere is kept as it is."""
    old, new = Path(config.output_dir), out.resolve()
    if old.resolve() == new:  # the same directory, perhaps named through a link
        return config
    same = 0  # trailing path components the two share
    while same < min(len(old.parts), len(new.parts)) - 1 and old.parts[-1 - same] == new.parts[-1 - same]:
        same += 1
    old_root, new_root = (old.parents[same - 1], new.parents[same - 1]) if same else (old, new)
    d = config.to_dict()
    d["output_dir"] = str(new)
    uri = d["tracking"]["mlflow"]["tracking_uri"]
    if uri and uri.startswith("sqlite:///") and Path(uri[len("sqlite:///") :]).is_relative_to(old_root):
        d["tracking"]["mlflow"]["tracking_uri"] = (
            f"sqlite:///{new_root / Path(uri[len('sqlite:///') :]).relative_to(old_root)}"
        )
    return TrainConfig.from_dict(d)


def log_outputs(out: Path, paths: list[Path], metrics: dict | None = None) -> list[str]:
    """Log ``paths`` (files or directories under the training's output directory ``out``: the exported
    model or adapter once its model card and lineage.json are written into it) to the runs the
    training's trackers recorded in ``out/trackers.json``: each tracker of ``report_to`` in
    ``out/train_config.json`` that recorded a run continues it (W&B resumes it, in a new offline-run
    directory when offline; MLflow reopens it), logs the paths that exist and ``metrics`` (name ->
    number, at the training's last step: results measured after it, such as its benchmarks) and
    finishes it again as succeeded with ``out/summary.json``. Returns the names of the trackers that logged.
    A tracker that raises is finished all the same where it started, and the others still log; then
    TrackerError names the first."""
    from largetrain_core.storage import read_json

    records_file = out / RECORDS
    records = read_json(records_file, "trackers' run records (trackers.json)") if records_file.exists() else {}
    config = moved_to(
        TrainConfig.from_dict(read_json(out / "train_config.json", "training config (train_config.json)")), out
    )
    summary = read_json(out / "summary.json", "training summary (summary.json)")
    done, errors = [], []
    for name in config.tracking.report_to:
        if name not in records or name == DagsterPipesTracker.name:
            continue
        tracker = TRACKERS[name]()
        try:
            tracker.start(config, records[name]["run_id"])
            try:
                for path in paths:
                    if Path(path).exists():
                        tracker.log_artifact(Path(path))
                if metrics:
                    tracker.log_metrics(summary.get("steps", 0), metrics)
            finally:
                tracker.finish({k: v for k, v in summary.items() if v is not None})
        except Exception as e:  # the other trackers still log; raised below, with the tracker named
            log.error(f"tracker {name!r} failed to log the outputs: {type(e).__name__}: {e}")
            errors.append((name, e))
            continue
        done.append(name)
    if errors:
        raise TrackerError("log the outputs", errors) from errors[0][1]
    return done


class TrackerError(RuntimeError):
    """One or more trackers raised while :class:`Trackers` drove them all. ``errors``: (tracker name,
    exception) of each, in the trackers' order; the first is the ``__cause__``."""

    def __init__(self, action: str, errors: list[tuple[str, BaseException]]):
        self.errors = errors
        name, first = errors[0]
        others = "".join(f"; then tracker {n!r}: {type(e).__name__}: {e}" for n, e in errors[1:])
        super().__init__(
            f"tracker {name!r} failed to {action}: {type(first).__name__}: {first}{others} "
            "(every other tracker did it all the same)"
        )


class Trackers:
    """Rank 0's trackers, driven as one: :class:`JsonlTracker` and those ``config.tracking.report_to`` names.
    Other ranks hold none. Each tracker's record (``start``'s return) is kept in ``trackers.json``.

    Every call reaches every tracker: one that raises (W&B's ``ConnectionResetError`` when its service
    process is gone, an unreachable MLflow server) is logged and the others go on; then the first
    error is raised as :class:`TrackerError`, naming the tracker, with the exception as its cause.
    So a failing tracker never leaves another's run open (an MLflow run RUNNING, Dagster Pipes
    without its closed message)."""

    def __init__(self, config: TrainConfig, rank: int):
        self.config = config
        names = config.tracking.report_to if rank == 0 else []
        self.items: list[Tracker] = ([JsonlTracker()] if rank == 0 else []) + [TRACKERS[n]() for n in names]
        self.records_file = Path(config.output_dir) / RECORDS
        self.finished = False

    def _each(self, action: str, call) -> None:
        """``call(tracker)`` for every tracker; then raise TrackerError on the first that raised."""
        errors = []
        for t in self.items:
            try:
                call(t)
            except Exception as e:  # reported below, with the tracker named
                log.error(f"tracker {t.name!r} failed to {action}: {type(e).__name__}: {e}")
                errors.append((t.name, e))
        if errors:
            raise TrackerError(action, errors) from errors[0][1]

    def start(self) -> dict:
        """Start every tracker, continuing the runs recorded by a previous start; returns the records.
        The records of those that started are kept even when another raised (then TrackerError)."""
        if not self.items:
            return {}
        records = json.loads(self.records_file.read_text()) if self.records_file.exists() else {}

        def start(t: Tracker) -> None:
            record = t.start(self.config, records.get(t.name, {}).get("run_id"))
            if record:
                records[t.name] = record

        try:
            self._each("start", start)
        finally:
            write_json_atomic(self.records_file, records)
        return records

    def log_metrics(self, step: int, metrics: dict) -> None:
        self._each("log metrics", lambda t: t.log_metrics(step, metrics))

    def log_artifact(self, path: Path) -> None:
        self._each(f"log {path}", lambda t: t.log_artifact(path))

    def finish(self, summary: dict | None, killed: bool = False) -> None:
        """Finish every tracker once (a second call does nothing); ``killed``: see :meth:`Tracker.finish`.
        Raises TrackerError, after finishing the others, when a tracker raised."""
        if self.finished:
            return
        self.finished = True
        self._each("finish", lambda t: t.finish(summary, killed))
