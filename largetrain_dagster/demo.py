"""``make demo``'s driver: ``python -m largetrain_dagster.demo [-c configs/demo.yaml]``.

Launches the demo's runs the way the web UI does, through Dagster's public interfaces only: it starts
``dagster dev -w workspace.yaml`` on 127.0.0.1 (webserver, daemon and code server, in a process group
of their own; ``--url`` uses a webserver that already runs instead, e.g. ``make dev``'s) and submits
each run with Dagster's GraphQL client (``dagster_graphql.DagsterGraphQLClient``), so that every run
carries the code location's origin and the web UI lists it under the ``largetrain`` location and its
jobs: one ``prepare_partitions`` run per data partition, then one ``lineage`` run. The instance's
queued run coordinator (dagster.yaml) hands each run to the daemon.

The terminal follows each run's event log (GraphQL ``logsForRun``): the stages in the order the job
runs them, a line per materialization and per asset check, warnings, and failures with their message.
While a training runs, a progress bar (rich) shows step/total, loss, tokens/s and ETA, read from the
training's metrics.jsonl (largetrain_dagster.progress); on a terminal that is not interactive the same
goes out as a line every ``--progress-seconds``. Everything ``dagster dev``, the runs and the training
processes print goes to the log file (``--log``), and the terminal says so; at the end it prints the
summary (largetrain_dagster.summary), where the log is and how to open the UI. Ctrl-C terminates the
running run (GraphQL ``terminateRun``) and stops the server.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import yaml
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from largetrain_core.processes import stop_process_group
from largetrain_dagster.configs import check_ops_keys
from largetrain_dagster.partitions import DATA_PARTITIONS
from largetrain_dagster.progress import TrainingProgress, duration

LOCATION, REPOSITORY = "largetrain", "__repository__"
RUN = "<run>"  # the live display's task for the run itself, until its worker has started
UI_URL = "http://127.0.0.1:3000"
FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}
# dagster dev loads the code location in a code server before the webserver answers for it: minutes on
# a busy 2-core machine (README, "Two commands"); a location that has not loaded by then has failed
LOAD_TIMEOUT_S = 600
# a terminated run stops its steps' process groups (SIGTERM, then SIGKILL after the launcher's
# kill_grace_seconds) before its worker reports CANCELED
CANCEL_TIMEOUT_S = 120

EVENTS = """query($runId: ID!, $cursor: String) { logsForRun(runId: $runId, afterCursor: $cursor, limit: 500) {
  __typename
  ... on EventConnection { cursor hasMore events { __typename
    ... on MessageEvent { message timestamp level stepKey eventType }
    ... on MaterializationEvent { assetKey { path } partition metadataEntries { label ... on BoolMetadataEntry { boolValue } } }
    ... on AssetCheckEvaluationEvent { evaluation { checkName success assetKey { path } } }
    ... on ExecutionStepFailureEvent { error { message } } } }
  ... on PythonError { message } ... on RunNotFoundError { message } } }"""
ASSET_NODES = """{ assetNodes { assetKey { path } dependencyKeys { path } opNames jobNames } }"""
LOCATIONS = """{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } } } } ... on PythonError { message } } }"""


def stage_order(parents: dict[tuple[str, ...], set[tuple[str, ...]]]) -> str:
    """The assets of one job (asset key path -> the paths of its parents) in dependency order, one group
    per depth, e.g. ``deduplicated_text (domain, pretrain) -> tokenizer -> token_shards (domain,
    pretrain) -> base_checkpoint``. Parents outside the job are left out."""
    depth: dict[tuple[str, ...], int] = {}

    def of(key: tuple[str, ...]) -> int:
        if key not in depth:
            depth[key] = 1 + max((of(p) for p in parents[key] if p in parents), default=-1)
        return depth[key]

    for key in parents:
        of(key)
    stages = []
    for d in sorted(set(depth.values())):
        level = sorted(k for k in depth if depth[k] == d)
        names = {k[-1] for k in level}
        if len(names) == 1 and len(level) > 1:
            stages.append(f"{level[0][-1]} ({', '.join('/'.join(k[:-1]) for k in level)})")
        else:
            stages.append(", ".join("/".join(k) for k in level))
    return " -> ".join(stages)


def config_nodes(op_names: list[str]) -> set[str]:
    """The names a run config's ``ops`` may key for an asset whose ops are ``op_names`` (GraphQL's
    ``opNames``): each op, and for a graph-backed asset (ops named ``graph.op``) the graph, whose config
    mapping takes the asset's config."""
    return set(op_names) | {op.split(".", 1)[0] for op in op_names}


def job_config(run_config: dict, nodes: set[str], steps: set[str]) -> dict:
    """``run_config`` with its ops cut down to ``nodes`` (one job's steps). Raises configs.RunConfigError
    when a key names none of ``steps`` (every step of the code location): a misspelled key is an error,
    never cut away unseen (configs.check_ops_keys)."""
    check_ops_keys(run_config, nodes, steps)
    return {**run_config, "ops": {op: c for op, c in (run_config.get("ops") or {}).items() if op in nodes}}


class Webserver:
    """A Dagster webserver's GraphQL endpoint at ``url`` (http://127.0.0.1:PORT): Dagster's GraphQL client
    for submitting and terminating runs, and plain GraphQL queries for what the client does not wrap
    (a run's event log, the asset graph, the code location's load status)."""

    def __init__(self, url: str):
        from dagster_graphql import DagsterGraphQLClient

        self.url = url.rstrip("/")
        host, _, port = self.url.split("://", 1)[1].partition(":")
        self.client = DagsterGraphQLClient(host, port_number=int(port) if port else None)

    def query(self, query: str, variables: dict | None = None) -> dict:
        """The ``data`` of a GraphQL query. Raises RuntimeError with the server's errors."""
        req = urllib.request.Request(
            f"{self.url}/graphql",
            data=json.dumps({"query": query, "variables": variables or {}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            body = json.loads(r.read())
        if body.get("errors"):
            raise RuntimeError(f"GraphQL error from {self.url}: {body['errors']}")
        return body["data"]

    def location_loaded(self) -> bool:
        """True once the ``largetrain`` code location has loaded; raises RuntimeError with the code
        location's error when it failed to load."""
        try:
            data = self.query(LOCATIONS)["workspaceOrError"]
        except (OSError, RuntimeError):  # not answering yet
            return False
        if data["__typename"] != "Workspace":
            raise RuntimeError(f"the workspace did not load: {data.get('message')}")
        entry = next((e for e in data["locationEntries"] if e["name"] == LOCATION), None)
        if entry is None or entry["loadStatus"] != "LOADED":
            return False
        error = entry["locationOrLoadError"] or {}
        if error.get("__typename") == "PythonError":
            raise RuntimeError(f"the code location {LOCATION} did not load: {error['message']}")
        return True

    def asset_nodes(self) -> list[dict]:
        return self.query(ASSET_NODES)["assetNodes"]

    def events(self, run_id: str, cursor: str | None) -> tuple[list[dict], str | None, bool]:
        """(events, next cursor, more to read) of the run's event log after ``cursor``."""
        data = self.query(EVENTS, {"runId": run_id, "cursor": cursor})["logsForRun"]
        if data["__typename"] != "EventConnection":
            raise RuntimeError(f"the event log of run {run_id}: {data.get('message')}")
        return data["events"], data["cursor"], data["hasMore"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def dagster_dev(workspace: str, console: Console) -> Iterator[Webserver]:
    """``dagster dev -w WORKSPACE`` on 127.0.0.1 and a free port, in a process group of its own (its
    output goes where this process's does: the log), until its code location has loaded; on exit
    the whole group is stopped (SIGINT, as Ctrl-C would, then SIGTERM and SIGKILL). Raises
    RuntimeError when the server exits or the code location fails to load."""
    port = _free_port()
    dagster = str(Path(sys.executable).with_name("dagster"))
    proc = subprocess.Popen(
        [dagster, "dev", "-w", workspace, "-h", "127.0.0.1", "-p", str(port)], start_new_session=True
    )
    server = Webserver(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while not server.location_loaded():
            if proc.poll() is not None:
                raise RuntimeError(f"dagster dev exited with status {proc.returncode} before serving {LOCATION}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"dagster dev did not load the code location {LOCATION} in {LOAD_TIMEOUT_S} s")
            time.sleep(1)
        yield server
    finally:
        console.print("stopping dagster dev ...", highlight=False)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        stop_process_group(proc, grace_seconds=10)


class RunView:
    """Follows one run's event log through the webserver and shows it on ``console`` (see module doc)."""

    def __init__(self, server: Webserver, run_id: str, console: Console, root: Path, progress_seconds: float):
        self.server, self.run_id, self.console, self.root = server, run_id, console, root
        self.progress_seconds = progress_seconds
        self.cursor: str | None = None
        self.started: dict[str, float] = {}  # step key -> start (event timestamp, seconds)
        self.training: dict[str, TrainingProgress] = {}
        self.tasks: dict[str, int] = {}
        self.last_line: dict[str, float] = {}
        self.errors: list[str] = []
        self.live = (
            Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(bar_width=30),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            )
            if console.is_terminal
            else None
        )

    def say(self, text: str) -> None:
        (self.live.console if self.live else self.console).print(text, highlight=False)

    def follow(self, poll_seconds: float = 1.0) -> str:
        """Show events until the run has finished; returns its status (SUCCESS, FAILURE, CANCELED)."""
        if self.live:
            self.live.start()
            self.tasks[RUN] = self.live.add_task("queued for the daemon", total=None, info="")
        try:
            while True:
                status = self.server.client.get_run_status(self.run_id).value
                self._drain()
                self._training_progress()
                if status in FINISHED:
                    self._drain()
                    return status
                time.sleep(poll_seconds)
        finally:
            if self.live:
                self.live.stop()

    def _drain(self) -> None:
        while True:
            events, self.cursor, more = self.server.events(self.run_id, self.cursor)
            for event in events:
                self._show(event)
            if not more:
                return

    def _show(self, ev: dict) -> None:
        kind, step = ev.get("eventType"), ev.get("stepKey")
        timestamp = int(ev.get("timestamp") or 0) / 1000
        if kind is None:  # a message logged by an asset (context.log): warnings and errors reach the terminal
            if ev.get("level") in ("WARNING", "ERROR", "CRITICAL"):
                self.say(f"  [yellow]![/yellow] {escape(ev.get('message', ''))}")
            return
        if kind == "RUN_START" and self.live and RUN in self.tasks:
            self.live.remove_task(self.tasks.pop(RUN))
        elif kind == "STEP_WORKER_STARTING" and self.live:
            self.tasks[step] = self.live.add_task(
                f"{escape(step.replace('__', '/'))} (starting its process)", total=None, info=""
            )
        elif kind == "STEP_START":
            self.started[step] = timestamp
            if self.live:
                name = escape(step.replace("__", "/"))
                if step in self.tasks:
                    self.live.update(self.tasks[step], description=name)
                else:
                    self.tasks[step] = self.live.add_task(name, total=None, info="")
            else:
                self.say(f"  > {step.replace('__', '/')} started")
        elif kind == "ASSET_MATERIALIZATION":
            part = f" [{ev['partition']}]" if ev.get("partition") else ""
            reused = any(e["label"] == "reused" and e.get("boolValue") for e in ev.get("metadataEntries", []))
            took = duration(timestamp - self.started.get(step, timestamp))
            note = "reused an existing complete artifact" if reused else f"done in {took}"
            self.say(f"  [green]✓[/green] {escape('/'.join(ev['assetKey']['path']) + part)}: {note}")
        elif kind == "ASSET_CHECK_EVALUATION":
            check = ev["evaluation"]
            mark, verdict = ("[green]✓[/green]", "passed") if check["success"] else ("[red]✗[/red]", "FAILED")
            self.say(f"  {mark} check {check['checkName']} on {escape('/'.join(check['assetKey']['path']))} {verdict}")
        elif kind in ("STEP_SUCCESS", "STEP_FAILURE", "STEP_SKIPPED"):
            if kind == "STEP_FAILURE":
                message = ((ev.get("error") or {}).get("message") or ev.get("message") or "step failed").strip()
                self.errors.append(f"{step}: {message}")
                self.say(f"  [red]✗ {escape(step.replace('__', '/'))} failed:[/red] {escape(message[:2000])}")
            elif kind == "STEP_SKIPPED":
                self.say(f"  - {escape(step.replace('__', '/'))} skipped (an upstream step or blocking check failed)")
            if self.live and step in self.tasks:
                self.live.remove_task(self.tasks.pop(step))
            reader = self.training.pop(step, None)
            last = reader.poll() if reader else None
            if last is not None:
                self.say(f"    training reached {last.line()}")
        elif kind == "RUN_FAILURE" and ev.get("message"):
            self.errors.append(ev["message"])

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
                self.live.update(
                    self.tasks[step], total=p.total, completed=p.step, info=f"{p.step}/{p.total or '?'}  {info}"
                )
            elif not self.live and now - self.last_line.get(step, 0) >= self.progress_seconds:
                self.last_line[step] = now
                self.say(f"    {step.replace('__', '/')}: {p.line()}")

    def _find_training(self, step: str, began: float) -> None:
        """A training writes ``<root>/<asset key>/<data version>/train_config.json`` before it starts."""
        if step in self.training:
            return
        configs = [
            c for c in Path(self.root, *step.split("__")).glob("*/train_config.json") if c.stat().st_mtime >= began - 5
        ]
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


def _launch(
    server: Webserver,
    plan: list[tuple[str, dict]],
    run_config: dict,
    console: Console,
    root: Path,
    progress_seconds: float,
    log: Path,
) -> bool:
    """Submit and follow the runs of ``plan`` in turn; False (after saying why) at the first that does
    not succeed. Raises configs.RunConfigError, before any run starts, for a key that names no step."""
    nodes = server.asset_nodes()
    steps = {op for n in nodes for op in config_nodes(n["opNames"])}
    configs = {}
    for job in dict.fromkeys(job for job, _ in plan):
        configs[job] = job_config(
            run_config, {op for n in nodes if job in n["jobNames"] for op in config_nodes(n["opNames"])}, steps
        )
    for i, (job, tags) in enumerate(plan, 1):
        parents = {
            tuple(n["assetKey"]["path"]): {tuple(d["path"]) for d in n["dependencyKeys"]}
            for n in nodes
            if job in n["jobNames"]
        }
        run_id = server.client.submit_job_execution(
            job, repository_location_name=LOCATION, repository_name=REPOSITORY, run_config=configs[job], tags=tags
        )
        part = f", partition {tags['dagster/partition']}" if "dagster/partition" in tags else ""
        console.print(
            f"[bold][{i}/{len(plan)}] {job}{part}[/bold] (run {run_id[:8]}): {escape(stage_order(parents))}",
            highlight=False,
        )
        view = RunView(server, run_id, console, root, progress_seconds)
        try:
            status = view.follow()
        except KeyboardInterrupt:
            console.print(f"interrupted: terminating run {run_id} ...", highlight=False)
            server.client.terminate_run(run_id)
            deadline = time.monotonic() + CANCEL_TIMEOUT_S  # the run worker marks it CANCELED once its steps stopped
            while time.monotonic() < deadline and server.client.get_run_status(run_id).value not in FINISHED:
                time.sleep(1)
            console.print(f"run {run_id} {server.client.get_run_status(run_id).value}", highlight=False)
            raise
        if status != "SUCCESS":
            console.print(
                f"[red]run {run_id} {status}[/red]" + "".join(f"\n  {escape(e[:2000])}" for e in view.errors[-3:]),
                highlight=False,
            )
            console.print(
                f"demo failed; full log: {log}; the run in the web UI: `make dev`, then {UI_URL}/runs/{run_id}",
                highlight=False,
            )
            return False
    return True


def run_tags(config_file: str, run_config: dict) -> dict[str, str]:
    """The tags that tell runs apart on the Runs page: ``largetrain/config`` (the run config file) and
    ``largetrain/corpus/<role>`` (each corpus path the run config sets: ``ops.<role>__raw_corpus.config.path``)."""
    tags = {"largetrain/config": str(config_file)}
    for op, value in sorted(((run_config or {}).get("ops") or {}).items()):
        role, _, step = op.rpartition("__")
        path = ((value or {}).get("config") or {}).get("path") if isinstance(value, dict) else None
        if step == "raw_corpus" and role and isinstance(path, str):
            tags[f"largetrain/corpus/{role.replace('__', '/')}"] = path
    return tags


def _parser(root: Path) -> argparse.ArgumentParser:
    """The demo's command line (``root``: the LARGETRAIN_ROOT its log goes under by default)."""
    p = argparse.ArgumentParser(prog="python -m largetrain_dagster.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("-c", "--config", default="configs/demo.yaml", help="run config (YAML), cut down to each job's ops")
    p.add_argument("-w", "--workspace", default="workspace.yaml")
    p.add_argument(
        "--url",
        default=None,
        help="a running Dagster webserver of this instance and workspace (e.g. make dev's "
        f"{UI_URL}); default: start dagster dev on 127.0.0.1 for the demo's runs",
    )
    p.add_argument("--log", default=str(root / "demo.log"), help="where everything the runs print goes")
    p.add_argument("--jobs", default="prepare_partitions,lineage", help="comma-separated, in this order")
    p.add_argument(
        "--partitions", default=None, help="data partitions of prepare_partitions (comma-separated; default all)"
    )
    p.add_argument(
        "--progress-seconds", type=float, default=10.0, help="training progress line interval without a terminal"
    )
    return p


def _plan(jobs: list[str], partitions: list[str], tags: dict) -> list[tuple[str, dict]]:
    """The demo's runs as (job, tags): prepare_partitions once per data partition, then each other job once."""
    plan = [
        (job, {"dagster/partition": pk, **tags}) for job in jobs if job == "prepare_partitions" for pk in partitions
    ]
    plan += [(job, dict(tags)) for job in jobs if job != "prepare_partitions"]
    return plan


def main(argv: list[str] | None = None) -> int:
    root = Path(os.environ.get("LARGETRAIN_ROOT", ".largetrain")).resolve()
    args = _parser(root).parse_args(argv)

    from dagster import DagsterInstance

    from largetrain_dagster import summary

    run_config = yaml.safe_load(Path(args.config).read_text()) or {}
    partitions = args.partitions.split(",") if args.partitions else DATA_PARTITIONS.get_partition_keys()
    tags = run_tags(args.config, run_config)
    plan = _plan(args.jobs.split(","), partitions, tags)
    jobs = list(dict.fromkeys(job for job, _ in plan))
    log = Path(args.log).resolve()
    console = _redirect_output(log)
    start = time.monotonic()
    console.print(
        f"largetrain demo: {len(plan)} runs of {', '.join(jobs)}; the full log goes to {log}", highlight=False
    )
    try:
        with contextlib.ExitStack() as stack:
            if args.url:
                server = Webserver(args.url)
                console.print(f"using the webserver at {server.url} ...", highlight=False)
                if not server.location_loaded():
                    raise RuntimeError(f"the webserver at {server.url} has not loaded the code location {LOCATION}")
            else:
                console.print(f"starting dagster dev for the code location of {args.workspace} ...", highlight=False)
                server = stack.enter_context(dagster_dev(args.workspace, console))
            if not _launch(server, plan, run_config, console, root, args.progress_seconds, log):
                return 1
    except KeyboardInterrupt:
        console.print(f"full log: {log}", highlight=False)
        return 130
    except Exception as e:  # e.g. the code location does not load: the traceback goes to the log
        traceback.print_exc()
        console.print(
            f"[red]demo failed:[/red] {escape(f'{type(e).__name__}: {e}'[:2000])}\nfull log: {log}", highlight=False
        )
        return 1
    with DagsterInstance.get() as instance:
        text = summary.render(instance)
    seconds = int(time.monotonic() - start)
    print(text, flush=True)
    console.print(f"\n[bold]== largetrain demo summary ==[/bold]\n{escape(text)}", highlight=False)
    console.print(f"runs: {len(plan)} succeeded; wall time {seconds // 60} min {seconds % 60} s", highlight=False)
    console.print(f"full log: {log}", highlight=False)
    console.print(
        f"web UI: `make dev`, then open {UI_URL} (the runs are under the code location {LOCATION}, "
        f"jobs {', '.join(jobs)})",
        highlight=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
