"""A class-data archive of Spark's JVM classes (AppCDS, JEP 350), for applications on ``local*`` masters.

A short Spark application spends most of its JVM's CPU loading and verifying Spark's classes from the
jars. The JVM can map them, already parsed and verified, from an archive that an earlier run of the
same JVM on the same class path dumped at exit (``-XX:ArchiveClassesAtExit``). ``make install``
(after the ``[spark]`` extra) builds the archive once per virtualenv at :func:`path` by running
:func:`warm_up` under spark-submit; ``submit.local_jvm_conf`` then starts the driver and executor JVMs of
local masters with ``-XX:SharedArchiveFile``. Measured on a 2-core EPYC, a tiny DataFrame job on
``local[2]``: 17 s and 18.4 CPU s without the archive, 11 s and 11.9 CPU s with it (about 35 % less);
on ``local-cluster[1,1,1024]`` 22.5 s / 28.4 CPU s against 15.1 s / 19.0 CPU s.

An archive dumped by another JVM build or for another class path is not used: the JVM prints nothing
(``-Xshare:auto``, the default) and loads the classes from the jars, as without it. Remote masters
(``spark://``, ``k8s://``, ``yarn``) never get the option: the archive is a file of this machine.

:func:`build` writes it atomically: a JVM that dies leaves no archive.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file by build(): never this directory's modules by their bare names
    sys.path[0] = str(Path(__file__).resolve().parents[3])

import os  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from importlib.util import find_spec  # noqa: E402

# the JVM options of every local* application (the C1 compiler only and the serial collector: short-lived
# single-machine applications start and finish faster; their JVMs do little work of their own, the rules run
# in Python workers)
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def path() -> Path:
    """``<virtualenv>/spark-classes.jsa``: beside the pyspark jars it was dumped from."""
    return Path(sys.prefix) / "spark-classes.jsa"


def build(out: Path | None = None, timeout: float = 600) -> Path:
    """Run :func:`warm_up` under spark-submit on ``local[2]`` with ``-XX:ArchiveClassesAtExit`` and move the
    archive to ``out`` (default :func:`path`). About 45 s and 150 MB. Raises RuntimeError naming the
    exit status and the log's tail when the application fails or dumps no archive."""
    out = Path(out or path())
    spec = find_spec("pyspark")
    if spec is None or not spec.origin:
        raise RuntimeError("the Spark class archive needs pyspark: pip install -e '.[spark]'")
    submit = Path(spec.origin).parent / "bin" / "spark-submit"
    with tempfile.TemporaryDirectory(prefix=".spark-classes-", dir=out.parent) as tmp:
        dumped = Path(tmp) / out.name
        options = (
            f"{JVM_OPTIONS} -XX:ArchiveClassesAtExit={shlex.quote(str(dumped))} -Xlog:cds=off -Xlog:cds+dynamic=off"
        )
        cmd = [str(submit), "--master", "local[2]", "--driver-java-options", options]
        cmd += [__file__, tmp]
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
        env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
        proc = subprocess.run(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
        )
        if proc.returncode != 0 or not dumped.is_file():
            raise RuntimeError(
                f"the Spark class archive: spark-submit exited with {proc.returncode}"
                f"{'' if dumped.is_file() else ' and dumped no archive'}:\n{proc.stdout[-3000:]}"
            )
        os.replace(dumped, out)
    return out


def warm_up(scratch: str) -> None:
    """The operations of the data-prep stages, on a few rows: a DataFrame from Python rows, Parquet
    written and read back, a group-by, a join, a union, a repartition and ``mapInArrow`` through a Python
    worker, so that the classes they load are in the archive."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("largetrain-class-archive").getOrCreate()
    try:
        df = spark.createDataFrame([(i, f"doc {i}") for i in range(256)], ["id", "text"])
        df.write.parquet(f"{scratch}/parts")
        read = spark.read.parquet(f"{scratch}/parts")
        counts = read.groupBy((read.id % 7).alias("k")).count()
        joined = read.join(counts, read.id == counts.k, "left").unionByName(
            read.join(counts, read.id == counts.k, "left")
        )

        def lengths(batches):
            for b in batches:
                yield pa.RecordBatch.from_pydict({"id": b.column("id"), "n": pc.utf8_length(b.column("text"))})

        out = joined.repartition(2).mapInArrow(lengths, "id long, n int").collect()
        assert len(out) == 512, len(out)
    finally:
        spark.stop()


if __name__ == "__main__":  # the application that build() submits
    warm_up(sys.argv[1])
