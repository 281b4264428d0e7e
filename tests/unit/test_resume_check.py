"""Issue 42 item 10: what a checkpoint records of its run (largetrain_core.training.resume_check), and a resume
with other settings: named at WARNING, refused across changed train data unless allowed; a copied root is
the same run."""

import logging
import shutil
from pathlib import Path

import polars as pl
import pytest

from largetrain_core.shards import TokenShards, build_token_shards
from largetrain_core.training.config import TrainConfig
from largetrain_core.training.resume_check import check_resume, identity_hash, run_identity

pytestmark = pytest.mark.unit


def _shards(tmp: Path, bpe_dir: Path, sentences: list[str], seq_len: int) -> Path:
    docs = tmp / f"docs-{seq_len}"
    docs.mkdir(parents=True)
    texts = [" ".join(sentences[i : i + 12]) for i in range(0, 240, 4)]
    pl.DataFrame(
        {"doc_id": [f"d{i}" for i in range(len(texts))], "source": ["t"] * len(texts), "text": texts}
    ).write_parquet(docs / "part-00000.parquet")
    out = tmp / "root" / f"shards-{seq_len}"
    out.mkdir(parents=True)
    build_token_shards(docs, bpe_dir, out, seq_len=seq_len, validation_fraction=0.1)
    return out


def _identity(shards: Path, **settings) -> dict:
    # tokenizer: the shards' directory, which carries the tokenizer that made them (a path recorded by content)
    cfg = TrainConfig.from_settings(output_dir="o", train_shards=str(shards), tokenizer=str(shards), **settings)
    return run_identity(cfg, TokenShards(shards, "train"))


@pytest.fixture
def two_shards(tmp_path, bpe_dir, sentences) -> tuple[Path, Path]:
    return _shards(tmp_path, bpe_dir, sentences, 16), _shards(tmp_path, bpe_dir, sentences, 32)


def test_a_copied_root_is_the_same_run(two_shards, tmp_path):
    shards = two_shards[0]
    copy = Path(shutil.copytree(shards.parent, tmp_path / "elsewhere" / "root")) / shards.name
    a, b = _identity(shards), _identity(copy)
    assert a == b and identity_hash(a) == identity_hash(b)
    assert TrainConfig.from_settings(output_dir="o", train_shards=str(shards)).config_hash() != (
        TrainConfig.from_settings(output_dir="o", train_shards=str(copy)).config_hash()
    )  # the hash of the paths as written, which checkpoints no longer record
    assert check_resume(Path("ck"), {"settings": a, "config_hash": identity_hash(a)}, b, False) == []


def test_changed_settings_are_named_at_warning(two_shards, caplog):
    shards = two_shards[0]
    saved = _identity(shards, learning_rate=5e-3, max_steps=8)
    now = _identity(shards, learning_rate=1e-3, max_steps=12)
    with caplog.at_level(logging.WARNING, logger="largetrain.training"):
        diffs = check_resume(Path("ck"), {"settings": saved, "config_hash": identity_hash(saved)}, now, False)
    assert diffs == ["learning_rate 0.005 -> 0.001", "max_steps 8 -> 12"]
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert (
        record.message
        == "ck was written with settings that differ from this run's: learning_rate 0.005 -> 0.001; max_steps 8 -> 12"
    )


def test_a_resume_across_changed_data_is_refused_unless_allowed(two_shards, caplog):
    short, long = two_shards
    saved, now = _identity(short), _identity(long)
    client = {"settings": saved, "config_hash": identity_hash(saved)}
    with pytest.raises(ValueError, match=r"ck was trained on other data.*seq_len 16 -> 32.*resume_across_data_change"):
        check_resume(Path("ck"), client, now, False)
    with caplog.at_level(logging.WARNING, logger="largetrain.training"):
        diffs = check_resume(Path("ck"), client, now, True)
    assert "seq_len 16 -> 32" in diffs and any(d.startswith("train_shards ") for d in diffs)
    assert "seq_len 16 -> 32" in caplog.text


def test_an_older_checkpoint_without_settings_is_warned_by_hash(two_shards, caplog):
    now = _identity(two_shards[0])
    with caplog.at_level(logging.WARNING, logger="largetrain.training"):
        assert check_resume(Path("ck"), {"config_hash": "0123456789abcdef"}, now, False) == []
    assert "records no settings" in caplog.text and "0123456789abcdef" in caplog.text


def test_a_base_model_is_recorded_by_its_content_wherever_it_lies(tmp_path):
    """storage.sampled_digest, a base model's identity in a checkpoint: the same for a copy, another for a
    changed config or a changed byte of the weights' sampled blocks (a file over 8 MiB: sampled, not read whole)."""
    from largetrain_core.storage import sampled_digest

    model = tmp_path / "a" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"hidden_size": 64}')
    (model / "model.safetensors").write_bytes(bytes(9 << 20))
    copy = Path(shutil.copytree(model, tmp_path / "b" / "model"))
    assert sampled_digest(model) == sampled_digest(copy)
    (copy / "config.json").write_text('{"hidden_size": 65}')
    assert sampled_digest(model) != sampled_digest(copy)
    (copy / "config.json").write_text('{"hidden_size": 64}')
    with open(copy / "model.safetensors", "r+b") as f:
        f.write(b"\x01")  # the first sampled block starts at byte 0
    assert sampled_digest(model) != sampled_digest(copy)
    assert sampled_digest(model, ["config.json", "absent.json"]) == sampled_digest(copy, ["config.json"])
