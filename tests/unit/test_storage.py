"""largetrain_core.storage: the manifest every artifact directory gets, its verification, and loaders that
name the file they failed on."""

import json
import os

import pytest

from largetrain_core import storage
from largetrain_core.storage import (
    MANIFEST,
    ArtifactError,
    MissingArtifactError,
    atomic_dir,
    loading,
    read_json,
    verify_manifest,
    write_manifest,
)


@pytest.fixture
def artifact(tmp_path):
    """An artifact directory as atomic_dir leaves it: two small files, one in a subdirectory, and one
    file larger than FULL_CHECKSUM_MAX_BYTES (checked by sampled blocks)."""
    final = tmp_path / "stage" / "0123456789abcdef"
    with atomic_dir(final) as tmp:
        (tmp / "stats.json").write_text(json.dumps({"documents": 3}))
        (tmp / "model").mkdir()
        (tmp / "model" / "config.json").write_text(json.dumps({"vocab_size": 300}))
        (tmp / "big.bin").write_bytes(os.urandom(storage.FULL_CHECKSUM_MAX_BYTES + 12_345))
    return final


def test_atomic_dir_writes_a_manifest_of_every_file(artifact):
    manifest = json.loads((artifact / MANIFEST).read_text())
    assert manifest["format"] == "largetrain.manifest/1" and manifest["paths"] is None
    assert sorted(manifest["files"]) == ["big.bin", "model/config.json", "stats.json"]
    for rel, entry in manifest["files"].items():
        assert entry["bytes"] == (artifact / rel).stat().st_size
        assert len(entry["xxh3_128"]) == 32
    assert "sample_xxh3_128" in manifest["files"]["big.bin"]
    assert "sample_xxh3_128" not in manifest["files"]["stats.json"]
    assert verify_manifest(artifact) == [] and verify_manifest(artifact, full=True) == []


def test_truncated_file_is_named(artifact):
    (artifact / "model" / "config.json").write_text('{"vocab_')
    (problem,) = verify_manifest(artifact)
    assert problem.startswith(f"{artifact / 'model' / 'config.json'}: ") and "bytes" in problem


def test_same_size_edit_of_a_small_file_is_found_by_its_checksum(artifact):
    path = artifact / "stats.json"
    path.write_text(path.read_text().replace("3", "4"))
    (problem,) = verify_manifest(artifact)
    assert problem.startswith(f"{path}: content differs")


def test_same_size_edit_of_a_large_file_is_found(artifact):
    path = artifact / "big.bin"
    st = path.stat()
    with open(path, "r+b") as fh:  # in the last sampled block
        fh.seek(st.st_size - 10)
        fh.write(b"\x00" * 10)
    # the writer changed the modification time: the whole file is hashed
    (problem,) = verify_manifest(artifact)
    assert problem == f"{path}: content differs from {MANIFEST} (xxh3-128 checksum)"
    # with the modification time put back, the sampled blocks still cover the edited bytes
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    (problem,) = verify_manifest(artifact)
    assert problem == f"{path}: content differs from {MANIFEST} (xxh3-128 of sampled blocks)"


def test_deleted_and_added_files_are_named(artifact):
    (artifact / "model" / "config.json").unlink()
    (artifact / "part-00001.parquet").write_bytes(b"PAR1")
    assert verify_manifest(artifact) == [
        f"{artifact / 'model' / 'config.json'}: listed in {MANIFEST} but missing",
        f"{artifact / 'part-00001.parquet'}: not in {MANIFEST} (added after the directory was written)",
    ]


def test_missing_or_damaged_manifest(artifact):
    (artifact / MANIFEST).write_text('{"format": "largetrain.manifest/1", "fi')
    (problem,) = verify_manifest(artifact)
    assert problem.startswith(f"{artifact / MANIFEST}: unreadable")
    (artifact / MANIFEST).unlink()
    (problem,) = verify_manifest(artifact)
    assert problem.startswith(f"{artifact / MANIFEST}: missing")


def test_manifest_of_some_entries_only(tmp_path):
    """A training directory: the final outputs are recorded; the checkpoints and the log keep changing."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "train.log").write_text("step 1\n")
    write_manifest(tmp_path, ["model", "summary.json"])
    (tmp_path / "train.log").write_text("step 1\nstep 2\n")
    (tmp_path / "checkpoints").mkdir()
    assert verify_manifest(tmp_path) == []
    (tmp_path / "model" / "model.safetensors").write_bytes(b"weight")
    (problem,) = verify_manifest(tmp_path)
    assert problem.startswith(str(tmp_path / "model" / "model.safetensors"))


def test_loaders_name_the_file_and_what_was_expected(tmp_path):
    path = tmp_path / "handle.json"
    with pytest.raises(MissingArtifactError, match=f"{path}: missing; expected handle"):
        read_json(path, "handle")
    path.write_text('{"path": "/x", "data_ver')
    with pytest.raises(ArtifactError, match=rf"{path}: not a valid handle \(JSONDecodeError"):
        read_json(path, "handle")
    with pytest.raises(ArtifactError, match=f"{path}: not a valid thing .*ZeroDivisionError"):
        with loading(path, "thing"):
            1 / 0  # noqa: B018
    with pytest.raises(KeyboardInterrupt):  # an interrupt is not turned into a file error
        with loading(path, "thing"):
            raise KeyboardInterrupt


def test_a_committed_version_is_kept_when_a_second_writer_finishes_it(tmp_path):
    """Two runs of one version (issue 23, item 5): the first to finish commits; the second discards its
    result, and the directory a reader has open is never replaced under it."""
    final = tmp_path / "stage" / "0123456789abcdef"
    first, second = atomic_dir(final), atomic_dir(final)
    with first as a:
        with second as b:  # both build at once
            (a / "part-00000.parquet").write_bytes(b"first")
            (b / "part-00000.parquet").write_bytes(b"second")
        reader = open(final / "part-00000.parquet", "rb") if final.exists() else None
    assert (first.committed, second.committed) == (False, True)  # the inner block finished first
    assert reader is not None and reader.read() == b"second"  # a reader of the committed version is undisturbed
    inode = (final / "part-00000.parquet").stat().st_ino
    assert (final / "part-00000.parquet").read_bytes() == b"second" and verify_manifest(final) == []
    third = atomic_dir(final)
    with third as c:
        (c / "part-00000.parquet").write_bytes(b"third")
    assert third.committed is False and (final / "part-00000.parquet").stat().st_ino == inode
    assert not [p for p in final.parent.iterdir() if p.name.startswith(".")]  # no temporary directory left


def test_a_damaged_version_is_replaced_by_the_next_writer(tmp_path):
    final = tmp_path / "v"
    with atomic_dir(final) as tmp:
        (tmp / "a.txt").write_text("good")
    (final / "a.txt").write_text("evil")
    again = atomic_dir(final)
    with again as tmp:
        (tmp / "a.txt").write_text("good")
    assert again.committed is True and (final / "a.txt").read_text() == "good" and verify_manifest(final) == []


def test_the_commit_marker_names_the_manifest(artifact):
    marker = json.loads((artifact / storage.COMMIT).read_text())
    assert marker["format"] == "largetrain.commit/1" and marker["objects"] is None
    manifest = (artifact / MANIFEST).read_text()
    (artifact / MANIFEST).write_text(manifest.replace('"paths": null', '"paths":  null'))
    (problem,) = verify_manifest(artifact)
    assert problem.startswith(f"{artifact / storage.COMMIT}: records another {MANIFEST}")


def test_a_version_on_an_in_memory_store(tmp_path, monkeypatch):
    """The commit without rename on fsspec's memory:// store: files, then the manifest, then the marker;
    the working copy is downloaded and checked; an edit after the commit is named."""
    import fsspec

    monkeypatch.setenv("LARGETRAIN_CACHE", str(tmp_path / "cache"))
    url = "memory://bucket-unit/root/stage/0123456789abcdef"
    mem = fsspec.filesystem("memory")
    with atomic_dir(url) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "x.json").write_text('{"a": 1}')
        (tmp / "stats.json").write_text("{}")
    root = "/bucket-unit/root/stage/0123456789abcdef"
    assert sorted(p.rsplit("/", 1)[1] for p in mem.find(root)) == [storage.COMMIT, MANIFEST, "stats.json", "x.json"]
    assert verify_manifest(url) == []
    local = storage.local_copy(url + "/sub")
    assert local == storage.mirror_path(url) / "sub" and (local / "x.json").read_text() == '{"a": 1}'
    assert storage.stored_location(local) == "memory://bucket-unit/root/stage/0123456789abcdef/sub"
    mem.pipe_file(root + "/sub/x.json", b'{"a": 2}')
    (problem,) = verify_manifest(url)
    assert problem.startswith(f"{url}/sub/x.json: content differs")
    with pytest.raises(ArtifactError, match="x.json: content differs"):
        storage.local_copy(url)
    mem.rm(root, recursive=True)


def test_paths_relative_to_a_url_root():
    handle = {
        "path": "s3://b/root/stage/v1",
        "stats": {"out": "s3://b/root/stage/v1/model", "elsewhere": "s3://other/x", "local": "/data/root/x"},
    }
    stored = storage.relative_to_root(handle, "s3://b/root/")
    assert stored["path"] == "stage/v1" and stored["stats"]["out"] == "stage/v1/model"
    assert stored["stats"]["elsewhere"] == "s3://other/x" and stored["stats"]["local"] == "/data/root/x"
    assert storage.resolve_under(stored, "/mnt/copy")["stats"]["out"] == "/mnt/copy/stage/v1/model"
    assert storage.resolve_under(stored, "gs://g/r")["path"] == "gs://g/r/stage/v1"
    local = storage.relative_to_root({"path": "/mnt/copy/stage/v1"}, "/mnt/copy")
    assert storage.resolve_under(local, "s3://b/root")["path"] == "s3://b/root/stage/v1"
