"""Where data preparation computes, for the whole deployment: the engine's name and each engine's own
settings, nested under its name. An engine's settings appear here once registered (a field named
as the engine, of its ``Settings``); an engine without a field runs with its defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from largetrain_core.executors.base import KILL_GRACE_SECONDS, Executor, Launch, launch_in_group, load
from largetrain_core.executors.local import LocalSettings
from largetrain_core.executors.spark.submit import SparkSettings
from largetrain_core.executors.threads import ThreadSettings


def _describe(text: str) -> dict:
    return {"description": text}


@dataclass(frozen=True)
class ExecutorSettings:
    """Where data preparation computes, for the whole deployment."""

    name: str = field(
        default="local",
        metadata=_describe(
            "The engine: local (in the step's process, or `local.workers` processes), threads (a thread pool "
            "of the step's process) or spark (spark-submit through Dagster Pipes); any module "
            "largetrain_core.executors.<name> that defines EXECUTOR. LARGETRAIN_EXECUTOR."
        ),
    )
    kill_grace_seconds: float = field(
        default=KILL_GRACE_SECONDS,
        metadata=_describe(
            "Seconds between SIGTERM and SIGKILL to a process an engine starts (a Spark job's process group) "
            "when the run is cancelled or fails."
        ),
    )
    local: LocalSettings = field(default_factory=LocalSettings, metadata=_describe("The local engine's settings."))
    threads: ThreadSettings = field(
        default_factory=ThreadSettings, metadata=_describe("The thread-pool engine's settings.")
    )
    spark: SparkSettings = field(default_factory=SparkSettings, metadata=_describe("The Spark engine's settings."))

    def executor(self, launch: Launch | None = None, log=None) -> Executor:
        """The engine named ``name`` with its settings (its field, else its defaults). Raises
        ValueError for an unknown name."""
        cls = load(self.name)
        grace = self.kill_grace_seconds
        return cls(
            getattr(self, self.name, None),
            launch=launch or (lambda cmd, env, log_path: launch_in_group(cmd, env, log_path, grace)),
            log=log,
        )
