"""The Spark engine as the submitting process sees it: each step (``run_global``) one ``spark-submit``
application of :mod:`largetrain_core.executors.spark.job` on the settings' master, started by the
engine's ``launch`` (the Dagster resource runs it through Dagster Pipes, in its own process group:
cancelling the run stops the driver, the executors and their Python workers). Imports no pyspark:
only the application does.

The job file names the step function and carries its inputs pickled (the application runs this same
code), the Spark settings and where to write the result; the application's log goes beside the
artifact's temporary directory, never into it, and its tail is in the error when it fails.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Callable, Sequence

from largetrain_core.cache import cache_dir
from largetrain_core.executors import steps
from largetrain_core.executors.base import Executor, ExecutorError
from largetrain_core.executors.spark import class_archive
from largetrain_core.storage import direct_url, record_uploaded


@dataclass(frozen=True)
class SparkSettings:
    """The Spark engine's settings."""

    master: str = field(
        default="local[*]",
        metadata={
            "description": "The cluster: a Spark master URL (local[*], local-cluster[2,1,1024], spark://host:7077, "
            "k8s://https://host:443, yarn). LARGETRAIN_SPARK_MASTER."
        },
    )
    conf: dict[str, str] = field(
        default_factory=dict,
        metadata={
            "description": "More settings of the cluster's jobs (spark.executor.memory, ...). LARGETRAIN_SPARK_CONF "
            "(a JSON object)."
        },
    )
    spark_submit: str = field(
        default="",
        metadata={"description": "Path of spark-submit; empty = $SPARK_HOME/bin/spark-submit, else pyspark's own."},
    )


def local_jvm_conf() -> dict[str, str]:
    """The driver's and the executors' JVM options for ``local*`` masters: :data:`class_archive.JVM_OPTIONS`,
    and the class-data archive of Spark's classes where ``make install`` built it (:mod:`class_archive`)."""
    options = class_archive.JVM_OPTIONS
    if class_archive.path().is_file():
        options += f" -XX:SharedArchiveFile={shlex.quote(str(class_archive.path()))}"
    return {"spark.driver.extraJavaOptions": options, "spark.executor.extraJavaOptions": options}


JOB = Path(__file__).resolve().parent / "job.py"


def encode(value: Any) -> str:
    """A value as the job file carries it: pickled, base64 text (the application runs this same code,
    and the job file is this process's own)."""
    return base64.b64encode(pickle.dumps(value)).decode()


def decode(text: str) -> Any:
    return pickle.loads(base64.b64decode(text))


def step_name(fn: Callable) -> str:
    """``module:qualname`` of a module-level function, as the job file names the step."""
    return f"{fn.__module__}:{fn.__qualname__}"


class SparkExecutor(Executor):
    """The data-preparation steps on Apache Spark (``settings.master``, ``settings.conf``), one
    application per step (:meth:`run_global`)."""

    name = "spark"
    process_name = "the Spark application"

    Settings = SparkSettings

    @classmethod
    def metadata(cls, record: dict) -> dict:
        """``executor``, ``spark_master``, ``spark_application_id``, ``spark_version`` and the whole record."""
        return {
            "executor": record["executor"],
            "spark_master": record.get("spark_master", ""),
            "spark_application_id": record.get("spark_application_id", ""),
            "spark_version": record.get("spark_version", ""),
            "spark": dict(record),
        }

    def map_tasks(self, fn: Callable[[Any], Any], units: Sequence[Any], description: str = "") -> list:
        """The tasks as Spark tasks of an application of their own (steps.map_all)."""
        if not units:
            return []
        base = cache_dir()
        base.mkdir(parents=True, exist_ok=True)
        out = Path(tempfile.mkdtemp(prefix=".spark-tasks-", dir=base))
        try:
            return self.run_global(steps.map_all, out, fn=fn, units=list(units))["results"]
        finally:
            shutil.rmtree(out, ignore_errors=True)

    def command(self, job_file: Path, stage: str) -> list[str]:
        """The spark-submit command line of one step's job (``stage``: the step's name). Raises ExecutorError when there is no spark-submit."""
        submit = self.settings.spark_submit
        if not submit and os.environ.get("SPARK_HOME"):
            submit = str(Path(os.environ["SPARK_HOME"]) / "bin" / "spark-submit")
        if not submit:
            spec = find_spec("pyspark")
            if spec is None or not spec.origin:
                raise ExecutorError(
                    "executor spark needs pyspark: pip install -e '.[spark]' (and Java 17: "
                    "scripts/install_system_deps.sh), or set spark_submit / SPARK_HOME"
                )
            submit = str(Path(spec.origin).parent / "bin" / "spark-submit")
        conf = dict(self.settings.conf)
        if self.settings.master.startswith(
            "local"
        ):  # the driver JVM starts before the job's session: its options go here
            conf = {**local_jvm_conf(), **conf}
        confs = [a for k, v in sorted(conf.items()) for a in ("--conf", f"{k}={v}")]
        return [
            submit,
            "--master",
            self.settings.master,
            "--name",
            f"largetrain-{stage}",
            *confs,
            str(JOB),
            str(job_file),
        ]

    def run_global(self, fn: Callable[..., dict], out_dir: Path, **inputs) -> dict:
        """Run the step ``fn(engine, out_dir, **inputs)`` as a Spark application (job.run_step: Spark's
        own implementation of the step where it has one, else ``fn`` on the driver with its tasks as
        Spark tasks); returns its counts plus the engine record (master, application id, Spark
        version, seconds). Raises ExecutorError with the tail of the Spark log when the application
        fails."""
        out, stage = Path(out_dir), fn.__name__
        work = Path(tempfile.mkdtemp(prefix=f".spark-{stage}-", dir=Path(out).parent))  # beside the artifact, not in it
        url = direct_url(out)  # a version at a URL: the tasks put their files there themselves
        try:
            job_file, stats_file, log_file = work / "job.json", work / "result.pickle", work / "spark.log"
            job_file.write_text(
                json.dumps(
                    {
                        "step": step_name(fn),
                        "inputs": encode(inputs),
                        "out_dir": str(out),
                        "out_url": url,
                        "result": str(stats_file),
                        "conf": self.settings.conf,
                    },
                    indent=1,
                )
            )
            cmd = self.command(job_file, stage)
            env = {
                **os.environ,
                "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
                "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON", sys.executable),
                "PYTHONUNBUFFERED": "1",
            }
            if self.settings.master.startswith("local"):
                env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            self.log.info(f"executor spark: {' '.join(cmd)}")
            t0 = time.perf_counter()
            code = self.launch(cmd, env, log_file)
            if code != 0 or not stats_file.exists():
                lines = log_file.read_text(errors="replace").splitlines() if log_file.exists() else []
                errors = [ln for ln in lines if "Error" in ln or "Exception" in ln]
                raise ExecutorError(
                    f"Spark {stage} exited with code {code}: {errors[-1] if errors else 'see the log'}\n"
                    "last lines of the Spark log:\n" + "\n".join(lines[-40:])
                )
            result = pickle.loads(stats_file.read_bytes())
            record_uploaded(out, result.get("uploaded") or {})
            return {
                **result["stats"],
                **self.record(
                    **result["spark"],
                    spark_seconds=round(time.perf_counter() - t0, 3),
                    **({"task_uploads": len(result["uploaded"])} if url else {}),
                ),
            }
        finally:
            shutil.rmtree(work, ignore_errors=True)


EXECUTOR = SparkExecutor
