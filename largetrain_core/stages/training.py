"""The training stages' core, shared by ``base_checkpoint`` and ``lora_adapter``: their data version (the
run's identity, :meth:`TrainConfig.identity`, with the inputs' versions), one training run or the reuse
of a finished one, and the seal of its outputs (docs/ARCHITECTURE.md, Training contract).

A stage builds its :class:`TrainConfig` once (:func:`train_config`: the run config, the stage's paths
and mode, the trackers), computes its data version from it, places it under that version, checks it
once (largetrain_core.training.preflight), writes ``train_config.json`` once, plans the run
(largetrain_core.stages.training_plan, which refuses what does not fit) and hands the file to the
orchestrator's launcher (:class:`Launch`); the ranks read it. The stages themselves:
largetrain_core.stages.base_checkpoint and lora_adapter; what they show: training_metadata.
"""

from __future__ import annotations

import copy
import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from largetrain_core import artifacts, fs
from largetrain_core.artifacts import CODE_VERSIONS
from largetrain_core.launch import Launcher
from largetrain_core.settings import merged
from largetrain_core.stages.base import StageError, StageResult, StageRun
from largetrain_core.storage import (
    COMMIT,
    part_files,
    data_version,
    local_copy,
    mirror_path,
    publish,
    read_json,
    relative_to_root,
    resolve_under,
    write_json_atomic,
    write_manifest,
)
from largetrain_core.training import preflight
from largetrain_core.stages.training_plan import plan_training
from largetrain_core.training.config import TrainConfig, read_sectioned
from largetrain_core.training.plan import PlanSettings
from largetrain_core.training import task_data
from largetrain_core.training.task_data import TaskDataSettings
from largetrain_core.training.trackers import METRICS

# The directory a finished training exports, by stage.
EXPORTED = {"base_checkpoint": "model", "lora_adapter": "adapter"}
# What a finished training leaves in its output directory, recorded in its _manifest.json and verified before reuse.
TRAINED_OUTPUTS = (
    "summary.json",
    METRICS,
    "model",
    "adapter",
    "merged",
    "loss_curve.png",
    "train_config.json",
    "trackers.json",
    "examples",
    "evaluation.json",
    "confusion_matrix.png",
    "benchmark",
    "gguf",
)


@dataclass(frozen=True)
class Launch:
    """What the orchestrator gives a training stage: its ``launcher`` (largetrain_core.launch.Launcher, run in
    the orchestrator's ``context``), the ranks per node and the nodes,
    the trackers' settings (``report_to``, ``wandb``, ``mlflow``), and ``report()``: the latest
    optimization report (report.json) or None, and why there is none (read only when a plan needs it)."""

    launcher: Launcher
    ranks_per_node: int
    nodes: int = 1
    tracking: dict = field(default_factory=lambda: {"report_to": [], "wandb": {}, "mlflow": {"tracking_uri": None}})
    report: Callable[[], tuple[dict | None, str]] = lambda: (None, "no optimization report was given")
    context: Any = None

    def run(self, config_file: Path, log_file: Path, **kw) -> dict:
        """``launcher.run`` in the orchestrator's ``context``: what rank 0 reported."""
        return self.launcher.run(self.context, config_file, log_file, **kw)


def training_version(stage: str, cfg: TrainConfig, *input_versions: str, ranks: int, **extra) -> str:
    """The data version of training stage ``stage``: its code version, ``cfg.identity("artifact")`` with
    ``extra`` settings, the inputs' data versions and the ranks per node (the sampler's shares)."""
    return data_version(CODE_VERSIONS[stage], {**cfg.identity("artifact"), **extra}, *input_versions, ranks)


def train_config(run: StageRun, settings: dict, launch: Launch, **set_by_stage) -> TrainConfig:
    """The TrainConfig of a training stage, built once: the run config ``settings`` (sectioned; an old
    one's top-level names moved into their sections with a WARNING: config.read_sectioned), the stage's
    ``set_by_stage`` (paths, mode; nested ones as dicts: ``model={"base_model": ...}``) and the trackers'
    settings of ``launch`` (``dagster_pipes`` added; MLflow's store defaults to
    ``sqlite:///<root>/mlruns.db``). Its output_dir and run name are set when its data version is known
    (:func:`placed`). Raises StageError (not retryable) for an unknown or invalid setting: nothing has
    been launched."""
    key = run.key[0]
    tracking = copy.deepcopy(launch.tracking)
    tracking["mlflow"]["tracking_uri"] = tracking["mlflow"].get("tracking_uri") or f"sqlite:///{_root_path(run)}"
    tracking["report_to"] = [
        *tracking["report_to"],
        *(["dagster_pipes"] * ("dagster_pipes" not in tracking["report_to"])),
    ]
    try:
        d = read_sectioned(settings, f"run config of {key}", run.log.warning)
        return TrainConfig.from_dict(merged(d, {**set_by_stage, "output_dir": "-", "tracking": tracking}))
    except ValueError as e:
        raise StageError(f"{key}: {e}. Nothing was launched; not retried (change the config).") from e


def placed(cfg: TrainConfig, run: StageRun, version: str) -> TrainConfig:
    """``cfg`` with its output_dir (the version's location under the storage root, a URL under an
    object-store root) and its trackers' run name ``<key>-<version>`` set."""
    where = artifacts.location(run.root, run.key, version)
    return replace(cfg, output_dir=str(where), tracking=replace(cfg.tracking, run_name=f"{run.key[0]}-{version}"))


def train(run: StageRun, version: str, cfg: TrainConfig, launch: Launch, plan: PlanSettings) -> tuple[Path, dict, bool]:
    """Run (or resume, or reuse) the training ``cfg`` (:func:`train_config`) of ``run``'s stage under
    ``<root>/<key>/<version>/``.

    A version whose outputs are committed and match their manifest is reused (artifacts.verified, the
    reuse check of every stage; a training is built in place, not in a temporary directory, so that a
    rerun resumes from its checkpoints). Else ``cfg`` is placed
    there (:func:`placed`), checked (largetrain_core.training.preflight), written to
    ``train_config.json``, planned (largetrain_core.stages.training_plan: refuses by raising StageError)
    and launched (``launch.launcher``); the ranks read that file.

    With an object-store root the training's output_dir is the version's URL: the ranks work in its
    local working copy and upload checkpoints and outputs (largetrain_core.training.sync); the stage
    seals and commits it (:func:`seal_training`). Returns (the local directory, the summary with its
    paths where they are stored, reused). Raises StageError (not retryable) for a config that does not
    fit its inputs: nothing has been launched."""
    key = run.key[0]
    where = artifacts.location(run.root, run.key, version)
    out = local_dir(where)
    rebuilt_because = None
    trained = (
        fs.exists(fs.join(where, COMMIT))
        if fs.is_url(where)
        else (out / "summary.json").exists() and (out / EXPORTED[key]).exists()
    )
    if trained:
        again = "running the training again (it resumes from its newest complete checkpoint)"
        intact, rebuilt_because = artifacts.verified(where, run.log, again)
        if intact:
            return local_copy(where), moved_summary(local_copy(where), where), True
    cfg = placed(cfg, run, version)
    try:  # fail here, before any process starts, and never retry: a config error fails the same way again
        preflight.check(cfg)
    except ValueError as e:
        raise StageError(f"{key}: {e}. Nothing was launched; not retried (change the config).") from e
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / "train_config.json"  # before the plan: a refused one can be planned again from it by hand
    write_json_atomic(cfg_path, cfg.to_dict())
    if fs.is_url(where):  # beside the version, where pods on other nodes read it
        write_json_atomic(fs.join(where, "train_config.json"), cfg.to_dict())
    ranks = (launch.ranks_per_node * max(1, launch.nodes), launch.ranks_per_node)
    plan_training(run, cfg, plan, out, launch, ranks, launch.report())
    try:
        reported = launch.run(cfg_path, out / "train.log", grace_seconds=cfg.checkpointing.preemption_grace_seconds)
    finally:
        if fs.is_url(where) and (out / "train.log").exists():
            fs.filesystem(where)[0].put_file(str(out / "train.log"), fs.filesystem(fs.join(where, "train.log"))[1])
    run.log.info(f"rank 0 reported {sorted(reported)}")
    summary = moved_summary(out, where)
    return out, {**summary, "rebuilt_because": rebuilt_because} if rebuilt_because else summary, False


def _root_path(run: StageRun) -> Path:
    """The local path of ``<root>/mlruns.db`` (its working copy for an object-store root)."""
    if fs.is_url(run.root):
        return mirror_path(fs.join(str(run.root), "mlruns.db"))
    return Path(run.root).resolve() / "mlruns.db"


def seal_training(out: Path, where: str | Path | None = None, changed: list[Path] = ()) -> None:
    """Record a finished training's outputs (TRAINED_OUTPUTS under ``out``; not the checkpoints and the log,
    which keep changing) in ``out/_manifest.json``, once everything is written into them (the model card).
    ``where``: the version's URL under an object-store root, where it is then committed (storage.publish;
    ``changed``: the files written after the trainer's upload)."""
    write_manifest(out, [p for p in TRAINED_OUTPUTS if (out / p).exists()])
    if where is not None and fs.is_url(where):
        publish(out, str(where), [Path(p).relative_to(out).as_posix() for p in changed])


def moved_summary(out: Path, where: str | Path | None = None) -> dict:
    """``out/summary.json`` with the paths that the training wrote under its output directory (named in
    ``train_config.json``; for a URL, its working copy) resolved under ``where`` (default ``out``): a
    copied or moved root reads its own model files, an object-store root gets their URLs."""
    summary = read_json(out / "summary.json", "training summary (summary.json)")
    cfg = out / "train_config.json"
    written_in = read_json(cfg, "training config (train_config.json)").get("output_dir") if cfg.exists() else None
    if not written_in:
        return summary
    relative = relative_to_root(summary, mirror_path(written_in) if fs.is_url(written_in) else written_in)
    return resolve_under(relative_to_root(relative, written_in), where if where is not None else out)


def local_dir(location: str | Path) -> Path:
    """The local directory of a location under the storage root: itself, or its working copy (for a URL)."""
    return mirror_path(str(location)) if fs.is_url(location) else Path(location)


def fine_tuning_examples(
    run: StageRun,
    version: str,
    settled: TrainConfig,
    text: Path,
    settings: TaskDataSettings,
    corpus_labels: list[str] | None = None,
) -> tuple[TrainConfig, dict]:
    """The examples of a fine-tuning task (``settled.task``) under ``<root>/<key>/<version>/examples``,
    built once from the documents of the deduplicated_text directory ``text``
    (largetrain_core.training.task_data.classification_examples or chat_examples, with the base model's
    tokenizer; for classification the label set of ``settings.labels`` and ``corpus_labels``, raw_corpus's
    declared labels: task_data.label_set), and ``settled`` with ``train_shards`` set to them. Returns (that config, the examples'
    report: manifest, the documents left out, the split); a WARNING names the documents left out, if any.
    Raises StageError (not retryable) for an object-store root, a ``settings.seq_len`` above the base
    model's ``max_position_embeddings`` (before any example is built), or documents without the labels or
    messages the task needs."""
    from largetrain_core.model import max_positions

    key = run.key[0]
    problems = settings.problems()
    if settled.task == "classification":
        try:
            task_data.label_set(settings.labels, corpus_labels)
        except ValueError as e:
            problems.append(str(e))
    base = Path(settled.model.base_model)
    positions = max_positions(base)
    if positions is not None and settings.seq_len > positions:
        problems.append(
            f"task_data.seq_len={settings.seq_len} is more than the base model {base} takes "
            f"(max_position_embeddings={positions}): set lora_adapter's task_data.seq_len to at most {positions}, "
            "or use a base model with longer positions"
        )
    if problems:
        raise StageError(f"{key}: " + "; ".join(problems))
    where = artifacts.location(run.root, run.key, version)
    if fs.is_url(where):
        raise StageError(f"{key}: task {settled.task} needs a local storage root (an object-store root: not yet)")
    examples = local_dir(where) / "examples"
    report_file = examples / "report.json"
    if not report_file.exists():
        tmp = examples.with_name(".tmp-examples")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            args = (part_files(text), Path(settled.model.base_model), settings, settled.seed, tmp)
            if settled.task == "classification":
                report = task_data.classification_examples(*args, corpus_labels=corpus_labels)
            else:
                report = task_data.chat_examples(*args)
        except ValueError as e:
            raise StageError(f"{key}: {text}: {e}") from e
        write_json_atomic(tmp / "report.json", report)
        shutil.rmtree(examples, ignore_errors=True)
        os.replace(tmp, examples)
        run.log.info(f"{key}: {settled.task} examples written to {examples}")
    report = read_json(report_file, "task examples report")
    if report["left_out"]:  # a second line behind raw_corpus's labels / require_label: said, never silent
        first = report["left_out"][0]
        hint = (
            "; raw_corpus require_label: true and labels: [...] reject such records where they are read"
            if settled.task == "classification"
            else ""
        )
        run.log.warning(
            f"{key}: {len(report['left_out'])} documents left out of the {settled.task} examples (listed in the "
            f"metadata's left_out; the first: {first['source']}: {first['reason']}){hint}"
        )
    return replace(settled, train_shards=str(examples)), report


def trained(
    run: StageRun,
    version: str,
    cfg: TrainConfig,
    plan: PlanSettings,
    launch: Launch,
    card_inputs: dict,
    base: dict | None = None,
    examples: dict | None = None,
) -> StageResult:
    """Train ``run``'s stage (base_checkpoint, or lora_adapter on the ``base`` handle) or reuse it
    (:func:`train`); evaluate a fine-tuning task's adapter on its test split (``examples``: the task
    examples' report); write the model card from ``card_inputs`` (largetrain_core.training.lineage.write_card);
    log the outputs to the trackers and seal a new training; return its result: the summary as stats,
    the metadata of largetrain_core.stages.training_metadata and the checks ``loss_finite_and_decreasing``
    (and for an adapter ``beats_majority_baseline``)."""
    from largetrain_core.stages import training_metadata as shown
    from largetrain_core.training import task_evaluation
    from largetrain_core.training.lineage import write_card

    out, summary, reused = train(run, version, cfg, launch, plan)
    model_dir = local_dir(summary["output"])
    evaluated = None
    if cfg.task != "causal_lm":
        base_dir, examples_dir = local_copy(base["stats"]["output"]), Path(cfg.train_shards)
        evaluated = (
            read_json(out / "evaluation.json", f"{cfg.task} evaluation (evaluation.json)")
            if reused
            else task_evaluation.evaluate_classifier(base_dir, model_dir, examples_dir, out, cfg.seed)
            if cfg.task == "classification"
            else task_evaluation.evaluate_chat(base_dir, model_dir, examples_dir, out)
        )
    card = write_card(
        run.log,
        "lora_adapter" if base is not None else "base_model",
        model_dir,
        version,
        card_inputs,
        train_dir=out,
        base_model=local_copy(base["stats"]["output"]) if base is not None else None,
        task=shown.card_task(cfg, evaluated, examples),
    )
    if not reused:
        log_trained_outputs(run, out, summary)
        seal_training(out, artifacts.location(run.root, run.key, version), card)
    metadata = shown.trained_metadata(out, summary, cfg, model_dir)
    checks = {"loss_finite_and_decreasing": shown.loss_check(run, out, summary, cfg)}
    if base is not None:
        metadata.update({**shown.adapter_metadata(model_dir), **shown.task_metadata(cfg, out, examples, evaluated)})
        checks["beats_majority_baseline"] = shown.majority_check(run, evaluated)
    return StageResult(out, version, summary, reused, metadata=metadata, checks=checks, show_stats=False)


def log_trained_outputs(run: StageRun, out: Path, summary: dict) -> None:
    """Log the exported directory (and merged/) to the training's tracker runs, after its model card and
    lineage.json are written into it (trackers.log_outputs; the training itself logged only the curves)."""
    from largetrain_core.training.trackers import log_outputs

    logged = log_outputs(out, [local_dir(summary["output"]), out / "merged"])
    if logged:
        run.log.info(f"{local_dir(summary['output']).name}/ with its model card logged to {', '.join(logged)}")
