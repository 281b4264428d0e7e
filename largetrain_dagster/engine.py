"""The data-preparation engine of raw_corpus, cleaned_text and deduplicated_text: ``local`` (the core's
polars functions in the asset's process; the default and the engine of ``make demo``) or ``spark``
(largetrain_core.spark_prep, with the same outputs, on any Spark master).

Chosen by the ``engine`` resource's config, or by the environment when the code location loads:
LARGETRAIN_ENGINE (``local`` or ``spark``), LARGETRAIN_SPARK_MASTER (``local[*]`` by default;
``local-cluster[2,1,1024]``, ``spark://host:7077``, ``k8s://https://host:443``, ``yarn``) and
LARGETRAIN_SPARK_CONF (a JSON object of more Spark settings, e.g. ``{"spark.executor.memory": "4g"}``).

Spark work is started the way Dagster recommends for Spark: ``spark-submit`` of
``largetrain_core/spark_prep.py`` through Dagster Pipes (``open_pipes_session``; the job calls
``open_dagster_pipes``), in a process group of its own. The job's log lines and its Spark stage
progress arrive as Dagster log messages; the engine, the master and the Spark application id are in
the materialization metadata. When the run is cancelled or the asset fails, the group and every
descendant (driver JVM, Python driver, local-cluster executor JVMs and their Python workers) get
SIGTERM, then SIGKILL after ``kill_grace_seconds``. The engine is not part of any data version: both
engines write the same data.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path

from dagster import (
    ConfigurableResource,
    Failure,
    MetadataValue,
    PipesTempFileContextInjector,
    PipesTempFileMessageReader,
    open_pipes_session,
)

from largetrain_core.clean import QualityConfig, clean_corpus
from largetrain_core.corpus import ReaderConfig, ingest
from largetrain_core.dedup import DedupConfig, deduplicate
from largetrain_dagster.resources import stop_process_group

ENGINES = ("local", "spark")


class DataEngine(ConfigurableResource):
    """Where raw_corpus, cleaned_text and deduplicated_text compute (module docstring)."""

    engine: str = "local"
    master: str = "local[*]"
    conf: dict[str, str] = {}
    spark_submit: str = ""  # path of spark-submit; "" = $SPARK_HOME/bin/spark-submit, else pyspark's own
    kill_grace_seconds: float = 10.0

    @classmethod
    def from_env(cls) -> "DataEngine":
        """The engine named by LARGETRAIN_ENGINE / LARGETRAIN_SPARK_MASTER / LARGETRAIN_SPARK_CONF.
        Raises ValueError for an unknown engine or a LARGETRAIN_SPARK_CONF that is not a JSON object."""
        engine = os.environ.get("LARGETRAIN_ENGINE", "local")
        if engine not in ENGINES:
            raise ValueError(f"LARGETRAIN_ENGINE must be one of {ENGINES}, got {engine!r}")
        try:
            conf = json.loads(os.environ.get("LARGETRAIN_SPARK_CONF") or "{}")
        except json.JSONDecodeError as e:
            raise ValueError(f"LARGETRAIN_SPARK_CONF is not JSON: {e}") from e
        if not isinstance(conf, dict):
            raise ValueError("LARGETRAIN_SPARK_CONF must be a JSON object of Spark settings")
        return cls(engine=engine, master=os.environ.get("LARGETRAIN_SPARK_MASTER", "local[*]"),
                   conf={str(k): str(v) for k, v in conf.items()})

    # ---------------------------------------------------------------------------------------- stages

    def ingest(self, context, reader: ReaderConfig, out: Path) -> dict:
        """corpus.ingest(reader, out) on this engine; its counts plus ``engine``."""
        if self._local():
            return {**ingest(reader, out), "engine": {"engine": "local"}}
        return self._spark(context, "ingest", {"reader": dataclasses.asdict(reader)}, out)

    def clean(self, context, in_dir: Path, out: Path, quality: QualityConfig) -> dict:
        """clean.clean_corpus(in_dir, out, quality) on this engine; its counts plus ``engine``."""
        if self._local():
            return {**clean_corpus(in_dir, out, quality), "engine": {"engine": "local"}}
        return self._spark(context, "clean", {"in_dir": str(in_dir), "quality": dataclasses.asdict(quality)}, out)

    def deduplicate(self, context, in_dirs: list[Path], out: Path, cfg: DedupConfig) -> dict:
        """dedup.deduplicate(in_dirs, out, cfg) on this engine; its counts plus ``engine``."""
        if self._local():
            return {**deduplicate(in_dirs, out, cfg), "engine": {"engine": "local"}}
        return self._spark(context, "deduplicate", {"in_dirs": [str(d) for d in in_dirs], "dedup": dataclasses.asdict(cfg)}, out)

    # ---------------------------------------------------------------------------------------- spark

    def _local(self) -> bool:
        if self.engine not in ENGINES:
            raise Failure(f"engine must be one of {ENGINES}, got {self.engine!r}")
        return self.engine == "local"

    def submit_command(self, job_file: Path, stage: str) -> list[str]:
        """The spark-submit command line of one stage's job."""
        import largetrain_core

        submit = self.spark_submit
        if not submit and os.environ.get("SPARK_HOME"):
            submit = str(Path(os.environ["SPARK_HOME"]) / "bin" / "spark-submit")
        if not submit:
            spec = find_spec("pyspark")
            if spec is None or not spec.origin:
                raise Failure("engine spark needs pyspark: pip install -e '.[spark]' (and Java 17: "
                              "scripts/install_system_deps.sh), or set spark_submit / SPARK_HOME")
            submit = str(Path(spec.origin).parent / "bin" / "spark-submit")
        job = Path(largetrain_core.__file__).parent / "spark_prep.py"
        conf = dict(self.conf)
        if self.master.startswith("local"):  # the driver JVM starts before the job's session: its options go here
            from largetrain_core.spark_prep import LOCAL_JVM_CONF

            conf = {**LOCAL_JVM_CONF, **conf}
        confs = [a for k, v in sorted(conf.items()) for a in ("--conf", f"{k}={v}")]
        return [submit, "--master", self.master, "--name", f"largetrain-{stage}", *confs, str(job), str(job_file)]

    def _spark(self, context, stage: str, args: dict, out: Path) -> dict:
        """Run one stage under spark-submit through Dagster Pipes; returns its counts plus ``engine``.
        Raises Failure with the tail of the Spark log when the application fails."""
        work = Path(tempfile.mkdtemp(prefix=f".spark-{stage}-", dir=Path(out).parent))  # beside the artefact, not in it
        try:
            job_file, stats_file, log_file = work / "job.json", work / "stats.json", work / "spark.log"
            job_file.write_text(json.dumps({"stage": stage, "args": {**args, "out_dir": str(out)}, "stats": str(stats_file),
                                            "conf": self.conf}, indent=1))
            cmd = self.submit_command(job_file, stage)
            env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
                   "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON", sys.executable),
                   "PYTHONUNBUFFERED": "1"}
            if self.master.startswith("local"):
                env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            context.log.info(f"engine spark: {' '.join(cmd)}")
            t0 = time.perf_counter()
            with open_pipes_session(context=context, context_injector=PipesTempFileContextInjector(),
                                    message_reader=PipesTempFileMessageReader()) as session:
                env.update(session.get_bootstrap_env_vars())
                with open(log_file, "ab") as logf:
                    proc = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
                    try:
                        while proc.poll() is None:
                            time.sleep(0.5)
                    finally:
                        if proc.poll() is None:
                            context.log.warning(f"stopping the Spark application (process group {proc.pid})")
                        stop_process_group(proc, self.kill_grace_seconds)
            if proc.returncode != 0 or not stats_file.exists():
                lines = log_file.read_text(errors="replace").splitlines()
                errors = [ln for ln in lines if "Error" in ln or "Exception" in ln]
                raise Failure(f"Spark {stage} exited with code {proc.returncode}: {errors[-1] if errors else 'see the log'}\n"
                              "last lines of the Spark log:\n" + "\n".join(lines[-40:]))
            result = json.loads(stats_file.read_text())
            meta = {"engine": "spark", **result["spark"], "spark_seconds": round(time.perf_counter() - t0, 3)}
            return {**result["stats"], "engine": meta}
        finally:
            shutil.rmtree(work, ignore_errors=True)


def engine_metadata(stats: dict) -> dict:
    """Materialization metadata of the engine that built an artefact (``local`` for artefacts built
    before the engine was recorded)."""
    e = stats.get("engine") or {"engine": "local"}
    md = {"engine": e["engine"]}
    if e["engine"] == "spark":
        md.update({"spark_master": e.get("spark_master", ""), "spark_application_id": e.get("spark_application_id", ""),
                   "spark_version": e.get("spark_version", ""), "spark": MetadataValue.json(e)})
    return md
