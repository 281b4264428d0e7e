"""GGUF exports by llama.cpp's own converter (largetrain_core.gguf_export), read back by transformers
(``gguf_file=``, which dequantizes through the ``gguf`` package): the same tokenizer ids and logits."""

import numpy as np
import pytest

from largetrain_core.gguf_export import export_gguf, is_gpt2_byte_level, main
from largetrain_core.model import build_model
from largetrain_core.tokenizer import load_tokenizer_info, save_hf_tokenizer

TEXT = "the quick brown fox jumps over the lazy dog, twice: 3.14 and 'quoted' text"


@pytest.fixture(scope="module")
def model_dir(bpe_dir, tmp_path_factory):
    """A model export as base_checkpoint writes one: a llama-tiny of the session's byte-level BPE."""
    info = load_tokenizer_info(bpe_dir)
    out = tmp_path_factory.mktemp("export")
    build_model("llama-tiny", info.vocab_size, 64, info.eos_id, info.bos_id, seed=1).save_pretrained(str(out))
    save_hf_tokenizer(info, out)
    return out


# f16 rounds each weight to 11 significant bits, q8_0 to 8 bits per block of 32 (scale in f16)
@pytest.mark.parametrize("outtype,atol", [("f16", 2e-3), ("q8_0", 3e-2)])
def test_gguf_reloads_in_transformers_with_the_same_ids_and_logits(model_dir, tmp_path, outtype, atol):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert is_gpt2_byte_level(model_dir / "tokenizer.json")
    path = export_gguf(model_dir, tmp_path / f"model.{outtype}.gguf", outtype)
    assert path.read_bytes()[:4] == b"GGUF" and not list(tmp_path.glob(".tmp-*"))

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    gguf_tok = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    assert gguf_tok(TEXT, add_special_tokens=False)["input_ids"] == ids[0].tolist()
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()(ids).logits.numpy()
        got = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name).eval()(ids).logits.numpy()
    assert got.shape == want.shape
    diff = np.abs(got - want).max()
    assert diff < atol, diff
    assert diff > 0 or outtype == "f32"  # the file holds the rounded weights, not a copy of ours


def test_the_cli_refuses_an_unknown_type_and_names_a_missing_converter(model_dir, tmp_path, monkeypatch, capsys):
    assert main([str(model_dir), str(tmp_path / "m.gguf"), "--outtype", "q8_0"]) == 0
    assert (tmp_path / "m.gguf").is_file()
    with pytest.raises(ValueError, match="outtype 'q4'"):
        export_gguf(model_dir, tmp_path / "x.gguf", "q4")
    monkeypatch.setenv("LARGETRAIN_LLAMA_CPP", str(tmp_path / "nowhere"))
    assert main([str(model_dir), str(tmp_path / "y.gguf")]) == 1
    assert "convert_hf_to_gguf.py: llama.cpp's converter is not installed" in capsys.readouterr().err
    assert not (tmp_path / "y.gguf").exists()
