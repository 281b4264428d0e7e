"""The six recipes of docs/guides/your-data.md (recipe 1 is the README's quick start), materialized from their config files
in configs/ with the asset selections their headers give to `dagster asset materialize`, so that the
recipes cannot rot: 2 (pretrain on your corpus) on an empty storage root, then 1 (LoRA on your corpus
with the existing base), then 3 (import a Hugging Face model directory and adapt it), then 4 (a classifier on the labelled records, its asset page then read in the web UI), 5 (an assistant from chat
records) and 6 (the classifier on the pretrained encoder all-MiniLM-L6-v2).

Each config file is read as it is; the test overrides only paths (the corpora, the model directory)
and sizes (sequence length, vocabulary, preset, steps, evaluation) to keep it small, and cuts the run
config down to each run's steps as the CLI's runs use it (keys of other steps are not used by a run).
Every key of every file must name a step of the code location (configs.check_ops_keys).
"""

import copy
import json
import os
import re
import shlex
import subprocess
import sys
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from dagster import AssetKey, AssetSelection, DagsterEventType, DagsterInstance, DagsterRunStatus, materialize

from helpers import REPO, TICKETS
from largetrain_dagster.configs import check_ops_keys, deep_merge
from largetrain_dagster.corpus import dedup_checks
from largetrain_dagster.definitions import ROLES, build_definitions, lineage_assets
from largetrain_dagster.partitions import DATA_PARTITIONS, PARTITIONED_KEYS
from largetrain_dagster.resources import read_handle
from largetrain_dagster.summary import render
from helpers.docblocks import Block, commands, section_blocks
from helpers.corpora import SHORT_RUN, labelled_corpus

PARTITION_KEYS = DATA_PARTITIONS.get_partition_keys()

SMALL = {  # sizes only: what each recipe does stays as its file says
    "tokenizer": {"vocab_size": 400},
    "pretrain__token_shards": {"seq_len": 32},
    "domain__token_shards": {"seq_len": 32},
    "base_checkpoint": {
        "model": {"preset": "llama-tiny"},
        "schedule": {"max_steps": 6, "warmup_steps": 1, "micro_batch_size": 4},
        "checkpointing": {"save_steps": 3},
        "tracking": {"logging_steps": 3},
        "optimizer": {"learning_rate": 0.005},
        **SHORT_RUN,
    },
    "lora_adapter": {
        "schedule": {"max_steps": 6, "warmup_steps": 1, "micro_batch_size": 4},
        "checkpointing": {"save_steps": 3},
        "tracking": {"logging_steps": 3},
        "optimizer": {"learning_rate": 0.01},
        **SHORT_RUN,
    },
    "evaluation": {"max_sequences": 8, "max_new_tokens": 4},
}


def recipe_commands(path: Path) -> list[tuple[str, bool]]:
    """(asset selection, run once per data partition) of each `dagster asset materialize` in the file's
    header, in order; each must name this file with -c."""
    header = "\n".join(line[1:].strip() for line in path.read_text().splitlines() if line.startswith("#"))
    commands = []
    for chunk in header.split("dagster asset materialize")[1:]:
        chunk = chunk.split(".venv/bin/")[0]
        assert f"-m largetrain_dagster.definitions -c configs/{path.name}" in " ".join(chunk.split()), chunk
        commands.append((re.search(r"--select '([^']+)'", chunk).group(1), "--partition $p" in chunk))
    loop = re.search(r"for p in \$\((.+?)\); do", header)
    if any(parted for _, parted in commands):  # the loop runs over what the command prints: every data partition
        assert loop, header
        printed = subprocess.run(
            shlex.split(loop.group(1).replace(".venv/bin/python", sys.executable)),
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert printed == PARTITION_KEYS
    return commands


def documented_keys(path: Path) -> set[str]:
    """The asset keys the file's ``# Materializes:`` line lists."""
    line = next(line for line in path.read_text().splitlines() if line.startswith("# Materializes:"))
    return {k.strip() for k in line.split(":", 1)[1].split(",")}


def merged(base: dict, extra: dict) -> dict:
    """``base``'s step configs with ``extra``'s values, sections merged setting by setting."""
    out = copy.deepcopy(base)
    for op, cfg in extra.items():
        step = out.setdefault(op, {}).setdefault("config", {})
        step.update(deep_merge(step, cfg))
    return out


class Lab:
    """One storage root and one Dagster instance (its DAGSTER_HOME ``home``, dagster.yaml's settings) that the
    recipes run on in turn, in this process (``materialize``) or through the dagster CLI."""

    def __init__(self, root: Path, home: Path, instance: DagsterInstance):
        self.root, self.home, self.instance = root, home, instance
        self.defs = build_definitions(root=str(root), nproc_per_node=1, wandb_mode="disabled", report_to=[])
        self.graph = self.defs.resolve_asset_graph()
        self.assets = [*lineage_assets(), *dedup_checks(ROLES)]
        self.known = {n.name for job in [self.defs.resolve_implicit_global_asset_job_def()] for n in job.graph.nodes}

    def run(self, name: str, overrides: dict, cli: bool = False) -> tuple[set[str], list]:
        """Materialize recipe ``name`` as its header says, its file's config with ``overrides`` and SMALL.
        ``cli``: each command of the header run as it is written, `dagster asset materialize -m
        largetrain_dagster.definitions -c <the config> --select ... [--partition p]`, a subprocess on this lab's
        root and instance. Returns (the asset keys materialized, the results: the runs' ids with ``cli``)."""
        path = REPO / "configs" / name
        cfg = yaml.safe_load(path.read_text())
        check_ops_keys(cfg, set(), self.known)  # every key names a step (raises RunConfigError otherwise)
        ops = merged(cfg["ops"], {op: v for op, v in SMALL.items() if op in cfg["ops"] or op in overrides})
        ops = merged(ops, overrides)
        if "pretrained_model" in ops.get("tokenizer", {}).get("config", {}):
            ops["tokenizer"]["config"].pop("vocab_size", None)
        if cli:
            return self._run_cli(path, {**cfg, "ops": ops})
        done, results = set(), []
        for select, parted in recipe_commands(path):
            keys = AssetSelection.from_coercible(select.split(",")).resolve(self.graph)  # as the CLI resolves it
            assert all(k.path[0] != "landed" for k in keys) and (parted == all(k in PARTITIONED_KEYS for k in keys))
            run_config = {"ops": {op: c for op, c in ops.items() if AssetKey(op.split("__")) in keys}}
            for pk in PARTITION_KEYS if parted else [None]:
                result = materialize(
                    self.assets,
                    resources=self.defs.resources,
                    instance=self.instance,
                    run_config=run_config,
                    selection=list(keys),
                    partition_key=pk,
                )
                assert result.success, (name, select, pk)
                checks = result.get_asset_check_evaluations()
                assert all(c.passed for c in checks), [(c.asset_key, c.check_name) for c in checks if not c.passed]
                results.append(result)
                done |= {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
        return done, results

    def _run_cli(self, path: Path, cfg: dict) -> tuple[set[str], list[str]]:
        """:meth:`run` through the dagster CLI: the whole config file (every step's keys, as the header's
        commands pass it) written beside the root; each run must succeed with every asset check passed."""
        config = self.root.parent / path.name
        config.write_text(yaml.safe_dump(cfg))
        env = {
            **os.environ,
            "LARGETRAIN_ROOT": str(self.root),
            "DAGSTER_HOME": str(self.home),
            "LARGETRAIN_NPROC": "1",
            "LARGETRAIN_REPORT_TO": "",
            "LARGETRAIN_WANDB_MODE": "disabled",
        }
        dagster = str(Path(sys.executable).with_name("dagster"))
        done, runs = set(), []
        for select, parted in recipe_commands(path):
            for pk in PARTITION_KEYS if parted else [None]:
                before = {r.run_id for r in self.instance.get_runs()}
                argv = [dagster, "asset", "materialize", "-m", "largetrain_dagster.definitions", "-c", str(config)]
                argv += ["--select", select] + (["--partition", pk] if pk else [])
                proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
                assert proc.returncode == 0, (path.name, select, pk, (proc.stdout + proc.stderr)[-4000:])
                (new,) = [r for r in self.instance.get_runs() if r.run_id not in before]
                assert new.status == DagsterRunStatus.SUCCESS, (path.name, select, pk, new.status)
                logs = self.instance.all_logs(new.run_id)
                failed = [
                    (e.dagster_event.event_specific_data.asset_key, e.dagster_event.event_specific_data.check_name)
                    for e in logs
                    if e.dagster_event
                    and e.dagster_event.event_type == DagsterEventType.ASSET_CHECK_EVALUATION
                    and not e.dagster_event.event_specific_data.passed
                ]
                assert not failed, failed
                done |= {
                    e.dagster_event.asset_key.to_user_string()
                    for e in logs
                    if e.dagster_event and e.dagster_event.event_type == DagsterEventType.ASSET_MATERIALIZATION
                }
                runs.append(new.run_id)
        return done, runs


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A lab on an instance in its own DAGSTER_HOME (the repository's dagster.yaml), which the CLI's runs share."""
    base = tmp_path_factory.mktemp("recipes")
    home = base / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    with DagsterInstance.from_config(str(home)) as instance:
        yield Lab(base / "root", home, instance)


@pytest.fixture(scope="module")
def tickets(tmp_path_factory) -> Path:
    """A slice of the new user's corpus (tests/data/support_tickets.jsonl): 300 labelled short records."""
    path = tmp_path_factory.mktemp("my_data") / "tickets.jsonl"
    path.write_text("".join(TICKETS.read_text().splitlines(keepends=True)[:300]))
    return path


def md(instance: DagsterInstance, key: str) -> dict:
    ev = instance.get_latest_materialization_event(AssetKey.from_user_string(key))
    return {k: getattr(v, "value", v) for k, v in ev.asset_materialization.metadata.items()}


def run_id(instance: DagsterInstance, key: str) -> str:
    return instance.get_latest_materialization_event(AssetKey.from_user_string(key)).run_id


@pytest.fixture(scope="module")
def recipe2(lab, tickets, tmp_path_factory):
    """Recipe 2 on an empty root: pretrain on prose documents of one's own, the tickets as the domain corpus."""
    books = labelled_corpus(tmp_path_factory.mktemp("books") / "books.jsonl")
    overrides = {
        "pretrain__raw_corpus": {"path": str(books)},
        "domain__raw_corpus": {"path": str(tickets)},
        "domain__cleaned_text": {"gopher_quality": False},
        "base_checkpoint": {"checkpointing": {"gguf_export": ["q8_0"]}},  # the option the file shows
    }
    done, _ = lab.run("pretrain_on_my_corpus.yaml", overrides)
    return done, books


def test_quick_start_is_recipe_1():
    """README.md's quick start (section "Your own data and model") runs the commands of recipe 1's header,
    which the recipe tests below materialize (the asset selections, the partition loop run as written)."""
    (block,) = section_blocks("README.md", "Your own data and model", "sh")
    path = REPO / "configs" / "lora_on_my_corpus.yaml"
    comment = "\n".join(line[1:] for line in path.read_text().splitlines() if line.startswith("#"))
    (header,) = [p for p in comment.split("\n\n") if "dagster asset materialize" in p]  # the paragraph of commands
    assert commands(block) == commands(Block(str(path), 1, "sh", "", header, ()))
    assert [select for select, _ in recipe_commands(path)] == [
        re.search(r"--select '([^']+)'", c).group(1) for c in commands(block) if "--select" in c
    ]


def test_recipe_2_pretrain_on_your_corpus(lab, recipe2):
    done, books = recipe2
    assert done == documented_keys(REPO / "configs" / "pretrain_on_my_corpus.yaml")
    assert done == {k.to_user_string() for a in lineage_assets() for k in a.keys}
    text = render(lab.instance)
    assert f"pretraining corpus (pretrain): {books.resolve()}" in text
    assert "corpus version: no provenance file; content digest " in text and "(every partition)" in text
    assert "base model: pretrained here from preset llama-tiny: loss" in text
    # checkpointing.gguf_export: the trained model also as GGUF (llama.cpp's converter), which transformers reads back
    from transformers import AutoModelForCausalLM

    base = md(lab.instance, "base_checkpoint")
    (gguf,) = (Path(p) for p in base["gguf_files"])
    assert gguf.name == "model-q8_0.gguf" and gguf.parent == Path(base["path"]) / "gguf"
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    assert model.config.vocab_size == base["vocab_size"]
    assert "LoRA adapter: r=16, lora_alpha=32 on down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj" in text
    # the evaluation's sample generations: each configured prompt, base and adapter on one line each
    samples = text.split("sample generations (greedy, at most 4 new tokens):\n")[1].splitlines()
    prompts = md(lab.instance, "evaluation")["config"]["prompts"]
    for i, prompt in enumerate(prompts[:3]):
        assert samples[3 * i] == f"  prompt {prompt!r}"
        assert samples[3 * i + 1].startswith("    base:           '") and samples[3 * i + 2].startswith(
            "    base + adapter: '"
        )


def test_recipe_1_lora_on_your_corpus_with_the_existing_base(lab, recipe2, tickets):
    before = {k: run_id(lab.instance, k) for k in ("tokenizer", "base_checkpoint", "pretrain/token_shards")}
    base_version = md(lab.instance, "base_checkpoint")["data_version"]
    done, _ = lab.run("lora_on_my_corpus.yaml", {"domain__raw_corpus": {"path": str(tickets)}})
    assert done == documented_keys(REPO / "configs" / "lora_on_my_corpus.yaml")
    assert {k: run_id(lab.instance, k) for k in before} == before  # the existing base and tokenizer, untouched
    lora = md(lab.instance, "lora_adapter")
    assert json.loads((Path(lora["path"]) / "train_config.json").read_text())["model"]["base_model"].startswith(
        str(lab.root.resolve() / "base_checkpoint" / base_version)
    )
    dedup, shards = md(lab.instance, "domain/deduplicated_text"), md(lab.instance, "domain/token_shards")
    hist = dedup["balance"]["after"]
    assert set(hist) == {"account", "billing", "shipping", "technical"} and len(set(hist.values())) == 1
    assert dedup["balance_repeats"] > 0 and shards["train_repeat_copies"] > 0  # the up-sample: repeats, not duplicates
    text = render(lab.instance)
    assert (
        f"domain corpus (domain): {tickets.resolve()}" in text and "balancing (up-sampled, seed 0): per class" in text
    )
    assert "intended repeats, not duplicates" in text and "the train split repeats" in text


@pytest.fixture(scope="module")
def someones_model(tmp_path_factory, tickets) -> Path:
    """A local Hugging Face directory as `save_pretrained` writes it: a tiny Llama and a byte-level BPE
    with its own special tokens (``<s>``, ``</s>``), trained here on the tickets. No hub access."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from largetrain_core.model import build_model

    src = tmp_path_factory.mktemp("someones_model")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = [json.loads(line)["text"] for line in TICKETS.read_text().splitlines()]
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=["<s>", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tok.save(str(src / "tokenizer.json"))
    (src / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    build_model(
        "llama-tiny", 400, 64, eos_id=tok.token_to_id("</s>"), bos_id=tok.token_to_id("<s>"), seed=3
    ).save_pretrained(src)
    return src


def test_recipe_3_import_a_hugging_face_model_and_adapt_it(lab, recipe2, tickets, someones_model):
    pretrain_dedup = run_id(lab.instance, "pretrain/deduplicated_text")
    done, _ = lab.run(
        "import_hf_model.yaml",
        {
            "domain__raw_corpus": {"path": str(tickets)},
            "tokenizer": {"pretrained_model": str(someones_model)},
            "base_checkpoint": {"pretrained_model": str(someones_model)},
        },
    )
    assert done == documented_keys(REPO / "configs" / "import_hf_model.yaml")
    assert run_id(lab.instance, "pretrain/deduplicated_text") == pretrain_dedup
    assert md(lab.instance, "tokenizer")["config"]["pretrained_model"] == str(someones_model)
    text = render(lab.instance)
    assert f"base model: imported from {someones_model}" in text and "not trained here" in text
    assert "LoRA adapter: r=16, lora_alpha=32 on" in text


def test_recipe_4_a_classifier_on_your_labelled_records(lab, recipe2, tickets, tmp_path):
    """The classifier recipe through the dagster CLI on the base the lab has: records without a label or outside
    the declared label set rejected by file, line and reason, the tickets' category learnt by a LoRA sequence classifier,
    evaluated on the held-out test split beside the baselines, its blocking check passed, its export labelling text."""
    from transformers import pipeline

    from largetrain_core.classification import load_classifier

    records = tmp_path / "tickets.jsonl"  # the tickets, and two records the declared label set rejects
    bad = [{"id": "no-label", "text": "where is my parcel"}, {"id": "odd", "text": "hello", "category": "sales"}]
    records.write_text(tickets.read_text() + "".join(json.dumps(r) + "\n" for r in bad))
    labels = ["account", "billing", "shipping", "technical"]
    done, _ = lab.run(
        "classifier_on_my_records.yaml",
        {
            "domain__raw_corpus": {"path": str(records), "labels": labels},
            "lora_adapter": {
                "schedule": {"max_steps": 80, "micro_batch_size": 16},
                "optimizer": {"learning_rate": 0.01},
                "evaluation": {"eval_steps": 40},
                "task_data": {"seq_len": 32},  # the small base's positions
            },
        },
        cli=True,
    )
    assert done == documented_keys(REPO / "configs" / "classifier_on_my_records.yaml")
    rejected = [
        row
        for pk in PARTITION_KEYS
        for row in pq.read_table(
            Path(read_handle(lab.root, AssetKey(["domain", "raw_corpus"]), pk)["path"]) / "rejected.parquet"
        ).to_pylist()
    ]
    assert sorted((r["source"], r["position"], r["reason"]) for r in rejected) == [
        ("tickets.jsonl", 301, "line 301: no label: field 'category' is missing or null"),
        ("tickets.jsonl", 302, f"line 302: label 'sales' is not in the declared label set {labels}"),
    ]
    lora = md(lab.instance, "lora_adapter")
    assert lora["task"] == "classification"
    assert lora["label_names"] == ["account", "billing", "shipping", "technical"]
    assert "| tfidf_logreg |" in lora["baselines"] and "| majority |" in lora["baselines"]
    assert (
        lora["test_macro_f1"] > json.loads((Path(lora["path"]) / "evaluation.json").read_text())["majority"]["macro_f1"]
    )
    split = lora["split"]
    assert sum(split["test"].values()) > 0 and set(split["test"]) == set(lora["label_names"])
    model, tok = load_classifier(md(lab.instance, "base_checkpoint")["output"], Path(lora["path"]) / "adapter")
    (label,) = pipeline("text-classification", model=model, tokenizer=tok)(["I was charged twice for my order"])
    assert label["label"] in lora["label_names"]
    classifier_page_in_the_web_ui(lab, lora, tmp_path)


def classifier_page_in_the_web_ui(lab, lora: dict, tmp_path: Path) -> None:
    """What a user sees on lora_adapter's asset page in the web UI (dagster-webserver on the lab's instance, headless
    Chromium): the task, the test macro-F1 as the metadata says, the baselines rendered as a table with a row per
    model, and the confusion matrix behind its "[Show Markdown]": an image loaded at the PNG's size."""
    from PIL import Image
    from selenium.webdriver.common.by import By

    from helpers.browser import chrome, metadata_cells, stop_group, wait
    from helpers.processes import free_port

    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(lab.home), "LARGETRAIN_ROOT": str(lab.root)}
    log = tmp_path / "webserver.log"
    webserver = str(Path(sys.executable).with_name("dagster-webserver"))
    with open(log, "wb") as out:
        argv = [webserver, "-m", "largetrain_dagster.definitions", "-h", "127.0.0.1", "-p", str(port)]
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    driver = None
    try:
        url = f"http://127.0.0.1:{port}"

        def serving():
            try:
                with urllib.request.urlopen(f"{url}/server_info", timeout=5) as r:
                    return r.status == 200
            except OSError:
                return False

        wait(serving, "dagster-webserver on the lab's instance", 180, proc=proc, log=log)
        driver = chrome(tmp_path / "chromium-profile")
        driver.get(f"{url}/assets/lora_adapter")

        def visible(xpath: str):
            return [e for e in driver.find_elements(By.XPATH, xpath) if e.is_displayed()]

        shown = metadata_cells(driver, "test_macro_f1", "lora_adapter's metadata")
        assert shown["task"].text == "classification"
        assert shown["test_macro_f1"].text == f"{lora['test_macro_f1']:g}"
        baselines = shown["baselines"].find_element(By.XPATH, ".//table")
        models = [r.find_elements(By.XPATH, "./td")[0].text for r in baselines.find_elements(By.XPATH, ".//tr[td]")]
        assert models == ["lora", "tfidf_logreg", "majority"]
        png = Image.open(Path(lora["path"]) / "confusion_matrix.png")
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", shown["confusion_matrix"])
        shown["confusion_matrix"].find_element(By.XPATH, ".//a[normalize-space(.)='[Show Markdown]']").click()
        img = wait(lambda: visible("//img[starts-with(@src, 'data:image/png;base64,')]"), "the confusion matrix", 30)[0]
        wait(
            lambda: driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0;", img),
            "the confusion matrix image to load",
            30,
        )
        assert driver.execute_script("return [arguments[0].naturalWidth, arguments[0].naturalHeight];", img) == list(
            png.size
        )
        (tmp_path / "lora_adapter_page.png").write_bytes(driver.get_screenshot_as_png())
    finally:
        if driver is not None:
            driver.quit()
        stop_group(proc)


def test_recipe_5_an_assistant_from_your_chat_records(lab, recipe2, tmp_path):
    """The chat recipe through the dagster CLI on the base the lab has: conversations read (malformed ones rejected by line), a message's
    e-mail address redacted in the messages the adapter trains on, the adapter trained on assistant tokens and
    evaluated on held-out conversations, its template saved with its tokenizer."""
    from helpers.finetune import conversations
    from largetrain_core.training.tasks import load_chat_adapter

    chats = tmp_path / "chats.jsonl"
    convs = conversations(60)
    convs[1][0]["content"] = "write to jane.doe@acmemail.org please"
    lines = [json.dumps({"id": f"c{i}", "messages": m}) for i, m in enumerate(convs)]
    lines.append(json.dumps({"id": "bad", "messages": [{"role": "narrator", "content": "once"}]}))
    chats.write_text("\n".join(lines) + "\n")
    done, _ = lab.run(
        "assistant_from_my_chats.yaml",
        {
            "domain__raw_corpus": {"path": str(chats), "max_rejected_fraction": 0.2},  # 1 of ~15 in a partition
            "lora_adapter": {
                "schedule": {"max_steps": 12},
                "evaluation": {"eval_steps": 6},
                "task_data": {"seq_len": 32},
            },
        },
        cli=True,
    )
    assert done == documented_keys(REPO / "configs" / "assistant_from_my_chats.yaml")
    lora = md(lab.instance, "lora_adapter")
    assert (
        lora["task"] == "chat" and lora["test_assistant_tokens"] > 0 and "| prompt | reference |" in lora["generations"]
    )
    assert "| lm-evaluation-harness `chat_answers` |" in lora["answers"]  # the held-out answers through the harness
    out = Path(lora["path"])
    records = json.loads((out / "examples" / "records.json").read_text())
    contents = [m["content"] for s in records.values() for c in s["messages"] for m in c]
    assert not any("acmemail" in c for c in contents) and "write to <EMAIL> please" in contents
    assert "narrator" not in json.dumps(records)
    model, tok = load_chat_adapter(md(lab.instance, "base_checkpoint")["output"], out / "adapter")
    assert "<|im_start|>" in tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)


def test_recipe_6_a_classifier_on_the_pretrained_encoder(lab, recipe2, tickets):
    """The classifier recipe on all-MiniLM-L6-v2 (the Makefile's $(VENV)/minilm/.installed), through the whole
    lineage: its WordPiece tokenizer copied as the tokenizer asset, the encoder imported whole as base_checkpoint,
    the tickets tokenized in its vocabulary, and a LoRA sequence classifier on it that beats the majority class
    (the blocking check) and labels text through pipeline("text-classification")."""
    from transformers import pipeline

    from largetrain_core.classification import load_classifier, pretrained_encoder

    cfg = yaml.safe_load((REPO / "configs" / "classifier_on_a_pretrained_encoder.yaml").read_text())["ops"]
    encoder = pretrained_encoder()  # the installed encoder: the config's path, relative to the repository root
    for op in ("tokenizer", "base_checkpoint"):
        assert (REPO / cfg[op]["config"]["pretrained_model"]).resolve() == encoder.resolve()
    done, _ = lab.run(
        "classifier_on_a_pretrained_encoder.yaml",
        {
            "domain__raw_corpus": {"path": str(tickets)},
            "tokenizer": {"pretrained_model": str(encoder)},
            "base_checkpoint": {"pretrained_model": str(encoder)},
            "lora_adapter": {
                "schedule": {"max_steps": 40, "warmup_steps": 4, "micro_batch_size": 16},
                "optimizer": {"learning_rate": 0.003},  # the file's (SMALL's 0.01 is for the tiny bases)
                "evaluation": {"eval_steps": 20},
                "checkpointing": {"save_steps": 20},
                "task_data": {"seq_len": 32},
            },
        },
    )
    assert done == documented_keys(REPO / "configs" / "classifier_on_a_pretrained_encoder.yaml")
    base = md(lab.instance, "base_checkpoint")
    assert 22_000_000 < base["parameters"] < 23_000_000  # all-MiniLM-L6-v2 with its pooler
    assert md(lab.instance, "tokenizer")["vocab_size"] == 30522  # BERT's uncased WordPiece
    lora = md(lab.instance, "lora_adapter")
    assert lora["task"] == "classification"
    assert lora["label_names"] == ["account", "billing", "shipping", "technical"]
    evaluation = json.loads((Path(lora["path"]) / "evaluation.json").read_text())
    assert lora["test_macro_f1"] > evaluation["majority"]["macro_f1"]
    model, tok = load_classifier(base["output"], Path(lora["path"]) / "adapter")
    assert model.config.model_type == "bert" and model.config.id2label == dict(enumerate(lora["label_names"]))
    (label,) = pipeline("text-classification", model=model, tokenizer=tok)(["I was charged twice for my order"])
    assert label["label"] in lora["label_names"]
