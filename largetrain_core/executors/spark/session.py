"""The Spark session of the data-preparation jobs: executors run this interpreter with the project
importable; for a ``local*`` master everything binds to 127.0.0.1 and the web UI is off."""

from __future__ import annotations

import os
import re
import sys

from pyspark.sql import SparkSession

from largetrain_core.executors.spark.submit import local_jvm_conf


def session(master: str | None = None, app_name: str = "largetrain-prep", conf: dict | None = None) -> SparkSession:
    """A SparkSession for the data-prep stages.

    ``master``: a Spark master URL (``local[*]``, ``local-cluster[2,1,1024]``, ``spark://host:7077``,
    ``k8s://...``, ``yarn``) or None to take the one ``spark-submit`` was given. Executors run
    ``PYSPARK_PYTHON`` (default this interpreter) with POLARS_MAX_THREADS and OMP_NUM_THREADS set to
    ``spark.executor.cores`` (default 1), so a task uses the cores it was given. A ``local*`` master
    binds driver, block manager and workers to 127.0.0.1 (SPARK_LOCAL_IP), turns the web UI off and
    starts the JVMs with :func:`submit.local_jvm_conf`.
    ``conf``: more Spark settings, applied last.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    b = SparkSession.builder.appName(app_name)
    if master:
        b = b.master(master)
    effective = master or os.environ.get("MASTER", "") or _submitted_master()
    settings: dict[str, str] = {}
    if effective.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings.update(
            {
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.ui.enabled": "false",
                **local_jvm_conf(),
            }
        )
    cores = str((conf or {}).get("spark.executor.cores", "1"))
    settings.update(
        {
            "spark.executorEnv.PYSPARK_PYTHON": os.environ["PYSPARK_PYTHON"],
            "spark.executorEnv.POLARS_MAX_THREADS": cores,
            "spark.executorEnv.OMP_NUM_THREADS": cores,
            "spark.sql.execution.arrow.maxRecordsPerBatch": "1024",
            "spark.ui.showConsoleProgress": "false",
        }
    )
    if os.environ.get("PYTHONPATH"):
        settings["spark.executorEnv.PYTHONPATH"] = os.environ["PYTHONPATH"]
    settings.update({k: str(v) for k, v in (conf or {}).items()})
    for k, v in settings.items():
        b = b.config(k, v)
    return b.getOrCreate()


def _submitted_master() -> str:
    """The --master of spark-submit, which passes it to the driver as the system property spark.master
    (visible here only through the JVM once started: read from the submit arguments instead)."""
    args = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    m = re.search(r"--master\s+(\S+)", args)
    return m.group(1) if m else ""
