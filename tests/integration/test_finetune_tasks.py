"""The fine-tuning tasks (issue 40) trained by the real entry point under torchrun with DeepSpeed (2 ranks,
ZeRO-2, fp32): a classifier and a chat adapter on a tiny Llama base, their exports loaded by the clients
(transformers' Auto classes, PEFT, pipelines), and a resume after a crash bitwise equal to the run without."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.finetune import MAX_LENGTH, conversations, separable_set, tiny_base
from helpers.one_launch import launch_many
from helpers.training import metrics, torchrun
from largetrain_core.training import tasks
from largetrain_core.training.config import TrainConfig


@pytest.fixture(scope="module")
def base(tmp_path_factory, bpe_dir):
    return tiny_base(bpe_dir, tmp_path_factory.mktemp("finetune") / "base")


@pytest.fixture(scope="module")
def classification_examples(base, tmp_path_factory):
    from largetrain_core.classification import load_classifier_tokenizer, stratified_split

    texts, labels = separable_set()
    names = ["billing", "shipping", "account"]
    split = stratified_split(labels, names, (0.6, 0.2, 0.2), seed=0)
    out = tmp_path_factory.mktemp("cls") / "examples"
    manifest = tasks.write_classification(
        out,
        {s: ([texts[i] for i in getattr(split, s)], labels[getattr(split, s)]) for s in tasks.SPLITS},
        names,
        load_classifier_tokenizer(base),
        seq_len=16,
    )
    assert manifest["splits"]["train"]["label_counts"] == {"billing": 36, "shipping": 22, "account": 14}
    return out


@pytest.fixture(scope="module")
def chat_examples(base, tmp_path_factory):
    from transformers import AutoTokenizer

    convs = conversations(60)
    out = tmp_path_factory.mktemp("chat") / "examples"
    tasks.write_chat(
        out,
        {"train": convs[:48], "validation": convs[48:54], "test": convs[54:]},
        AutoTokenizer.from_pretrained(base),
        64,
    )
    return out


def config(task, out, examples, base, **settings) -> TrainConfig:
    return TrainConfig.from_settings(
        **{
            "output_dir": str(out),
            "train_shards": str(examples),
            "mode": "lora",
            "task": task,
            "base_model": str(base),
            "zero_stage": 2,
            "precision": "fp32",
            "activation_checkpointing": False,
            "micro_batch_size": 4,
            "max_steps": 30,
            "learning_rate": 1e-2,
            "weight_decay": 0.0,
            "warmup_steps": 2,
            "save_steps": 10,
            "eval_steps": 10,
            "logging_steps": 10,
            "report_to": [],
            "lora": {"r": 8, "lora_alpha": 16.0},
            **settings,
        }
    )


CHAT_LORA = {"r": 8, "lora_alpha": 16.0, "merge_export": True}


@pytest.fixture(scope="module")
def runs(base, classification_examples, chat_examples, tmp_path_factory) -> dict[str, Path]:
    """The classifier and the chat adapter (with its merged export) trained 30 steps each (checkpoints and
    evaluations at 10, 20, 30), one after the other in the same 2 ranks of one torchrun
    (tests/helpers/one_launch.py): the clients' tests and the resumes' references."""
    tmp = tmp_path_factory.mktemp("finetune_runs")
    outs = {"classification": tmp / "classification", "chat": tmp / "chat"}
    specs = [
        {"train": config("classification", outs["classification"], classification_examples, base).to_dict()},
        {"train": config("chat", outs["chat"], chat_examples, base, lora=CHAT_LORA).to_dict()},
    ]
    launch_many(specs, tmp / "specs.json")
    return outs


@pytest.fixture(scope="module")
def classifier_run(runs):
    return runs["classification"]


@pytest.fixture(scope="module")
def chat_run(runs):
    return runs["chat"]


def test_a_classifier_trains_under_torchrun_and_its_export_labels_new_text(
    base, classification_examples, classifier_run
):
    from transformers import pipeline

    from helpers.finetune import WORDS
    from largetrain_core.classification import evaluate_predictions, load_classifier, predict_logits

    summary = json.loads((classifier_run / "summary.json").read_text())
    assert summary["task"] == "classification" and summary["vocab_size"] == 3  # the logits' width: 3 labels
    assert summary["last_loss"] < summary["first_loss"]
    assert summary["eval_loss"] < np.log(3)  # below a uniform guess over the 3 labels
    model, tok = load_classifier(base, classifier_run / "adapter")
    test = tasks.TaskExamples(classification_examples, "test")
    texts, y = separable_set()
    from largetrain_core.classification import stratified_split

    split = stratified_split(y, list(WORDS), (0.6, 0.2, 0.2), seed=0)
    pred = predict_logits(model, tok, [texts[i] for i in split.test], MAX_LENGTH).argmax(1)
    assert test.take(np.arange(len(test)))["label"].tolist() == y[split.test].tolist()
    m = evaluate_predictions(y[split.test], pred, list(WORDS))
    assert m["accuracy"] > 0.5  # the majority class is 50 % of the test split
    classify = pipeline("text-classification", model=model, tokenizer=tok)
    assert classify("refund invoice payment")[0]["label"] in WORDS


def test_a_chat_adapter_trains_on_assistant_tokens_and_loads_with_its_template(base, chat_run, chat_examples, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from largetrain_core import chat

    summary = json.loads((chat_run / "summary.json").read_text())
    assert summary["task"] == "chat" and summary["last_loss"] < summary["first_loss"]
    adapter = chat_run / "adapter"
    tok = AutoTokenizer.from_pretrained(adapter)
    assert tok.chat_template == chat.CHATML_TEMPLATE and len(tok) == 302
    messages = conversations(60)[55]
    ids, _ = chat.render(tok, messages)
    assert tok.apply_chat_template(messages, tokenize=True)["input_ids"] == ids.tolist()
    from safetensors.torch import load_file
    from transformers import pipeline

    saved = load_file(adapter / "adapter_model.safetensors")
    delta = "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta"
    assert saved[delta].shape == (2, 64)  # the rows of <|im_start|> and <|im_end|>, trained (PEFT trainable tokens)
    model = AutoModelForCausalLM.from_pretrained(base)
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    model = PeftModel.from_pretrained(model, adapter).eval()
    start = model.get_input_embeddings()(torch.tensor([300]))[0]
    assert torch.equal(start.detach(), saved[delta][0])  # the client's fresh row is replaced by the trained one
    generate = pipeline("text-generation", model=model, tokenizer=tok)
    (reply,) = generate([{"role": "user", "content": "my refund question"}], max_new_tokens=4, do_sample=False)
    assert reply["generated_text"][-1]["role"] == "assistant"
    # merged/: loaded without PEFT, the same next-token logits as base + adapter, and the template with it
    merged = AutoModelForCausalLM.from_pretrained(chat_run / "merged").eval()
    merged_tok = AutoTokenizer.from_pretrained(chat_run / "merged")
    assert merged_tok.chat_template == chat.CHATML_TEMPLATE
    ids = torch.tensor([chat.render(tok, messages)[0].tolist()])
    with torch.no_grad():
        a, b = merged(input_ids=ids).logits, model(input_ids=ids).logits
    assert float((a - b).abs().max()) <= 1e-4 * float(b.abs().max())
    # the stage's evaluation: greedy answers to held-out prompts scored against the references
    from largetrain_core.harness import answer_scores
    from largetrain_core.stages.training_metadata import answers_markdown
    from largetrain_core.training.task_evaluation import evaluate_chat

    test = conversations(60)[54:]  # the chat_examples fixture's test split, as task_data.chat_examples records it
    records = {"test": {"doc_id": [f"c{i}" for i in range(54, 60)], "messages": test}}
    (chat_examples / "records.json").write_text(json.dumps(records))
    evaluated = evaluate_chat(base, adapter, chat_examples, tmp_path, generations=3, max_new_tokens=8)
    shown = evaluated["generations"]
    assert len(shown) == evaluated["answers"]["items"] == 3 and evaluated["assistant_tokens"] > 0
    for g in shown:
        assert {k: g[k] for k in ("exact_match", "token_f1")} == answer_scores(g["generated"], g["reference"])
    for k in ("exact_match", "token_f1"):
        assert evaluated["answers"][k] == pytest.approx(np.mean([g[k] for g in shown]))
    # every test conversation's answer again through lm-evaluation-harness (base + adapter, the adapter's
    # tokenizer and template), stopped at the template's end of turn, scored the same way
    lm = evaluated["lm_eval"]
    assert lm["task"] == "chat_answers" and lm["items"] == 6
    bench = tmp_path / "benchmark"
    rows = [json.loads(line) for line in (bench / "tasks" / "chat_answers.jsonl").read_text().splitlines()]
    assert [r["doc_id"] for r in rows] == [f"c{i}" for i in range(54, 60)]
    items = sorted(
        (json.loads(line) for line in (bench / "samples.jsonl").read_text().splitlines()), key=lambda s: s["doc_id"]
    )
    for row, conv in zip(rows, test):
        before = [{"role": m["role"], "content": m["content"]} for m in conv[:-1]]
        assert row["prompt"] == tok.apply_chat_template(before, tokenize=False, add_generation_prompt=True)
        assert row["answer"] == conv[-1]["content"]
    for s in items:
        assert answer_scores(s["generations"][0], rows[s["doc_id"]]["answer"])["token_f1"] == s["token_f1"]
    for g, s in zip(shown, items):  # the stage's own greedy answer, which is not cut at <|im_end|>, starts with it
        assert g["generated"].startswith(s["generations"][0].strip()), (g["generated"], s["generations"])
    for k in ("exact_match", "token_f1"):
        assert lm[k]["value"] == pytest.approx(np.mean([s[k] for s in items]))
    assert "| lm-evaluation-harness `chat_answers` | 6 |" in answers_markdown(evaluated)


@pytest.mark.parametrize("task", ["classification", "chat"])
def test_a_resume_after_a_crash_is_bitwise_the_run_without(
    task, base, classification_examples, chat_examples, runs, tmp_path
):
    """The 30-step run of :func:`runs` (checkpoints and evaluations at 10, 20 and 30) again in a fresh torchrun,
    killed after step 12 and run again from step 10: every step's loss, the evaluations and the exported adapter
    bitwise those of the run without."""
    from safetensors.torch import load_file

    examples = classification_examples if task == "classification" else chat_examples
    settings = {"lora": CHAT_LORA} if task == "chat" else {}
    crashed = config(task, tmp_path / "crashed", examples, base, **settings)
    torchrun(crashed, tmp_path, fault="after_step:12", name="crashed")
    assert max(metrics(tmp_path / "crashed")) == 12
    proc = torchrun(crashed, tmp_path, name="resumed")
    assert "step-000010 at step 10" in proc.stderr, proc.stderr[-3000:]
    a, b = metrics(runs[task]), metrics(tmp_path / "crashed")
    assert sorted(a) == sorted(b) == list(range(1, 31))
    assert [a[s]["loss"] for s in range(1, 31)] == [b[s]["loss"] for s in range(1, 31)]
    assert [a[s]["eval_loss"] for s in (10, 20, 30)] == [b[s]["eval_loss"] for s in (10, 20, 30)]
    wa = load_file(runs[task] / "adapter" / "adapter_model.safetensors")
    wb = load_file(tmp_path / "crashed" / "adapter" / "adapter_model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
