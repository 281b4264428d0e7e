"""Committing versions to an object store (largetrain_core.storage) against real S3, GCS and Azure Blob API
servers on 127.0.0.1 (tests/conftest.py: bucket): the marker last, what a crashed
writer leaves, an object edited after its commit, and two writers of one version."""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from largetrain_core import fs, storage
from largetrain_core.storage import COMMIT, LOCK, MANIFEST, ArtifactError, atomic_dir, verify_manifest


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LARGETRAIN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _write(tmp, files: dict) -> None:
    for rel, data in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_bytes(data)


FILES = {"stats.json": b'{"documents": 3}', "part-00000.parquet": b"P" * 1000, "model/config.json": b"{}"}


def test_a_version_is_committed_with_its_marker_last(bucket, cache):
    url = fs.join(bucket, "root", "stage", "0123456789abcdef")
    with atomic_dir(url) as tmp:
        _write(tmp, FILES)
    fsys, root = fs.filesystem(url)
    listing = fsys.find(root, detail=True)
    names = sorted(p[len(root) + 1 :] for p in listing)
    assert names == sorted([COMMIT, MANIFEST, *FILES])
    marker = json.loads(fsys.cat_file(f"{root}/{COMMIT}"))
    assert set(marker["objects"]) == {MANIFEST, *FILES}  # sizes and ETags of everything, from one listing
    assert all(marker["objects"][r]["etag"] == fs.object_stamp(listing[f"{root}/{r}"]) for r in FILES)
    assert verify_manifest(url) == [] and verify_manifest(url, full=True) == []
    assert storage.part_files(url) == [f"{url}/part-00000.parquet"]
    local = storage.local_copy(url)  # the working copy, downloaded and checked
    assert {p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()} >= set(FILES)
    assert verify_manifest(local) == [] and storage.stored_location(local) == url


def test_an_object_edited_after_its_commit_is_named(bucket, cache):
    url = fs.join(bucket, "v")
    with atomic_dir(url) as tmp:
        _write(tmp, FILES)
    fsys, root = fs.filesystem(url)
    fsys.pipe_file(f"{root}/part-00000.parquet", b"Q" * 1000)  # same size: only the content tells
    (problem,) = verify_manifest(url)
    assert problem == (
        f"{url}/part-00000.parquet: content differs from {MANIFEST} (xxh3-128 checksum; edited after "
        "the version was committed)"
    )
    with pytest.raises(ArtifactError, match="part-00000.parquet: content differs"):
        storage.local_copy(url)
    fsys.pipe_file(f"{root}/extra.parquet", b"x")
    fsys.rm_file(f"{root}/model/config.json")
    assert verify_manifest(url)[:2] == [
        f"{url}/model/config.json: listed in {MANIFEST} but missing",
        f"{url}/extra.parquet: not in {MANIFEST} (added after the version was committed)",
    ]
    # the next writer replaces the damaged version, removing what does not belong to it
    again = atomic_dir(url)
    with again as tmp:
        _write(tmp, FILES)
    assert again.committed is True and verify_manifest(url) == [] and not fsys.exists(f"{root}/extra.parquet")


WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from largetrain_core.storage import atomic_dir
    with atomic_dir(sys.argv[1]) as tmp:
        for i in range(8):
            (tmp / f"part-{i:05d}.parquet").write_bytes(bytes([i]) * 50_000)
""")


def test_a_writer_killed_mid_upload_leaves_nothing_trusted(bucket, cache, tmp_path):
    url = fs.join(bucket, "root", "stage", "v")
    env = {**os.environ, "LARGETRAIN_FAULT": "mid_upload", "PYTHONPATH": os.getcwd()}
    r = subprocess.run([sys.executable, "-c", WRITER, url], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr  # SIGKILL, half of the files uploaded
    fsys, root = fs.filesystem(url)
    left = sorted(p[len(root) + 1 :] for p in fsys.find(root))
    assert LOCK in left and "part-00000.parquet" in left and COMMIT not in left and MANIFEST not in left
    (problem,) = verify_manifest(url)
    assert problem.startswith(f"{url}/{COMMIT}: missing: the version was never committed")
    with pytest.raises(storage.MissingArtifactError, match="no committed version holds it"):
        storage.local_copy(url)
    # the next run: the dead writer's lock is taken over (same host, process gone), its objects removed
    r = subprocess.run(
        [sys.executable, "-c", WRITER, url],
        env={**env, "LARGETRAIN_FAULT": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "taking over the lock of a writer that is gone" in r.stderr
    assert verify_manifest(url) == [] and LOCK not in {p[len(root) + 1 :] for p in fsys.find(root)}


def test_a_second_writer_waits_for_the_lock_and_keeps_the_committed_version(bucket, cache):
    """Two writers of one version: the second waits while the first holds the lock, then finds the
    version committed and discards its own result; both succeed."""
    url = fs.join(bucket, "v")
    fsys, root = fs.filesystem(url)
    fsys.pipe_file(f"{root}/{LOCK}", json.dumps({"token": "t", "host": "other-host", "pid": 1, "beat": 0}).encode())
    outcome = {}

    def second():
        w = atomic_dir(url)
        with w as tmp:
            _write(tmp, {**FILES, "stats.json": b'{"documents": 3, "seconds": 2}'})
        outcome["committed"] = w.committed

    t = threading.Thread(target=second)
    t.start()
    time.sleep(2.0)
    assert t.is_alive() and not fsys.exists(f"{root}/{COMMIT}")  # waiting on the first writer's lock
    fsys.rm_file(f"{root}/{LOCK}")  # the first writer, finishing: it uploads and commits under its lock
    first = atomic_dir(url)
    with first as tmp:
        _write(tmp, FILES)
    t.join(60)
    assert not t.is_alive()
    assert sorted([first.committed, outcome["committed"]]) == [False, True]  # exactly one version was committed
    assert verify_manifest(url) == []


def test_a_lock_without_heartbeat_is_taken_over(bucket, cache, monkeypatch):
    monkeypatch.setenv("LARGETRAIN_LOCK_STALE_SECONDS", "1")
    url = fs.join(bucket, "v")
    fsys, root = fs.filesystem(url)
    fsys.pipe_file(f"{root}/{LOCK}", json.dumps({"token": "t", "host": "other-host", "pid": 1, "beat": 0}).encode())
    w = atomic_dir(url)
    t0 = time.monotonic()
    with w as tmp:
        _write(tmp, FILES)
    assert w.committed is True and 1.0 <= time.monotonic() - t0 < 30 and verify_manifest(url) == []


def test_files_put_by_other_processes_are_committed_with_the_marker_last_and_not_uploaded_again(bucket, cache):
    """atomic_dir.direct_url: a direct writer (a Spark task) puts files under the final prefix while the
    block runs, with the lock held; fetch_uploaded brings them into the temporary directory; the commit
    uploads only the rest (the direct writer's objects keep their LastModified), removes the writer's
    scratch objects, and writes the manifest and the marker last. A block that fails leaves no marker."""
    url = fs.join(bucket, "root", "stage", "0123456789abcdef")
    fsys, root = fs.filesystem(url)
    fsys.pipe_file(f"{root}/part-00009.parquet", b"an uncommitted attempt's")
    with pytest.raises(RuntimeError, match="job failed"), atomic_dir(url) as tmp:
        assert storage.direct_url(tmp) == url and fsys.exists(f"{root}/{LOCK}")
        assert not fsys.exists(f"{root}/part-00009.parquet")  # the uncommitted attempt's objects are gone
        fsys.pipe_file(f"{root}/part-00000.parquet", b"P" * 1000)
        raise RuntimeError("job failed")
    assert not fsys.exists(f"{root}/{COMMIT}") and not fsys.exists(f"{root}/{LOCK}")
    assert verify_manifest(url) and "never committed" in verify_manifest(url)[0]

    with atomic_dir(url) as tmp:
        assert storage.direct_url(tmp) == url
        assert not fsys.exists(f"{root}/part-00000.parquet")  # the failed attempt's object was removed
        fsys.pipe_file(f"{root}/part-00000.parquet", b"P" * 1000)  # a task's output
        fsys.pipe_file(f"{root}/_chunks/000000-00000.parquet", b"scratch")  # a task's scratch file
        before = fsys.info(f"{root}/part-00000.parquet")
        objects = storage.fetch_uploaded(url, tmp, ["part-00000.parquet", "_chunks/000000-00000.parquet"])
        storage.record_uploaded(tmp, objects)
        (tmp / "_chunks" / "000000-00000.parquet").unlink()
        (tmp / "_chunks").rmdir()
        _write(tmp, {"stats.json": b'{"documents": 3}'})
        time.sleep(1.1)  # S3's and Azure's write times have whole seconds: an upload now would show
    assert storage.direct_url(tmp) is None  # the block is over
    names = sorted(p[len(root) + 1 :] for p in fsys.find(root))
    assert names == [COMMIT, MANIFEST, "part-00000.parquet", "stats.json"]
    assert verify_manifest(url) == []
    after = fsys.info(f"{root}/part-00000.parquet")
    written = lambda info: info.get("LastModified") or info.get("generation") or info.get("last_modified")  # noqa: E731
    assert written(after) == written(before) is not None  # S3's and Azure's write time, GCS's generation
    order = lambda info: int(info["generation"]) if "generation" in info else written(info)  # noqa: E731
    assert order(fsys.info(f"{root}/stats.json")) > order(before)
    local = storage.local_copy(url)
    assert (local / "part-00000.parquet").read_bytes() == b"P" * 1000


def test_token_shards_stream_from_the_store_through_the_cache(bucket, cache, tmp_path, bpe_dir, sentences, monkeypatch):
    """A token shard directory committed to the store is streamed through a cache holding two shards: every
    sequence equals the local directory's, each fetched file is checked, and the cache stays within its bound."""
    import numpy as np

    from helpers.parts import sentence_docs
    from largetrain_core.shards import TokenShards, build_token_shards

    docs = sentence_docs(tmp_path / "docs", sentences)
    url, local = fs.join(bucket, "token_shards", "v1"), tmp_path / "local"
    with atomic_dir(url) as out:
        build_token_shards(docs, bpe_dir, out, seq_len=16, validation_fraction=0.1, sequences_per_shard=16)
    local.mkdir()
    build_token_shards(docs, bpe_dir, local, seq_len=16, validation_fraction=0.1, sequences_per_shard=16)
    here = TokenShards(local, "train")
    biggest = max(e["bytes"] for e in here.manifest["splits"]["train"]["shards"])
    monkeypatch.setenv("LARGETRAIN_SHARD_CACHE_BYTES", str(2 * biggest))
    there = TokenShards(url, "train")
    assert there.remote and len(there) == len(here) > 64 and there.missing_files() == []
    order = np.random.default_rng(0).permutation(len(here))[:64]  # random reads: files evicted and fetched again
    for i in range(0, len(order), 8):
        assert np.array_equal(there.take(order[i : i + 8]), here.take(order[i : i + 8]))
    assert np.array_equal(there.take(np.arange(len(here))), here.take(np.arange(len(here))))  # every sequence, in order
    assert 0 < there.cache.peak_bytes() <= 2 * biggest
    there.close()
