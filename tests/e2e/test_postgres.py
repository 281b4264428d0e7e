"""The PostgreSQL instance profile (deploy/dagster.postgres.yaml) against a real PostgreSQL server.

The test starts its own server (Debian ``postgresql``: initdb + pg_ctl) on 127.0.0.1 and a free port,
with the data directory and unix socket in a temporary directory, as the ``postgres`` user when run
as root (PostgreSQL refuses to run as root). A ``dagster asset materialize`` through the CLI then
stores its run and materialization there; the test reads them back with psycopg2 and through the
instance. The server is stopped (pg_ctl stop -m immediate) and its files removed afterwards.
"""

import glob
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance

from helpers.lineage import PARTITION_KEYS
from helpers import REPO
from helpers.corpora import CORPORA, corpus
from helpers.processes import free_port


def _pg_bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


INITDB, PG_CTL = _pg_bin("initdb"), _pg_bin("pg_ctl")


@pytest.fixture
def postgres():
    if not (INITDB and PG_CTL):
        pytest.skip("needs Debian postgresql (apt-get install postgresql); .ci/run installs it")
    base = Path(tempfile.mkdtemp(prefix="largetrain-pg-"))
    base.chmod(0o755)
    data, sock = base / "data", base / "sock"
    data.mkdir(), sock.mkdir()
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres"), shutil.chown(sock, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    password = secrets.token_hex(16)
    pwfile = base / "pw"
    pwfile.write_text(password)
    pwfile.chmod(0o644)
    port = free_port()
    subprocess.run(
        as_user
        + [
            INITDB,
            "-D",
            str(data),
            "-U",
            "dagster",
            f"--pwfile={pwfile}",
            "--auth=scram-sha-256",
            "--no-sync",
            "-E",
            "UTF8",
        ],
        check=True,
        capture_output=True,
    )
    pwfile.unlink()
    log = base / "server.log"
    if as_user:
        log.touch(), shutil.chown(log, "postgres", "postgres")
    start = subprocess.run(
        as_user
        + [
            PG_CTL,
            "-D",
            str(data),
            "-l",
            str(log),
            "-w",
            "-t",
            "60",
            "-o",
            f"-h 127.0.0.1 -p {port} -k {sock} -c fsync=off -c max_connections=50",
            "start",
        ],
        capture_output=True,
        text=True,
    )
    try:
        assert start.returncode == 0, start.stderr + log.read_text()
        import psycopg2

        c = psycopg2.connect(host="127.0.0.1", port=port, user="dagster", password=password, dbname="postgres")
        try:
            c.autocommit = True
            c.cursor().execute("CREATE DATABASE dagster")
        finally:
            c.close()
        yield {
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_PORT": str(port),
            "DAGSTER_PG_USER": "dagster",
            "DAGSTER_PG_PASSWORD": password,
            "DAGSTER_PG_DB": "dagster",
        }
    finally:
        subprocess.run(as_user + [PG_CTL, "-D", str(data), "-m", "immediate", "-w", "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def test_runs_and_materializations_land_in_postgres(postgres, tmp_path, monkeypatch):
    import psycopg2

    corpus("shakespeare")
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster.postgres.yaml", home / "dagster.yaml")
    env = {**os.environ, **postgres, "DAGSTER_HOME": str(home), "LARGETRAIN_ROOT": str(tmp_path / "root")}
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "corpora").symlink_to(CORPORA.resolve())
    dagster = str(Path(sys.executable).with_name("dagster"))
    m = subprocess.run(
        [
            dagster,
            "asset",
            "materialize",
            "-m",
            "largetrain_dagster.definitions",
            "--select",
            "domain/raw_corpus",
            "--partition",
            PARTITION_KEYS[0],
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert m.returncode == 0, m.stderr[-1500:]
    assert postgres["DAGSTER_PG_PASSWORD"] not in m.stdout + m.stderr  # the secret is never logged

    with psycopg2.connect(
        host="127.0.0.1",
        port=int(postgres["DAGSTER_PG_PORT"]),
        user="dagster",
        password=postgres["DAGSTER_PG_PASSWORD"],
        dbname="dagster",
    ) as c:
        cur = c.cursor()
        cur.execute("SELECT run_id, status FROM runs")
        runs = cur.fetchall()
        cur.execute(
            "SELECT count(*) FROM event_logs WHERE dagster_event_type = 'ASSET_MATERIALIZATION' AND asset_key = %s",
            (AssetKey(["domain", "raw_corpus"]).to_string(),),
        )
        (materializations,) = cur.fetchone()
    assert [s for _, s in runs] == ["SUCCESS"] and materializations == 1

    for k, v in {**postgres, "DAGSTER_HOME": str(home)}.items():
        monkeypatch.setenv(k, v)
    with DagsterInstance.get() as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        ev = instance.get_latest_materialization_event(AssetKey(["domain", "raw_corpus"]))
        assert ev.run_id == runs[0][0]
        assert ev.asset_materialization.partition == PARTITION_KEYS[0]
        assert 0 < ev.asset_materialization.metadata["documents"].value < 38  # one partition's share of the plays
