"""A fine-tuned adapter evaluated on its task examples' held-out test split, after training, in the
lora_adapter stage: a classifier beside the majority class and TF-IDF + logistic regression, a chat
adapter by its assistant tokens' perplexity and its generations beside the reference answers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from largetrain_core.harness import answer_scores
from largetrain_core.training.tasks import MANIFEST, TaskExamples, counted, load_chat_adapter, task_loss


def evaluate_classifier(base_model: Path, adapter: Path, examples: Path, out: Path, seed: int = 0) -> dict:
    """Evaluate a trained classifier (``adapter``, exported by :func:`export`, on ``base_model``) on the
    test split of ``examples`` (its ``records.json``), beside the baselines trained on the same train
    split: the majority class and TF-IDF + logistic regression (largetrain_core.classification). Writes
    ``out/evaluation.json`` (``{"lora", "majority", "tfidf_logreg"}``: each
    largetrain_core.classification.evaluate_predictions; ``validation_loss_per_class``: nats per class on
    the validation split) and ``out/confusion_matrix.png``; returns the dict."""
    from largetrain_core.classification import (
        confusion_matrix_png,
        evaluate_predictions,
        load_classifier,
        majority_baseline,
        per_class_loss,
        predict_logits,
        tfidf_logreg_baseline,
    )

    manifest = json.loads((examples / MANIFEST).read_text())
    names, seq_len = manifest["label_names"], manifest["seq_len"]
    records = json.loads((examples / "records.json").read_text())
    train, test, val = records["train"], records["test"], records["validation"]
    if not test["label"]:
        raise ValueError(f"{examples}: the test split holds no record: set task_data.test_fraction > 0")
    model, tok = load_classifier(base_model, adapter)
    y = np.array(test["label"], dtype=np.int64)
    result = {
        "lora": evaluate_predictions(y, predict_logits(model, tok, test["text"], seq_len).argmax(1), names),
        "majority": evaluate_predictions(y, majority_baseline(np.array(train["label"]), len(y)), names),
        "tfidf_logreg": evaluate_predictions(
            y, tfidf_logreg_baseline(train["text"], np.array(train["label"]), test["text"], seed=seed), names
        ),
        "label_names": names,
    }
    if val["label"]:
        loss = per_class_loss(predict_logits(model, tok, val["text"], seq_len), np.array(val["label"]))
        result["validation_loss_per_class"] = {
            n: (None if np.isnan(v) else round(float(v), 4)) for n, v in zip(names, loss)
        }
    confusion_matrix_png(
        result["lora"]["confusion"], names, out / "confusion_matrix.png", "Confusion matrix (test split)"
    )
    (out / "evaluation.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def evaluate_chat(
    base_model: Path, adapter: Path, examples: Path, out: Path, generations: int = 5, max_new_tokens: int = 48
) -> dict:
    """Evaluate a chat adapter on the held-out test conversations of ``examples``: the loss (nats) and
    perplexity on their trained assistant tokens only (:func:`task_loss` over the test rows, every
    trained token counted once), and greedy generations through the chat template for the first
    ``generations`` test conversations' last prompt, beside the reference answer. Writes
    ``out/evaluation.json`` and returns it: ``{"assistant_loss", "assistant_perplexity",
    "assistant_tokens", "generations": [{"doc_id", "prompt", "reference", "generated", "exact_match",
    "token_f1"}], "answers": {"items", "exact_match", "token_f1"}}``: each generation scored against its
    reference by SQuAD's exact match and token F1 (largetrain_core.harness.answer_scores), ``answers`` their
    means over the generations (None without one); largetrain_core.harness.build_chat_task is the same
    scoring as an lm-evaluation-harness task."""
    import math

    import torch

    model, tok = load_chat_adapter(base_model, adapter)
    test = TaskExamples(examples, "test")
    nats, n = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(test), 8):
            batch = {k: torch.from_numpy(v) for k, v in test.take(np.arange(start, min(start + 8, len(test)))).items()}
            nats += float(task_loss("chat", model, batch, reduction="sum"))
            n += counted("chat", batch)
    records = json.loads((examples / "records.json").read_text())["test"]
    shown = []
    for doc_id, messages in list(zip(records["doc_id"], records["messages"]))[:generations]:
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        prompt = tok.apply_chat_template(
            messages[:last], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.no_grad():
            ids = model.generate(
                **prompt, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.eos_token_id
            )
        generated = tok.decode(ids[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
        shown.append(
            {
                "doc_id": doc_id,
                "prompt": messages[last - 1]["content"],
                "reference": messages[last]["content"],
                "generated": generated,
                **answer_scores(generated, messages[last]["content"]),
            }
        )
    loss = nats / n if n else float("nan")
    result = {
        "assistant_loss": loss,
        "assistant_perplexity": math.exp(loss) if n and loss < 700 else None,
        "assistant_tokens": n,
        "generations": shown,
        "answers": {
            "items": len(shown),
            **{k: float(np.mean([g[k] for g in shown])) if shown else None for k in ("exact_match", "token_f1")},
        },
    }
    (out / "evaluation.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return result
