"""largetrain_core.storage: the manifest every artefact directory gets, its verification, and loaders that
name the file they failed on."""

import json
import os

import pytest

from largetrain_core import storage
from largetrain_core.storage import (
    MANIFEST,
    ArtefactError,
    MissingArtefactError,
    atomic_dir,
    loading,
    read_json,
    verify_manifest,
    write_manifest,
)


@pytest.fixture
def artefact(tmp_path):
    """An artefact directory as atomic_dir leaves it: two small files, one in a subdirectory, and one
    file larger than FULL_CHECKSUM_MAX_BYTES (checked by sampled blocks)."""
    final = tmp_path / "stage" / "0123456789abcdef"
    with atomic_dir(final) as tmp:
        (tmp / "stats.json").write_text(json.dumps({"documents": 3}))
        (tmp / "model").mkdir()
        (tmp / "model" / "config.json").write_text(json.dumps({"vocab_size": 300}))
        (tmp / "big.bin").write_bytes(os.urandom(storage.FULL_CHECKSUM_MAX_BYTES + 12_345))
    return final


def test_atomic_dir_writes_a_manifest_of_every_file(artefact):
    manifest = json.loads((artefact / MANIFEST).read_text())
    assert manifest["format"] == "largetrain.manifest/1" and manifest["paths"] is None
    assert sorted(manifest["files"]) == ["big.bin", "model/config.json", "stats.json"]
    for rel, entry in manifest["files"].items():
        assert entry["bytes"] == (artefact / rel).stat().st_size
        assert len(entry["xxh3_128"]) == 32
    assert "sample_xxh3_128" in manifest["files"]["big.bin"]
    assert "sample_xxh3_128" not in manifest["files"]["stats.json"]
    assert verify_manifest(artefact) == [] and verify_manifest(artefact, full=True) == []


def test_truncated_file_is_named(artefact):
    (artefact / "model" / "config.json").write_text('{"vocab_')
    (problem,) = verify_manifest(artefact)
    assert problem.startswith(f"{artefact / 'model' / 'config.json'}: ") and "bytes" in problem


def test_same_size_edit_of_a_small_file_is_found_by_its_checksum(artefact):
    path = artefact / "stats.json"
    path.write_text(path.read_text().replace("3", "4"))
    (problem,) = verify_manifest(artefact)
    assert problem.startswith(f"{path}: content differs")


def test_same_size_edit_of_a_large_file_is_found(artefact):
    path = artefact / "big.bin"
    st = path.stat()
    with open(path, "r+b") as fh:  # in the last sampled block
        fh.seek(st.st_size - 10)
        fh.write(b"\x00" * 10)
    # the writer changed the modification time: the whole file is hashed
    (problem,) = verify_manifest(artefact)
    assert problem == f"{path}: content differs from {MANIFEST} (xxh3-128 checksum)"
    # with the modification time put back, the sampled blocks still cover the edited bytes
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    (problem,) = verify_manifest(artefact)
    assert problem == f"{path}: content differs from {MANIFEST} (xxh3-128 of sampled blocks)"


def test_deleted_and_added_files_are_named(artefact):
    (artefact / "model" / "config.json").unlink()
    (artefact / "part-00001.parquet").write_bytes(b"PAR1")
    assert verify_manifest(artefact) == [
        f"{artefact / 'model' / 'config.json'}: listed in {MANIFEST} but missing",
        f"{artefact / 'part-00001.parquet'}: not in {MANIFEST} (added after the directory was written)",
    ]


def test_missing_or_damaged_manifest(artefact):
    (artefact / MANIFEST).write_text('{"format": "largetrain.manifest/1", "fi')
    (problem,) = verify_manifest(artefact)
    assert problem.startswith(f"{artefact / MANIFEST}: unreadable")
    (artefact / MANIFEST).unlink()
    (problem,) = verify_manifest(artefact)
    assert problem.startswith(f"{artefact / MANIFEST}: missing")


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
    with pytest.raises(MissingArtefactError, match=f"{path}: missing; expected handle"):
        read_json(path, "handle")
    path.write_text('{"path": "/x", "data_ver')
    with pytest.raises(ArtefactError, match=rf"{path}: not a valid handle \(JSONDecodeError"):
        read_json(path, "handle")
    with pytest.raises(ArtefactError, match=f"{path}: not a valid thing .*ZeroDivisionError"):
        with loading(path, "thing"):
            1 / 0
    with pytest.raises(KeyboardInterrupt):  # an interrupt is not turned into a file error
        with loading(path, "thing"):
            raise KeyboardInterrupt
