"""The Spark engine from Dagster: a partitioned backfill of the data-prep assets (raw_corpus, cleaned_text
per partition, then deduplicated_text) through ``dagster.materialize`` and through the dagster CLI, with
``spark-submit`` started by the assets through Dagster Pipes; and a cancelled run, after which no Spark
JVM (driver or executor) and no PySpark worker is left. Shakespeare's plays, 2 data partitions (the
kernel docs for the cancelled run, long enough to be stopped mid-stage).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
from dagster import AssetKey, DagsterInstance

from largetrain_core.clean import QualityConfig, clean_corpus
from largetrain_core.corpus import ReaderConfig, ingest
from largetrain_core.dedup import DedupConfig, deduplicate
from largetrain_core.storage import part_files
from largetrain_core.launch import proc_stat
from largetrain_dagster import partitions
from largetrain_dagster.corpus import corpus_assets
from largetrain_dagster.definitions import build_definitions
from largetrain_dagster.engine import DataEngine
from largetrain_dagster.partitions import data_partitions
from largetrain_dagster.resources import read_handle
from lineage import materialize_lineage

REPO = Path(__file__).resolve().parents[1]
PLAYS = REPO / ".largetrain" / "corpora" / "shakespeare"
KEYS = ["000", "001"]
DAGSTER = str(Path(sys.executable).with_name("dagster"))


def _local_chain(tmp: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Kept documents and duplicates of the local engine over the same 2 partitions (core functions)."""
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


def test_backfill_with_spark_through_materialize(tmp_path, monkeypatch):
    monkeypatch.setattr(partitions, "DATA_PARTITIONS", data_partitions(2))
    root = tmp_path / "root"
    (root / "corpora").mkdir(parents=True)
    (root / "corpora" / "shakespeare").symlink_to(PLAYS)
    defs = build_definitions(root=str(root), wandb_mode="disabled")
    resources = {**defs.resources, "engine": DataEngine(engine="spark", master="local[2]")}
    with DagsterInstance.ephemeral() as instance:
        runs = materialize_lineage(corpus_assets("domain"), resources, instance, {}, partitions=KEYS)
        assert runs.success
        assert len(runs.results) == 3  # one run per partition, then the global step
        for m in runs.get_asset_materialization_events():
            md = m.materialization.metadata
            assert md["engine"].value == "spark" and md["spark_master"].value == "local[2]"
            assert md["spark_application_id"].value.startswith("local-")
        assert all(e.passed for e in runs.get_asset_check_evaluations())  # accounting
        for r in runs.results:  # each run's log has the Spark application's stage progress, through Pipes
            logs = [e.user_message for e in instance.all_logs(r.run_id)]
            assert any(m.startswith("Spark stage ") and "tasks done" in m for m in logs), logs
            assert any("[pipes] external process successfully opened dagster pipes" in m for m in logs)
    handle = read_handle(root, AssetKey(["domain", "deduplicated_text"]))
    kept, dups = _local_chain(tmp_path / "local")
    assert _docs(Path(handle["path"])).equals(kept)
    assert pl.read_parquet(Path(handle["path"]) / "duplicates.parquet").equals(dups)


def test_backfill_through_the_cli_then_a_cancelled_run_leaves_no_spark_process(tmp_path):
    """The CLI, one run per partition as `make demo` does: domain raw_corpus + cleaned_text of partitions
    000 and 001 (local[2]), equal to the local engine's; then a run of pretrain/raw_corpus on a
    local-cluster (an executor JVM of its own) gets SIGTERM while Spark works (the signal a run worker
    gets when its run is terminated): the step is interrupted, the engine stops the application's
    process group and every descendant; no JVM (driver, executor) and no PySpark worker survives;
    nothing is published."""
    root = str(tmp_path / "root")
    env = {**os.environ, "LARGETRAIN_ROOT": root, "DAGSTER_HOME": str(tmp_path / "home"), "LARGETRAIN_DATA_PARTITIONS": "2",
           "LARGETRAIN_ENGINE": "spark", "LARGETRAIN_SPARK_MASTER": "local[2]"}
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    (tmp_path / "root" / "corpora").mkdir(parents=True)
    (tmp_path / "root" / "corpora" / "shakespeare").symlink_to(PLAYS)
    cli = [DAGSTER, "asset", "materialize", "-m", "largetrain_dagster.definitions"]
    for p, key in enumerate(KEYS):
        m = subprocess.run([*cli, "--select", "domain/raw_corpus,domain/cleaned_text", "--partition", key],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        out = m.stdout + m.stderr
        assert m.returncode == 0, out[-3000:]
        assert "RUN_SUCCESS" in out and "engine spark:" in out and "on local[2]" in out
        assert "Spark stage 0 [raw_corpus: read files]: " in out and "[cleaned_text: normalize and filter]: " in out
        handle = read_handle(tmp_path / "root", AssetKey(["domain", "cleaned_text"]), key)
        assert handle["stats"]["engine"]["engine"] == "spark"
        raw, local = tmp_path / f"raw{p}", tmp_path / f"clean{p}"
        raw.mkdir()
        local.mkdir()
        ingest(ReaderConfig(str(PLAYS), partition=p, partitions=2), raw)
        clean_corpus(raw, local, QualityConfig())
        assert _docs(Path(handle["path"])).equals(_docs(local))

    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({"ops": {"pretrain__raw_corpus": {"config": {"path": str(REPO / ".largetrain" / "corpora" / "linux-doc")}}}}))
    env |= {"LARGETRAIN_SPARK_MASTER": "local-cluster[1,1,1024]", "LARGETRAIN_SPARK_CONF": json.dumps({"spark.largetrain.bytesPerTask": "1"})}
    log = open(tmp_path / "dagster.log", "w")  # noqa: SIM115 (closed in the finally below)
    proc = subprocess.Popen([*cli, "--select", "pretrain/raw_corpus", "--partition", KEYS[1], "-c", str(cfg)], cwd=REPO,
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:  # wait for the executor JVM and its Python workers
            mine = _ours(root)
            if any("CoarseGrainedExecutorBackend" in c for c in mine.values()) and any("pyspark.daemon" in c for c in mine.values()):
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
