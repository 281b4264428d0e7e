"""The one way a step runs a command of its own: :func:`run_process`.

The command starts in a process group of its own through Dagster Pipes (a temporary-file context
and message channel, ``open_pipes_session``, read by :class:`WholeLineMessageReader`): what it logs
with ``open_dagster_pipes`` arrives in the run log as it happens, and what it reports
(``report_asset_materialization``) comes back as metadata. Its stdout and stderr go to a log file.
When the step fails or the run is cancelled while it runs, the whole process tree gets SIGTERM, then
SIGKILL after the grace period (largetrain_core.processes.stop_process_group), and the run log says so.

Used by the training launcher (torchrun, also for the optimization ablation) and the Spark
executor (spark-submit). The Kubernetes launcher keeps dagster-k8s's ``PipesK8sClient``, which
owns its pod's session; it shares :func:`reported_metadata`.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from dagster import PipesMessageReader, PipesTempFileContextInjector, open_pipes_session
from dagster_pipes import PipesDefaultMessageWriter

from largetrain_core.processes import run_in_group


@dataclass(frozen=True)
class ProcessResult:
    """``returncode``: the command's exit code (negative: the signal that killed it); ``metadata``:
    what it reported through Pipes, merged (:func:`reported_metadata`)."""

    returncode: int
    metadata: dict = field(default_factory=dict)


class WholeLineMessageReader(PipesMessageReader):
    """Dagster's temporary-file message channel (``PipesTempFileMessageReader``'s protocol: the child
    appends one JSON message per line to the file named in its bootstrap parameters), read so that a
    message is handled only once its line is whole.

    Dagster's reader thread parses whatever ``readline`` returns at the end of the file, so a message
    read while the child is still writing it (a write that crosses a page boundary reaches the file
    in parts) fails to parse and ends the thread: every later log line and report of the command is
    lost. Here the part is kept until the rest of its line arrives. A line that does not parse, a
    message Dagster's handler refuses, and a last line the command never finished (killed while
    writing it) are reported to the run as Pipes framework errors naming the file and the line
    number; the lines after them are still read."""

    @contextmanager
    def read_messages(self, handler) -> Iterator[dict]:
        closed = threading.Event()
        with tempfile.TemporaryDirectory(prefix="largetrain-pipes-") as tmp:
            path = os.path.join(tmp, "messages")
            open(path, "wb").close()
            thread = threading.Thread(target=self._read, args=(path, handler, closed), daemon=True)
            thread.start()
            try:
                yield {
                    PipesDefaultMessageWriter.FILE_PATH_KEY: path,
                    PipesDefaultMessageWriter.INCLUDE_STDIO_IN_MESSAGES_KEY: False,
                }
            finally:
                closed.set()
                thread.join()

    @staticmethod
    def _read(path: str, handler, closed: threading.Event) -> None:
        def bad(number: int, reason: str) -> None:
            where = f"{path}, line {number}: {reason}"
            try:
                raise ValueError(where)
            except ValueError:
                handler.report_pipes_framework_exception(where, sys.exc_info())

        pending, number = b"", 0
        with open(path, "rb") as f:
            while True:
                part = f.readline()
                if part.endswith(b"\n"):
                    line, pending, number = pending + part, b"", number + 1
                    try:
                        message = json.loads(line)
                    except ValueError as e:
                        bad(number, f"not a Pipes message ({e}): {line[:200]!r}")
                        continue
                    try:
                        handler.handle_message(message)
                    except Exception:
                        handler.report_pipes_framework_exception(f"{path}, line {number}", sys.exc_info())
                elif part:
                    pending += part
                elif closed.is_set():
                    break
                else:
                    time.sleep(0.01)
        if pending:
            bad(number + 1, f"the command's last message is incomplete: {pending[:200]!r}")

    def no_messages_debug_text(self) -> str:
        return "Attempted to read messages from a local temporary file."


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
        context=context, context_injector=PipesTempFileContextInjector(), message_reader=WholeLineMessageReader()
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
