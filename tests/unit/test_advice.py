"""Every training error that gives advice, with the advice followed: the refused config or input,
changed as its message says, is accepted (issue 23 item 7). The checks made before anything is
launched (largetrain_core.training.preflight: the config, then its inputs) on tiny shards and base models built from
their config alone; the import and the assets' refusals through Dagster: tests/integration/test_advice_dagster.py."""

import json
from pathlib import Path

import polars as pl
import pytest

from helpers.corpora import english_sentences
from largetrain_core.model import PRESETS, build_model, embedding_overflow, import_pretrained
from largetrain_core.shards import build_token_shards
from largetrain_core.training import preflight
from largetrain_core.training.config import PRECISIONS, ZERO_STAGES, TrainConfig
from largetrain_core.training.trackers import TRACKERS


def refused(cfg: dict, advice: str, inputs: bool = False) -> None:
    """``cfg`` (the settings by their own names, TrainConfig.from_settings) is refused with a message
    containing ``advice``."""
    config = TrainConfig.from_settings(**{"output_dir": "o", "train_shards": "s", **cfg})
    with pytest.raises(ValueError) as e:
        preflight.check(config, cuda=False) if inputs else preflight.check_config(config, cuda=False)
    assert advice in str(e.value), str(e.value)


def accepted(cfg: dict, inputs: bool = False) -> None:
    config = TrainConfig.from_settings(**{"output_dir": "o", "train_shards": "s", **cfg})
    preflight.check(config, cuda=False) if inputs else preflight.check_config(config, cuda=False)


def test_config_advice_followed_is_accepted():
    # "use 'auto' or 'fp32'"
    refused(
        {"precision": "fp16"},
        "precision fp16 needs CUDA: DeepSpeed's CPU accelerator does not support fp16; use 'auto' or 'fp32'",
    )
    accepted({"precision": "auto"}), accepted({"precision": "fp32"})
    # "needs zero_stage 1, 2 or 3"
    refused({"offload_optimizer": True, "zero_stage": 0}, "offload_optimizer needs zero_stage 1, 2 or 3")
    for stage in (1, 2, 3):
        accepted({"offload_optimizer": True, "zero_stage": stage})
    # "needs model.base_model"
    refused({"mode": "lora"}, "mode 'lora' needs model.base_model")
    accepted({"mode": "lora", "base_model": "b"})
    # "set warmup_steps to at most 20 (e.g. 2, ...) or raise max_steps"
    refused(
        {"max_steps": 20, "warmup_steps": 50},
        "set warmup_steps to at most 20 (e.g. 2, a tenth of max_steps) or raise max_steps",
    )
    accepted({"max_steps": 20, "warmup_steps": 20}), accepted({"max_steps": 20, "warmup_steps": 2})
    accepted({"max_steps": 50, "warmup_steps": 50})
    # "set it to false for pretraining"
    refused({"lora": {"merge_export": True}}, "lora.merge_export applies to mode 'lora' only; set it to false")
    accepted({"lora": {"merge_export": False}})


def test_listed_choices_are_accepted():
    """A refusal that lists the valid choices: each of them is accepted (fp16 only with CUDA)."""
    refused({"preset": "llama-7b"}, f"preset must be one of {', '.join(PRESETS)}")
    for preset in PRESETS:
        accepted({"preset": preset})
    refused({"precision": "fp8"}, f"precision must be one of {', '.join(PRECISIONS)}")
    for precision in PRECISIONS:
        TrainConfig.from_settings(output_dir="o", train_shards="s", precision=precision).validate(cuda=True)
    refused({"zero_stage": 4}, f"zero_stage must be one of {', '.join(map(str, ZERO_STAGES))}")
    for stage in ZERO_STAGES:
        accepted({"zero_stage": stage})
    refused({"report_to": ["tensorboard"]}, f"report_to must list distinct trackers among {sorted(TRACKERS)}")
    accepted({"report_to": sorted(TRACKERS)})


# ------------------------------------------------------------------------------------------------
# what does not fit the inputs (preflight.input_problems): tiny shards, base models from their config.json


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("advice_docs")
    texts = [" ".join(english_sentences(300)[i : i + 30]) for i in range(0, 300, 10)]
    pl.DataFrame(
        {"doc_id": [f"d{i}" for i in range(len(texts))], "source": ["t"] * len(texts), "text": texts}
    ).write_parquet(out / "part-00000.parquet")
    return out


def shards(docs: Path, tokenizer: Path, out: Path, seq_len: int = 32, validation_fraction: float = 0.1) -> Path:
    out.mkdir()
    build_token_shards(docs, tokenizer, out, seq_len=seq_len, validation_fraction=validation_fraction)
    return out


def base(directory: Path, vocab: int, positions: int = 64, tied: bool = True) -> Path:
    """A llama-tiny base model's config.json (all that preflight reads: it builds the model on the meta device)."""
    config = build_model("llama-tiny", vocab, positions, eos_id=0).config
    config.tie_word_embeddings = tied
    config.save_pretrained(directory)
    return directory


def lora(train_shards: Path, base_model: Path, **settings) -> dict:
    return {"mode": "lora", "train_shards": str(train_shards), "base_model": str(base_model), **settings}


def test_an_encoder_base_is_refused_for_a_language_model_adapter(docs, bpe_dir, tmp_path):
    """A base_checkpoint imported from an encoder (all-MiniLM-L6-v2's kind: BertModel, no language-model head) serves
    classification only: a causal_lm (or chat) adapter on it is refused before launch, naming the way out; a
    causal LM base, as the message says, is accepted."""
    from transformers import BertConfig

    s32 = shards(docs, bpe_dir, tmp_path / "s32")
    vocab = json.loads((s32 / "manifest.json").read_text())["vocab_size"]
    encoder = tmp_path / "encoder"
    BertConfig(
        vocab_size=vocab,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        architectures=["BertModel"],
    ).save_pretrained(encoder)
    refused(
        lora(s32, encoder),
        "is an encoder (BertModel: no language-model head), which serves task classification only, not causal_lm: "
        "import or train a causal LM as base_checkpoint",
        inputs=True,
    )
    accepted(lora(s32, base(tmp_path / "causal", vocab)), inputs=True)


def test_input_advice_followed_is_accepted(docs, bpe_dir, make_word_tokenizer, tmp_path):
    s32 = shards(docs, bpe_dir, tmp_path / "s32")
    vocab = json.loads((s32 / "manifest.json").read_text())["vocab_size"]
    # "re-materialize the token shards with seq_len <= 16, or use a base model with longer positions"
    short = base(tmp_path / "short", vocab, positions=16)
    refused(
        lora(s32, short),
        "re-materialize the token shards with seq_len <= 16, or use a base model with longer positions",
        inputs=True,
    )
    accepted(lora(shards(docs, bpe_dir, tmp_path / "s16", seq_len=16), short), inputs=True)
    accepted(lora(s32, base(tmp_path / "long", vocab, positions=64)), inputs=True)
    # "tokenize with the base model's tokenizer": a base whose embedding is smaller, with its own tokenizer
    words = sorted({w for t in english_sentences(300) for w in t.split()})
    small = base(make_word_tokenizer(tmp_path / "small", words), len(words) + 1)
    refused(
        lora(s32, small),
        f"token ids up to {vocab - 1} do not fit the base model's vocabulary of {len(words) + 1}: "
        "tokenize with the base model's tokenizer",
        inputs=True,
    )
    accepted(lora(shards(docs, small, tmp_path / "s_small"), small), inputs=True)
    # tied weights: "Remove ['lm_head'] from lora.target_modules, or adapt a copy of the base model saved with
    # tie_word_embeddings false"
    tied = base(tmp_path / "tied", vocab)
    refused(
        lora(s32, tied, lora={"target_modules": ["q_proj", "lm_head"]}),
        "Remove ['lm_head'] from lora.target_modules, or adapt a copy of the base model saved with "
        "tie_word_embeddings false",
        inputs=True,
    )
    accepted(lora(s32, tied, lora={"target_modules": ["q_proj"]}), inputs=True)
    accepted(
        lora(s32, base(tmp_path / "untied", vocab, tied=False), lora={"target_modules": ["q_proj", "lm_head"]}),
        inputs=True,
    )
    # a target that matches nothing: "its adaptable linear layers are [...]", one of them accepted
    refused(
        lora(s32, tied, lora={"target_modules": ["qproj"]}),
        "its adaptable linear layers are ['down_proj', 'gate_proj', 'k_proj', 'o_proj', 'q_proj', 'up_proj', 'v_proj']",
        inputs=True,
    )
    accepted(lora(s32, tied, lora={"target_modules": ["o_proj"]}), inputs=True)
    # "make the shards with validation_fraction > 0 or set eval_strategy 'no'", before anything is launched
    s0 = shards(docs, bpe_dir, tmp_path / "s0", validation_fraction=0.0)
    refused(
        {"train_shards": str(s0)},
        "the validation split holds no sequence, so there is nothing to evaluate on; "
        "make the shards with validation_fraction > 0 or set eval_strategy 'no'",
        inputs=True,
    )
    accepted({"train_shards": str(s0), "eval_strategy": "no"}, inputs=True)
    accepted({"train_shards": str(s32)}, inputs=True)


def test_tokenizer_beyond_the_embedding_is_refused_with_the_fix_that_works(tmp_path):
    """A model directory whose own tokenizer has added tokens beyond its embedding (tests/cases README:
    issue 23 item 7): import_pretrained refuses it naming the cause, the ids and tokens without a row, and
    the fix; resized with transformers' resize_token_embeddings as the message shows, it imports."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from helpers.training import someones_tokenizer

    src = tmp_path / "model"
    src.mkdir()
    bos, eos = someones_tokenizer(src)  # 300 ids
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    tok.add_tokens(["<tool>", "</tool>"])
    tok.save(str(src / "tokenizer.json"))
    build_model("llama-tiny", 300, 64, eos_id=eos, bos_id=bos, seed=3).save_pretrained(src)
    problem = embedding_overflow(src)
    assert problem == (
        f"{src}: its own tokenizer (tokenizer.json) has ids up to 301, but the model's embedding has only 300 rows "
        "(config.json vocab_size): ids 300..301 ('<tool>', '</tool>') have no embedding. Resize the embedding to the "
        "tokenizer and save the model again (transformers: m = AutoModelForCausalLM.from_pretrained(d); "
        f"m.resize_token_embeddings(len(AutoTokenizer.from_pretrained(d))); m.save_pretrained(d), with d = {str(src)!r}), "
        "or use a tokenizer whose ids all fit its 300 rows"
    )
    with pytest.raises(ValueError) as e:
        import_pretrained(src, tmp_path / "imported")
    assert str(e.value) == problem and not (tmp_path / "imported").exists()
    # the advice, as written
    d = str(src)
    m = AutoModelForCausalLM.from_pretrained(d)
    m.resize_token_embeddings(len(AutoTokenizer.from_pretrained(d)))
    m.save_pretrained(d)
    assert embedding_overflow(src) is None
    info = import_pretrained(src, tmp_path / "imported")
    assert info["model_vocab_size"] == info["tokenizer_vocab_size"] == 302
