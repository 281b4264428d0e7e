"""The end-to-end tier: the browser against `dagster dev`, the whole lineage through Dagster, determinism
across runs, the recipes, PostgreSQL. Fixtures of every tier are in tests/conftest.py; this tier's own:
the whole lineage materialized once for the session (:func:`tiny_lineage`), for the tests that read it."""

from dataclasses import dataclass
from pathlib import Path

import pytest
from dagster import DagsterInstance

from helpers.corpora import copy_tiny_slice, corpus, tiny_run_config
from helpers.lineage import Runs, materialize_lineage
from largetrain_core.provenance import write_provenance
from largetrain_dagster.definitions import build_definitions, lineage_assets


@dataclass(frozen=True)
class Lineage:
    """One materialization of the whole lineage: its storage ``root``, the ``corpora`` it read, the
    ``instance`` that recorded it (ephemeral, open for the session) and the ``runs`` (one per data
    partition, then one for the rest)."""

    root: Path
    corpora: Path
    instance: DagsterInstance
    runs: Runs


@pytest.fixture(scope="session")
def tiny_lineage(tmp_path_factory) -> Lineage:
    """The whole lineage (lineage_assets: both corpus chains, tokenizer, shards, base model, adapter,
    evaluation) on the tiny slice of the real corpora (helpers.corpora.tiny_run_config), with 2 training
    ranks, materialized once for the session as the CLI does it (helpers.lineage). The slice is copied
    first (file times not kept) and the kernel docs' copy gets a provenance file, as `make corpora`
    writes one. Tests read it and never write into its root (they copy the root for that)."""
    corpus("linux-doc"), corpus("shakespeare")
    base = tmp_path_factory.mktemp("tiny_lineage")
    corpora = copy_tiny_slice(base / "corpora here", keep_times=False)
    write_provenance(corpora / "linux-doc" / "admin-guide", "linux-doc-6.1", registry="debian", version="6.1.192-3")
    root = base / "storage root"
    defs = build_definitions(root=str(root), nproc_per_node=2, wandb_mode="disabled")
    with DagsterInstance.ephemeral() as instance:
        runs = materialize_lineage(lineage_assets(), defs.resources, instance, tiny_run_config(corpora))
        assert runs.success, [
            e.event_specific_data.error.message for r in runs.results for e in r.all_events if e.is_step_failure
        ]
        yield Lineage(root, corpora, instance, runs)
