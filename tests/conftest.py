"""Shared fixtures for the core tests: the input cases in tests/cases and small real tokenizers."""

import itertools
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

CASES = Path(__file__).resolve().parent / "cases"


@pytest.fixture
def cases() -> Path:
    """Inputs that broke pipelines like ours (tests/cases; README.md there gives each one's right result)."""
    return CASES


@pytest.fixture
def make_word_tokenizer():
    """Factory: a WordLevel tokenizer (whitespace split) with ``vocab`` (list: ids 0.. in order, or dict),
    then ``specials`` added as special tokens; saved to ``out_dir/tokenizer.json`` with an optional
    tokenizer_config.json. Returns the directory."""

    def make(out_dir: Path, vocab, specials=("<|endoftext|>",), config: dict | None = None) -> Path:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        ids = vocab if isinstance(vocab, dict) else {w: i for i, w in enumerate(vocab)}
        tok = Tokenizer(models.WordLevel(ids, unk_token="<unk-not-in-vocab>"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        if specials:
            tok.add_special_tokens(list(specials))
        tok.save(str(out_dir / "tokenizer.json"))
        if config is not None:
            (out_dir / "tokenizer_config.json").write_text(json.dumps(config))
        return out_dir

    return make


def english_sentences(n: int = 300) -> list[str]:
    """``n`` short, distinct, deterministic English sentences."""
    subjects = ["The cat", "A dog", "My sister", "The old man", "Our teacher", "The farmer"]
    verbs = ["walks to", "looks at", "talks about", "runs past", "waits for"]
    objects = ["the river", "a small house", "the green field", "the market", "an empty road",
               "the station", "the morning train", "a quiet garden", "the red barn", "the village"]
    out = [f"{s} {v} {o}." for s, v, o in itertools.product(subjects, verbs, objects)]
    assert len(out) >= n
    return out[:n]


@pytest.fixture(scope="session")
def bpe_dir(tmp_path_factory) -> Path:
    """A byte-level BPE of 300 ids trained once per session by largetrain_core.tokenizer.train_bpe."""
    from largetrain_core.tokenizer import train_bpe

    out = tmp_path_factory.mktemp("bpe")
    sents = english_sentences(300)
    train_bpe([sents[i:i + 50] for i in range(0, len(sents), 50)], 300, out)
    return out


@pytest.fixture
def sentences() -> list[str]:
    return english_sentences(300)
