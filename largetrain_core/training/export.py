"""The trained result as files the ecosystem loads: ``model/`` (a Hugging Face directory, pretraining),
``adapter/`` (a PEFT directory, LoRA) and ``merged/`` (base + adapter folded in, a Hugging Face
directory). Each is written to a temporary sibling and renamed into place. Weights are safetensors.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from largetrain_core.training.config import TrainConfig


def export(engine, cfg: TrainConfig, out: Path, rank: int, dist) -> Path:
    """Write ``model/`` (pretrain) or ``adapter/`` (lora; plus ``merged/`` with ``lora.merge_export``)
    under ``out``; every rank calls it. Returns the directory written.

    Under ZeRO-3 the weights are consolidated on rank 0 by DeepSpeed, one layer at a time
    (``_zero3_consolidated_16bit_state_dict``: every rank takes part; it keeps the training dtype,
    fp32 in fp32 runs). A non-default adapter name is saved at the top of ``adapter/`` (PEFT would
    nest it in ``adapter/<name>/``) and recorded in ``adapter_name.txt``; load it with
    ``PeftModel.from_pretrained(model, dir, adapter_name=name)``.
    """
    final = out / ("model" if cfg.mode == "pretrain" else "adapter")
    tmp = out / f".tmp-{final.name}"
    state = engine._zero3_consolidated_16bit_state_dict() if cfg.zero_stage == 3 else None
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        if cfg.mode == "pretrain":
            _save_model(engine.module, cfg, state, tmp)
        else:
            _save_adapter(engine.module, cfg.lora.adapter_name, state, tmp)
        _replace_dir(tmp, final)
        if cfg.mode == "lora" and cfg.lora.merge_export:
            export_merged(Path(cfg.base_model), final, cfg.lora.adapter_name, out / "merged")
    dist.barrier()
    return final


def _save_model(module, cfg: TrainConfig, state: dict | None, tmp: Path) -> None:
    from largetrain_core.tokenizer import load_tokenizer_info, save_hf_tokenizer

    module.config.use_cache = True
    module.save_pretrained(str(tmp), state_dict=state, safe_serialization=True)
    save_hf_tokenizer(load_tokenizer_info(Path(cfg.tokenizer or cfg.train_shards)), tmp)


def _save_adapter(module, name: str, state: dict | None, tmp: Path) -> None:
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


def export_merged(base_dir: Path, adapter_dir: Path, adapter_name: str, final: Path) -> None:
    """``final``: base + adapter folded into the base weights (W + (lora_alpha / r) B A, peft
    ``merge_and_unload``), a HF directory with the base's tokenizer. Built from the exported files on
    CPU in fp32, so that it also proves the exported adapter loads, the same under every ZeRO stage."""
    from peft import PeftModel

    from largetrain_core.model import load_model
    from largetrain_core.tokenizer import load_tokenizer_info, save_hf_tokenizer

    merged = PeftModel.from_pretrained(load_model(base_dir), str(adapter_dir), adapter_name=adapter_name).merge_and_unload()
    merged.config.use_cache = True
    tmp = final.with_name(f".tmp-{final.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(str(tmp), safe_serialization=True)
    if (base_dir / "tokenizer.json").exists():
        save_hf_tokenizer(load_tokenizer_info(base_dir), tmp)
    _replace_dir(tmp, final)


def _replace_dir(tmp: Path, final: Path) -> None:
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
