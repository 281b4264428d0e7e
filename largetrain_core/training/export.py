"""The trained result as files the ecosystem loads: ``model/`` (a Hugging Face directory, pretraining),
``adapter/`` (a PEFT directory, LoRA), ``merged/`` (base + adapter folded in, a Hugging Face
directory) and ``gguf/`` (GGUF files for llama.cpp). Each is written to a temporary sibling and
renamed into place. Weights are safetensors.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from largetrain_core.training.config import TrainConfig


def export(engine, cfg: TrainConfig, out: Path, rank: int, dist) -> Path:
    """Write ``model/`` (pretrain) or ``adapter/`` (lora; plus ``merged/`` with ``lora.merge_export``)
    under ``out``, and ``gguf/`` with ``checkpointing.gguf_export`` (:func:`export_gguf_files`); every rank
    calls it. Returns the directory written.

    Under ZeRO-3 the weights are consolidated on rank 0 by DeepSpeed, one layer at a time
    (``_zero3_consolidated_16bit_state_dict``: every rank takes part; it keeps the training dtype,
    fp32 in fp32 runs). A non-default adapter name is saved at the top of ``adapter/`` (PEFT would
    nest it in ``adapter/<name>/``) and recorded in ``adapter_name.txt``; load it with
    ``PeftModel.from_pretrained(model, dir, adapter_name=name)``.
    """
    final = out / ("model" if cfg.mode == "pretrain" else "adapter")
    tmp = out / f".tmp-{final.name}"
    state = engine._zero3_consolidated_16bit_state_dict() if cfg.parallelism.zero_stage == 3 else None
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        if cfg.mode == "pretrain":
            _save_model(engine.module, cfg, state, tmp)
        elif cfg.task != "causal_lm":
            from largetrain_core.training import tasks

            tasks.export(engine.module, cfg, tasks.TaskExamples(cfg.train_shards, "train"), state, tmp)
        else:
            save_adapter(engine.module, cfg.lora.adapter_name, state, tmp)
        _replace_dir(tmp, final)
        if cfg.task == "chat" and cfg.lora.merge_export:
            from largetrain_core.training import tasks

            tasks.export_chat_merged(Path(cfg.model.base_model), final, out / "merged", tasks.probe(cfg.train_shards))
        elif cfg.mode == "lora" and cfg.lora.merge_export:
            export_merged(
                Path(cfg.model.base_model), final, cfg.lora.adapter_name, out / "merged", probe_batch(cfg.train_shards)
            )
        if cfg.checkpointing.gguf_export:
            export_gguf_files(
                final if cfg.mode == "pretrain" else out / "merged", out / "gguf", cfg.checkpointing.gguf_export
            )
    dist.barrier()
    return final


def export_gguf_files(model_dir: Path, gguf_dir: Path, outtypes: list[str]) -> list[Path]:
    """``gguf_dir/model-<type>.gguf`` for each of ``outtypes`` (largetrain_core.gguf_export.export_gguf, each
    written whole or not at all) from the Hugging Face directory ``model_dir``; returns the files. Raises as
    export_gguf does (the converter not installed, or failing)."""
    from largetrain_core.gguf_export import export_gguf

    gguf_dir.mkdir(parents=True, exist_ok=True)
    return [export_gguf(model_dir, gguf_dir / f"model-{t}.gguf", t) for t in outtypes]


def _save_model(module, cfg: TrainConfig, state: dict | None, tmp: Path) -> None:
    from largetrain_core.tokenizer import load_tokenizer_info, save_hf_tokenizer

    module.config.use_cache = True
    module.save_pretrained(str(tmp), state_dict=state, safe_serialization=True)
    save_hf_tokenizer(load_tokenizer_info(Path(cfg.model.tokenizer or cfg.train_shards)), tmp)


def save_adapter(module, name: str, state: dict | None, tmp: Path) -> None:
    if state is not None:
        # PEFT's save_pretrained picks the adapter weights out of a full state dict itself
        module.save_pretrained(str(tmp), state_dict=state, selected_adapters=[name])
    else:
        module.save_pretrained(str(tmp), selected_adapters=[name])
    if name != "default":
        nested = tmp / name
        for f in nested.iterdir():
            os.replace(f, tmp / f.name)
        nested.rmdir()
    (tmp / "adapter_name.txt").write_text(name + "\n")


# The largest relative difference between the merged export's logits and base + adapter's on the probe
# batch: max |merged - unmerged| / max |unmerged|. fp32 merging reorders one matmul's sums, which moves
# logits by about 1e-7 of their size; a wrong merge (a tied weight updated twice) moves them by O(1).
MERGE_TOLERANCE = 1e-5


def probe_batch(shards: str | Path, n: int = 2):
    """The first ``n`` sequences of the shards' validation split (the train split when validation is
    empty), as an int64 tensor of shape (n, seq_len): the inputs on which a merged export is checked."""
    import numpy as np
    import torch

    from largetrain_core.shards import TokenShards

    data = TokenShards(shards, "validation")
    data = data if len(data) else TokenShards(shards, "train")
    rows = data.take(np.arange(min(n, len(data))))[:, :-1]
    return torch.from_numpy(rows.astype(np.int64))


def export_merged(base_dir: Path, adapter_dir: Path, adapter_name: str, final: Path, probe) -> None:
    """``final``: base + adapter folded into the base weights (W + (lora_alpha / r) B A, peft
    ``merge_and_unload``), a HF directory with the base's tokenizer. Built from the exported files on
    CPU in fp32, so that it also proves the exported adapter loads, the same under every ZeRO stage.

    Verified before it is put in place: the written directory, loaded again, must give the logits of
    base + adapter (unmerged) on ``probe`` (int64 token ids, shape (batch, positions)) within
    MERGE_TOLERANCE relative; else nothing is written and ValueError names the difference and its cause
    (the adapted modules whose weight is tied to another's, lora.tied_targets, when there are any)."""
    from peft import PeftConfig, PeftModel

    from largetrain_core.model import load_model
    from largetrain_core.tokenizer import load_tokenizer_info, save_hf_tokenizer
    from largetrain_core.training.lora import tied_targets

    base = load_model(base_dir)
    targets = PeftConfig.from_pretrained(str(adapter_dir)).target_modules
    tied = tied_targets(base, [targets] if isinstance(targets, str) else sorted(targets))
    model = PeftModel.from_pretrained(base, str(adapter_dir), adapter_name=adapter_name).eval()
    tmp = final.with_name(f".tmp-{final.name}")
    diff = merge_into(model, probe, tmp)
    if not diff <= MERGE_TOLERANCE:
        shutil.rmtree(tmp, ignore_errors=True)
        cause = (
            (
                "the adapter changes modules whose weight is tied to another's: "
                + "; ".join(f"{m} with {', '.join(o)}" for m, o in sorted(tied.items()))
            )
            if tied
            else "merge_and_unload does not reproduce this adapter"
        )
        raise ValueError(
            f"merged export of {adapter_dir} on {base_dir} refused: its logits differ from base + adapter "
            f"by {diff:.3g} (max relative) on a probe batch of {probe.shape[0]} x {probe.shape[1]} tokens, "
            f"more than {MERGE_TOLERANCE:g}; {cause}. The adapter itself is exported; load it with PEFT "
            "on the base model instead of merging"
        )
    if (base_dir / "tokenizer.json").exists():
        save_hf_tokenizer(load_tokenizer_info(base_dir), tmp)
    _replace_dir(tmp, final)


def merge_into(model, probe, tmp: Path) -> float:
    """Fold the PEFT ``model``'s adapter into its base (``merge_and_unload``), save the result as a Hugging
    Face directory ``tmp`` (replaced; safetensors, ``use_cache`` on) and load it again: returns the max
    relative difference of its logits from the unmerged model's on ``probe`` (int64 token ids, shape
    (batch, positions)), max |merged - unmerged| / max |unmerged|."""
    import torch

    from largetrain_core.model import load_model

    with torch.no_grad():
        want = model(input_ids=probe).logits
    merged = model.merge_and_unload()
    merged.config.use_cache = True
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(str(tmp), safe_serialization=True)
    with torch.no_grad():
        got = load_model(tmp).eval()(input_ids=probe).logits
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def _replace_dir(tmp: Path, final: Path) -> None:
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
