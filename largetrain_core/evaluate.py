"""Held-out evaluation: perplexity on the validation split of token shards.

Perplexity = exp(mean next-token cross-entropy in nats) over every target token of the evaluated
sequences (each sequence of seq_len + 1 tokens gives seq_len targets). Runs in fp32 without
DeepSpeed: evaluation of a saved model needs no distributed state.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from largetrain_core.model import load_adapter, load_model
from largetrain_core.shards import TokenShards
from largetrain_core.storage import loading
from largetrain_core.tokenizer import load_tokenizer_info
from largetrain_core.training.loss import next_token_loss, targets


def load_for_eval(model_dir: Path, adapter_dir: Path | None = None):
    """The HF model in ``model_dir`` (fp32, eval mode), with the PEFT adapter of ``adapter_dir`` applied if given.
    Raises (Missing)ArtifactError naming a missing or damaged file (largetrain_core.model.load_model, load_adapter)."""
    model = load_model(model_dir)
    if adapter_dir is not None:
        model = load_adapter(model, adapter_dir)
    return model.eval()


@torch.no_grad()
def perplexity(
    model, shards_dir: Path, split: str = "validation", max_sequences: int | None = 64, batch_size: int = 8
) -> dict:
    """Perplexity of ``model`` on the first ``max_sequences`` sequences of ``split``.

    Returns ``{"perplexity", "loss_nats", "sequences", "tokens"}``. Raises ValueError on an empty split.
    """
    data = TokenShards(shards_dir, split)
    n = len(data) if max_sequences is None else min(len(data), max_sequences)
    if n == 0:
        raise ValueError(f"{shards_dir}: split {split!r} holds no sequence to evaluate")
    total, count = 0.0, 0
    for start in range(0, n, batch_size):
        batch = torch.from_numpy(data.take(np.arange(start, min(n, start + batch_size))).astype(np.int64))
        total += next_token_loss(model, batch, reduction="sum").item()
        count += targets(batch)
    loss = total / count
    return {"perplexity": math.exp(loss), "loss_nats": loss, "sequences": n, "tokens": count}


@torch.no_grad()
def sample_generations(model, tokenizer_dir: Path, prompts: list[str], max_new_tokens: int = 24) -> list[dict]:
    """Greedy continuations (deterministic: no sampling) of each prompt, ``max_new_tokens`` new tokens at most.

    The prompt is encoded with the tokenizer of ``tokenizer_dir`` (a HF directory) after its BOS when it
    has one; generation stops at EOS. Returns ``[{"prompt", "completion"}]`` with the completion decoded
    without special tokens.
    """
    from transformers import AutoTokenizer

    load_tokenizer_info(Path(tokenizer_dir))  # a damaged tokenizer.json or tokenizer_config.json is named
    with loading(tokenizer_dir, "Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json)"):
        tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    out = []
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
        if tok.bos_token_id is not None:
            ids = torch.cat([torch.tensor([[tok.bos_token_id]]), ids], dim=1)
        gen = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.eos_token_id,
        )
        out.append({"prompt": prompt, "completion": tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=True)})
    return out
