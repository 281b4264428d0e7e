"""LoRA adapters on a causal LM (PEFT): which modules to adapt, and wrapping the model."""

from __future__ import annotations

from pathlib import Path

from largetrain_core.training.config import LoraSettings


def _linear_types() -> tuple[type, ...]:
    """The layer types a default target may have: ``torch.nn.Linear`` and transformers' ``Conv1D`` (GPT-2's
    linear layers, weight stored as (in_features, out_features)), as PEFT's ``all-linear`` shorthand takes."""
    import torch
    from transformers.pytorch_utils import Conv1D

    return torch.nn.Linear, Conv1D


def decoder_blocks(model) -> list[str]:
    """Names of the decoder blocks of ``model``: the modules whose class transformers lists in the model's
    ``_no_split_modules`` (the blocks it never splits across devices: LlamaDecoderLayer, GPT2Block, ...);
    where none is found, every element of an ``nn.ModuleList``."""
    import torch

    classes = set(getattr(model, "_no_split_modules", None) or ())
    blocks = [name for name, m in model.named_modules() if type(m).__name__ in classes]
    return blocks or [
        f"{name}.{i}" for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) for i in range(len(m))
    ]


def adaptable_modules(model) -> dict[str, list[str]]:
    """``{last name component: sorted layer type names}`` of every module anywhere in ``model`` whose type
    PEFT's LoRA can adapt (nn.Linear, transformers Conv1D, nn.Embedding, nn.Conv1d/2d/3d,
    nn.MultiheadAttention): what ``lora.target_modules`` can name."""
    import torch

    kinds = (
        *_linear_types(),
        torch.nn.Embedding,
        torch.nn.Conv1d,
        torch.nn.Conv2d,
        torch.nn.Conv3d,
        torch.nn.MultiheadAttention,
    )
    out: dict[str, set[str]] = {}
    for name, m in model.named_modules():
        if name and isinstance(m, kinds):
            out.setdefault(name.rsplit(".", 1)[-1], set()).add(type(m).__name__)
    return {k: sorted(v) for k, v in sorted(out.items())}


def _listed(modules: dict[str, list[str]]) -> str:
    return ", ".join(f"{k} ({'/'.join(v)})" for k, v in modules.items()) or "none"


def lora_target_modules(model) -> list[str]:
    """Names (last path component) of every ``nn.Linear`` and transformers ``Conv1D`` inside the decoder
    blocks (:func:`decoder_blocks`); the LM head, outside them, is never among them. Raises ValueError
    naming the modules LoRA can adapt (:func:`adaptable_modules`) when there is none."""
    linear = _linear_types()
    blocks = tuple(f"{b}." for b in decoder_blocks(model))
    names = {
        name.rsplit(".", 1)[-1]
        for name, m in model.named_modules()
        if isinstance(m, linear) and name.startswith(blocks)
    }
    if not names:
        where = f"its {len(blocks)} decoder blocks" if blocks else "any decoder block (none found)"
        raise ValueError(
            f"no nn.Linear or Conv1D layer inside {where} of {type(model).__name__} to adapt by default; "
            f"set lora.target_modules to some of the modules LoRA can adapt: {_listed(adaptable_modules(model))}"
        )
    return sorted(names)


def fan_in_fan_out(model, targets: list[str]) -> bool:
    """PEFT's ``fan_in_fan_out`` for ``targets`` on ``model``: True when they adapt transformers ``Conv1D``
    layers (GPT-2: the weight is stored as (in_features, out_features), the transpose of nn.Linear's)."""
    from transformers.pytorch_utils import Conv1D

    return any(isinstance(model.get_submodule(name), Conv1D) for t in targets for name in matched_modules(model, t))


def meta_model(model_dir: Path):
    """The causal LM of the Hugging Face directory's ``config.json``, built on torch's meta device: its
    modules, parameter names and weight tying without reading or allocating any weight. Raises
    (Missing)ArtifactError naming config.json when it is missing or damaged."""
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
    will do): no default target to discover (``target_modules`` null), names that match no module (PEFT
    would fail inside every rank), and targets whose weight is tied to another module's (see
    :func:`tied_targets`). Each names the modules LoRA can adapt where that is the fix."""
    if not settings.target_modules:
        try:  # the discovered default: linear layers inside the decoder blocks, never tied
            lora_target_modules(model)
        except ValueError as e:
            return [str(e)]
        return []
    problems = []
    unknown = [t for t in settings.target_modules if not matched_modules(model, t)]
    if unknown:
        try:
            linear = f"its adaptable linear layers are {lora_target_modules(model)}"
        except ValueError:
            linear = f"LoRA can adapt {_listed(adaptable_modules(model))}"
        problems.append(f"lora.target_modules {unknown} match no module of the base model; {linear}")
    tied = tied_targets(model, settings.target_modules)
    if tied:
        shared = "; ".join(f"{m} shares its weight with {', '.join(o)}" for m, o in sorted(tied.items()))
        problems.append(
            f"lora.target_modules adapt tied weights ({shared}): base + adapter cannot be merged into "
            "one model (the update would change the tied module too), so a merged export would differ "
            f"from the adapter. Remove {sorted({m.rsplit('.', 1)[-1] for m in tied})} from "
            "lora.target_modules, or adapt a copy of the base model saved with tie_word_embeddings false"
        )
    return problems


def add_lora(model, settings: LoraSettings, activation_checkpointing: bool, trainable_token_indices=None):
    """(PEFT model with a fresh adapter named ``settings.adapter_name``, the adapted module names).
    ``trainable_token_indices``: token ids whose embedding rows are trained too (PEFT's
    ``trainable_token_indices``: the chat template's added special tokens; a tied output head follows).

    Only the adapter trains (PEFT freezes the rest). ``fan_in_fan_out`` is set for transformers Conv1D
    targets (:func:`fan_in_fan_out`; PEFT would otherwise warn and set it itself). With activation
    checkpointing the embedding's output is made to require grad: with the embedding frozen,
    checkpointed blocks would otherwise get inputs that do not require grad, and no gradient would
    reach the adapters."""
    from peft import LoraConfig, get_peft_model

    targets = settings.target_modules or lora_target_modules(model)
    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.lora_alpha,
        lora_dropout=settings.lora_dropout,
        target_modules=targets,
        fan_in_fan_out=fan_in_fan_out(model, targets),
        task_type="CAUSAL_LM",
        bias="none",
        trainable_token_indices=list(trainable_token_indices) if trainable_token_indices else None,
    )
    if activation_checkpointing:
        model.enable_input_require_grads()
    return get_peft_model(model, config, adapter_name=settings.adapter_name), targets
