"""Benchmark evaluation through the real lm-evaluation-harness (largetrain_core.harness): task files with
known answers scored by lm-eval's HFLM on a model directory and, through its PEFT support, on base + adapter;
the checks that keep task data local; the cloze task built from held-out documents."""

import json
import math
import shutil

import numpy as np
import pytest
import torch

from largetrain_core.harness import TaskFileError, build_cloze_task, check_task_files, evaluate, results_table
from largetrain_core.model import build_model
from largetrain_core.tokenizer import load_tokenizer_info, save_hf_tokenizer

WORDS = [
    "the",
    "old",
    "man",
    "walks",
    "to",
    "river",
    "house",
    "aa",
    "b",
    "c",
    "x",
    "y",
    "zzzzzzzzz",
    "longwordhere",
    "p",
    "q",
    "cc",
    "dd",
    "ee",
    "f",
    "a",
    "dog",
    "sits",
]

# With every next-token distribution uniform over V ids, a choice of n words (one token each) has
# log-likelihood -n ln V: acc picks the choice with the fewest words, acc_norm the one with the most bytes
# per word (lm-eval divides by the choice's length in bytes); ties go to the first choice.
KNOWN = [
    {"context": "the old man", "choices": [" aa", " b c"], "label": 0},  # acc right, acc_norm right
    {"context": "the dog", "choices": [" x y", " zzzzzzzzz"], "label": 0},  # acc wrong, acc_norm wrong
    {"context": "the dog walks", "choices": [" longwordhere", " p q"], "label": 1},  # acc wrong, acc_norm wrong
    {"context": "the man sits", "choices": [" cc dd ee", " f"], "label": 1},  # acc right, acc_norm wrong
]


def task(directory, name, rows, data_name=None, yaml_extra=""):
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / (data_name or f"{name}.jsonl")
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (directory / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data.name}\ntest_split: test\n"
        'output_type: multiple_choice\ndoc_to_text: "{{context}}"\ndoc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{label}}"\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n' + yaml_extra
    )
    return directory / f"{name}.yaml"


@pytest.fixture(scope="module")
def models(tmp_path_factory, make_word_tokenizer_module):
    """A word-level tokenizer; a llama-tiny whose final norm is zero (every distribution uniform), a random
    llama-tiny, and a random LoRA adapter on the latter (PEFT, lora_B not zero, so it changes the outputs)."""
    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("harness")
    tok = make_word_tokenizer_module(root / "tok", WORDS)
    info = load_tokenizer_info(tok)
    out = {"V": info.vocab_size}
    for name in ("uniform", "random"):
        m = build_model("llama-tiny", info.vocab_size, 64, info.eos_id, info.bos_id, seed=1)
        if name == "uniform":
            with torch.no_grad():
                m.model.norm.weight.zero_()
        m.config.use_cache = True
        m.save_pretrained(root / name)
        save_hf_tokenizer(info, root / name)
        out[name] = root / name
    torch.manual_seed(2)
    peft_model = get_peft_model(
        build_model("llama-tiny", info.vocab_size, 64, info.eos_id, info.bos_id, seed=1),
        LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False),
    )
    peft_model.save_pretrained(root / "adapter")
    out["adapter"] = root / "adapter"
    return out


@pytest.fixture(scope="module")
def make_word_tokenizer_module():
    """tests/conftest.py's make_word_tokenizer for a module-scoped fixture."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    def make(out_dir, vocab):
        out_dir.mkdir(parents=True, exist_ok=True)
        t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk-not-in-vocab>"))
        t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        t.add_special_tokens(["<|endoftext|>"])
        t.save(str(out_dir / "tokenizer.json"))
        return out_dir

    return make


def test_known_answers_scored_through_the_harness(models, tmp_path):
    tasks = tmp_path / "tasks"
    names = check_task_files([task(tmp_path / "src", "known_cloze", KNOWN)], tasks)
    assert names == ["known_cloze"]
    res = evaluate(models["uniform"], tasks, names, samples_file=tmp_path / "samples.jsonl")
    t = res["tasks"]["known_cloze"]
    assert t["items"] == 4
    assert t["metrics"]["acc"] == {"value": 0.5, "stderr": pytest.approx(math.sqrt(1 / 3) / 2)}
    assert t["metrics"]["acc_norm"] == {"value": 0.25, "stderr": pytest.approx(0.25)}
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    ln_v = math.log(models["V"])
    for r in rows:  # -words x ln V for every choice
        want = [-len(c.split()) * ln_v for c in KNOWN[r["doc_id"]]["choices"]]
        assert r["loglikelihoods"] == pytest.approx(want, rel=1e-5)
    assert "| known_cloze | acc | 4 | 0.5000 ± 0.2887 |" in results_table({"uniform": res})


def _loglikelihoods(model, tokenizer, context, choices):
    """Each choice's log-likelihood as a continuation of ``context``, computed here (lm-eval's split: the
    context's own tokens, then the rest of the whole string's tokens)."""
    ctx = tokenizer(context, add_special_tokens=False).input_ids
    out = []
    for c in choices:
        whole = tokenizer(context + c, add_special_tokens=False).input_ids
        ids = torch.tensor([whole])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids[:, :-1]).logits.float(), -1)[0]
        out.append(float(sum(logp[t - 1, whole[t]] for t in range(len(ctx), len(whole)))))
    return out


def test_base_and_adapter_through_the_harness_peft_support(models, tmp_path):
    from transformers import AutoTokenizer

    from largetrain_core.evaluate import load_for_eval

    rng = np.random.default_rng(0)
    rows = [
        {
            "context": " ".join(rng.choice(WORDS[:7], 3)),
            "choices": [" " + " ".join(rng.choice(WORDS, k)) for k in (1, 2, 1)],
            "label": int(rng.integers(0, 3)),
        }
        for _ in range(12)
    ]
    tasks = tmp_path / "tasks"
    check_task_files([task(tmp_path / "src", "random_cloze", rows)], tasks)
    tok = AutoTokenizer.from_pretrained(str(models["random"]))
    got = {}
    for label, adapter in (("base", None), ("adapter", models["adapter"])):
        res = evaluate(
            models["random"], tasks, ["random_cloze"], adapter_dir=adapter, samples_file=tmp_path / f"{label}.jsonl"
        )
        model = load_for_eval(models["random"], adapter)
        want = [_loglikelihoods(model, tok, r["context"], r["choices"]) for r in rows]
        samples = sorted(
            (json.loads(line) for line in (tmp_path / f"{label}.jsonl").read_text().splitlines()),
            key=lambda s: s["doc_id"],
        )
        for s in samples:
            assert s["loglikelihoods"] == pytest.approx(want[s["doc_id"]], rel=1e-4, abs=1e-4)
        acc = np.mean([int(np.argmax(w)) == r["label"] for w, r in zip(want, rows)])
        assert res["tasks"]["random_cloze"]["metrics"]["acc"]["value"] == pytest.approx(acc)
        got[label] = [s["loglikelihoods"] for s in samples]
    assert not np.allclose(got["base"], got["adapter"])  # the adapter was applied


def test_task_files_must_name_local_data(tmp_path):
    hub = tmp_path / "hub.yaml"
    hub.write_text("task: hub_task\ndataset_path: hellaswag\noutput_type: multiple_choice\n")
    with pytest.raises(
        TaskFileError, match=r"hub.yaml: dataset_path 'hellaswag' is not local data: nothing is downloaded"
    ):
        check_task_files([hub], tmp_path / "out")
    missing = task(tmp_path / "m", "missing", KNOWN)
    (tmp_path / "m" / "missing.jsonl").unlink()
    with pytest.raises(
        TaskFileError, match=r"missing.yaml: dataset_kwargs.data_files names missing.jsonl, which does not exist"
    ):
        check_task_files([missing], tmp_path / "out")
    nameless = tmp_path / "nameless.yaml"
    nameless.write_text("dataset_path: json\n")
    with pytest.raises(TaskFileError, match="key 'task'"):
        check_task_files([nameless], tmp_path / "out")
    with pytest.raises(TaskFileError, match="no such task file"):
        check_task_files([tmp_path / "nope.yaml"], tmp_path / "out")
    # relative data files are taken from the task file's directory and written absolute
    names = check_task_files([task(tmp_path / "rel", "rel_task", KNOWN)], tmp_path / "out")
    assert (
        names == ["rel_task"]
        and str((tmp_path / "rel" / "rel_task.jsonl").resolve()) in (tmp_path / "out" / "rel_task.yaml").read_text()
    )


def test_cloze_task_from_held_out_documents(tmp_path):
    def line(i, j):
        return f"line {i} {j} of the play, where it ends in {i} and {j}."

    docs = [(f"d{i}", "\n".join(line(i, j) for j in range(5))) for i in range(4)]
    info = build_cloze_task(docs, tmp_path, "domain_cloze", items=10, choices=4, seed=3)
    assert info["items"] == 10 and info["sentences"] == 20 and info["documents"] == 4 and info["chance"] == 0.25
    rows = [json.loads(line) for line in (tmp_path / "domain_cloze.jsonl").read_text().splitlines()]
    for r in rows:
        own = line(r["doc_id"][1:], r["sentence"]).split()
        assert r["context"] == " ".join(own[: len(own) // 2])
        assert r["choices"][r["label"]] == " " + " ".join(own[len(own) // 2 :])
        assert len(set(r["choices"])) == 4
    assert sorted(r["label"] for r in rows) != [0] * 10  # shuffled
    assert build_cloze_task(docs, tmp_path / "again", "domain_cloze", items=10, seed=3)["items"] == 10
    assert (tmp_path / "again" / "domain_cloze.jsonl").read_text() == (tmp_path / "domain_cloze.jsonl").read_text()
    with pytest.raises(ValueError, match="1 held-out document.* fewer than the 4 choices"):
        build_cloze_task([("d0", "too short.")], tmp_path / "x", "t")


def test_cloze_leaves_out_sentences_longer_than_the_models_context(tmp_path, models):
    """HFLM asserts that a continuation fits the context: a sentence over max_tokens is not used, counted."""
    from largetrain_core.harness import context_of

    count, length = context_of(models["random"])
    assert length == 64 and count("the old man walks") == 4
    short = [f"short line {j} of the play ends here at {j}." for j in range(6)]
    long_ = [" ".join(["word"] * 30) + f" {j}." for j in range(3)]
    docs = [("d0", "\n".join(short + long_))]
    info = build_cloze_task(
        docs, tmp_path, "c", items=6, choices=4, max_words=40, count_tokens=lambda t: len(t.split()), max_tokens=20
    )
    assert info["too_long"] == 3 and info["sentences"] == 6
    rows = [json.loads(x) for x in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert rows and all(len((r["context"] + c).split()) <= 20 for r in rows for c in r["choices"])
    with pytest.raises(ValueError, match=r"at most 20 tokens \(3 longer\)"):
        build_cloze_task(
            [("d0", "\n".join(long_ + short[:2]))],
            tmp_path / "y",
            "c",
            count_tokens=lambda t: len(t.split()),
            max_tokens=20,
        )


def test_benchmarks_of_base_and_adapter_on_held_out_documents(models, tmp_path):
    import polars as pl

    from largetrain_core.harness import BenchmarkSettings, held_out_documents, run_benchmarks
    from largetrain_core.shards import split_of

    rng = np.random.default_rng(1)
    ids = [f"doc{i}" for i in range(40)]
    texts = ["\n".join(" ".join(rng.choice(WORDS, 9)) for _ in range(3)) for _ in ids]  # 3 lines of 9 words
    (tmp_path / "text").mkdir()
    pl.DataFrame({"doc_id": ids, "source": ["s"] * 40, "text": texts}).write_parquet(
        tmp_path / "text" / "part-00000.parquet"
    )
    manifest = {"validation_fraction": 0.3, "seed": 7}
    held = list(held_out_documents(tmp_path / "text", manifest))
    assert [d for d, _ in held] == [d for d, v in zip(ids, split_of(ids, 0.3, 7)) if v] and 0 < len(held) < 40
    settings = BenchmarkSettings(tasks=(str(task(tmp_path / "src", "known_cloze", KNOWN)),), cloze_items=6)
    record = run_benchmarks(
        settings,
        {"base": (models["random"], None), "adapter": (models["random"], models["adapter"])},
        tmp_path / "out",
        held_out=iter(held),
    )
    assert record["tasks"] == ["domain_cloze", "known_cloze"] and record["cloze"]["items"] == 6
    for label in ("base", "adapter"):
        cloze = record["results"][label]["tasks"]["domain_cloze"]
        assert (
            cloze["items"] == 6 and 0 <= cloze["metrics"]["acc"]["value"] <= 1 and cloze["metrics"]["acc"]["stderr"] > 0
        )
    assert record["results"]["adapter"]["adapter"] == str(models["adapter"])
    assert json.loads((tmp_path / "out" / "benchmark.json").read_text()) == record
    # the committed cloze names its data beside it, so a copied directory reads it again
    assert (
        record["cloze"]["data"] == "tasks/domain_cloze.jsonl" and record["cloze"]["yaml"] == "tasks/domain_cloze.yaml"
    )
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "out", moved)
    shutil.rmtree(tmp_path / "out")
    assert '"domain_cloze.jsonl"' in (moved / "tasks" / "domain_cloze.yaml").read_text()
    assert check_task_files([moved / "tasks" / "domain_cloze.yaml"], tmp_path / "again") == ["domain_cloze"]
    assert (
        str((moved / "tasks" / "domain_cloze.jsonl").resolve())
        in (tmp_path / "again" / "domain_cloze.yaml").read_text()
    )
    with pytest.raises(ValueError, match="no task to run"):
        run_benchmarks(BenchmarkSettings(cloze_items=0), {"base": (models["random"], None)}, tmp_path / "none")


def test_evaluation_stage_scores_base_and_adapter(models, tmp_path):
    """The evaluation stage (largetrain_core.stages.evaluation) with its benchmarks: the cloze from the domain
    documents the shards hold out, scores with stderr as stats, a table, and model cards with the results."""
    import logging

    import polars as pl
    from huggingface_hub import ModelCard

    from largetrain_core.harness import BenchmarkSettings
    from largetrain_core.shards import build_token_shards
    from largetrain_core.stages.base import Artifact, StageRun
    from largetrain_core.stages.evaluation import EvaluationSettings, evaluation

    rng = np.random.default_rng(2)
    ids = [f"doc{i}" for i in range(60)]
    texts = ["\n".join(" ".join(rng.choice(WORDS, 9)) for _ in range(4)) for _ in ids]
    text = tmp_path / "text"
    text.mkdir()
    pl.DataFrame({"doc_id": ids, "source": ["s"] * 60, "text": texts}).write_parquet(text / "part-00000.parquet")
    shards = tmp_path / "shards"
    shards.mkdir()
    build_token_shards(text, models["random"], shards, seq_len=16, validation_fraction=0.2, source_data_version="t1")
    shard = Artifact(shards, "s1", {})
    settings = EvaluationSettings(
        max_sequences=4, prompts=("the old man",), max_new_tokens=2, benchmark=BenchmarkSettings(cloze_items=5)
    )
    result = evaluation(
        settings,
        Artifact(models["random"].parent, "b1", {"output": str(models["random"])}),
        Artifact(models["adapter"].parent, "a1", {"output": str(models["adapter"])}),
        shard,
        shard,
        StageRun(root=tmp_path / "root", asset=("evaluation",), log=logging.getLogger("t")),
        Artifact(text, "t1", {}),
    )
    for model in ("base", "adapter"):  # stderr: the sample standard deviation of 0/1 scores over sqrt(n)
        p = result.stats[f"lm_eval/{model}/domain_cloze/acc"]
        assert result.stats[f"lm_eval/{model}/domain_cloze/acc_stderr"] == pytest.approx(math.sqrt(p * (1 - p) / 4))
    assert result.stats["lm_eval_cloze_items"] == 5
    assert "| domain_cloze | acc | 5 |" in result.metadata["benchmark_results"]
    card = ModelCard.load(str(result.path / "benchmark" / "adapter_card" / "README.md"))
    assert {r.metric_type for r in card.data.eval_results} == {"acc", "acc_norm"}
    assert "## Benchmarks (lm-evaluation-harness)" in card.text
    held = json.loads((result.path / "benchmark" / "benchmark.json").read_text())
    cloze_docs = {
        json.loads(line)["doc_id"]
        for line in (result.path / "benchmark" / "tasks" / "domain_cloze.jsonl").read_text().splitlines()
    }
    from largetrain_core.shards import split_of

    assert cloze_docs <= {d for d, v in zip(ids, split_of(ids, 0.2, 0)) if v} and held["cloze"]["items"] == 5


def test_benchmark_scores_reach_the_trainings_mlflow_run(tmp_path):
    from mlflow.tracking import MlflowClient

    from largetrain_core.stages.evaluation import report_to_trackers
    from largetrain_core.storage import write_json_atomic
    from largetrain_core.training.config import TrainConfig
    from largetrain_core.training.trackers import RECORDS, MlflowTracker

    out = tmp_path / "lora_adapter" / "v1"
    out.mkdir(parents=True)
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    cfg = TrainConfig.from_dict(
        {
            "output_dir": str(out),
            "train_shards": str(tmp_path),
            "report_to": ["mlflow"],
            "mlflow": {"tracking_uri": uri},
        }
    )
    write_json_atomic(out / "train_config.json", cfg.to_dict())
    write_json_atomic(out / "summary.json", {"steps": 7, "last_loss": 1.5})
    tracker = MlflowTracker()
    record = tracker.start(cfg, None)
    tracker.finish({"steps": 7})
    write_json_atomic(out / RECORDS, {"mlflow": record})
    assert report_to_trackers(
        out, {"lm_eval/adapter/domain_cloze/acc": 0.625, "lm_eval/adapter/domain_cloze/acc_stderr": 0.1}
    ) == ["mlflow"]
    client = MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(record["run_id"], "lm_eval/adapter/domain_cloze/acc")
    assert [(m.value, m.step) for m in history] == [(0.625, 7)]
    assert client.get_run(record["run_id"]).info.status == "FINISHED"
    assert report_to_trackers(tmp_path / "imported", {"x": 1.0}) == []  # no training here: nothing to log to


def test_the_task_file_of_the_docs_scores(models, tmp_path):
    """docs/guides/training.md, "Benchmarks with lm-evaluation-harness": its task file, with its data file beside it
    (the known-answer items), checked as local and scored through the harness as the evaluation scores it."""
    from helpers.docblocks import section_blocks

    block = next(
        b
        for b in section_blocks("docs/guides/training.md", "Benchmarks with lm-evaluation-harness", "yaml")
        if "ops:" not in b.text
    )
    (tmp_path / "my_tasks").mkdir()
    (tmp_path / "my_tasks" / "support_intent.yaml").write_text(block.text)
    (tmp_path / "my_tasks" / "support_intent.jsonl").write_text("".join(json.dumps(r) + "\n" for r in KNOWN))
    names = check_task_files([tmp_path / "my_tasks"], tmp_path / "tasks")
    assert names == ["support_intent"]
    res = evaluate(models["uniform"], tmp_path / "tasks", names)
    assert res["tasks"]["support_intent"]["metrics"]["acc"]["value"] == 0.5


def test_answer_scores_are_squads_exact_match_and_token_f1():
    from largetrain_core.harness import answer_scores, normalize_answer

    assert normalize_answer("  The Cat, sat!  ") == "cat sat"
    assert answer_scores("The cat sat.", "a cat sat on the mat") == {"exact_match": 0.0, "token_f1": 2 * 0.5 / 1.5}
    assert answer_scores("Cat sat", "the cat  sat!") == {"exact_match": 1.0, "token_f1": 1.0}
    assert answer_scores("dog dog", "dog") == {"exact_match": 0.0, "token_f1": 2 * 0.5 / 1.5}  # repeats count once each
    assert answer_scores("", "the") == {"exact_match": 1.0, "token_f1": 1.0}  # both empty once normalized
    assert answer_scores("", "dog") == {"exact_match": 0.0, "token_f1": 0.0}


@pytest.fixture(scope="module")
def bpe_models(bpe_dir, tmp_path_factory):
    """llama-tiny bases with the session's byte-level BPE (a generation's stop string, its EOS, encodes as bytes):
    ``random`` and ``uniform`` (its final norm zero: every logit 0, so greedy decoding picks id 0, the EOS, and stops)."""
    from transformers import AutoModelForCausalLM

    from helpers.finetune import tiny_base
    from largetrain_core.tokenizer import load_tokenizer_info, save_hf_tokenizer

    root = tmp_path_factory.mktemp("chat_harness")
    random = tiny_base(bpe_dir, root / "random")
    model = AutoModelForCausalLM.from_pretrained(random)
    with torch.no_grad():
        model.model.norm.weight.zero_()
    model.save_pretrained(root / "uniform")
    save_hf_tokenizer(load_tokenizer_info(bpe_dir), root / "uniform")
    return {"random": random, "uniform": root / "uniform"}


def test_a_chat_task_scores_greedy_answers_by_exact_match_and_token_f1(bpe_models, tmp_path):
    """build_chat_task's generative task through the harness: the uniform model's greedy answer is id 0, its EOS,
    so it answers nothing and each item's scores are known; the random model's are recomputed from its
    generations."""
    from transformers import AutoTokenizer

    from largetrain_core.harness import build_chat_task

    def conv(user, answer, system=None):
        head = [{"role": "system", "content": system}] if system else []
        return head + [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]

    convs = [
        ("c0", conv("the old man", "the")),
        ("c1", conv("the dog sits", "old man", system="a b")),
        ("c2", conv("the man walks", "the dog")),
        ("c3", [{"role": "user", "content": "river"}]),  # no answer: skipped
    ]
    record = build_chat_task(
        convs,
        tmp_path / "tasks",
        "chat_answers",
        lambda m: " ".join(x["content"] for x in m),
        stop=["\n"],
        max_gen_toks=2,
    )
    assert (record["items"], record["conversations"], record["skipped"]) == (3, 4, 1)
    rows = [json.loads(line) for line in (tmp_path / "tasks" / "chat_answers.jsonl").read_text().splitlines()]
    assert [(r["doc_id"], r["prompt"], r["answer"]) for r in rows] == [
        ("c0", "the old man", "the"),
        ("c1", "a b the dog sits", "old man"),
        ("c2", "the man walks", "the dog"),
    ]
    res = evaluate(bpe_models["uniform"], tmp_path / "tasks", ["chat_answers"], samples_file=tmp_path / "u.jsonl")
    metrics = res["tasks"]["chat_answers"]["metrics"]
    assert res["tasks"]["chat_answers"]["items"] == 3
    assert metrics["exact_match"]["value"] == pytest.approx(1 / 3) and metrics["token_f1"]["value"] == pytest.approx(
        1 / 3
    )
    samples = [json.loads(line) for line in (tmp_path / "u.jsonl").read_text().splitlines()]
    assert [s["generations"] for s in sorted(samples, key=lambda s: s["doc_id"])] == [[""]] * 3
    assert AutoTokenizer.from_pretrained(bpe_models["uniform"]).convert_ids_to_tokens(0) == "<|endoftext|>"
    assert [s["exact_match"] for s in sorted(samples, key=lambda s: s["doc_id"])] == [1.0, 0.0, 0.0]

    from largetrain_core.harness import answer_scores

    res = evaluate(bpe_models["random"], tmp_path / "tasks", ["chat_answers"], samples_file=tmp_path / "r.jsonl")
    samples = sorted(
        (json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()), key=lambda s: s["doc_id"]
    )
    scores = [answer_scores(s["generations"][0], rows[s["doc_id"]]["answer"]) for s in samples]
    for metric in ("exact_match", "token_f1"):
        assert res["tasks"]["chat_answers"]["metrics"][metric]["value"] == pytest.approx(
            np.mean([x[metric] for x in scores])
        )
