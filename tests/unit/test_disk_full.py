"""Issue 42 item 8: a disk that fills during a checkpoint save is named (ENOSPC, the path, the free space), the
incomplete checkpoint removed so that the rank's error file fits, and a training whose output directory has no
room for a checkpoint is neither started nor retried, nor reported as killed or preempted."""

import errno
from pathlib import Path

import pytest

from largetrain_core.artifacts import build_or_reuse
from largetrain_core.storage import DiskFullError
from largetrain_core.training.checkpoints import mark_complete, no_space_error
from largetrain_dagster.resources import space_problem, training_failure

pytestmark = pytest.mark.unit


def _short_write() -> RuntimeError:
    """What torch.save's zip writer raises for a write that the disk refused: a RuntimeError without errno,
    raised while handling the real ENOSPC of a write to /dev/full (Linux: every write fails with ENOSPC)."""
    try:
        try:
            with open("/dev/full", "wb") as f:
                f.write(b"x")
                f.flush()
        except OSError as e:
            raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed") from e
    except RuntimeError as r:
        return r
    raise AssertionError("/dev/full accepted a write")


def test_a_full_disk_during_a_data_step_names_the_file_the_version_and_the_free_space(tmp_path):
    """A build whose Parquet writer hits ENOSPC and whose error reads like a reader's ("File out of
    specification"): a DiskFullError naming the part file, the version being built under the root and the
    free space; the version is not committed."""
    final = tmp_path / "root" / "pretrain" / "cleaned_text" / "v1"

    def build(out):
        (out / "part-00000.parquet").write_bytes(b"PAR1" * 10)
        raise ValueError("File out of specification: the file is too short") from _short_write()

    with pytest.raises(DiskFullError) as caught:
        build_or_reuse(final, build)
    err = caught.value
    assert err.errno == errno.ENOSPC and err.filename.endswith("part-00000.parquet")
    assert str(err).startswith(
        f"[Errno 28] No space left on device (ENOSPC) writing {err.filename} while building {final}: "
    )
    assert "bytes free on its file system (ValueError: File out of specification" in str(err)
    assert not final.exists()
    with pytest.raises(ValueError, match="a bad row"):  # another error stays what it is
        build_or_reuse(final, lambda out: (_ for _ in ()).throw(ValueError("a bad row")))


def test_a_full_disk_during_a_save_is_named_with_the_path_and_the_free_space(tmp_path):
    ckpt = tmp_path / "checkpoints" / "step-000004"
    ckpt.mkdir(parents=True)
    (ckpt / "mp_rank_00_model_states.pt").write_bytes(b"x" * 100)
    err = no_space_error(_short_write(), ckpt)
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC and err.filename == str(ckpt)
    assert str(err).startswith(f"[Errno 28] No space left on device (ENOSPC) while saving checkpoint {ckpt}: ")
    assert "bytes were free on its file system" in str(err) and "file write failed" in str(err)
    assert not ckpt.exists()  # never resumed from (no marker); removed, the rank's error file fits

    other = tmp_path / "checkpoints" / "step-000008"
    other.mkdir()
    assert no_space_error(ValueError("a bad tensor"), other) is None and other.exists()


def test_no_room_for_a_checkpoint_is_refused_before_a_start_and_named_after_a_failure(tmp_path):
    out = tmp_path / "base_checkpoint" / "v1"
    ckpt = out / "checkpoints" / "step-000002"
    ckpt.mkdir(parents=True)
    with open(ckpt / "zero_pp_rank_0_mp_rank_00_optim_states.pt", "wb") as f:
        f.truncate(2**43)  # a sparse file of 8 TiB: the newest checkpoint is larger than any free space here
    mark_complete(ckpt, 2, 2, 2)
    problem = space_problem(out)
    assert problem.startswith(f"No space left on device (ENOSPC) for the training in {out}: its file system has ")
    taken = sum(f.stat().st_size for f in ckpt.iterdir())  # the sparse file and COMPLETE.json
    assert f"the newest checkpoint {ckpt} takes {taken:,}" in problem and "not retried" in problem

    # torchrun SIGKILLed, no rank's error file (a full disk takes them too): ENOSPC, not "killed or preempted"
    logs = tmp_path / "torchelastic"
    logs.mkdir()
    failure = training_failure(-9, logs, tmp_path / "train.log", out)
    assert failure.allow_retries is False and f"(ENOSPC) for the training in {out}: " in failure.description
    assert "killed or preempted" not in failure.description

    small = tmp_path / "lora_adapter" / "v1"
    (small / "checkpoints" / "step-000002").mkdir(parents=True)
    (small / "checkpoints" / "step-000002" / "a.pt").write_bytes(b"x" * 100)
    mark_complete(small / "checkpoints" / "step-000002", 2, 1, 0)
    assert space_problem(small) is None
    killed = training_failure(-9, logs, tmp_path / "train.log", small)  # room on disk: killed, retried
    assert killed.allow_retries is True and "killed or preempted" in killed.description


def test_a_storage_root_on_a_tmpfs_that_fills_during_cleaned_text(tmp_path, request):
    """The case built for real (shared/cases "disk full (build it)"): a storage root on a 1 MiB tmpfs holding
    raw_corpus, then filled by another file to 8 KiB free. cleaned_text fails with the kernel's ENOSPC named with
    the part file, the version and the free space; nothing of the version is left (no directory, no commit
    marker, no temporary directory). With the filler deleted the rerun succeeds, reuses raw_corpus, and its
    version equals a run's on the normal disk, file for file."""
    from helpers.small_disk import can_mount, fill, rerun_in_mount_namespace, tmpfs

    from largetrain_core.clean import QualityConfig
    from largetrain_core.executors.local import LocalExecutor
    from largetrain_core.readers import ReaderConfig
    from largetrain_core.stages.base import StageRun
    from largetrain_core.stages.cleaned_text import cleaned_text
    from largetrain_core.stages.raw_corpus import raw_corpus
    from largetrain_core.storage import verify_manifest

    if not can_mount():
        return rerun_in_mount_namespace(request.node.nodeid)
    src = tmp_path / "corpus"
    src.mkdir()
    for i in range(8):
        (src / f"d{i}.txt").write_text(f"Document {i}: " + "some words about the kernel here. " * (20 + i))
    quality = QualityConfig(gopher_quality=False, gopher_repetition=False, c4=False)

    def steps(root):
        raw = raw_corpus(ReaderConfig(str(src)), StageRun(root, ("c", "raw_corpus"), executor=LocalExecutor()))
        return raw, lambda: cleaned_text(quality, raw, StageRun(root, ("c", "cleaned_text"), executor=LocalExecutor()))

    ref = steps(tmp_path / "disk")[1]()
    with tmpfs(tmp_path / "small", 1 << 20) as root:
        raw, clean = steps(root)
        filler = fill(root, 8192)
        with pytest.raises(DiskFullError) as caught:
            clean()
        err = caught.value
        version = root / "c" / "cleaned_text" / ref.data_version
        assert err.errno == errno.ENOSPC and err.filename.endswith("part-00000.parquet")
        assert err.filename.startswith(str(root / "c" / "cleaned_text" / ".tmp-"))  # the file being written
        assert str(err).startswith(
            f"[Errno 28] No space left on device (ENOSPC) writing {err.filename} while building {version}: "
        )
        assert " bytes free on its file system (OSError: [Errno 28] " in str(err)
        assert "Free space there, then run the step again" in str(err)
        assert list((root / "c" / "cleaned_text").iterdir()) == []  # nothing half-written kept, none committed
        assert verify_manifest(raw.path) == []  # the committed input is untouched

        filler.unlink()
        again = clean()
        assert not again.reused and again.data_version == ref.data_version
        assert verify_manifest(again.path) == []

        def files(d):
            return {str(p.relative_to(d)): p for p in Path(d).rglob("*") if p.is_file() and p.name != "stats.json"}

        made, expected = files(again.path), files(ref.path)
        assert sorted(made) == sorted(expected)
        for name in expected:  # the rerun's version is the normal disk's, byte for byte (stats.json holds seconds)
            if name not in ("_manifest.json", "_COMMITTED.json"):
                assert made[name].read_bytes() == expected[name].read_bytes(), name
