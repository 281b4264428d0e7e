"""Train or load a Hugging Face ``tokenizers`` tokenizer; the EOS/BOS policy.

Policy: every document is encoded without special tokens and followed by the EOS id; when the
tokenizer defines a BOS token (``bos_token`` in a loaded directory's tokenizer_config.json), BOS is
put in front of every document. Text that spells a special token (a page quoting ``<|endoftext|>``)
is encoded as ordinary text, like tiktoken's ``encode_ordinary``, so EOS/BOS ids only ever mark
document boundaries. A trained tokenizer is a byte-level BPE (GPT-2 style: any byte
sequence encodes, no unknown token) with one special token, ``<|endoftext|>``, used as EOS.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS_TOKEN = "<|endoftext|>"


@dataclass(frozen=True)
class TokenizerInfo:
    """What the shards need to know about a tokenizer.

    vocab_size: the full vocabulary including added special tokens: one more than the largest id, so
        ids are < vocab_size even when a tokenizer's ids have gaps.
    sha256: of the tokenizer.json bytes.
    """

    path: Path
    eos_id: int
    bos_id: int | None
    vocab_size: int
    sha256: str

    @property
    def dtype(self) -> np.dtype:
        return storage_dtype(self.vocab_size)


def storage_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id (0..vocab_size-1) fits in 16 bits, else uint32 (docs/ARCHITECTURE.md, Shard format)."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def train_bpe(texts: Iterable[list[str]], vocab_size: int, out_dir: Path, min_frequency: int = 2) -> TokenizerInfo:
    """Train a byte-level BPE of ``vocab_size`` ids (EOS included) on batches of texts.

    Writes ``out_dir/tokenizer.json``. Raises ValueError if vocab_size is below the 256 byte symbols + EOS.
    """
    if vocab_size < 257:
        raise ValueError(f"vocab_size {vocab_size} < 257: a byte-level BPE needs the 256 bytes plus EOS")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_flatten(texts), trainer=trainer)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    return load_tokenizer_info(out_dir)


def _flatten(batches: Iterable[list[str]]) -> Iterator[str]:
    for batch in batches:
        yield from batch


def load_tokenizer_info(path: Path) -> TokenizerInfo:
    """Read tokenizer.json (a file, or a directory holding it and optionally tokenizer_config.json).

    EOS is ``eos_token`` from tokenizer_config.json if present, else ``<|endoftext|>``; BOS is
    ``bos_token`` from tokenizer_config.json if present. Raises FileNotFoundError when there is no
    tokenizer.json and ValueError when the EOS token is not in the vocabulary.
    """
    path = Path(path)
    tj = path / "tokenizer.json" if path.is_dir() else path
    if not tj.exists():
        raise FileNotFoundError(f"no tokenizer.json at {path}")
    tok = Tokenizer.from_file(str(tj))
    eos, bos = EOS_TOKEN, None
    cfg_file = tj.parent / "tokenizer_config.json"
    if cfg_file.exists():
        cfg = json.loads(cfg_file.read_text())
        eos = _token_str(cfg.get("eos_token")) or eos
        bos = _token_str(cfg.get("bos_token"))
    eos_id = tok.token_to_id(eos)
    if eos_id is None:
        raise ValueError(f"{tj}: EOS token {eos!r} is not in the vocabulary")
    bos_id = tok.token_to_id(bos) if bos else None
    if bos and bos_id is None:
        raise ValueError(f"{tj}: BOS token {bos!r} is not in the vocabulary")
    vocab_size = max(tok.get_vocab(with_added_tokens=True).values()) + 1  # not the count: ids may have gaps
    return TokenizerInfo(tj, eos_id, bos_id, vocab_size, hashlib.sha256(tj.read_bytes()).hexdigest())


def _token_str(value) -> str | None:
    if isinstance(value, dict):  # {"content": "</s>", ...} in older tokenizer_config.json files
        return value.get("content")
    return value


def encode_documents(tok: Tokenizer, info: TokenizerInfo, texts: list[str]) -> list[np.ndarray]:
    """Encode a batch of documents in parallel (tokenizers' thread pool) following the EOS/BOS policy.

    Returns one 1-D array per document, dtype ``info.dtype``, ending in ``info.eos_id``.
    """
    ordinary = tok.encode_special_tokens
    tok.encode_special_tokens = True  # special-token text inside a document is plain text (module doc)
    try:
        encodings = tok.encode_batch_fast(texts, add_special_tokens=False)
    finally:
        tok.encode_special_tokens = ordinary
    dtype = info.dtype
    head = [info.bos_id] if info.bos_id is not None else []
    return [np.array(head + e.ids + [info.eos_id], dtype=dtype) for e in encodings]


def save_hf_tokenizer(info: TokenizerInfo, out_dir: Path) -> None:
    """Write the tokenizer as a transformers ``PreTrainedTokenizerFast`` directory (tokenizer.json,
    tokenizer_config.json with eos/bos), loadable with ``AutoTokenizer.from_pretrained``."""
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_file(str(info.path))
    kwargs = {"eos_token": tok.id_to_token(info.eos_id)}
    if info.bos_id is not None:
        kwargs["bos_token"] = tok.id_to_token(info.bos_id)
    PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs).save_pretrained(str(out_dir))


def copy_tokenizer(src: Path, out_dir: Path) -> TokenizerInfo:
    """Take the tokenizer of an existing model instead of training one: copy ``tokenizer.json`` and
    ``tokenizer_config.json`` (when present: it names EOS/BOS) from the local directory ``src`` into
    ``out_dir``. Raises FileNotFoundError / ValueError as :func:`load_tokenizer_info`."""
    src, out_dir = Path(src), Path(out_dir)
    load_tokenizer_info(src)  # validate before copying
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (src / name).exists():
            (out_dir / name).write_bytes((src / name).read_bytes())
    return load_tokenizer_info(out_dir)
