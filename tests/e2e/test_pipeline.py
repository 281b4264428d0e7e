"""The whole asset graph through Dagster on a tiny real slice of both corpora, and the CLI path.

Needs the real corpora (`make corpora`, which `make test` runs first); LARGETRAIN_ROOT/corpora or
./.largetrain/corpora.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dagster import AssetKey, DagsterInstance

from largetrain_dagster.definitions import build_definitions, lineage_assets
from largetrain_dagster.resources import read_handle
from helpers import REPO
from helpers.corpora import CORPORA, corpus, tiny_run_config
from helpers.lineage import PARTITION_KEYS, materialize_lineage


def test_whole_lineage_materializes(tiny_lineage, tmp_path):
    """The session's lineage (tests/e2e/conftest.py): every asset and partition, the counts, the checks,
    the model and adapter loadable; materialized again, every artifact is reused."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    root, instance, result = tiny_lineage.root, tiny_lineage.instance, tiny_lineage.runs
    assert len(result.results) == len(PARTITION_KEYS) + 1  # one run per data partition, then the rest
    keys = {k.to_user_string() for k in instance.get_asset_keys()}
    for name in ("raw_corpus", "cleaned_text", "deduplicated_text", "token_shards"):
        assert {f"pretrain/{name}", f"domain/{name}"} <= keys
    assert {"tokenizer", "base_checkpoint", "lora_adapter", "evaluation"} <= keys

    def md(*key):
        ev = instance.get_latest_materialization_event(AssetKey(list(key)))
        return {k: getattr(v, "value", v) for k, v in ev.asset_materialization.metadata.items()}

    # every data partition of both chains materialized, and the global step read them all
    for key in ("pretrain/raw_corpus", "pretrain/cleaned_text", "domain/raw_corpus", "domain/cleaned_text"):
        assert instance.get_materialized_partitions(AssetKey.from_user_string(key)) == set(PARTITION_KEYS)
    dedup = md("pretrain", "deduplicated_text")
    assert dedup["partitions"] == len(PARTITION_KEYS)
    read = [m.metadata["documents"].value for m in result.asset_materializations_for_node("pretrain__raw_corpus")]
    assert len(read) == len(PARTITION_KEYS) and sum(read) == dedup["documents_input"] == 40
    assert (
        dedup["documents_kept"]
        + dedup["documents_filtered"]
        + dedup["documents_duplicate"]
        + dedup["documents_rejected"]
        == 40
    )
    plays = sum(m.metadata["documents"].value for m in result.asset_materializations_for_node("domain__raw_corpus"))
    assert 1 <= plays <= len(PARTITION_KEYS) and md("domain", "deduplicated_text")["documents_kept"] == plays
    base = md("base_checkpoint")
    assert base["steps"] == 12 and base["precision"] == "fp32" and base["last_loss"] < base["first_loss"]
    checks = {(e.asset_key.to_user_string(), e.check_name): e.passed for e in result.get_asset_check_evaluations()}
    assert checks[("pretrain/deduplicated_text", "accounting")]
    assert checks[("domain/token_shards", "token_ids_below_vocab")]
    assert checks[("base_checkpoint", "loss_finite_and_decreasing")]
    assert checks[("evaluation", "adapter_beats_base_on_domain")]  # blocking: the run would have failed
    ev = md("evaluation")
    assert all(ev[k] > 1 for k in ("base_pretrain_perplexity", "base_domain_perplexity", "adapter_domain_perplexity"))
    # read by people: a percentage, and the generations as verbatim text blocks, one per prompt and model
    cut = 100 * (1 - ev["adapter_domain_perplexity"] / ev["base_domain_perplexity"])
    assert (
        0 < ev["adapter_domain_perplexity_reduction_percent"] < 100
        and abs(ev["adapter_domain_perplexity_reduction_percent"] - cut) < 0.1
    )
    assert ev["sample_generations"].count("```text\n") == 3 * 3 and "Prompt 3" in ev["sample_generations"]
    # lm-evaluation-harness on the cloze over the held-out plays: a score with its stderr for both models
    for model in ("base", "adapter"):
        assert 0 <= ev[f"lm_eval/{model}/domain_cloze/acc"] <= 1 and ev[f"lm_eval/{model}/domain_cloze/acc_stderr"] > 0
    assert "| domain_cloze | acc |" in ev["benchmark_results"]

    base_dir = Path(base["output"])
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    adapter_dir = Path(md_lora_output(root))
    tuned = PeftModel.from_pretrained(model, adapter_dir)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.isfinite(tuned(ids).logits).all()

    # Materializing again with the same config and inputs reuses every artifact (same data versions); in a
    # copy of the root, which the session's lineage must keep as it is
    again_root = tmp_path / "root"
    shutil.copytree(root, again_root, symlinks=True)
    defs = build_definitions(root=str(again_root), nproc_per_node=2, wandb_mode="disabled")
    with DagsterInstance.ephemeral() as instance:
        again = materialize_lineage(lineage_assets(), defs.resources, instance, tiny_run_config(tiny_lineage.corpora))
        assert again.success
        reused = [m.metadata["reused"].value for m in again.asset_materializations_for_node("base_checkpoint")]
        assert reused == [True]


def md_lora_output(root: Path) -> str:
    return read_handle(root, AssetKey("lora_adapter"))["stats"]["output"]


def test_cli_validate_and_materialize_subset(tmp_path):
    corpus("shakespeare")
    env = {**os.environ, "LARGETRAIN_ROOT": str(tmp_path / "root"), "DAGSTER_HOME": str(tmp_path / "home")}
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    dagster = str(Path(sys.executable).with_name("dagster"))
    v = subprocess.run(
        [dagster, "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert v.returncode == 0, v.stderr[-3000:]
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        json.dumps(
            {"ops": {"domain__raw_corpus": {"config": {"path": str(CORPORA / "shakespeare"), "max_documents": 3}}}}
        )
    )
    m = subprocess.run(
        [
            dagster,
            "asset",
            "materialize",
            "-m",
            "largetrain_dagster.definitions",
            "--select",
            "domain/raw_corpus,domain/cleaned_text",
            "--partition",
            PARTITION_KEYS[0],
            "-c",
            str(cfg),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert m.returncode == 0, m.stderr[-3000:]
    assert "RUN_SUCCESS" in m.stderr + m.stdout
    handle = read_handle(tmp_path / "root", AssetKey(["domain", "cleaned_text"]), PARTITION_KEYS[0])
    assert 1 <= handle["stats"]["input"] <= 3
    assert Path(handle["path"]).is_dir()


def test_data_partition_keys_and_bad_counts():
    from largetrain_dagster.partitions import data_partitions

    assert data_partitions("3").get_partition_keys() == ["000", "001", "002"]
    keys = data_partitions(1500).get_partition_keys()
    assert (keys[0], keys[-1], len(keys)) == ("0000", "1499", 1500)  # sortable: one width for all keys
    for bad in ("0", "-2", "abc", ""):
        with pytest.raises(ValueError, match="LARGETRAIN_DATA_PARTITIONS must be an integer >= 1"):
            data_partitions(bad)


def test_rejected_share_counts_every_record_read_and_a_changed_partition_count_fails(tmp_path, monkeypatch):
    """max_rejected_fraction is a share of the records read (subsetting does not inflate it); the global
    step refuses partitions made under another LARGETRAIN_DATA_PARTITIONS instead of losing their files."""
    from largetrain_dagster import partitions
    from largetrain_dagster.corpus import corpus_assets
    from largetrain_dagster.partitions import data_partitions

    src = tmp_path / "corpus"
    src.mkdir()
    for i in range(99):
        (src / f"doc{i:02d}.txt").write_text(f"the document {i} and a few words in it\n")  # 2 stop words
    (src / "bad.txt").write_bytes(b"not utf-8 \xff\n")  # 1 of 100 records rejected: under the 5% limit
    defs = build_definitions(root=str(tmp_path / "root"), wandb_mode="disabled")
    ops = {
        "domain__raw_corpus": {"config": {"path": str(src), "sample_fraction": 0.1}},
        "domain__cleaned_text": {"config": {"min_words": 1}},
    }
    with DagsterInstance.ephemeral() as instance:
        result = materialize_lineage(corpus_assets("domain")[:3], defs.resources, instance, {"ops": ops})
        assert result.success  # a 10% sample keeps ~10 documents; the one rejected record is still 1 of 100
        md = result.asset_materializations_for_node("domain__deduplicated_text")[0].metadata
        assert md["documents_rejected"].value == 1 and md["partitions"].value == len(PARTITION_KEYS)

        # the deployment now says 2 partitions: partitions 000 and 001 hold a 4-way split of the files
        monkeypatch.setattr(partitions, "DATA_PARTITIONS", data_partitions(2))
        again = materialize_lineage(
            corpus_assets("domain")[:3],
            defs.resources,
            instance,
            {"ops": ops},
            ["domain/deduplicated_text"],
            raise_on_error=False,
        )
        assert not again.success
        errors = [e.event_specific_data.error.message for e in again.last.all_events if e.is_step_failure]
        assert any("was made as partition 0 of 4, but LARGETRAIN_DATA_PARTITIONS is now 2" in m for m in errors), errors
