"""Locations as URLs (largetrain_core.fs) against real S3, GCS and Azure Blob API servers on 127.0.0.1."""

import pytest

from helpers.stores import AZURITE_KEY, STORES
from largetrain_core import fs


def test_local_paths_and_urls_are_told_apart(tmp_path):
    assert not fs.is_url(tmp_path) and not fs.is_url(f"file://{tmp_path}")
    assert fs.is_url("s3://bucket/x") and fs.is_url("memory://x") and fs.is_url("gs://b")
    assert fs.local_path(f"file://{tmp_path}") == tmp_path.resolve()
    with pytest.raises(ValueError, match="not a local path"):
        fs.local_path("s3://bucket/x")
    assert fs.join("s3://b/root/", "a", "b/") == "s3://b/root/a/b"
    assert fs.join(str(tmp_path), "a", "b") == str(tmp_path / "a" / "b")


def test_credentials_in_a_url_are_redacted():
    assert fs.redact("s3://AKIAEXAMPLE:s3cr3t@bucket/root") == "s3://***@bucket/root"
    assert fs.redact("s3://bucket/root") == "s3://bucket/root"


def test_files_round_trip_through_each_store(bucket):
    fsys, path = fs.filesystem(fs.join(bucket, "dir", "a.txt"))
    fsys.pipe_file(path, b"hello")
    again, _ = fs.filesystem(bucket)
    assert again.cat_file(path) == b"hello"
    fs.check_access(bucket, "read the corpus")
    fs.check_access(fs.join(bucket, "root"), "write the storage root", write=True)
    assert not again.exists(f"{path.rsplit('/', 1)[0]}/.largetrain-write-probe")


@pytest.mark.parametrize("store", STORES)
def test_a_missing_bucket_fails_naming_the_location_and_operation(store, request):
    request.getfixturevalue(STORES[store])
    with pytest.raises(fs.StorageAccessError, match=rf"cannot read the corpus at {store}://no-such-bucket-here/x") as e:
        fs.check_access(f"{store}://no-such-bucket-here/x", "read the corpus")
    with pytest.raises(
        fs.StorageAccessError, match=rf"cannot write the storage root at {store}://no-such-bucket-here"
    ) as f:
        fs.check_access(f"{store}://no-such-bucket-here/root", "write the storage root", write=True)
    for raised in (e, f):  # Azurite's account key is in the environment's connection string, never in a message
        assert AZURITE_KEY not in str(raised.value) and AZURITE_KEY[:12] not in str(raised.value)


def test_a_missing_local_directory_fails_before_work(tmp_path):
    with pytest.raises(fs.StorageAccessError, match="cannot read the corpus at .*nowhere"):
        fs.check_access(tmp_path / "nowhere", "read the corpus")


def test_the_training_entry_point_reads_its_config_from_a_url(s3_bucket, tmp_path):
    """What Kubernetes pods do with an object-store root: `-m largetrain_core.training s3://.../train_config.json`.
    A config with an unknown key is read from the bucket and refused, naming the key."""
    import json
    import os
    import subprocess
    import sys

    url = fs.join(s3_bucket, "base_checkpoint", "v1", "train_config.json")
    fsys, path = fs.filesystem(url)
    fsys.pipe_file(path, json.dumps({"not_a_setting": 1}).encode())
    r = subprocess.run(
        [sys.executable, "-m", "largetrain_core.training", url],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TORCHELASTIC_ERROR_FILE": str(tmp_path / "error.json")},
    )
    assert r.returncode != 0
    assert "unknown training config keys ['not_a_setting']" in r.stderr + r.stdout
