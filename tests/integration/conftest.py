"""Fixtures of the integration tier (Dagster materializations, DeepSpeed, Spark, PostgreSQL, the S3 API
server): tiny real token shards for the trainings, a root holding the pretraining token shards of the tiny
run config, the uninterrupted run the resume tests compare with, and a real S3 API server on 127.0.0.1."""

import shutil
from pathlib import Path

import numpy as np
import pytest
from filelock import FileLock

from helpers.training import SENTENCES, resume_config, torchrun
from largetrain_core.shards import build_token_shards
from largetrain_core.storage import write_manifest
from largetrain_core.tokenizer import train_bpe


def built_once(tmp_path_factory, worker_id: str, name: str, build) -> Path:
    """``build(directory)`` run once for the whole pytest run, by whichever xdist worker asks first, the
    others waiting on a lock and then reading what it wrote: the directory of this run shared by every
    worker (the parent of each worker's base temp), or the base temp without xdist. A build that failed
    is run again by the next one to ask."""
    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        shared = shared.parent
    out, done = shared / name, shared / f"{name}.done"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            build(out)
            done.touch()
    return out


@pytest.fixture(scope="session")
def shards(tmp_path_factory, worker_id) -> Path:
    """Tiny real token shards: a BPE trained on repetitive sentences, seq_len 32, built once for every
    worker (:func:`built_once`). Shared: tests only read them."""
    return built_once(tmp_path_factory, worker_id, "train_data", _build_shards) / "shards"


def _build_shards(root: Path) -> None:
    import polars as pl

    docs = root / "docs"
    docs.mkdir()
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.permutation(SENTENCES)) for _ in range(60)]
    pl.DataFrame({"doc_id": [f"d{i}" for i in range(60)], "source": ["t"] * 60, "text": texts}).write_parquet(
        docs / "part-00000.parquet"
    )
    train_bpe([texts], 320, root / "tok")
    out = root / "shards"
    out.mkdir()
    build_token_shards(docs, root / "tok", out, seq_len=32, validation_fraction=0.1)


@pytest.fixture
def pretrain_root(tmp_path_factory, worker_id, tmp_path) -> Path:
    """``tmp_path / "root"``: a root holding the assets of helpers.corpora.PRETRAIN_SHARDS_KEYS materialized
    through Dagster with the tiny run config's ops (a few linux-doc files), as the training tests' first run
    made them; built once for every worker (:func:`built_once`) and copied for each test (a root's handles
    hold paths relative to it), so that a test's trainings find their inputs by the root's handles alone, as
    a run of `dagster asset materialize --select base_checkpoint` does."""
    shared = built_once(tmp_path_factory, worker_id, "pretrain_root", _build_pretrain_root)
    return Path(shutil.copytree(shared, tmp_path / "root", symlinks=True))


def _build_pretrain_root(root: Path) -> None:
    from dagster import DagsterInstance

    from helpers.corpora import CORPORA, PRETRAIN_SHARDS_KEYS, corpus, pretrain_shards_ops
    from helpers.lineage import materialize_lineage
    from largetrain_dagster.definitions import build_definitions, lineage_assets

    corpus("linux-doc")
    defs = build_definitions(root=str(root), nproc_per_node=1, wandb_mode="disabled", report_to=[])
    with DagsterInstance.ephemeral() as instance:
        ops = {"ops": pretrain_shards_ops(CORPORA)}
        assert materialize_lineage(lineage_assets(), defs.resources, instance, ops, PRETRAIN_SHARDS_KEYS).success


@pytest.fixture(scope="session")
def uninterrupted(shards, tmp_path_factory, worker_id) -> Path:
    """The output directory of helpers.training.resume_config run once, start to end, on 2 ranks on local
    disk: the reference the resume tests compare with (their losses, grad norms and weights), read by the
    tests of several files and never written; built once for every worker (:func:`built_once`)."""

    def build(tmp: Path) -> None:
        torchrun(resume_config(tmp / "uninterrupted", shards), tmp)

    return built_once(tmp_path_factory, worker_id, "uninterrupted", build) / "uninterrupted"


@pytest.fixture
def tiny_shards(tmp_path, bpe_dir, sentences) -> Path:
    """Token shards of seq_len 32 over the session's BPE (60 documents of the shared sentences), sealed with
    a manifest as the token_shards asset seals its directory (the IO manager verifies it on load)."""
    import polars as pl

    docs = tmp_path / "docs"
    docs.mkdir()
    texts = [" ".join(sentences[i : i + 12]) for i in range(0, 240, 4)]
    pl.DataFrame(
        {"doc_id": [f"d{i}" for i in range(len(texts))], "source": ["t"] * len(texts), "text": texts}
    ).write_parquet(docs / "part-00000.parquet")
    out = tmp_path / "shards"
    out.mkdir()
    build_token_shards(docs, bpe_dir, out, seq_len=32, validation_fraction=0.1)
    write_manifest(out)  # as the token_shards asset seals its directory: the IO manager verifies it on load
    return out
