"""Inputs of the fine-tuning tests (issue 40): a small separable labelled set, short conversations, and a
tiny Llama base saved with the session's BPE as a Hugging Face directory."""

from pathlib import Path

import numpy as np

WORDS = {
    "billing": "invoice refund charged payment card price amount receipt".split(),
    "shipping": "parcel courier delivery box tracking arrived package address".split(),
    "account": "password login email username reset profile locked signin".split(),
}
MAX_LENGTH = 64  # the base's max_positions: no text of the set is truncated (the pipeline truncates none)


def separable_set(seed: int = 0) -> tuple[list[str], np.ndarray]:
    """120 texts of 3 to 6 words of one class's vocabulary each: 60 billing, 36 shipping, 24 account."""
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for c, (name, n) in enumerate(zip(WORDS, (60, 36, 24))):
        for _ in range(n):
            texts.append(" ".join(rng.choice(WORDS[name], size=int(rng.integers(3, 7)))))
            labels.append(c)
    return texts, np.array(labels, dtype=np.int64)


def conversations(n: int, seed: int = 0) -> list[list[dict]]:
    """``n`` short support conversations: a user asks about a topic of :data:`WORDS`, the assistant answers
    with that topic's name and two of its words (learnable), some with a system prompt or a second turn
    whose first answer has weight 0."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        topic = list(WORDS)[i % 3]
        words = rng.choice(WORDS[topic], size=3)
        messages = [{"role": "system", "content": "be brief"}] if i % 4 == 0 else []
        messages += [
            {"role": "user", "content": f"my {words[0]} question"},
            {"role": "assistant", "content": f"{topic}: {words[1]} {words[2]}"},
        ]
        if i % 5 == 0:
            messages[-1]["weight"] = 0
            messages += [{"role": "user", "content": "and then"}, {"role": "assistant", "content": f"{topic} done"}]
        out.append(messages)
    return out


def tiny_base(bpe_dir: Path, out: Path) -> Path:
    """A llama-tiny base (max positions :data:`MAX_LENGTH`, seed 3) saved with the BPE's tokenizer into ``out``."""
    from largetrain_core.model import build_model
    from largetrain_core.tokenizer import load_tokenizer_info, save_hf_tokenizer

    info = load_tokenizer_info(bpe_dir)
    build_model("llama-tiny", info.vocab_size, MAX_LENGTH, info.eos_id, seed=3).save_pretrained(out)
    save_hf_tokenizer(info, out)
    return out


def benchmark_module():
    """benchmarks/finetune.py loaded as a module (it is a script, not a package module)."""
    import importlib.util

    from helpers import REPO

    spec = importlib.util.spec_from_file_location("finetune_benchmark", REPO / "benchmarks" / "finetune.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
