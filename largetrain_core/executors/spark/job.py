"""The Spark application of one data-preparation step, run by ``spark-submit`` (submit.SparkExecutor)::

    spark-submit --master local[2] largetrain_core/executors/spark/job.py JOB.json

JOB.json: ``{"step": "module:function", "inputs": PICKLED, "out_dir": DIR, "out_url": URL|null,
"result": PATH, "conf": {...}}``: the step runs on the driver's engine (driver.SparkDriver: Spark's own
implementation of the step where it has one); its counts, the Spark record and the uploaded files are
written (pickled) to ``result``; progress and Spark stage completion go to Dagster Pipes when the
process was started by Dagster (else to stderr).
"""

import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the package, never this directory's modules by their bare names
    sys.path[0] = str(Path(__file__).resolve().parents[3])

import contextlib  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pickle  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from largetrain_core.executors.base import RECORD  # noqa: E402
from largetrain_core.executors.spark.commit import Uploads  # noqa: E402
from largetrain_core.executors.spark.driver import SparkDriver  # noqa: E402
from largetrain_core.executors.spark.progress import progress  # noqa: E402
from largetrain_core.executors.spark.session import session  # noqa: E402
from largetrain_core.executors.spark.submit import decode  # noqa: E402


def resolve(name: str):
    """The function ``module:qualname`` (submit.step_name)."""
    module, _, qualname = name.partition(":")
    obj = importlib.import_module(module)
    for attr in qualname.split("."):
        obj = getattr(obj, attr)
    return obj


def main(argv: list[str]) -> int:
    """``spark-submit .../executors/spark/job.py JOB.json``: run the job's step, write its result to job["result"]."""
    job = json.loads(Path(argv[0]).read_text())
    with contextlib.ExitStack() as stack:
        pipes = None
        if os.environ.get("DAGSTER_PIPES_CONTEXT"):
            from dagster_pipes import open_dagster_pipes

            pipes = stack.enter_context(open_dagster_pipes())
        lock = threading.Lock()

        def log(msg: str) -> None:
            with lock:
                print(msg, file=sys.stderr, flush=True)
                if pipes:
                    pipes.log.info(msg)

        t0 = time.perf_counter()
        spark = session(conf=job.get("conf"))
        stack.callback(spark.stop)
        sc = spark.sparkContext
        started = time.perf_counter() - t0
        log(
            f"Spark {spark.version} application {sc.applicationId} on {sc.master} "
            f"(default parallelism {sc.defaultParallelism}), session started in {started:.1f} s"
        )
        uploads = Uploads(job.get("out_url"))
        step = resolve(job["step"])
        with progress(spark, log) as steps:
            stats = SparkDriver(spark, steps, uploads).run_global(step, Path(job["out_dir"]), **decode(job["inputs"]))
        stats.pop(RECORD, None)  # the submitting process records the engine
        meta = {
            "spark_application_id": sc.applicationId,
            "spark_master": sc.master,
            "spark_version": spark.version,
            "spark_default_parallelism": sc.defaultParallelism,
            "spark_session_start_seconds": round(started, 3),
        }
        result = Path(job["result"])
        tmp = result.with_name(result.name + ".tmp")
        tmp.write_bytes(pickle.dumps({"stats": stats, "spark": meta, "uploaded": uploads.objects}))
        os.replace(tmp, result)
        if pipes:
            pipes.report_custom_message(meta)
        log(f"{job['step']} done in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
