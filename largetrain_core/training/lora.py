"""LoRA adapters on a causal LM (PEFT): which modules to adapt, and wrapping the model."""

from __future__ import annotations

import re
from pathlib import Path

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


def meta_model(model_dir: Path):
    """The causal LM of the Hugging Face directory's ``config.json``, built on torch's meta device: its
    modules, parameter names and weight tying without reading or allocating any weight. Raises
    (Missing)ArtefactError naming config.json when it is missing or damaged."""
    import torch
    from transformers import AutoModelForCausalLM

    from largetrain_core.model import model_config

    config = model_config(model_dir)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def matched_modules(model, target: str) -> list[str]:
    """Names of the modules of ``model`` that PEFT adapts for the target name ``target`` (PEFT's own
    matching, ``check_target_module_exists``: the full name, or its last components)."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists

    config = LoraConfig(target_modules=[target])
    return [name for name, _ in model.named_modules() if name and check_target_module_exists(config, name)]


def tied_targets(model, targets: list[str]) -> dict[str, list[str]]:
    """``{adapted module: other names of its weight}`` for every module that ``targets`` adapt whose
    parameter is shared with another module (tied weights, e.g. ``lm_head`` and ``model.embed_tokens``
    under ``tie_word_embeddings``). LoRA on such a module cannot be merged: ``merge_and_unload`` adds
    the update to the one shared tensor, so it changes the other module too (PEFT issue 2777)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    out = {}
    for target in targets:
        for module_name in matched_modules(model, target):
            for pname, p in model.get_submodule(module_name).named_parameters(recurse=False):
                others = [n for n in names[id(p)] if n != f"{module_name}.{pname}"]
                if others:
                    out[module_name] = others
    return out


def target_problems(model, settings: LoraSettings) -> list[str]:
    """What makes ``settings.target_modules`` unusable on ``model`` (a model from :func:`meta_model`
    will do): names that match no module (PEFT would fail inside every rank), and targets whose weight
    is tied to another module's (see :func:`tied_targets`)."""
    if not settings.target_modules:
        return []  # the discovered default: linear layers inside the decoder blocks, never tied
    problems = []
    unknown = [t for t in settings.target_modules if not matched_modules(model, t)]
    if unknown:
        problems.append(f"lora.target_modules {unknown} match no module of the base model; its adaptable "
                        f"linear layers are {lora_target_modules(model)}")
    tied = tied_targets(model, settings.target_modules)
    if tied:
        shared = "; ".join(f"{m} shares its weight with {', '.join(o)}" for m, o in sorted(tied.items()))
        problems.append(f"lora.target_modules adapt tied weights ({shared}): base + adapter cannot be merged into "
                        "one model (the update would change the tied module too), so a merged export would differ "
                        f"from the adapter. Remove {sorted({m.rsplit('.', 1)[-1] for m in tied})} from "
                        "lora.target_modules, or adapt a copy of the base model saved with tie_word_embeddings false")
    return problems


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
