"""Corpora for the tests: the real ones (`make corpora`) and the tiny run config of the whole lineage on
them; inputs built in code (deterministic English sentences, a labelled JSONL corpus, JSONL records);
a corpus read back whole as the readers read it."""

import itertools
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from helpers import REPO
from largetrain_core.corpus import DOC_SCHEMA, REJECT_SCHEMA, read_corpus
from largetrain_core.readers import ReaderConfig

CORPORA = Path(os.environ.get("LARGETRAIN_ROOT", REPO / ".largetrain")) / "corpora"


def corpus(name: str) -> Path:
    path = CORPORA / name
    if not path.is_dir():
        pytest.fail(f"real corpus missing at {path}: run `make corpora` (make test does)")
    return path


# The tests' trainings are genuine short runs (a few steps): their loss falls, but not always by the margins
# that a real training must pass (largetrain_core.training.config.HealthSettings;
# tests/integration/test_training_health.py runs the defaults and this override).
SHORT_RUN = {"health": {"min_loss_decrease": 0.0, "min_nats_below_uniform": 0.0}}


def tiny_run_config(corpora_root: Path) -> dict:
    """A few kernel docs (at most 10 per data partition) and a few plays (at most 1 per partition),
    vocab 512, seq_len 64, llama-tiny, a few steps (SHORT_RUN)."""
    train = {
        "model": {"preset": "llama-tiny"},
        "schedule": {"max_steps": 12, "warmup_steps": 2, "micro_batch_size": 4},
        "optimizer": {"learning_rate": 5e-3},
        "checkpointing": {"save_steps": 6},
        "tracking": {"logging_steps": 6},
        "parallelism": {"zero_stage": 2},
        **SHORT_RUN,
    }
    lora = {
        "schedule": {"max_steps": 6, "warmup_steps": 1, "micro_batch_size": 4},
        "optimizer": {"learning_rate": 1e-2},
        "checkpointing": {"save_steps": 3},
        "tracking": {"logging_steps": 3},
        "lora": {"r": 4, "lora_alpha": 8.0},
        **SHORT_RUN,
    }
    return {
        "ops": {
            "pretrain__raw_corpus": {
                "config": {"path": str(corpora_root / "linux-doc" / "admin-guide"), "max_documents": 10}
            },
            "domain__raw_corpus": {
                "config": {"path": str(corpora_root / "shakespeare" / "comedies"), "max_documents": 1}
            },
            "tokenizer": {"config": {"vocab_size": 512}},
            "pretrain__token_shards": {"config": {"seq_len": 64, "validation_fraction": 0.1}},
            "domain__token_shards": {"config": {"seq_len": 64, "validation_fraction": 0.1}},
            "base_checkpoint": {"config": train},
            "lora_adapter": {"config": lora},
            "evaluation": {"config": {"max_sequences": 8}},
        }
    }


# What pretrain/token_shards is made from: its text is pretrain/filtered_text, whose relevance classifier
# trains on the domain text against the pretraining text, and whose decontamination reads evaluation_sets.
PRETRAIN_SHARDS_KEYS = [
    "pretrain/raw_corpus",
    "pretrain/cleaned_text",
    "pretrain/deduplicated_text",
    "domain/raw_corpus",
    "domain/cleaned_text",
    "domain/deduplicated_text",
    "relevance_classifier",
    "evaluation_sets",
    "pretrain/filtered_text",
    "tokenizer",
    "pretrain/token_shards",
]


def pretrain_shards_ops(corpora_root: Path) -> dict:
    """The ops of :func:`tiny_run_config` for the steps of :data:`PRETRAIN_SHARDS_KEYS`."""
    keys = {k.replace("/", "__") for k in PRETRAIN_SHARDS_KEYS}
    return {k: v for k, v in tiny_run_config(corpora_root)["ops"].items() if k in keys}


TINY_SLICE = ("linux-doc/admin-guide", "shakespeare/comedies")  # what tiny_run_config reads of each corpus


def copy_tiny_slice(dest: Path, keep_times: bool) -> Path:
    """The corpus directories :func:`tiny_run_config` reads, copied under ``dest`` (with their file times,
    or not: the data versions must not care); returns ``dest``, to pass to tiny_run_config."""
    copy = shutil.copy2 if keep_times else shutil.copy
    for sub in TINY_SLICE:
        shutil.copytree(CORPORA / sub, dest / sub, copy_function=copy)
    return dest


def english_sentences(n: int = 300) -> list[str]:
    """``n`` short, distinct, deterministic English sentences."""
    subjects = ["The cat", "A dog", "My sister", "The old man", "Our teacher", "The farmer"]
    verbs = ["walks to", "looks at", "talks about", "runs past", "waits for"]
    objects = [
        "the river",
        "a small house",
        "the green field",
        "the market",
        "an empty road",
        "the station",
        "the morning train",
        "a quiet garden",
        "the red barn",
        "the village",
    ]
    out = [f"{s} {v} {o}." for s, v, o in itertools.product(subjects, verbs, objects)]
    assert len(out) >= n
    return out[:n]


CLASSES = {"billing": 12, "shipping": 6, "returns": 3}  # prose documents per class


def labelled_corpus(path: Path) -> Path:
    """Prose documents (ten distinct sentences each, one per line: they pass every rule group) in
    three unbalanced classes, plus per class a short record (fails the Gopher word count), the last
    billing document again with doubled spaces (an exact duplicate under the dedup key) and the first
    billing document with one word changed (a near duplicate)."""
    sents = english_sentences(300)
    order = [sents[(i * 37) % 300] for i in range(300)]  # a stride through the sentences: subjects and verbs vary
    recs, k = [], 0
    for label, n in CLASSES.items():
        for _ in range(n):
            recs.append(
                {"id": f"{label}-{len(recs)}", "text": "\n".join(order[k * 10 : (k + 1) * 10]), "category": label}
            )
            k += 1
        recs.append({"id": f"{label}-short", "text": f"Where is my {label} answer?", "category": label})
    first = recs[0]["text"]
    recs.append(
        {"id": "billing-exact", "text": recs[CLASSES["billing"] - 1]["text"].replace(" ", "  "), "category": "billing"}
    )
    recs.append({"id": "billing-near", "text": first.replace(first.split()[3], "lake", 1), "category": "billing"})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def write_jsonl(path: Path, records: list) -> Path:
    """``records`` (dicts, or strings written as they are) one per line into ``path``."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def read_all(path, **kw) -> tuple[pa.Table, pa.Table]:
    """(documents, rejected records) of the corpus at ``path``, as raw_corpus's readers return them."""
    batches = list(read_corpus(ReaderConfig(str(path), **kw)))
    docs = pa.concat_tables([b.documents for b in batches]) if batches else DOC_SCHEMA.empty_table()
    rej = pa.concat_tables([b.rejected for b in batches]) if batches else REJECT_SCHEMA.empty_table()
    return docs, rej
