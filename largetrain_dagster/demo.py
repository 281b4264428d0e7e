"""``make demo``'s driver: ``python -m largetrain_dagster.demo [-c configs/demo.yaml]``.

Launches the demo's runs the way the web UI does: through the Dagster instance (DAGSTER_HOME), its
run launcher and the code location that ``workspace.yaml`` loads, so that every run carries the
code location's origin and ``dagster dev -w workspace.yaml`` lists it under the ``largetrain``
location and its jobs: one ``prepare_partitions`` run per data partition, then one ``lineage`` run.

The terminal follows each run's Dagster event log: the stages in the order the job runs them, a
line per materialization and per asset check, warnings, and failures with their message. While a
training runs, a progress bar (rich) shows step/total, loss, tokens/s and ETA, read from the
training's metrics.jsonl (largetrain_dagster.progress); on a terminal that is not interactive the
same goes out as a line every ``--progress-seconds``. Everything the code server, the runs and the
training processes print goes to the log file (``--log``), and the terminal says so; at the end it
prints the summary (largetrain_dagster.summary), where the log is and how to open the UI.

The workspace and run-creation calls are Dagster's own CLI path for ``dagster job launch``
(dagster._cli.job), with ``launch_run`` instead of ``submit_run``: the queued run coordinator of
dagster.yaml would otherwise wait for a daemon that the demo does not start.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import traceback
from pathlib import Path

import yaml
from dagster import AssetKey, DagsterEventType, DagsterInstance
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from largetrain_dagster.configs import check_ops_keys
from largetrain_dagster.partitions import DATA_PARTITIONS
from largetrain_dagster.progress import TrainingProgress, duration

LOCATION, REPOSITORY = "largetrain", "__repository__"
RUN = "<run>"  # the live display's task for the run itself, until its worker has started
UI_URL = "http://127.0.0.1:3000"


def stage_order(asset_graph, job_name: str) -> str:
    """The job's assets in dependency order, one group per depth, e.g. ``deduplicated_text (domain,
    pretrain) -> tokenizer -> token_shards (domain, pretrain) -> base_checkpoint``."""
    keys = [k for k in asset_graph.toposorted_asset_keys if job_name in asset_graph.get(k).job_names]
    depth: dict[AssetKey, int] = {}
    for k in keys:  # parents come first
        depth[k] = 1 + max((depth[p] for p in asset_graph.get(k).parent_keys if p in depth), default=-1)
    stages = []
    for d in sorted(set(depth.values())):
        level = sorted((k for k in keys if depth[k] == d), key=lambda k: k.path)
        names = {k.path[-1] for k in level}
        if len(names) == 1 and len(level) > 1:
            stages.append(f"{level[0].path[-1]} ({', '.join('/'.join(k.path[:-1]) for k in level)})")
        else:
            stages.append(", ".join(k.to_user_string() for k in level))
    return " -> ".join(stages)


def job_config(run_config: dict, nodes: set[str], steps: set[str]) -> dict:
    """``run_config`` with its ops cut down to ``nodes`` (one job's steps). Raises configs.RunConfigError
    when a key names none of ``steps`` (every step of the code location): a misspelled key is an error,
    never cut away unseen (configs.check_ops_keys)."""
    check_ops_keys(run_config, nodes, steps)
    return {**run_config, "ops": {op: c for op, c in (run_config.get("ops") or {}).items() if op in nodes}}


def create_run(instance: DagsterInstance, workspace, job_name: str, run_config: dict, tags: dict):
    """A run of ``job_name`` of the workspace's code location, created as ``dagster job launch`` and the
    UI create theirs (remote job origin and code origin attached); ``run_config``'s ops are cut down to
    the job's nodes. Returns the DagsterRun (not started). Raises configs.RunConfigError when a key under
    ``ops`` names no step of the code location."""
    from dagster._core.definitions.selector import JobSubsetSelector

    location = workspace.get_code_location(LOCATION)
    repo = location.get_repository(REPOSITORY)
    remote_job = location.get_job(JobSubsetSelector(location_name=LOCATION, repository_name=REPOSITORY,
                                                    job_name=job_name, op_selection=None))
    nodes = {n.node_name for n in remote_job.job_snapshot.dep_structure_snapshot.node_invocation_snaps}
    config = job_config(run_config, nodes, {k.to_python_identifier() for k in repo.asset_graph.get_all_asset_keys()})
    plan = location.get_execution_plan(remote_job, config, step_keys_to_execute=None, known_state=None,
                                       instance=instance).execution_plan_snapshot
    return instance.create_run(
        job_name=job_name, run_id=None, run_config=config, resolved_op_selection=None,
        step_keys_to_execute=plan.step_keys_to_execute, op_selection=None, status=None, root_run_id=None,
        parent_run_id=None, tags={**remote_job.tags, **tags}, job_snapshot=remote_job.job_snapshot,
        execution_plan_snapshot=plan, parent_job_snapshot=remote_job.parent_job_snapshot,
        remote_job_origin=remote_job.get_remote_origin(), job_code_origin=remote_job.get_python_origin(),
        asset_selection=None, asset_check_selection=None, asset_graph=repo.asset_graph)


class RunView:
    """Follows one run's event log and shows it on ``console`` (see module doc)."""

    def __init__(self, instance: DagsterInstance, run_id: str, console: Console, root: Path, progress_seconds: float):
        self.instance, self.run_id, self.console, self.root = instance, run_id, console, root
        self.progress_seconds = progress_seconds
        self.cursor: str | None = None
        self.started: dict[str, float] = {}  # step key -> start (event timestamp)
        self.training: dict[str, TrainingProgress] = {}
        self.tasks: dict[str, int] = {}
        self.last_line: dict[str, float] = {}
        self.errors: list[str] = []
        self.live = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=30),
                             TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console,
                             transient=True) if console.is_terminal else None

    def say(self, text: str) -> None:
        (self.live.console if self.live else self.console).print(text, highlight=False)

    def follow(self, poll_seconds: float = 0.5):
        """Show events until the run has finished; returns the finished DagsterRun."""
        if self.live:
            self.live.start()
            self.tasks[RUN] = self.live.add_task("starting the run worker", total=None, info="")
        try:
            while True:
                run = self.instance.get_run_by_id(self.run_id)
                self._drain()
                self._training_progress()
                if run.is_finished:
                    self._drain()
                    return run
                time.sleep(poll_seconds)
        finally:
            if self.live:
                self.live.stop()

    def _drain(self) -> None:
        while True:
            conn = self.instance.get_records_for_run(self.run_id, cursor=self.cursor, limit=500)
            for record in conn.records:
                self._show(record.event_log_entry)
            self.cursor = conn.cursor
            if not conn.has_more:
                return

    def _show(self, entry) -> None:
        ev = entry.dagster_event
        if ev is None:  # a message logged by an asset (context.log): warnings and errors reach the terminal
            if entry.level >= logging.WARNING:
                self.say(f"  [yellow]![/yellow] {escape(entry.user_message)}")
            return
        step = ev.step_key
        kind = ev.event_type
        if kind == DagsterEventType.RUN_START and self.live and RUN in self.tasks:
            self.live.remove_task(self.tasks.pop(RUN))
        elif kind == DagsterEventType.STEP_WORKER_STARTING and self.live:
            self.tasks[step] = self.live.add_task(f"{escape(step.replace('__', '/'))} (starting its process)", total=None, info="")
        elif kind == DagsterEventType.STEP_START:
            self.started[step] = entry.timestamp
            if self.live:
                name = escape(step.replace("__", "/"))
                if step in self.tasks:
                    self.live.update(self.tasks[step], description=name)
                else:
                    self.tasks[step] = self.live.add_task(name, total=None, info="")
            else:
                self.say(f"  > {step.replace('__', '/')} started")
        elif kind == DagsterEventType.ASSET_MATERIALIZATION:
            mat = ev.event_specific_data.materialization
            part = f" [{mat.partition}]" if mat.partition else ""
            reused = getattr(mat.metadata.get("reused"), "value", False)
            took = duration(entry.timestamp - self.started.get(step, entry.timestamp))
            note = "reused an existing complete artefact" if reused else f"done in {took}"
            self.say(f"  [green]✓[/green] {escape(mat.asset_key.to_user_string() + part)}: {note}")
        elif kind == DagsterEventType.ASSET_CHECK_EVALUATION:
            check = ev.event_specific_data
            mark, verdict = ("[green]✓[/green]", "passed") if check.passed else ("[red]✗[/red]", "FAILED")
            self.say(f"  {mark} check {check.check_name} on {escape(check.asset_key.to_user_string())} {verdict}")
        elif kind in (DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE, DagsterEventType.STEP_SKIPPED):
            if kind == DagsterEventType.STEP_FAILURE:
                error = ev.event_specific_data.error
                message = error.message.strip() if error else ev.message or "step failed"
                self.errors.append(f"{step}: {message}")
                self.say(f"  [red]✗ {escape(step.replace('__', '/'))} failed:[/red] {escape(message[:2000])}")
            elif kind == DagsterEventType.STEP_SKIPPED:
                self.say(f"  - {escape(step.replace('__', '/'))} skipped (an upstream step or blocking check failed)")
            if self.live and step in self.tasks:
                self.live.remove_task(self.tasks.pop(step))
            reader = self.training.pop(step, None)
            last = reader.poll() if reader else None
            if last is not None:
                self.say(f"    training reached {last.line()}")
        elif kind == DagsterEventType.RUN_FAILURE and ev.message:
            self.errors.append(ev.message)

    def _training_progress(self) -> None:
        """For each running step that has started a training since it began, its newest progress."""
        now = time.time()
        for step, began in self.started.items():
            if step in self.tasks or (not self.live and step not in self.last_line):
                self._find_training(step, began)
            reader = self.training.get(step)
            p = reader.poll() if reader else None
            if p is None:
                continue
            if self.live and step in self.tasks:
                info = p.line().split(", ", 1)[1] if ", " in p.line() else ""
                self.live.update(self.tasks[step], total=p.total, completed=p.step,
                                 info=f"{p.step}/{p.total or '?'}  {info}")
            elif not self.live and now - self.last_line.get(step, 0) >= self.progress_seconds:
                self.last_line[step] = now
                self.say(f"    {step.replace('__', '/')}: {p.line()}")

    def _find_training(self, step: str, began: float) -> None:
        """A training writes ``<root>/<asset key>/<data version>/train_config.json`` before it starts."""
        if step in self.training:
            return
        configs = [c for c in Path(self.root, *step.split("__")).glob("*/train_config.json")
                   if c.stat().st_mtime >= began - 5]
        if configs:
            self.training[step] = TrainingProgress(max(configs, key=lambda c: c.stat().st_mtime).parent)
            if not self.live:
                self.last_line[step] = 0.0


def _redirect_output(log: Path) -> Console:
    """Send this process's stdout and stderr, and so every child's, to ``log``; return a console on
    the original stdout."""
    log.parent.mkdir(parents=True, exist_ok=True)
    terminal = os.fdopen(os.dup(1), "w", buffering=1)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush(), sys.stderr.flush()
    os.dup2(fd, 1), os.dup2(fd, 2)
    os.close(fd)
    return Console(file=terminal, soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    root = Path(os.environ.get("LARGETRAIN_ROOT", ".largetrain")).resolve()
    p = argparse.ArgumentParser(prog="python -m largetrain_dagster.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("-c", "--config", default="configs/demo.yaml", help="run config (YAML), cut down to each job's ops")
    p.add_argument("-w", "--workspace", default="workspace.yaml")
    p.add_argument("--log", default=str(root / "demo.log"), help="where everything the runs print goes")
    p.add_argument("--jobs", default="prepare_partitions,lineage", help="comma-separated, in this order")
    p.add_argument("--partitions", default=None, help="data partitions of prepare_partitions (comma-separated; default all)")
    p.add_argument("--progress-seconds", type=float, default=10.0, help="training progress line interval without a terminal")
    args = p.parse_args(argv)

    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget

    from largetrain_dagster import summary

    run_config = yaml.safe_load(Path(args.config).read_text()) or {}
    partitions = args.partitions.split(",") if args.partitions else DATA_PARTITIONS.get_partition_keys()
    plan = [(job, {"dagster/partition": pk}) for job in args.jobs.split(",") if job == "prepare_partitions" for pk in partitions]
    plan += [(job, {}) for job in args.jobs.split(",") if job != "prepare_partitions"]
    jobs = list(dict.fromkeys(job for job, _ in plan))
    log = Path(args.log).resolve()
    console = _redirect_output(log)
    start = time.monotonic()
    console.print(f"largetrain demo: {len(plan)} runs of {', '.join(jobs)}; "
                  f"the full log goes to {log}", highlight=False)
    console.print(f"loading the code location of {args.workspace} ...", highlight=False)
    run_id = None
    with DagsterInstance.get() as instance:
        try:
            with WorkspaceProcessContext(instance, WorkspaceFileTarget(paths=[args.workspace]), read_only=False) as wpc:
                workspace = wpc.create_request_context()
                graph = workspace.get_code_location(LOCATION).get_repository(REPOSITORY).asset_graph
                for i, (job, tags) in enumerate(plan, 1):
                    run = create_run(instance, workspace, job, run_config, tags)
                    run_id = run.run_id
                    part = f", partition {tags['dagster/partition']}" if tags else ""
                    console.print(f"[bold][{i}/{len(plan)}] {job}{part}[/bold] (run {run_id[:8]}): "
                                  f"{escape(stage_order(graph, job))}", highlight=False)
                    instance.launch_run(run_id, workspace)
                    view = RunView(instance, run_id, console, root, args.progress_seconds)
                    finished = view.follow()
                    if finished.status.value != "SUCCESS":
                        console.print(f"[red]run {run_id} {finished.status.value}[/red]" +
                                      "".join(f"\n  {escape(e[:2000])}" for e in view.errors[-3:]), highlight=False)
                        console.print(f"demo failed; full log: {log}; the run in the web UI: `make dev`, then "
                                      f"{UI_URL}/runs/{run_id}", highlight=False)
                        return 1
                    run_id = None
        except KeyboardInterrupt:
            if run_id is not None:
                console.print(f"interrupted: terminating run {run_id} ...", highlight=False)
                instance.run_launcher.terminate(run_id)
            console.print(f"full log: {log}", highlight=False)
            return 130
        except Exception as e:  # e.g. the code location does not load: the traceback goes to the log
            traceback.print_exc()
            console.print(f"[red]demo failed:[/red] {escape(f'{type(e).__name__}: {e}'[:2000])}\nfull log: {log}", highlight=False)
            return 1
        text = summary.render(instance)
    seconds = int(time.monotonic() - start)
    print(text, flush=True)
    console.print(f"\n[bold]== largetrain demo summary ==[/bold]\n{escape(text)}", highlight=False)
    console.print(f"runs: {len(plan)} succeeded; wall time {seconds // 60} min {seconds % 60} s", highlight=False)
    console.print(f"full log: {log}", highlight=False)
    console.print(f"web UI: `make dev`, then open {UI_URL} (the runs are under the code location {LOCATION}, "
                  f"jobs {', '.join(jobs)})", highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
