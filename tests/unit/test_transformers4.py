"""The tokenizers and models the project writes load in transformers 4.x as in 5.x: optimum-onnx and
llama.cpp's converter pin 4.x. transformers 4.57 lives in ``.venv/llama.cpp/site`` (the Makefile's
``$(VENV)/llama.cpp/.installed``, a dependency of ``make test``) and runs in a child process with that
folder first on PYTHONPATH; the rest (torch, numpy, safetensors) is the virtualenv's."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from largetrain_core import chat
from largetrain_core.model import build_model
from largetrain_core.tokenizer import EOS_TOKEN, load_tokenizer_info, read_tokenizer, save_hf_tokenizer, save_tokenizer

TRANSFORMERS4 = Path(sys.prefix) / "llama.cpp" / "site"
TEXTS = ["the quick brown fox jumps over the lazy dog", "a short one"]
MESSAGES = [{"role": "user", "content": "what is a shard?"}, {"role": "assistant", "content": "a file of tokens"}]

CHILD = """
import json, sys
import torch, transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
base, chat_dir, texts, messages = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
tok = AutoTokenizer.from_pretrained(base)
batch = tok(texts, padding=True, return_tensors="pt")
model = AutoModelForCausalLM.from_pretrained(base).eval()
with torch.no_grad():
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
chat_tok = AutoTokenizer.from_pretrained(chat_dir)
print(json.dumps({
    "version": transformers.__version__, "class": type(tok).__name__, "pad": tok.pad_token_id, "eos": tok.eos_token_id,
    "bos": tok.bos_token_id, "config_bos": model.config.bos_token_id, "input_ids": batch["input_ids"].tolist(),
    "attention_mask": batch["attention_mask"].tolist(), "logits": logits.tolist(),
    "chat_ids": list(chat_tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]),
}))
"""


def _in_transformers4(*args: str) -> dict:
    assert (TRANSFORMERS4 / "transformers").is_dir(), (
        f"{TRANSFORMERS4}: missing; `make install` puts transformers 4.x there"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TRANSFORMERS4), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",  # tiny models: more threads only spin (35 CPU s against 13 s wall)
    }
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_model_and_a_chat_tokenizer_we_write_load_in_transformers_4_as_in_5(bpe_dir, tmp_path):
    """A base model directory as the project exports it (config.json, safetensors, the tokenizer through
    save_hf_tokenizer) and a ChatML tokenizer (save_tokenizer): transformers 4.57 loads both as
    ``PreTrainedTokenizerFast`` with EOS as its pad token, pads a batch, and gives the ids, the mask, the
    chat template's ids and the logits (1e-5) that transformers 5 gives here; config.json declares no BOS
    id, as the tokenizer has none."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    info = load_tokenizer_info(bpe_dir)
    base = tmp_path / "base"
    build_model("llama-tiny", info.vocab_size, 64, info.eos_id, info.bos_id).save_pretrained(str(base))
    save_hf_tokenizer(info, base)
    chat_tok = PreTrainedTokenizerFast(tokenizer_object=read_tokenizer(info.path), eos_token=EOS_TOKEN)
    chat.add_chat_template(chat_tok)
    save_tokenizer(chat_tok, tmp_path / "chat")

    old = _in_transformers4(str(base), str(tmp_path / "chat"), json.dumps(TEXTS), json.dumps(MESSAGES))
    assert old["version"].startswith("4.") and old["class"] == "PreTrainedTokenizerFast"
    assert old["pad"] == old["eos"] == info.eos_id and old["bos"] is None and old["config_bos"] is None

    tok = AutoTokenizer.from_pretrained(str(base))
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    assert batch["input_ids"].tolist() == old["input_ids"] and batch["attention_mask"].tolist() == old["attention_mask"]
    assert batch["attention_mask"][1].sum() < batch["attention_mask"][0].sum()  # the padding was exercised
    model = AutoModelForCausalLM.from_pretrained(str(base)).eval()
    with torch.no_grad():
        logits = model(**batch).logits.numpy()
    mask = batch["attention_mask"].numpy().astype(bool)
    np.testing.assert_allclose(np.array(old["logits"])[mask], logits[mask], atol=1e-5)
    new_chat = AutoTokenizer.from_pretrained(str(tmp_path / "chat"))
    assert old["chat_ids"] == list(new_chat.apply_chat_template(MESSAGES, tokenize=True, return_dict=True)["input_ids"])
    cfg = json.loads((base / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and "backend" not in cfg
