"""The Spark application of one data-preparation stage, run by ``spark-submit`` (submit.SparkExecutor)::

    spark-submit --master local[2] largetrain_core/executors/spark/job.py JOB.json

JOB.json: ``{"stage": "ingest"|"map_parts"|"deduplicate"|"find_contamination"|"tokenize", "args": {...},
"stats": PATH, "conf": {...}}``;
the stage's counts are written to ``stats``, progress and Spark stage completion go to Dagster Pipes
when the process was started by Dagster (else to stderr).
"""

import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the package, never this directory's modules by their bare names
    sys.path[0] = str(Path(__file__).resolve().parents[3])

import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from pyspark.sql import SparkSession  # noqa: E402

from largetrain_core.dedup import DedupConfig, VerifyConfig  # noqa: E402
from largetrain_core.executors.spark.commit import Uploads  # noqa: E402
from largetrain_core.executors.spark.decontamination import find_contamination  # noqa: E402
from largetrain_core.executors.spark.dedup import deduplicate  # noqa: E402
from largetrain_core.executors.spark.ingest import ingest  # noqa: E402
from largetrain_core.executors.spark.map_parts import map_parts  # noqa: E402
from largetrain_core.executors.spark.progress import Progress, progress  # noqa: E402
from largetrain_core.executors.spark.session import session  # noqa: E402
from largetrain_core.executors.spark.submit import decode_step  # noqa: E402
from largetrain_core.executors.spark.tokenize import tokenize  # noqa: E402
from largetrain_core.readers import ReaderConfig  # noqa: E402
from largetrain_core.storage import write_json_atomic  # noqa: E402

STAGES = ("ingest", "map_parts", "deduplicate", "find_contamination", "tokenize")


def run_stage(spark: SparkSession, stage: str, args: dict, progress: Progress, uploads: Uploads) -> dict:
    """Run one stage from its JSON arguments (as written by submit.SparkExecutor); the tasks put their
    files under ``uploads.url`` when it is set (args["out_url"]: the version's URL)."""
    out = Path(args["out_dir"])
    if stage == "ingest":
        return ingest(spark, ReaderConfig(**args["reader"]), out, progress, uploads)
    if stage == "map_parts":
        return map_parts(spark, decode_step(args["step"]), Path(args["in_dir"]), out, progress, uploads)
    if stage == "deduplicate":
        return deduplicate(
            spark,
            [Path(d) for d in args["in_dirs"]],
            out,
            DedupConfig(**args["dedup"]),
            progress,
            uploads,
            VerifyConfig(**args["verify"]) if args.get("verify") else None,
        )
    if stage == "find_contamination":
        return find_contamination(
            spark, [Path(d) for d in args["in_dirs"]], Path(args["index_dir"]), Path(args["out_file"]), progress
        )
    if stage == "tokenize":
        return tokenize(
            spark,
            Path(args["in_dir"]),
            Path(args["tokenizer"]),
            out,
            args["partition"],
            args["partitions"],
            decode_step(args["packing"]),
            progress,
            uploads,
        )
    raise ValueError(f"unknown stage {stage!r}: one of {STAGES}")


def main(argv: list[str]) -> int:
    """``spark-submit .../executors/spark/job.py JOB.json``: run the job's stage, write its counts to job["stats"]."""
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
        uploads = Uploads(job["args"].get("out_url"))
        with progress(spark, log) as steps:
            stats = run_stage(spark, job["stage"], job["args"], steps, uploads)
        meta = {
            "spark_application_id": sc.applicationId,
            "spark_master": sc.master,
            "spark_version": spark.version,
            "spark_default_parallelism": sc.defaultParallelism,
            "spark_session_start_seconds": round(started, 3),
        }
        write_json_atomic(Path(job["stats"]), {"stats": stats, "spark": meta, "uploaded": uploads.objects})
        if pipes:
            pipes.report_custom_message(meta)
        log(f"{job['stage']} done in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
