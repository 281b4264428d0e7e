"""benchmarks/finetune.py's parts classification (issue 40 (a)) and chat_ppl (issue 40 (c)) at a tiny size:
main() on a tiny Llama base, the fortune sample of tests/data/recipe_corpora and the chat records of
tests/data/chat, 2 steps a LoRA run (5 trainings under torchrun, 1 rank each: classification's also on the
imported encoder all-MiniLM-L6-v2). The JSON's structure only:
never timing, never that one classifier or adapter beats another."""

import json
import math

import pytest

from helpers import TESTS
from helpers.finetune import tiny_base

CLASSIFIERS = ("macro_f1", "accuracy", "per_class_f1", "per_class", "confusion", "n")
RUN = ("steps", "first_loss", "last_loss", "train_seconds", "wall_seconds")


@pytest.fixture(scope="module")
def finetune():
    from helpers.finetune import benchmark_module

    return benchmark_module()


@pytest.fixture(scope="module")
def result(finetune, bpe_dir, tmp_path_factory):
    """main() with both parts into a finetune.json that already holds the packing part."""
    from largetrain_core.recipe_corpora import fortune_records, write_jsonl

    tmp = tmp_path_factory.mktemp("finetune-runs")
    base = tiny_base(bpe_dir, tmp / "base")
    fortunes = tmp / "fortunes.jsonl"
    write_jsonl(fortunes, fortune_records(TESTS / "data" / "recipe_corpora" / "fortunes", ["science", "food"]))
    out = tmp / "finetune.json"
    out.write_text(json.dumps({"packing": {"trained_tokens_per_s_ratio": 0.7}}))
    argv = ["--parts", "classification,chat_ppl", "--out", str(out), "--base", str(base)]
    argv += ["--fortunes", str(fortunes), "--faq", str(TESTS / "data" / "chat" / "messages.jsonl")]
    argv += ["--max-steps", "2", "--micro-batch", "1", "--seq-len", "64"]
    assert finetune.main(argv) == 0
    return json.loads(out.read_text())


def test_both_parts_are_merged_beside_the_packing_part(result):
    assert set(result) == {"packing", "classification", "chat"}
    assert result["packing"] == {"trained_tokens_per_s_ratio": 0.7}
    for key in ("classification", "chat"):
        assert result[key]["command"].startswith("finetune.py --parts classification,chat_ppl")


def test_the_classification_part_has_each_classifier_and_the_label_counts(result):
    c = result["classification"]
    names = ["food", "science"]
    for scores in (c["lora"], c["unbalanced"]["lora"], c["tfidf_logreg"], c["majority"]):
        assert set(CLASSIFIERS) <= set(scores)
        assert 0 <= scores["macro_f1"] <= 1 and 0 <= scores["accuracy"] <= 1
        assert list(scores["per_class_f1"]) == names
    for run in (c["lora"], c["unbalanced"]["lora"], c["minilm"]["lora"]):
        assert set(RUN) <= set(run) and run["steps"] == 2
    # the imported encoder (all-MiniLM-L6-v2, the Makefile's $(VENV)/minilm/.installed) on the balanced split
    assert set(CLASSIFIERS) <= set(c["minilm"]["lora"]) and list(c["minilm"]["lora"]["per_class_f1"]) == names
    assert c["minilm"]["lora"]["parameters"] > 22_000_000 > 1_000_000 > c["lora"]["parameters"]
    assert c["minilm"]["lora"]["train_rows"] == c["lora"]["train_rows"]
    assert c["label_names"] == names
    assert (c["steps"], c["seq_len"], c["learning_rate"]) == (2, 64, 3e-3)
    assert set(c["label_counts"]) == {"train", "train_balanced", "validation", "test"}
    assert sum(c["label_counts"]["test"].values()) == c["majority"]["n"] == 2  # one fortune of each class
    assert c["lora"]["train_rows"] == sum(c["label_counts"]["train_balanced"].values())
    assert c["unbalanced"]["lora"]["train_rows"] == sum(c["label_counts"]["train"].values())
    s = c["settings"]
    assert (s["steps"], s["seq_len"], s["micro_batch"], s["learning_rate"]) == (2, 64, 1, 3e-3)
    assert c["data"]["records"] == 6 and c["seconds"] > 0


def test_the_chat_part_has_both_perplexities_over_the_same_held_out_tokens(result):
    h = result["chat"]
    assert set(h["assistant_ppl"]) == {"masked", "unmasked"}
    assert all(math.isfinite(p) and p > 1 for p in h["assistant_ppl"].values())
    assert h["held_out_assistant_tokens"] > 0
    assert h["examples"] == {"train": 2, "held_out": 1, "rejected": 14}
    assert (h["steps"], h["seq_len"]) == (2, 64)
    runs = h["runs"]
    assert set(RUN) <= set(runs["masked"]) and runs["unmasked"]["steps"] == 2
    # unmasked trains on every token but padding and each example's first: more than the assistant tokens
    assert runs["unmasked"]["train_trained_tokens"] > runs["masked"]["train_trained_tokens"] > 0
    assert h["seconds"] > 0


def test_the_unmasked_split_labels_every_token_of_the_same_rows(finetune, bpe_dir, tmp_path):
    """The rewritten train split keeps write_chat's rows and position ids; its labels are the input ids
    (but padding and each example's first token) where write_chat's are the assistant tokens only."""
    import numpy as np
    from transformers import AutoTokenizer

    from helpers.finetune import conversations
    from largetrain_core.training import tasks

    base = tiny_base(bpe_dir, tmp_path / "base")
    convs = conversations(6)
    for name in ("masked", "unmasked"):
        tasks.write_chat(tmp_path / name, {"train": convs}, AutoTokenizer.from_pretrained(base), 64)
    counts = finetune.unmask_train_split(tmp_path / "unmasked", convs, 64)
    m, u = (tasks.TaskExamples(tmp_path / k, "train").columns for k in ("masked", "unmasked"))
    assert np.array_equal(m["input_ids"], u["input_ids"]) and np.array_equal(m["position_ids"], u["position_ids"])
    trained = m["labels"] != -100
    assert np.array_equal(u["labels"][trained], m["labels"][trained])  # the assistant tokens, labelled alike
    assert (u["labels"] != -100).sum() == counts["trained_tokens"] > trained.sum()
    starts = u["position_ids"] == 0
    assert (u["labels"][starts] == -100).all()  # each example's first token (and the padding's) is no target
