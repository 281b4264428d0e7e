"""Causal language models: named presets built from a transformers config, or an existing
Hugging Face directory loaded from local disk (never from a hub).

Presets are Llama-style decoders (RMSNorm, SwiGLU MLP, rotary positions; transformers
``LlamaConfig``), sized by hidden size / layers / heads. Parameter counts below include the
tied embedding at a vocabulary of 8,192.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from largetrain_core.storage import loading, read_json

if TYPE_CHECKING:  # torch and transformers load where a model is built: this module's presets do not need them
    import torch
    from transformers import LlamaConfig, PreTrainedModel

# name -> (hidden_size, intermediate_size, layers, attention heads)
PRESETS: dict[str, tuple[int, int, int, int]] = {
    "llama-tiny": (64, 172, 2, 2),  # ~0.6M parameters: tests
    "llama-3m": (192, 512, 4, 4),  # ~3.3M: the CPU demo
    "llama-20m": (384, 1024, 8, 6),  # ~17M
    "llama-125m": (768, 2048, 12, 12),  # ~110M + embeddings: the GPU check
}


def build_config(
    preset: str, vocab_size: int, max_positions: int, eos_id: int, bos_id: int | None = None
) -> LlamaConfig:
    """A ``LlamaConfig`` for ``preset``. Raises KeyError naming the known presets."""
    from transformers import LlamaConfig

    if preset not in PRESETS:
        raise KeyError(f"unknown model preset {preset!r}; known: {sorted(PRESETS)}")
    hidden, inter, layers, heads = PRESETS[preset]
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        bos_token_id=bos_id,  # None without a BOS token: config.json and the tokenizer agree
        pad_token_id=None,
        use_cache=False,
    )


def build_model(
    preset: str, vocab_size: int, max_positions: int, eos_id: int, bos_id: int | None = None, seed: int = 0
) -> PreTrainedModel:
    """A freshly initialized fp32 causal LM (transformers' own init, under ``torch.manual_seed(seed)``)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(
        build_config(preset, vocab_size, max_positions, eos_id, bos_id), dtype=torch.float32
    )


def check_safetensors(path: Path, what: str = "safetensors weights file") -> list[str]:
    """Open the safetensors file ``path`` (its header only: cheap) and return its tensor names.
    Raises MissingArtifactError / ArtifactError naming the file when it is absent, cut short or garbled
    (safetensors checks that the header's offsets cover the file exactly)."""
    from safetensors import safe_open

    with loading(path, what), safe_open(str(path), framework="pt") as f:
        return list(f.keys())


def _check_weights(directory: Path, stem: str, what: str) -> None:
    """Check the safetensors weights of an HF directory: ``<stem>.safetensors``, or every shard that
    ``<stem>.safetensors.index.json`` lists."""
    index = directory / f"{stem}.safetensors.index.json"
    if index.exists():
        shards = read_json(index, f"safetensors index of the {what}").get("weight_map", {}).values()
        for name in sorted(set(shards)):
            check_safetensors(directory / name, f"safetensors weights shard of the {what}")
    else:
        check_safetensors(directory / f"{stem}.safetensors", f"safetensors weights of the {what}")


def load_model(path: Path) -> PreTrainedModel:
    """Load a local Hugging Face causal-LM directory (config.json + safetensors weights) in fp32.

    Only safetensors weights are accepted (``use_safetensors=True``): no pickle is ever loaded.
    Raises MissingArtifactError (a FileNotFoundError) or ArtifactError (a ValueError) naming the file
    (config.json, the weights) that is missing or damaged, or the directory when transformers refuses it.
    """
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(path)
    what = "Hugging Face causal-LM directory"
    read_json(path / "config.json", f"config.json of a {what}")
    _check_weights(path, "model", what)
    with loading(path, f"{what} (config.json + safetensors weights)"):
        return AutoModelForCausalLM.from_pretrained(
            str(path), dtype=torch.float32, use_safetensors=True, local_files_only=True
        )


def load_encoder(path: Path) -> PreTrainedModel:
    """Load a local Hugging Face encoder directory (:func:`is_encoder`) with ``AutoModel`` in fp32,
    safetensors only; raises as :func:`load_model`."""
    import torch
    from transformers import AutoModel

    path = Path(path)
    what = "Hugging Face encoder directory"
    read_json(path / "config.json", f"config.json of a {what}")
    _check_weights(path, "model", what)
    with loading(path, f"{what} (config.json + safetensors weights)"):
        return AutoModel.from_pretrained(str(path), dtype=torch.float32, use_safetensors=True, local_files_only=True)


def load_adapter(model: PreTrainedModel, adapter_dir: Path, adapter_name: str = "default"):
    """``peft.PeftModel.from_pretrained(model, adapter_dir, adapter_name=...)`` (safetensors weights only),
    after checking adapter_config.json and adapter_model.safetensors: raises MissingArtifactError /
    ArtifactError naming the file that is missing or damaged."""
    from peft import PeftModel

    adapter_dir = Path(adapter_dir)
    what = "PEFT adapter directory"
    read_json(adapter_dir / "adapter_config.json", f"adapter_config.json of a {what}")
    _check_weights(adapter_dir, "adapter_model", what)
    with loading(adapter_dir, f"{what} (adapter_config.json + adapter_model.safetensors)"):
        return PeftModel.from_pretrained(model, str(adapter_dir), adapter_name=adapter_name)


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    """Recompute each decoder block's activations in the backward pass (non-reentrant
    ``torch.utils.checkpoint``): transformers' ``activation_checkpointing_enable``, or where the installed
    transformers predates it (5.17, the GPU image's, has only this), ``gradient_checkpointing_enable``,
    the same switch under its older name."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def parameter_count(model: torch.nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def embedding_overflow(model_dir: Path) -> str | None:
    """None when every id of the Hugging Face directory's own tokenizer (its vocabulary and its added
    tokens) has a row in the model's embedding (config.json ``vocab_size``); else the cause, naming the
    ids (and tokens) without a row, and the two fixes: resize the embedding to the tokenizer with
    transformers' ``resize_token_embeddings`` and save the model again, or use a tokenizer whose ids all
    fit. Raises as :func:`largetrain_core.tokenizer.load_tokenizer_info` and for a missing config.json."""
    from largetrain_core.tokenizer import load_tokenizer_info, read_tokenizer

    model_dir = Path(model_dir)
    info = load_tokenizer_info(model_dir)
    rows = read_json(model_dir / "config.json", "config.json of a Hugging Face causal-LM directory")["vocab_size"]
    if info.vocab_size <= rows:
        return None
    tok = read_tokenizer(info.path)
    beyond = [t for t in (tok.id_to_token(i) for i in range(rows, info.vocab_size)) if t is not None]
    shown = ", ".join(repr(t) for t in beyond[:5]) + (f" and {len(beyond) - 5} more" if len(beyond) > 5 else "")
    return (
        f"{model_dir}: its own tokenizer ({info.path.name}) has ids up to {info.vocab_size - 1}, but the model's "
        f"embedding has only {rows} rows (config.json vocab_size): ids {rows}..{info.vocab_size - 1} ({shown}) have "
        f"no embedding. Resize the embedding to the tokenizer and save the model again (transformers: "
        f"m = AutoModelForCausalLM.from_pretrained(d); m.resize_token_embeddings(len(AutoTokenizer.from_pretrained(d))); "
        f"m.save_pretrained(d), with d = {str(model_dir)!r}), or use a tokenizer whose ids all fit its {rows} rows"
    )


# architectures whose class names a generative head: a config naming only others (BertModel,
# BertForMaskedLM, ...) and not is_decoder is an encoder (:func:`is_encoder`)
GENERATIVE_HEADS = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def is_encoder(model_dir: Path) -> bool:
    """Whether the Hugging Face directory holds an encoder (BERT-style: all-MiniLM-L6-v2), not a causal
    LM: its config.json's ``architectures`` name no class with a generative head
    (:data:`GENERATIVE_HEADS`) and ``is_decoder`` is not set. An encoder serves the classification task
    only (AutoModelForSequenceClassification). Raises as :func:`model_config`."""
    config = model_config(model_dir)
    architectures = getattr(config, "architectures", None) or []
    generative = any(a.endswith(GENERATIVE_HEADS) for a in architectures)
    return bool(architectures) and not generative and not getattr(config, "is_decoder", False)


def import_pretrained(src: Path, out: Path) -> dict:
    """Import an existing causal LM, or an encoder (:func:`is_encoder`), from the local Hugging Face
    directory ``src`` into ``out``. An encoder is loaded with ``AutoModel`` (its pooler kept, no LM
    head added) and its tokenizer saved with its own special tokens (``AutoTokenizer``: pad, CLS, SEP;
    SEP is its EOS, largetrain_core.tokenizer.load_tokenizer_info); ``model_type`` says which it is.

    ``src`` needs config.json, safetensors weights and a tokenizer (tokenizer.json, optionally
    tokenizer_config.json naming eos/bos). The model is loaded in fp32 (safetensors only, no hub) and
    written to ``out`` (which must not exist; the caller builds it atomically) as config.json +
    model.safetensors + the tokenizer, so that it loads like a pretrained ``base_checkpoint``.
    Returns ``{"parameters", "model_vocab_size", "tokenizer_vocab_size", "eos_id", "bos_id", "model_type"}``.
    Raises FileNotFoundError without a tokenizer.json, ValueError when a token id of the tokenizer
    does not fit the model's embedding (:func:`embedding_overflow`, which says how to fix it).
    """
    from largetrain_core.tokenizer import load_tokenizer_info, save_hf_tokenizer

    src, out = Path(src), Path(out)
    info = load_tokenizer_info(src)
    encoder = is_encoder(src)
    model = load_encoder(src) if encoder else load_model(src)
    problem = embedding_overflow(src)
    if problem:
        raise ValueError(problem)
    model.config.use_cache = True
    model.save_pretrained(str(out), safe_serialization=True)
    if encoder:
        from transformers import AutoTokenizer

        from largetrain_core.tokenizer import save_tokenizer

        save_tokenizer(AutoTokenizer.from_pretrained(str(src), local_files_only=True), out)
    else:
        save_hf_tokenizer(info, out)
    return {
        "parameters": parameter_count(model),
        "model_vocab_size": model.config.vocab_size,
        "tokenizer_vocab_size": info.vocab_size,
        "eos_id": info.eos_id,
        "bos_id": info.bos_id,
        "model_type": model.config.model_type,
    }


def tokenizer_mismatch(model_dir: Path, shards_manifest: dict, shards_tokenizer: Path) -> str | None:
    """None when the token shards were made with the tokenizer of the HF directory ``model_dir``,
    else a message saying what differs (same vocabulary with added tokens, same EOS id, and every
    shard id below the model's embedding size). ``shards_tokenizer``: the tokenizer.json the shards
    were built with (its directory)."""
    from largetrain_core.tokenizer import load_tokenizer_info, read_tokenizer

    mine, theirs = load_tokenizer_info(model_dir), load_tokenizer_info(shards_tokenizer)
    if read_tokenizer(mine.path).get_vocab(True) != read_tokenizer(theirs.path).get_vocab(True):
        return f"the shards' tokenizer ({theirs.path}) has another vocabulary than the model's ({mine.path})"
    if shards_manifest["eos_id"] != mine.eos_id:
        return f"the shards end documents with id {shards_manifest['eos_id']}, the model's EOS is {mine.eos_id}"
    vocab = read_json(Path(model_dir) / "config.json", "config.json of a Hugging Face causal-LM directory")[
        "vocab_size"
    ]
    if shards_manifest["vocab_size"] > vocab:
        return f"shard ids reach {shards_manifest['vocab_size'] - 1}, the model's embedding has {vocab} rows"
    return None


def model_config(model_dir: Path):
    """The transformers config of the Hugging Face directory ``model_dir`` (its config.json, local only).
    Raises MissingArtifactError / ArtifactError naming config.json when it is missing or not a model config."""
    from transformers import AutoConfig

    path = Path(model_dir) / "config.json"
    with loading(path, "config.json of a Hugging Face causal-LM directory"):
        return AutoConfig.from_pretrained(str(model_dir), local_files_only=True)


def max_positions(model_dir: Path) -> int | None:
    """``max_position_embeddings`` of the Hugging Face directory's config.json (None when the model has no
    such limit): the longest sequence, in tokens, the model takes."""
    return getattr(model_config(model_dir), "max_position_embeddings", None)
