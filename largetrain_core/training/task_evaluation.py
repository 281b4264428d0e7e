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
    "token_f1"}], "answers": {"items", "exact_match", "token_f1"}, "lm_eval": ...}``: each generation scored
    against its reference by SQuAD's exact match and token F1 (largetrain_core.harness.answer_scores),
    ``answers`` their means over the generations (None without one); ``lm_eval``, every test conversation's
    last answer scored the same way through lm-evaluation-harness (:func:`chat_answers_benchmark`)."""
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
    result["lm_eval"] = chat_answers_benchmark(
        base_model, adapter, examples, tok, records, out / "benchmark", max_new_tokens
    )
    (out / "evaluation.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return result


CHAT_TASK = "chat_answers"


def chat_answers_benchmark(
    base_model: Path, adapter: Path, examples: Path, tok, records: dict, out: Path, max_new_tokens: int
) -> dict | None:
    """The test conversations (``records``: records.json's test split) as an lm-evaluation-harness generative
    task (largetrain_core.harness.build_chat_task, named :data:`CHAT_TASK`: each conversation's last
    assistant answer generated greedily from the messages before it, rendered through the adapter
    tokenizer's chat template, until the template's end of turn, largetrain_core.chat.end_of_turn, or
    ``max_new_tokens``, at most half the base's ``max_position_embeddings``: the harness keeps the prompt's
    last positions less the tokens to generate), run by the harness into ``out`` (``tasks/``, ``samples.jsonl``) on base + adapter
    merged: the training's ``merged/`` beside ``adapter`` when it was exported, else merged here into a
    temporary directory (largetrain_core.training.tasks.export_chat_merged, checked against the unmerged
    logits on ``examples``' probe rows). Merged, because the harness ties the weights of a PEFT model, which
    the template's trainable token rows do not allow. Returns ``{"task", "items", "exact_match",
    "token_f1", "lm_eval_version"}``: the means over the items with their standard errors (``{"value",
    "stderr"}``); None when no test conversation has an answer to score."""
    import tempfile

    from transformers import AutoConfig

    from largetrain_core.chat import end_of_turn
    from largetrain_core.harness import build_chat_task, chat_yaml, evaluate
    from largetrain_core.training.tasks import export_chat_merged, probe

    def prompt(messages: list[dict]) -> str:
        plain = [{"role": m["role"], "content": m["content"]} for m in messages]
        return tok.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)

    stops = end_of_turn(tok)
    positions = AutoConfig.from_pretrained(str(base_model), local_files_only=True).max_position_embeddings
    max_gen_toks = max(1, min(max_new_tokens, positions // 2))
    try:
        task = build_chat_task(
            zip(records["doc_id"], records["messages"]),
            out / "tasks",
            CHAT_TASK,
            prompt,
            stops,
            max_gen_toks=max_gen_toks,
        )
    except ValueError:
        return None
    with tempfile.TemporaryDirectory(prefix="chat-merged-") as tmp:
        merged = Path(adapter).parent / "merged"
        if not (merged / "config.json").is_file():
            merged = Path(tmp) / "merged"
            export_chat_merged(Path(base_model), Path(adapter), merged, probe(examples))
        res = evaluate(merged, out / "tasks", [CHAT_TASK], samples_file=out / "samples.jsonl")
    # the kept task names its data by its place beside the YAML, not the build directory's absolute path
    (out / "tasks" / f"{CHAT_TASK}.yaml").write_text(
        chat_yaml(CHAT_TASK, Path(f"{CHAT_TASK}.jsonl"), stops, max_gen_toks)
    )
    metrics = res["tasks"][CHAT_TASK]["metrics"]
    return {
        "task": CHAT_TASK,
        "items": task["items"],
        "exact_match": metrics["exact_match"],
        "token_f1": metrics["token_f1"],
        "lm_eval_version": res["lm_eval_version"],
    }
