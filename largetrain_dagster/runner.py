"""The one way a step runs a command of its own: :func:`run_process`.

The command starts in a process group of its own through Dagster Pipes (a temporary-file context
and message channel, ``open_pipes_session``): what it logs with ``open_dagster_pipes`` arrives in the
run log as it happens, and what it reports (``report_asset_materialization``) comes back as
metadata. Its stdout and stderr go to a log file. When the step fails or the run is cancelled while
it runs, the whole process tree gets SIGTERM, then SIGKILL after the grace period
(largetrain_core.processes.stop_process_group), and the run log says so.

Used by the training launcher (torchrun, also for the optimization ablation) and the Spark
executor (spark-submit). The Kubernetes launcher keeps dagster-k8s's ``PipesK8sClient``, which
owns its pod's session; it shares :func:`reported_metadata`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dagster import PipesTempFileContextInjector, PipesTempFileMessageReader, open_pipes_session

from largetrain_core.processes import run_in_group


@dataclass(frozen=True)
class ProcessResult:
    """``returncode``: the command's exit code (negative: the signal that killed it); ``metadata``:
    what it reported through Pipes, merged (:func:`reported_metadata`)."""

    returncode: int
    metadata: dict = field(default_factory=dict)


def reported_metadata(results) -> dict:
    """The metadata of every result a Pipes session got (``PipesSession.get_results()`` or a Pipes
    client's), merged in the order reported."""
    out: dict = {}
    for result in results:
        out.update(result.metadata or {})
    return out


def run_process(
    context,
    cmd: list[str],
    log_path: Path,
    what: str,
    env: dict[str, str] | None = None,
    grace_seconds: float = 10.0,
    on_tick: Callable[[], None] | None = None,
    tick_seconds: float = 0.5,
) -> ProcessResult:
    """Run ``cmd`` as a child of the step ``context`` (module docstring) and wait for its end.

    ``env``: its environment (default this process's), to which the Pipes bootstrap variables are
    added; ``log_path``: its stdout and stderr, appended; ``what``: how the run log names it when it
    has to be stopped ("stopping <what> (process group <pid>)"); ``on_tick()``: called every
    ``tick_seconds`` while it runs, in the step's thread (progress reports). Returns its exit code
    and reported metadata whatever the code; raises only what interrupted the wait, after the tree
    was stopped."""
    with open_pipes_session(
        context=context, context_injector=PipesTempFileContextInjector(), message_reader=PipesTempFileMessageReader()
    ) as session:
        full_env = {**(os.environ if env is None else env), **session.get_bootstrap_env_vars()}
        code = run_in_group(
            cmd,
            full_env,
            Path(log_path),
            grace_seconds,
            on_tick=on_tick,
            tick_seconds=tick_seconds,
            on_stop=lambda pid: context.log.warning(f"stopping {what} (process group {pid})"),
        )
    return ProcessResult(code, reported_metadata(session.get_results()))
