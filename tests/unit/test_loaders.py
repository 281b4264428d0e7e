"""Every loader of a stored artifact names the file and what it expected when the file is cut short,
garbled or missing (issue 12, kind 6): tokenizer, model weights, PEFT adapter, shards, part files."""

import json
from pathlib import Path

import polars as pl
import pytest
import torch

from largetrain_core.evaluate import load_for_eval, sample_generations
from largetrain_core.model import build_model, load_adapter, load_model
from largetrain_core.shards import TokenShards, build_token_shards
from largetrain_core.storage import ArtifactError, MissingArtifactError
from largetrain_core.tokenizer import load_tokenizer_info, save_hf_tokenizer


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.fixture(scope="module")
def saved(tmp_path_factory, bpe_dir):
    """A tiny HF model directory (with its tokenizer) and a PEFT LoRA adapter for it, saved as the
    training exports them (safetensors)."""
    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("saved")
    info = load_tokenizer_info(bpe_dir)
    model = build_model("llama-tiny", info.vocab_size, 32, info.eos_id)
    model.save_pretrained(str(root / "model"), safe_serialization=True)
    save_hf_tokenizer(info, root / "model")
    peft = get_peft_model(
        build_model("llama-tiny", info.vocab_size, 32, info.eos_id),
        LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]),
    )
    peft.save_pretrained(str(root / "adapter"))
    return root


def copy_of(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_intact_artifacts_load(saved):
    model = load_for_eval(saved / "model", saved / "adapter")
    assert torch.isfinite(model(input_ids=torch.tensor([[1, 2, 3]])).logits).all()


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_truncated_tokenizer_file_is_named(saved, tmp_path, name):
    d = copy_of(saved / "model", tmp_path / "model")
    truncate(d / name)
    with pytest.raises(ArtifactError, match=f"^{d / name}: not a valid .*{name}"):
        load_tokenizer_info(d)
    with pytest.raises(ArtifactError, match=f"^{d / name}: "):  # evaluation's prompts go through AutoTokenizer
        sample_generations(None, d, ["a prompt"])


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_truncated_model_file_is_named(saved, tmp_path, name):
    d = copy_of(saved / "model", tmp_path / "model")
    truncate(d / name)
    with pytest.raises(ArtifactError, match=f"^{d / name}: not a valid .*Hugging Face causal-LM directory"):
        load_model(d)


def test_missing_model_weights_are_named(saved, tmp_path):
    d = copy_of(saved / "model", tmp_path / "model")
    (d / "model.safetensors").unlink()
    with pytest.raises(
        MissingArtifactError, match=f"^{d / 'model.safetensors'}: missing; expected safetensors weights"
    ):
        load_model(d)


@pytest.mark.parametrize("name", ["adapter_config.json", "adapter_model.safetensors"])
def test_truncated_adapter_file_is_named(saved, tmp_path, name):
    d = copy_of(saved / "adapter", tmp_path / "adapter")
    truncate(d / name)
    with pytest.raises(ArtifactError, match=f"^{d / name}: not a valid .*PEFT adapter directory"):
        load_adapter(load_model(saved / "model"), d)
    with pytest.raises(ArtifactError, match=f"^{d / name}: "):
        load_for_eval(saved / "model", d)


def test_truncated_files_read_by_the_shard_builder_are_named(saved, tmp_path, sentences):
    docs = tmp_path / "docs"
    docs.mkdir()
    pl.DataFrame({"doc_id": [f"d{i}" for i in range(len(sentences))], "text": sentences}).write_parquet(
        docs / "part-00000.parquet"
    )
    tok = copy_of(saved / "model", tmp_path / "tok")
    out = tmp_path / "shards"
    out.mkdir()
    build_token_shards(docs, tok, out, seq_len=16)
    assert len(TokenShards(out, "train")) > 0

    truncate(docs / "part-00000.parquet")
    with pytest.raises(ArtifactError, match=f"^{docs / 'part-00000.parquet'}: not a valid Parquet part file"):
        build_token_shards(docs, tok, tmp_path / "again", seq_len=16)
    truncate(tok / "tokenizer.json", 0.9)
    with pytest.raises(
        ArtifactError, match=f"^{tok / 'tokenizer.json'}: not a valid Hugging Face tokenizers tokenizer.json"
    ):
        build_token_shards(docs, tok, tmp_path / "again", seq_len=16)
    truncate(out / "manifest.json")
    with pytest.raises(ArtifactError, match=f"^{out / 'manifest.json'}: not valid JSON"):
        TokenShards(out, "train")
    assert json.loads((saved / "model" / "tokenizer_config.json").read_text())["split_special_tokens"] is True
