"""Stored artifacts through Dagster: the genome case (one 300,000-letter run) through every data stage,
damaged artifacts rebuilt instead of reused, damaged inputs and handles named, and the cancellation of
a tokenizer training in progress (issue 12, kinds 6, 7 and 8)."""

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from dagster import AssetKey, DagsterInstance

from helpers import REPO
from largetrain_core.storage import MANIFEST, verify_manifest
from largetrain_dagster.definitions import build_definitions, lineage_assets
from largetrain_dagster.resources import read_handle
from helpers.corpora import CORPORA, SHORT_RUN, corpus, tiny_run_config
from helpers.lineage import materialize_lineage

CHAIN = [
    "pretrain/raw_corpus",
    "pretrain/cleaned_text",
    "pretrain/deduplicated_text",
    "tokenizer",
    "pretrain/token_shards",
]
# what pretrain/filtered_text (the text of pretrain/token_shards) also needs: the relevance classifier, trained on
# the domain text (a few plays), and the evaluation sets; no relevance cut is set, so every genome document stays
FILTER_INPUTS = [
    "domain/raw_corpus",
    "domain/cleaned_text",
    "domain/deduplicated_text",
    "relevance_classifier",
    "evaluation_sets",
    "pretrain/filtered_text",
]
RULES_OFF = {
    k: None
    for k in (
        "min_words",
        "max_words",
        "min_mean_word_length",
        "max_mean_word_length",
        "max_hash_word_ratio",
        "max_ellipsis_word_ratio",
        "max_bullet_lines_ratio",
        "max_ellipsis_lines_ratio",
        "min_alpha_word_fraction",
        "min_stop_words",
    )
}


def run_config(cases: Path, **tokenizer) -> dict:
    """The genome case as the pretraining corpus, every quality rule off (the long run reaches the
    tokenizer whatever the rules say), a 300-id BPE and 64-token sequences."""
    return {
        "ops": {
            "pretrain__raw_corpus": {"config": {"path": str(cases / "genome_sequence.jsonl"), "id_field": "id"}},
            "pretrain__cleaned_text": {"config": RULES_OFF},
            "tokenizer": {"config": {"vocab_size": 300, **tokenizer}},
            "pretrain__token_shards": {"config": {"seq_len": 64, "validation_fraction": 0.25}},
            "domain__raw_corpus": tiny_run_config(CORPORA)["ops"]["domain__raw_corpus"],
        }
    }


def metadata(result, node: str) -> dict:
    (mat,) = result.asset_materializations_for_node(node)
    return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}


@pytest.fixture(scope="module")
def genome(tmp_path_factory):
    """The genome case materialized through raw corpus, cleaned and deduplicated text, tokenizer and shards."""
    from helpers import CASES

    corpus("shakespeare")
    root = tmp_path_factory.mktemp("genome") / "root"
    defs = build_definitions(root=str(root), nproc_per_node=1, wandb_mode="disabled")
    with DagsterInstance.ephemeral() as instance:
        result = materialize_lineage(
            lineage_assets(), defs.resources, instance, run_config(CASES), CHAIN + FILTER_INPUTS
        )
    assert result.success
    return root, defs, result


def rematerialize(defs, keys: list[str], **kw):
    from helpers import CASES

    with DagsterInstance.ephemeral() as instance:
        return materialize_lineage(lineage_assets(), defs.resources, instance, run_config(CASES), keys, **kw)


def handle(root: Path, *key: str) -> dict:
    return read_handle(root, AssetKey(list(key)))


def test_genome_case_through_every_data_stage(genome):
    root, _, result = genome
    dedup = metadata(result, "pretrain__deduplicated_text")
    assert dedup["documents_input"] == dedup["documents_kept"] == 4
    tok = metadata(result, "tokenizer")
    # the one 300,000-letter run was cut before BPE training, and counted
    assert (tok["long_runs_split"], tok["documents"], tok["max_pretoken_chars"]) == (1, 4, 1000)
    assert tok["reused"] is False and "rebuilt_because" not in tok
    shards = metadata(result, "pretrain__token_shards")
    assert shards["total_tokens"] > 0 and shards["train_documents"] + shards["validation_documents"] == 4
    for key in CHAIN[2:]:  # every output directory carries a manifest that its files match
        path = Path(handle(root, *key.split("/"))["path"])
        assert (path / MANIFEST).exists() and verify_manifest(path) == []


def damage_tokenizer_json(root):
    path = Path(handle(root, "tokenizer")["path"]) / "tokenizer.json"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def damage_stats_json(root):  # an edit of the same size
    path = Path(handle(root, "pretrain", "token_shards")["path"]) / "stats.json"
    path.write_text(path.read_text().replace('"dtype": "uint16"', '"dtype": "uint32"'))
    return path


def delete_shard(root):
    d = Path(handle(root, "pretrain", "token_shards")["path"])
    path = d / json.loads((d / "manifest.json").read_text())["splits"]["train"]["shards"][0]["file"]
    path.unlink()
    return path


@pytest.mark.parametrize(
    "damage,key",
    [
        (damage_tokenizer_json, "tokenizer"),
        (damage_stats_json, "pretrain/token_shards"),
        (delete_shard, "pretrain/token_shards"),
    ],
)
def test_damaged_artifact_is_rebuilt_never_reused(genome, damage, key):
    root, defs, _ = genome
    before = handle(root, *key.split("/"))
    damaged = damage(root)
    result = rematerialize(defs, [key])
    assert result.success
    md = metadata(result, key.replace("/", "__"))
    assert md["reused"] is False
    assert str(damaged) in md["rebuilt_because"]
    after = handle(root, *key.split("/"))
    assert after["path"] == before["path"] and verify_manifest(Path(after["path"])) == []
    # the rebuilt directory holds what the first build wrote, and is reused from now on
    assert {k: v for k, v in after["stats"].items() if k not in ("seconds", "rebuilt_because")} == {
        k: v for k, v in before["stats"].items() if k != "seconds"
    }
    assert metadata(rematerialize(defs, [key]), key.replace("/", "__"))["reused"] is True


def test_damaged_training_output_is_trained_again(genome):
    """base_checkpoint (one rank, a few steps): reused while intact; with model.safetensors cut short
    the next materialization trains again (resuming from its last checkpoint), never ``reused: true``.
    A run config written before the sections (every setting at the top level) trains the same: its
    settings are moved into their sections with a WARNING, and its data version is the sectioned one's."""
    from largetrain_core.model import load_model

    root, defs, _ = genome  # one training rank
    train = {
        "model": {"preset": "llama-tiny"},
        "schedule": {"max_steps": 4, "warmup_steps": 1, "micro_batch_size": 2},
        "checkpointing": {"save_steps": 4},
        "tracking": {"logging_steps": 2},
        "parallelism": {"zero_stage": 1},
        **SHORT_RUN,
    }
    flat = {
        "preset": "llama-tiny",
        "max_steps": 4,
        "warmup_steps": 1,
        "micro_batch_size": 2,
        "save_steps": 4,
        "logging_steps": 2,
        "zero_stage": 1,
        **SHORT_RUN["health"],
    }

    def materialize_base(config=train):
        from helpers import CASES

        cfg = run_config(CASES)
        cfg["ops"]["base_checkpoint"] = {"config": config}
        with DagsterInstance.ephemeral() as instance:
            result = materialize_lineage(lineage_assets(), defs.resources, instance, cfg, ["base_checkpoint"])
            logged = [e.user_message for e in instance.all_logs(result.run_id) if e.level >= logging.WARNING]
        assert result.success
        return {**metadata(result, "base_checkpoint"), "warnings": logged}

    first = materialize_base(flat)
    moved = [m for m in first["warnings"] if "settings written without their sections" in m]
    assert (
        moved and "max_steps -> schedule.max_steps" in moved[0] and "zero_stage -> parallelism.zero_stage" in moved[0]
    )
    again = materialize_base()
    assert first["reused"] is False and again["reused"] is True and again["data_version"] == first["data_version"]
    assert not any("without their sections" in m for m in again["warnings"])
    weights = Path(first["output"]) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    again = materialize_base()
    assert again["reused"] is False and str(weights) in again["rebuilt_because"]
    assert load_model(Path(again["output"])).config.vocab_size == 300
    assert materialize_base()["reused"] is True


def test_damaged_input_fails_its_consumer_naming_the_file(genome):
    root, defs, _ = genome
    damaged = damage_tokenizer_json(root)
    result = rematerialize(defs, ["pretrain/token_shards"], raise_on_error=False)
    assert not result.success
    (failure,) = [e for e in result.last.all_events if e.is_step_failure]
    message = str(failure.step_failure_data.error)
    assert str(damaged) in message and "Re-materialize tokenizer" in message
    assert rematerialize(defs, ["tokenizer"]).success  # restored for the other tests


def test_truncated_handle_is_named(genome):
    root, defs, _ = genome
    path = root / "_handles" / "tokenizer.json"
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    try:
        result = rematerialize(defs, ["pretrain/token_shards"], raise_on_error=False)
        (failure,) = [e for e in result.last.all_events if e.is_step_failure]
        assert f"{path}: not a valid handle of tokenizer" in str(failure.step_failure_data.error)
    finally:
        path.write_text(text)


def _processes_with(marker: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if d.name.isdigit() and marker in cmd and state != "Z":
            out.append(int(d.name))
    return out


def test_interrupting_a_tokenizer_materialization_ends_its_training(genome, tmp_path):
    """``dagster asset materialize`` of the tokenizer without the cut (minutes of BPE training on the
    genome run), interrupted as Ctrl-C does once the training process runs: Dagster's interrupt reaches
    the asset, and the training process is gone when the command has ended."""
    from helpers import CASES

    root, _, _ = genome
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    cfg = tmp_path / "run.yaml"
    ops = run_config(CASES, vocab_size=8192, max_pretoken_chars=10**9)["ops"]
    cfg.write_text(yaml.safe_dump({"ops": {"tokenizer": ops["tokenizer"]}}))
    env = {**os.environ, "LARGETRAIN_ROOT": str(root), "DAGSTER_HOME": str(home)}
    dagster = str(Path(sys.executable).with_name("dagster"))
    proc = subprocess.Popen(
        [
            dagster,
            "asset",
            "materialize",
            "-m",
            "largetrain_dagster.definitions",
            "--select",
            "tokenizer",
            "-c",
            str(cfg),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    marker = f"largetrain_core.tokenizer {root}"  # the training child's command line: its output lies under root
    try:
        deadline = time.monotonic() + 300
        while not _processes_with(marker) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _processes_with(marker), f"the BPE training process never started:\n{proc.communicate()[0][-3000:]}"
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0 and "DagsterExecutionInterruptedError" in output, output[-3000:]
    assert not _processes_with(marker), "the BPE training process outlived the interrupted run"
    assert not list((root / "tokenizer").glob(".tmp-*")), "the interrupted build left its temporary directory"
