"""Fixtures of the integration tier (Dagster materializations, DeepSpeed, Spark, PostgreSQL, the S3 API
server): tiny real token shards for the trainings, the uninterrupted run the resume tests compare with,
and a real S3 API server on 127.0.0.1."""

from pathlib import Path

import numpy as np
import pytest

from helpers.training import SENTENCES, resume_config, torchrun
from largetrain_core.shards import build_token_shards
from largetrain_core.storage import write_manifest
from largetrain_core.tokenizer import train_bpe


@pytest.fixture(scope="session")
def shards(tmp_path_factory) -> Path:
    """Tiny real token shards: a BPE trained on repetitive sentences, seq_len 32. Shared: tests only read them."""
    import polars as pl

    root = tmp_path_factory.mktemp("train_data")
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
    return out


@pytest.fixture(scope="session")
def uninterrupted(shards, tmp_path_factory) -> Path:
    """The output directory of helpers.training.resume_config run once, start to end, on 2 ranks on local
    disk: the reference the resume tests compare with (their losses, grad norms and weights), read by the
    tests of several files and never written."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    torchrun(resume_config(tmp / "uninterrupted", shards), tmp)
    return tmp / "uninterrupted"


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
