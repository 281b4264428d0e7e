"""The Spark executor from Dagster: a partitioned backfill of the data-prep assets (raw_corpus, cleaned_text
per partition, then deduplicated_text) through the dagster CLI and through ``dagster.materialize``, with
``spark-submit`` started by the assets through Dagster Pipes; and a cancelled run, after which no Spark
JVM (driver or executor) and no PySpark worker is left. Shakespeare's plays, 2 data partitions (the
kernel docs for the cancelled run, long enough to be stopped mid-stage). That the Spark executor writes
what the local one writes, stage by stage: tests/integration/test_spark.py.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from dagster import AssetKey, DagsterInstance

from helpers import REPO
from largetrain_core.clean import Cleaning, QualityConfig, clean_corpus
from largetrain_core.corpus import ingest
from largetrain_core.readers import ReaderConfig
from largetrain_core.dedup import DedupConfig, deduplicate
from largetrain_core import fs
from largetrain_core.storage import part_files, verify_manifest
from largetrain_core.processes import proc_stat
from largetrain_dagster import partitions
from largetrain_dagster.corpus import corpus_assets
from largetrain_dagster.definitions import build_definitions
from largetrain_dagster.executor import DataExecutor
from largetrain_dagster.partitions import data_partitions
from largetrain_dagster.resources import read_handle
from helpers.lineage import materialize_lineage

PLAYS = REPO / ".largetrain" / "corpora" / "shakespeare"
KEYS = ["000", "001"]
CLI = [str(Path(sys.executable).with_name("dagster")), "asset", "materialize", "-m", "largetrain_dagster.definitions"]


def _local_chain(tmp: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Kept documents and duplicates of the local executor over the same 2 partitions (core functions)."""
    cleaned = []
    for p in range(2):
        raw, c = tmp / f"raw{p}", tmp / f"clean{p}"
        raw.mkdir(parents=True)
        c.mkdir()
        ingest(ReaderConfig(str(PLAYS), partition=p, partitions=2), raw)
        clean_corpus(raw, c, QualityConfig())
        cleaned.append(c)
    (tmp / "dd").mkdir()
    deduplicate(cleaned, tmp / "dd", DedupConfig())
    return _docs(tmp / "dd"), pl.read_parquet(tmp / "dd" / "duplicates.parquet")


def _docs(d: Path) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(p) for p in part_files(d)], how="vertical_relaxed")


def _backfill(root: str, executor: DataExecutor, run_config: dict) -> None:
    """domain raw_corpus and cleaned_text of each partition, then deduplicated_text, on ``executor``."""
    defs = build_definitions(root=root, wandb_mode="disabled")
    with DagsterInstance.ephemeral() as instance:
        runs = materialize_lineage(
            corpus_assets("domain"), {**defs.resources, "executor": executor}, instance, run_config, partitions=KEYS
        )
        assert runs.success
        assert len(runs.results) == 3  # one run per partition, then the global step
        for m in runs.get_asset_materialization_events():
            md = m.materialization.metadata
            assert md["executor"].value == "spark" and md["spark_master"].value == executor.spark.master
            assert md["spark_application_id"].value.startswith(("local-", "app-"))
        assert all(e.passed for e in runs.get_asset_check_evaluations())  # accounting
        for r in runs.results:  # each run's log has the Spark application's stage progress, through Pipes
            logs = [e.user_message for e in instance.all_logs(r.run_id)]
            assert any(m.startswith("Spark stage ") and "tasks done" in m for m in logs), logs
            assert any("[pipes] external process successfully opened dagster pipes" in m for m in logs)


# What differs between two runs of a version, whatever the storage: when and where it ran (stats), and the
# bookkeeping of the commit (modification times in the manifest, ETags in the marker)
RUN_RECORDS = ("stats.json", "_manifest.json", "_COMMITTED.json")


def _version_files(root: Path) -> dict[str, bytes]:
    """Every data file of every version of the domain chain under ``root`` (relative path -> bytes)."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted((root / "domain").rglob("*"))
        if p.is_file() and p.name not in RUN_RECORDS
    }


@pytest.fixture(scope="module")
def cli_partition(tmp_path_factory) -> Path:
    """The CLI, one run of a partition as `make demo` does: domain raw_corpus + cleaned_text of partition 000
    on ``local[2]``, chosen by LARGETRAIN_EXECUTOR, with a root on local disk; returns the test directory
    (``root``, ``home``, ``cli.log``: the command's output)."""
    tmp = tmp_path_factory.mktemp("cli")
    env = {**_cli_env(tmp), "LARGETRAIN_SPARK_MASTER": "local[2]"}
    m = subprocess.run(
        [*CLI, "--select", "domain/raw_corpus,domain/cleaned_text", "--partition", KEYS[0]],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    (tmp / "cli.log").write_text(m.stdout + m.stderr)
    assert m.returncode == 0, (m.stdout + m.stderr)[-3000:]
    return tmp


def _cli_env(tmp: Path) -> dict[str, str]:
    """The environment of a dagster CLI run on the Spark executor with its root and instance under ``tmp``."""
    env = {
        **os.environ,
        "LARGETRAIN_ROOT": str(tmp / "root"),
        "DAGSTER_HOME": str(tmp / "home"),
        "LARGETRAIN_DATA_PARTITIONS": "2",
        "LARGETRAIN_EXECUTOR": "spark",
    }
    env.pop("LARGETRAIN_ENGINE", None)
    if not (tmp / "home").exists():
        (tmp / "home").mkdir()
        (tmp / "home" / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
        (tmp / "root" / "corpora").mkdir(parents=True)
        (tmp / "root" / "corpora" / "shakespeare").symlink_to(PLAYS)
    return env


def test_backfill_on_s3_through_materialize_writes_the_files_of_local_disk(
    cli_partition, tmp_path, monkeypatch, s3_bucket
):
    """The backfill on ``local-cluster[1,2,1024]`` (an executor JVM of 2 cores, apart from the driver) with the
    corpus and the root in a bucket (moto's S3 server on 127.0.0.1): partition 000's raw_corpus and
    cleaned_text have the data versions and the files, byte for byte, of the CLI's run on ``local[2]`` with a
    root on local disk (:func:`cli_partition`); the kept documents and duplicates of the global step are the
    local executor's (compared by content: the global step's byte-for-byte equality across storage is not
    tested here, its Spark output is the local executor's in tests/integration/test_spark.py). On the bucket
    the tasks read their inputs and put their part files there themselves: the executor has a
    LARGETRAIN_CACHE of its own, and the driver's holds no task's scratch directory."""
    monkeypatch.setattr(partitions, "DATA_PARTITIONS", data_partitions(2))
    driver_cache, executor_cache = tmp_path / "driver cache", tmp_path / "executor cache"
    monkeypatch.setenv("LARGETRAIN_CACHE", str(driver_cache))
    fsys, bucket = fs.filesystem(s3_bucket)
    plays = sorted(p for p in PLAYS.rglob("*") if p.is_file())
    fsys.put(
        [str(p) for p in plays], [f"{bucket}/corpora/shakespeare/{p.relative_to(PLAYS).as_posix()}" for p in plays]
    )
    s3_root = fs.join(s3_bucket, "largetrain")
    cluster = DataExecutor(
        name="spark",
        spark={
            "master": "local-cluster[1,2,1024]",
            "conf": {"spark.executorEnv.LARGETRAIN_CACHE": str(executor_cache)},
        },
    )
    _backfill(
        s3_root,
        cluster,
        {"ops": {"domain__raw_corpus": {"config": {"path": fs.join(s3_bucket, "corpora", "shakespeare")}}}},
    )

    fsys.get(f"{bucket}/largetrain/", str(tmp_path / "bucket"), recursive=True)
    versions = sorted(p.parent for p in (tmp_path / "bucket" / "domain").rglob("_COMMITTED.json"))
    assert len(versions) == 5 and all(
        verify_manifest(fs.join(s3_root, v.relative_to(tmp_path / "bucket").as_posix())) == [] for v in versions
    )
    local, bucket_files = _version_files(cli_partition / "root"), _version_files(tmp_path / "bucket")
    assert {"/".join(rel.split("/")[1:3]) for rel in local} == {"raw_corpus/000", "cleaned_text/000"}
    assert [rel for rel in local if rel not in bucket_files] == []  # the same data versions, the same files
    assert [rel for rel in local if local[rel] != bucket_files[rel]] == []
    assert len(bucket_files) > len(local)  # and partition 001 and the global step beside them
    kept, dups = _local_chain(tmp_path / "local")
    dedup = next(v for v in versions if v.relative_to(tmp_path / "bucket").parts[1] == "deduplicated_text")
    assert _docs(dedup).equals(kept)
    assert pl.read_parquet(dedup / "duplicates.parquet").equals(dups)
    for v in versions:  # every part file the tasks wrote went to the bucket from the tasks themselves
        stats = json.loads((v / "stats.json").read_text())
        assert stats["executor"]["task_uploads"] >= len(list(v.glob("part-*.parquet"))) > 0, v
    assert (executor_cache / "spark-tasks").is_dir() and not any((executor_cache / "spark-tasks").iterdir())
    assert not (driver_cache / "spark-tasks").exists()


def test_backfill_through_the_cli_then_a_cancelled_run_leaves_no_spark_process(cli_partition, tmp_path):
    """The CLI's run of partition 000 (:func:`cli_partition`) ran on the Spark executor, logged its stages,
    and equals the local executor's (the other partition and the global step: the backfill test above; the
    variables' parsing, with the deprecated alias: tests/unit/test_executors.py); then a run of
    pretrain/raw_corpus on a local-cluster (an executor JVM of its own) gets SIGTERM while Spark works (the
    signal a run worker gets when its run is terminated): the step is interrupted, the executor stops the
    application's process group and every descendant; no JVM (driver, executor) and no PySpark worker
    survives; nothing is published."""
    out = (cli_partition / "cli.log").read_text()
    assert "RUN_SUCCESS" in out and "executor spark:" in out and "on local[2]" in out
    assert (
        "Spark stage 0 [raw_corpus: read files]: " in out and f"[{Cleaning.description}, MinHash signatures]: " in out
    )
    handle = read_handle(cli_partition / "root", AssetKey(["domain", "cleaned_text"]), KEYS[0])
    assert handle["stats"]["executor"]["executor"] == "spark"
    raw, local = tmp_path / "raw", tmp_path / "clean"
    raw.mkdir()
    local.mkdir()
    ingest(ReaderConfig(str(PLAYS), partition=0, partitions=2), raw)
    clean_corpus(raw, local, QualityConfig())
    assert _docs(Path(handle["path"])).equals(_docs(local))

    root = str(tmp_path / "root")
    cfg = tmp_path / "run.json"
    cfg.write_text(
        json.dumps(
            {"ops": {"pretrain__raw_corpus": {"config": {"path": str(REPO / ".largetrain" / "corpora" / "linux-doc")}}}}
        )
    )
    env = _cli_env(tmp_path) | {
        "LARGETRAIN_SPARK_MASTER": "local-cluster[1,1,1024]",
        "LARGETRAIN_SPARK_CONF": json.dumps({"spark.largetrain.bytesPerTask": "1"}),
    }
    log = open(tmp_path / "dagster.log", "w")  # noqa: SIM115 (closed in the finally below)
    proc = subprocess.Popen(
        [*CLI, "--select", "pretrain/raw_corpus", "--partition", KEYS[1], "-c", str(cfg)],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:  # wait for the executor JVM and its Python workers
            mine = _ours(root)
            if any("CoarseGrainedExecutorBackend" in c for c in mine.values()) and any(
                "pyspark.daemon" in c for c in mine.values()
            ):
                break
            time.sleep(0.2)
        assert proc.poll() is None, (tmp_path / "dagster.log").read_text()[-3000:]
        started = _ours(root)
        assert sum(c.split()[0].endswith("java") for c in started.values()) >= 2, started  # driver and executor JVMs
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        deadline = time.time() + 30
        while time.time() < deadline and _ours(root):
            time.sleep(0.5)
        assert _ours(root) == {}, f"left running: {_ours(root)}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    text = (tmp_path / "dagster.log").read_text()
    assert "stopping the Spark application" in text, text[-3000:]
    assert proc.returncode != 0
    published = Path(root) / "pretrain" / "raw_corpus" / KEYS[1]
    assert not published.exists() or not list(published.iterdir()), list(published.iterdir())


def _ours(root: str) -> dict[int, str]:
    """Live processes started for this test's storage root (LARGETRAIN_ROOT in their environment):
    pid -> command line."""
    found = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            environ = (p / "environ").read_bytes().split(b"\0")
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        st = proc_stat(int(p.name))
        if f"LARGETRAIN_ROOT={root}".encode() in environ and st is not None and st[0] not in ("Z", "X"):
            found[int(p.name)] = cmd
    return found
