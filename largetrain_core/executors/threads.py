"""The thread-pool engine: tasks on ``threads`` threads of the step's process. The core's work in a
task (polars, pyarrow, the tokenizer, MinHash) runs outside the GIL, so tasks overlap without the
start-up and pickling of worker processes; memory: about ``threads`` tasks' parts in one process."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from largetrain_core.executors.base import RECORD, Executor


@dataclass(frozen=True)
class ThreadSettings:
    """The thread-pool engine's settings."""

    threads: int = field(
        default=4,
        metadata={
            "description": "Tasks at once, each on a thread of the step's process. The outputs do not depend on it."
        },
    )

    def __post_init__(self):
        if not isinstance(self.threads, int) or isinstance(self.threads, bool) or self.threads < 1:
            raise ValueError(f"executor threads must be an integer >= 1, got {self.threads!r}")


class ThreadExecutor(Executor):
    """Tasks on a pool of ``settings.threads`` threads; a step's global part in the calling thread."""

    name = "threads"
    Settings = ThreadSettings

    @property
    def slots(self) -> int:
        return self.settings.threads

    def map_tasks(self, fn: Callable[[Any], Any], units: Sequence[Any], description: str = "") -> list:
        with ThreadPoolExecutor(max(1, min(self.settings.threads, len(units)))) as pool:
            futures = [pool.submit(fn, u) for u in units]
            try:
                return [f.result() for f in futures]
            except BaseException:  # a task failed: start no other
                for f in futures:
                    f.cancel()
                raise

    def record(self, **extra) -> dict:
        return {RECORD: {"executor": self.name, "threads": self.settings.threads, **extra}}


EXECUTOR = ThreadExecutor
