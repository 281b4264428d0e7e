"""The engine interface of data preparation: where raw_corpus, cleaned_text, deduplicated_text,
filtered_text and token_shards' partitions compute (docs/ARCHITECTURE.md, "Adding an executor").
datatrove's ``executor/base.py`` is the model: an engine runs tasks, "rank r of world", and names no
stage.

Two primitives:

* :meth:`Executor.map_tasks` ``(fn, units)``: ``fn(unit)`` for every unit, independent tasks, the
  results in the units' order. ``fn`` and the units must pickle (a module-level function or a
  ``functools.partial`` of one) for an engine that runs them in other processes.
* :meth:`Executor.run_global` ``(fn, out_dir, **inputs)``: a step over the whole input,
  ``fn(engine, out_dir, **inputs) -> counts``, which writes only inside ``out_dir`` (a temporary
  directory renamed into place by the caller when complete: largetrain_core.artifacts) and hands
  its independent parts to ``engine.map_tasks``. Here it runs in this process; an engine may run it
  elsewhere (Spark: in a Spark application, with a distributed implementation of its own where it has
  one). The data-preparation steps are such functions (largetrain_core.executors.steps).

An engine must give the outputs of the local engine, in the same layout, with the same counts
(token shards: the same sequences in the same order): so the engine is in no data version.

Engines are found by name: ``largetrain_core.executors.<name>`` holds ``EXECUTOR``, the class
(:func:`load`), whose ``Settings`` dataclass is its own settings (nested under its name in
largetrain_core.executors.settings.ExecutorSettings). :meth:`Executor.run_global` returns the step's
counts plus :data:`RECORD`: what ran it (``{"executor": name, ...}``), which the engine's
:meth:`Executor.metadata` turns into materialization metadata.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

RECORD = "executor"  # the stats key of the engine record
LOG = logging.getLogger("largetrain_core.executors")
KILL_GRACE_SECONDS = 10.0  # default seconds between SIGTERM and SIGKILL to a process an engine starts
NOT_ENGINES = {"base", "settings", "steps"}  # the modules of largetrain_core.executors that are no engine
# (command, environment, log file) -> exit code: how an engine starts a process of its own
Launch = Callable[[list[str], dict, Path], int]


@dataclass(frozen=True)
class NoSettings:
    """The settings of an engine that has none."""


class ExecutorError(RuntimeError):
    """An engine's job failed (not the data): the message holds what its log says. Running again can succeed."""


class Executor(ABC):
    """Where the data-preparation steps compute: :meth:`map_tasks` (abstract) and :meth:`run_global`.

    ``settings``: the engine's own (an instance of its ``Settings``; default ``Settings()``);
    ``launch``: how to start a process of its own (default :func:`launch_in_group`; the Dagster
    resource passes one that runs it through Dagster Pipes); ``log``: where its lines go
    (``info``/``warning``)."""

    name: str = ""
    Settings: type = NoSettings
    process_name: str = "the executor's process"  # how a log names a process it starts ("stopping <process_name>")

    def __init__(self, settings: Any = None, launch: Launch | None = None, log=None):
        self.settings = self.Settings() if settings is None else settings
        if not isinstance(self.settings, self.Settings):
            raise TypeError(
                f"executor {self.name}: settings must be {self.Settings.__name__}, got {type(settings).__name__}"
            )
        self.launch = launch or launch_in_group
        self.log = log or LOG

    @property
    def slots(self) -> int:
        """Tasks that run at once (a step may cut its work into this many runs); 1 by default."""
        return 1

    @abstractmethod
    def map_tasks(self, fn: Callable[[Any], Any], units: Sequence[Any], description: str = "") -> list:
        """``[fn(u) for u in units]``: each unit an independent task (rank r of world len(units)), run
        wherever the engine runs tasks; results in the units' order. ``description``: what the tasks do,
        for the log and for errors. A task's exception is raised as it is; the engine's own failure
        (a worker process killed, a lost cluster) raises :class:`ExecutorError`."""

    def run_global(self, fn: Callable[..., dict], out_dir: Path, **inputs) -> dict:
        """``fn(self, out_dir, **inputs)`` (a step of largetrain_core.executors.steps, or any function
        of that shape), in this process, its tasks through :meth:`map_tasks`: its counts plus the
        engine record (:data:`RECORD`)."""
        return {**fn(self, Path(out_dir), **inputs), **self.record()}

    def record(self, **extra) -> dict:
        """What ran a step, as recorded in its stats (:data:`RECORD`)."""
        return {RECORD: {"executor": self.name, **extra}}

    @classmethod
    def metadata(cls, record: dict) -> dict:
        """Materialization metadata of the record (:meth:`record`) of a step this engine ran, as plain
        values (a dict is shown as JSON): ``executor`` and ``executor_<key>`` for each of the record's
        other keys."""
        return {"executor": record["executor"], **{f"executor_{k}": v for k, v in record.items() if k != "executor"}}


def launch_in_group(cmd: list[str], env: dict, log_path: Path, grace_seconds: float = KILL_GRACE_SECONDS) -> int:
    """Run ``cmd`` in a process group of its own to its end (largetrain_core.processes.run_in_group)."""
    from largetrain_core.processes import run_in_group

    return run_in_group(cmd, env, Path(log_path), grace_seconds)


def known() -> list[str]:
    """The engine names: the modules and packages of largetrain_core.executors but :data:`NOT_ENGINES`."""
    import largetrain_core.executors as package

    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.name not in NOT_ENGINES)


def load(name: str) -> type[Executor]:
    """The engine class named ``name`` (``EXECUTOR`` of largetrain_core.executors.<name>).
    Raises ValueError naming the known engines."""
    if name not in known():
        raise ValueError(f"executor must be one of {', '.join(known())}, got {name!r}")
    return importlib.import_module(f"largetrain_core.executors.{name}").EXECUTOR


def metadata(stats: dict) -> dict:
    """Materialization metadata of the engine that built an artifact, from its stats' record (an
    engine no longer known: its name only)."""
    record = stats.get(RECORD) or {"executor": "local"}
    try:
        cls = load(record["executor"])
    except ValueError:
        return {"executor": record["executor"]}
    return cls.metadata(record)
