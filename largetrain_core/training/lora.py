"""LoRA adapters on a causal LM (PEFT): which modules to adapt, and wrapping the model."""

from __future__ import annotations

import re

from largetrain_core.training.config import LoraSettings


def lora_target_modules(model) -> list[str]:
    """Names (last path component) of every nn.Linear inside the decoder blocks (``.layers.N.`` or
    ``.h.N.`` in the module path); the LM head is excluded. Raises ValueError when there is none."""
    import torch

    names = set()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and re.search(r"\.layers?\.\d+\.|\.h\.\d+\.", f".{name}."):
            names.add(name.rsplit(".", 1)[-1])
    if not names:
        raise ValueError("no nn.Linear modules inside decoder blocks found; set lora.target_modules explicitly")
    return sorted(names)


def add_lora(model, settings: LoraSettings, activation_checkpointing: bool):
    """(PEFT model with a fresh adapter named ``settings.adapter_name``, the adapted module names).

    Only the adapter trains (PEFT freezes the rest). With activation checkpointing the embedding's
    output is made to require grad: with the embedding frozen, checkpointed blocks would otherwise get
    inputs that do not require grad, and no gradient would reach the adapters."""
    from peft import LoraConfig, get_peft_model

    targets = settings.target_modules or lora_target_modules(model)
    config = LoraConfig(r=settings.r, lora_alpha=settings.lora_alpha, lora_dropout=settings.lora_dropout,
                        target_modules=targets, task_type="CAUSAL_LM", bias="none")
    if activation_checkpointing:
        model.enable_input_require_grads()
    return get_peft_model(model, config, adapter_name=settings.adapter_name), targets
