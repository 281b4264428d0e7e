"""The asset graph through Dagster and the CLI path (the whole lineage: tests/e2e/test_lineage.py).

Needs the real corpora (`make corpora`, which `make test` runs first); LARGETRAIN_ROOT/corpora or
./.largetrain/corpora.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance

from largetrain_dagster.definitions import build_definitions
from largetrain_dagster.resources import read_handle
from helpers import REPO
from helpers.corpora import CORPORA, corpus
from helpers.lineage import PARTITION_KEYS, materialize_lineage


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
