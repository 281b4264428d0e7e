"""The Spark executor as the submitting process sees it: each stage one ``spark-submit`` application
of :mod:`largetrain_core.executors.spark.job` on the settings' master, started by the executor's
``launch`` (the Dagster resource runs it through Dagster Pipes, in its own process group: cancelling
the run stops the driver, the executors and their Python workers). Imports no pyspark: only the
application does.

The job file carries the stage's arguments (a PartStep pickled: the application runs this same
code), the Spark settings and where to write the counts; the application's log goes beside the
artifact's temporary directory, never into it, and its tail is in the error when it fails.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import pickle
import shlex
import shutil
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path

from largetrain_core.dedup import DedupConfig, VerifyConfig
from largetrain_core.executors.base import Executor, ExecutorError
from largetrain_core.executors.spark import class_archive
from largetrain_core.parts import PartStep
from largetrain_core.readers import ReaderConfig
from largetrain_core.shards import Packing
from largetrain_core.storage import direct_url, record_uploaded


def local_jvm_conf() -> dict[str, str]:
    """The driver's and the executors' JVM options for ``local*`` masters: :data:`class_archive.JVM_OPTIONS`,
    and the class-data archive of Spark's classes where ``make install`` built it (:mod:`class_archive`)."""
    options = class_archive.JVM_OPTIONS
    if class_archive.path().is_file():
        options += f" -XX:SharedArchiveFile={shlex.quote(str(class_archive.path()))}"
    return {"spark.driver.extraJavaOptions": options, "spark.executor.extraJavaOptions": options}


JOB = Path(__file__).resolve().parent / "job.py"


def encode_step(step: PartStep | Packing) -> str:
    """A PartStep (or a Packing) as the job file carries it: pickled, base64 text: the application runs
    this same code, and the job file is this process's own."""
    return base64.b64encode(pickle.dumps(step)).decode()


def decode_step(text: str) -> PartStep | Packing:
    return pickle.loads(base64.b64decode(text))


class SparkExecutor(Executor):
    """raw_corpus, cleaned_text, deduplicated_text, filtered_text's n-gram join and token_shards'
    partitions on Apache Spark (``settings.master``, ``settings.conf``)."""

    name = "spark"
    process_name = "the Spark application"

    def ingest(self, reader: ReaderConfig, out_dir: Path) -> dict:
        return self.submit("ingest", {"reader": dataclasses.asdict(reader)}, out_dir)

    def map_parts(self, step: PartStep, in_dir: Path, out_dir: Path) -> dict:
        return self.submit("map_parts", {"in_dir": str(in_dir), "step": encode_step(step)}, out_dir)

    def deduplicate(
        self, in_dirs: list[Path], out_dir: Path, cfg: DedupConfig, verify: VerifyConfig | None = VerifyConfig()
    ) -> dict:
        args = {
            "in_dirs": [str(d) for d in in_dirs],
            "dedup": dataclasses.asdict(cfg),
            "verify": dataclasses.asdict(verify) if verify else None,
        }
        return self.submit("deduplicate", args, out_dir)

    def find_contamination(self, in_dirs: list[Path], index_dir: Path, out_file: Path) -> dict:
        args = {"in_dirs": [str(d) for d in in_dirs], "index_dir": str(index_dir), "out_file": str(out_file)}
        return self.submit("find_contamination", args, Path(out_file).parent)

    def tokenize(
        self, in_dir: Path, tokenizer_path: Path, out_dir: Path, partition: int, partitions: int, packing: Packing
    ) -> dict:
        args = {
            "in_dir": str(in_dir),
            "tokenizer": str(tokenizer_path),
            "partition": partition,
            "partitions": partitions,
            "packing": encode_step(packing),
        }
        return self.submit("tokenize", args, out_dir)

    def command(self, job_file: Path, stage: str) -> list[str]:
        """The spark-submit command line of one stage's job. Raises ExecutorError when there is no spark-submit."""
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

    def submit(self, stage: str, args: dict, out: Path) -> dict:
        """Run one stage as a Spark application; returns its counts plus the executor record (master,
        application id, Spark version, seconds). Raises ExecutorError with the tail of the Spark log
        when the application fails."""
        work = Path(tempfile.mkdtemp(prefix=f".spark-{stage}-", dir=Path(out).parent))  # beside the artifact, not in it
        url = direct_url(out)  # a version at a URL: the tasks put their files there themselves
        try:
            job_file, stats_file, log_file = work / "job.json", work / "stats.json", work / "spark.log"
            job_file.write_text(
                json.dumps(
                    {
                        "stage": stage,
                        "args": {**args, "out_dir": str(out), "out_url": url},
                        "stats": str(stats_file),
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
            result = json.loads(stats_file.read_text())
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
