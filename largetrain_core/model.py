"""Causal language models: named presets built from a transformers config, or an existing
Hugging Face directory loaded from local disk (never from a hub).

Presets are Llama-style decoders (RMSNorm, SwiGLU MLP, rotary positions; transformers
``LlamaConfig``), sized by hidden size / layers / heads. Parameter counts below include the
tied embedding at a vocabulary of 8,192.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel

# name -> (hidden_size, intermediate_size, layers, attention heads)
PRESETS: dict[str, tuple[int, int, int, int]] = {
    "llama-tiny": (64, 172, 2, 2),  # ~0.6M parameters: tests
    "llama-3m": (192, 512, 4, 4),  # ~3.3M: the CPU demo
    "llama-20m": (384, 1024, 8, 6),  # ~17M
    "llama-125m": (768, 2048, 12, 12),  # ~110M + embeddings: the GPU check
}


def build_config(preset: str, vocab_size: int, max_positions: int, eos_id: int, bos_id: int | None = None) -> LlamaConfig:
    """A ``LlamaConfig`` for ``preset``. Raises KeyError naming the known presets."""
    if preset not in PRESETS:
        raise KeyError(f"unknown model preset {preset!r}; known: {sorted(PRESETS)}")
    hidden, inter, layers, heads = PRESETS[preset]
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max_positions,
        tie_word_embeddings=True, eos_token_id=eos_id, bos_token_id=bos_id if bos_id is not None else eos_id,
        pad_token_id=None, use_cache=False,
    )


def build_model(preset: str, vocab_size: int, max_positions: int, eos_id: int, bos_id: int | None = None,
                seed: int = 0) -> PreTrainedModel:
    """A freshly initialized fp32 causal LM (transformers' own init, under ``torch.manual_seed(seed)``)."""
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(build_config(preset, vocab_size, max_positions, eos_id, bos_id),
                                            dtype=torch.float32)


def load_model(path: Path) -> PreTrainedModel:
    """Load a local Hugging Face causal-LM directory (config.json + safetensors weights) in fp32.

    Only safetensors weights are accepted (``use_safetensors=True``): no pickle is ever loaded.
    Raises OSError when the directory is not a model directory.
    """
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, use_safetensors=True,
                                                local_files_only=True)


def parameter_count(model: torch.nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def import_pretrained(src: Path, out: Path) -> dict:
    """Import an existing causal LM from the local Hugging Face directory ``src`` into ``out``.

    ``src`` needs config.json, safetensors weights and a tokenizer (tokenizer.json, optionally
    tokenizer_config.json naming eos/bos). The model is loaded in fp32 (safetensors only, no hub) and
    written to ``out`` (which must not exist; the caller builds it atomically) as config.json +
    model.safetensors + the tokenizer, so that it loads like a pretrained ``base_checkpoint``.
    Returns ``{"parameters", "model_vocab_size", "tokenizer_vocab_size", "eos_id", "bos_id", "model_type"}``.
    Raises FileNotFoundError without a tokenizer.json, ValueError when a token id of the tokenizer
    does not fit the model's embedding (tokenizer vocabulary larger than ``config.vocab_size``).
    """
    from largetrain_core.tokenizer import load_tokenizer_info, save_hf_tokenizer

    src, out = Path(src), Path(out)
    info = load_tokenizer_info(src)
    model = load_model(src)
    if info.vocab_size > model.config.vocab_size:
        raise ValueError(f"{src}: the tokenizer has ids up to {info.vocab_size - 1}, the model's embedding only "
                         f"{model.config.vocab_size} rows; use the tokenizer this model was trained with")
    model.config.use_cache = True
    model.save_pretrained(str(out), safe_serialization=True)
    save_hf_tokenizer(info, out)
    return {"parameters": parameter_count(model), "model_vocab_size": model.config.vocab_size,
            "tokenizer_vocab_size": info.vocab_size, "eos_id": info.eos_id, "bos_id": info.bos_id,
            "model_type": model.config.model_type}


def tokenizer_mismatch(model_dir: Path, shards_manifest: dict, shards_tokenizer: Path) -> str | None:
    """None when the token shards were made with the tokenizer of the HF directory ``model_dir``,
    else a message saying what differs (same vocabulary with added tokens, same EOS id, and every
    shard id below the model's embedding size). ``shards_tokenizer``: the tokenizer.json the shards
    were built with (its directory)."""
    from tokenizers import Tokenizer

    from largetrain_core.tokenizer import load_tokenizer_info

    mine, theirs = load_tokenizer_info(model_dir), load_tokenizer_info(shards_tokenizer)
    if Tokenizer.from_file(str(mine.path)).get_vocab(True) != Tokenizer.from_file(str(theirs.path)).get_vocab(True):
        return f"the shards' tokenizer ({theirs.path}) has another vocabulary than the model's ({mine.path})"
    if shards_manifest["eos_id"] != mine.eos_id:
        return f"the shards end documents with id {shards_manifest['eos_id']}, the model's EOS is {mine.eos_id}"
    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    if shards_manifest["vocab_size"] > vocab:
        return f"shard ids reach {shards_manifest['vocab_size'] - 1}, the model's embedding has {vocab} rows"
    return None
