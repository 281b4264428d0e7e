"""Causal language models: named presets built from a transformers config, or an existing
Hugging Face directory loaded from local disk (never from a hub).

Presets are Llama-style decoders (RMSNorm, SwiGLU MLP, rotary positions; transformers
``LlamaConfig``), sized by hidden size / layers / heads. Parameter counts below include the
tied embedding at a vocabulary of 8,192.
"""

from __future__ import annotations

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
