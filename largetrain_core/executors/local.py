"""The local engine: tasks in this process, or in ``workers`` spawned processes (the default engine,
and what ``make demo`` runs)."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from largetrain_core.executors.base import Executor, ExecutorError, RECORD


@dataclass(frozen=True)
class LocalSettings:
    """The local engine's settings."""

    workers: int = field(
        default=1,
        metadata={
            "description": "Tasks (part files of cleaned_text and filtered_text, runs of token_shards) at once, "
            "each in a worker process (memory: about this many parts); 1: one at a time in the step's "
            "process. The outputs do not depend on it. LARGETRAIN_WORKERS."
        },
    )

    def __post_init__(self):
        if not isinstance(self.workers, int) or isinstance(self.workers, bool) or self.workers < 1:
            raise ValueError(f"executor workers must be an integer >= 1, got {self.workers!r}")


class LocalExecutor(Executor):
    """Every task in the calling process, one at a time (memory bounded by a part); with
    ``settings.workers`` > 1, tasks in that many spawned processes (as datatrove's
    LocalPipelineExecutor ``workers``)."""

    name = "local"
    Settings = LocalSettings

    @property
    def slots(self) -> int:
        return self.settings.workers

    def map_tasks(self, fn: Callable[[Any], Any], units: Sequence[Any], description: str = "") -> list:
        """Raises ExecutorError (retryable) when a worker process died, e.g. killed for memory."""
        workers = min(self.settings.workers, len(units))
        if workers <= 1:
            return [fn(u) for u in units]
        # spawn, not fork: the caller (a Dagster step, the polars pool) holds threads
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        try:
            results = list(pool.map(fn, units))
        except BrokenProcessPool as e:
            pool.shutdown(wait=False, cancel_futures=True)
            raise ExecutorError(
                f"{description}: a worker process of the local executor died ({e}); if it ran out of "
                f"memory (each holds a task's part), lower the executor's workers (now "
                f"{self.settings.workers}, LARGETRAIN_WORKERS)"
            ) from e
        except BaseException:  # a task failed, or the step was cancelled: start no other task
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        return results

    def record(self, **extra) -> dict:
        return {RECORD: {"executor": self.name, "workers": self.settings.workers, **extra}}


EXECUTOR = LocalExecutor
