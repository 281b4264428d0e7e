"""An object-store root that cannot be used fails before any work, naming the URL and the operation,
with the secret in no message: a missing bucket, wrong credentials (a real S3 API server on
127.0.0.1 that checks them), an unreachable endpoint, credentials written into the URL."""

import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from dagster import DagsterInstance

from largetrain_core import fs
from largetrain_dagster.definitions import build_definitions, lineage_assets
from helpers.lineage import materialize_lineage

SECRET = "sEcReT-do-not-print-4f1c2"


def _run(root: str, tmp_path):
    """domain/raw_corpus of partition 000 with the storage root ``root``: (result, every event's text)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir(exist_ok=True)
    (corpus / "a.jsonl").write_text('{"id": "a", "text": "one document"}\n')
    defs = build_definitions(root=root, nproc_per_node=1, wandb_mode="disabled")
    cfg = {"ops": {"domain__raw_corpus": {"config": {"path": str(corpus)}}}}
    with DagsterInstance.ephemeral() as instance:
        result = materialize_lineage(
            lineage_assets(),
            defs.resources,
            instance,
            cfg,
            ["domain/raw_corpus"],
            partitions=["000"],
            raise_on_error=False,
        )
        events = [repr(e) for e in instance.all_logs(result.run_id)]
        types = {e.dagster_event.event_type_value for e in instance.all_logs(result.run_id) if e.dagster_event}
    return result, "\n".join(events), types


def _failed_before_work(result, events: str, types: set, url: str, capfd) -> str:
    assert not result.success
    assert "ASSET_MATERIALIZATION" not in types and "STEP_OUTPUT" not in types
    assert f"cannot write the storage root (LARGETRAIN_ROOT) at {url}" in events
    out, err = capfd.readouterr()
    assert SECRET not in events + out + err
    return events


@pytest.fixture
def secret_env(monkeypatch, tmp_path):
    monkeypatch.setenv("LARGETRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)


def test_a_missing_bucket_fails_before_any_work(s3_server, secret_env, tmp_path, capfd):
    url = "s3://no-such-bucket-largetrain/root"
    events = _failed_before_work(*_run(url, tmp_path), url, capfd)
    assert "NoSuchBucket" in events or "does not exist" in events
    assert not (tmp_path / "cache" / "mirror").exists()  # nothing was built


def test_wrong_credentials_fail_before_any_work(secret_env, tmp_path, monkeypatch, capfd):
    """A second S3 server that checks credentials (moto's INITIAL_NO_AUTH_ACTION_COUNT=0): the key id
    is unknown to it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        endpoint = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNKEY000000")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        url = "s3://team-bucket/root"
        events = _failed_before_work(*_run(url, tmp_path), url, capfd)
        assert "PermissionError" in events and "Access Key Id you provided does not exist" in events
    finally:
        proc.kill()
        proc.wait()


def test_an_unreachable_endpoint_fails_before_any_work(secret_env, tmp_path, monkeypatch, capfd):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    url = "s3://team-bucket/root"
    events = _failed_before_work(*_run(url, tmp_path), url, capfd)
    assert "EndpointConnectionError" in events and f"127.0.0.1:{port}" in events


def test_credentials_in_the_url_are_refused_and_never_shown(s3_server, secret_env, tmp_path, capfd):
    url = f"s3://AKIAEXAMPLE:{SECRET}@team-bucket/root"
    result, events, types = _run(url, tmp_path)
    assert not result.success and "ASSET_MATERIALIZATION" not in types
    assert "s3://***@team-bucket/root: credentials in a URL are not taken" in events
    out, err = capfd.readouterr()
    assert SECRET not in events + out + err
    with pytest.raises(fs.StorageAccessError, match=r"s3://\*\*\*@team-bucket/x: credentials in a URL"):
        fs.filesystem(f"s3://AKIAEXAMPLE:{SECRET}@team-bucket/x")
