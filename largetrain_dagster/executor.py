"""The data-preparation executor resource: where raw_corpus, cleaned_text, deduplicated_text, filtered_text and
token_shards' partitions compute
(largetrain_core.executors): ``local`` (the core's functions in the step's process; the default and
the executor of ``make demo``), ``threads`` (a thread pool of the step's process) or ``spark``
(largetrain_core.executors.spark, the same outputs, on any Spark master). Each engine's settings nest
under its name (``{name: spark, spark: {master: ..., conf: {...}}}``; largetrain_core.executors.settings).

Chosen by the ``executor`` resource's config, or by the environment when the code location loads:
LARGETRAIN_EXECUTOR (``local`` or ``spark``; LARGETRAIN_ENGINE, its former name, still works and
logs a deprecation warning), LARGETRAIN_SPARK_MASTER (``local[*]`` by default;
``local-cluster[2,1,1024]``, ``spark://host:7077``, ``k8s://https://host:443``, ``yarn``) and
LARGETRAIN_SPARK_CONF (a JSON object of more Spark settings, e.g. ``{"spark.executor.memory": "4g"}``)
and LARGETRAIN_WORKERS (the local executor's part files at once, each in a worker process; 1 by default).

A process an executor starts (Spark: one ``spark-submit`` per stage) runs through Dagster Pipes
(largetrain_dagster.runner.run_process) in a process group of its own: its log lines and Spark stage
progress arrive as Dagster log messages, and when the run is cancelled or the asset fails the whole
tree gets SIGTERM, then SIGKILL after ``kill_grace_seconds``. The executor, the master and the Spark
application id are in the materialization metadata; the executor is in no data version.
"""

from __future__ import annotations

import json
import logging
import os

from dagster import ConfigurableResource, Failure

from largetrain_core.executors.base import Executor, load
from largetrain_core.executors.settings import ExecutorSettings
from largetrain_core.settings import positive_int
from largetrain_dagster.configs import dagster_config
from largetrain_dagster.runner import run_process

LOG = logging.getLogger(__name__)


class DataExecutor(dagster_config(ExecutorSettings, "DataExecutorFields", base=ConfigurableResource)):
    """Where the data-preparation stages compute (largetrain_dagster.executor)."""

    @classmethod
    def from_env(cls) -> "DataExecutor":
        """The executor named by LARGETRAIN_EXECUTOR (or, deprecated, LARGETRAIN_ENGINE) with
        LARGETRAIN_SPARK_MASTER / LARGETRAIN_SPARK_CONF / LARGETRAIN_WORKERS. Raises ValueError for an
        unknown executor, two names that disagree, a LARGETRAIN_SPARK_CONF that is not a JSON object or
        LARGETRAIN_WORKERS not a positive integer."""
        name, old = os.environ.get("LARGETRAIN_EXECUTOR"), os.environ.get("LARGETRAIN_ENGINE")
        if old is not None:
            LOG.warning(
                "LARGETRAIN_ENGINE is deprecated: set LARGETRAIN_EXECUTOR=%s instead (the data-prep "
                "engine is now the executor; DeepSpeed's engine is another thing)",
                old,
            )
            if name is not None and name != old:
                raise ValueError(
                    f"LARGETRAIN_EXECUTOR={name} and LARGETRAIN_ENGINE={old} disagree: unset LARGETRAIN_ENGINE"
                )
        name = name or old or "local"
        try:
            load(name)
        except ValueError as e:
            raise ValueError(f"LARGETRAIN_EXECUTOR: {e}") from e
        try:
            conf = json.loads(os.environ.get("LARGETRAIN_SPARK_CONF") or "{}")
        except json.JSONDecodeError as e:
            raise ValueError(f"LARGETRAIN_SPARK_CONF is not JSON: {e}") from e
        if not isinstance(conf, dict):
            raise ValueError("LARGETRAIN_SPARK_CONF must be a JSON object of Spark settings")
        return cls(
            name=name,
            local={"workers": positive_int(os.environ.get("LARGETRAIN_WORKERS", "1"), "LARGETRAIN_WORKERS")},
            spark={
                "master": os.environ.get("LARGETRAIN_SPARK_MASTER", "local[*]"),
                "conf": {str(k): str(v) for k, v in conf.items()},
            },
        )

    def bind(self, context) -> Executor:
        """The executor of one step (largetrain_core.executors.base.Executor), logging to the step's log
        and starting its processes through Dagster Pipes in ``context``."""
        try:
            settings = self.to_core()
        except ValueError as e:
            raise Failure(f"resources.executor: {e}. Not retried (change the config).", allow_retries=False) from e
        try:
            cls = load(settings.name)
        except ValueError as e:
            raise Failure(str(e)) from e

        def launch(cmd: list[str], env: dict, log_path) -> int:
            return run_process(
                context, cmd, log_path, cls.process_name, env=env, grace_seconds=settings.kill_grace_seconds
            ).returncode

        return settings.executor(launch=launch, log=context.log)
