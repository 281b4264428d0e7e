"""Shared fixtures for the core tests: the input cases in tests/cases and small real tokenizers."""

import itertools
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

CASES = Path(__file__).resolve().parent / "cases"


@pytest.fixture
def cases() -> Path:
    """Inputs that broke pipelines like ours (tests/cases; README.md there gives each one's right result)."""
    return CASES


@pytest.fixture
def make_word_tokenizer():
    """Factory: a WordLevel tokenizer (whitespace split) with ``vocab`` (list: ids 0.. in order, or dict),
    then ``specials`` added as special tokens; saved to ``out_dir/tokenizer.json`` with an optional
    tokenizer_config.json. Returns the directory."""

    def make(out_dir: Path, vocab, specials=("<|endoftext|>",), config: dict | None = None) -> Path:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        ids = vocab if isinstance(vocab, dict) else {w: i for i, w in enumerate(vocab)}
        tok = Tokenizer(models.WordLevel(ids, unk_token="<unk-not-in-vocab>"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        if specials:
            tok.add_special_tokens(list(specials))
        tok.save(str(out_dir / "tokenizer.json"))
        if config is not None:
            (out_dir / "tokenizer_config.json").write_text(json.dumps(config))
        return out_dir

    return make


def english_sentences(n: int = 300) -> list[str]:
    """``n`` short, distinct, deterministic English sentences."""
    subjects = ["The cat", "A dog", "My sister", "The old man", "Our teacher", "The farmer"]
    verbs = ["walks to", "looks at", "talks about", "runs past", "waits for"]
    objects = ["the river", "a small house", "the green field", "the market", "an empty road",
               "the station", "the morning train", "a quiet garden", "the red barn", "the village"]
    out = [f"{s} {v} {o}." for s, v, o in itertools.product(subjects, verbs, objects)]
    assert len(out) >= n
    return out[:n]


@pytest.fixture(scope="session")
def bpe_dir(tmp_path_factory) -> Path:
    """A byte-level BPE of 300 ids trained once per session by largetrain_core.tokenizer.train_bpe."""
    from largetrain_core.tokenizer import train_bpe

    out = tmp_path_factory.mktemp("bpe")
    sents = english_sentences(300)
    train_bpe([sents[i:i + 50] for i in range(0, len(sents), 50)], 300, out)
    return out


@pytest.fixture
def sentences() -> list[str]:
    return english_sentences(300)


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 API server (moto's standalone server) on 127.0.0.1 for the session, in its own process.

    While it runs, the standard variables point every S3 client at it: AWS_ENDPOINT_URL (read by
    boto3 and by largetrain_core.fs), test credentials in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY,
    AWS_DEFAULT_REGION. Yields the endpoint URL; the server is stopped and the variables restored after."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto server did not start on {endpoint} (exit {proc.poll()})")
            time.sleep(0.2)
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing-key-id",
           "AWS_SECRET_ACCESS_KEY": "testing-secret-key", "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in [*env, "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"]}
    for k in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        os.environ.pop(k, None)
    os.environ.update(env)
    try:
        yield endpoint
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def s3_bucket(s3_server, request) -> str:
    """A new, empty bucket on :func:`s3_server`, named after the test; returns ``s3://<bucket>``."""
    import re

    import fsspec

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-") + f"-{abs(hash(request.node.nodeid)) % 10**6}"
    fs = fsspec.filesystem("s3", endpoint_url=s3_server, skip_instance_cache=True)
    fs.mkdir(name)
    return f"s3://{name}"


# Test tiers (docs/ARCHITECTURE.md, Tests): ``unit`` runs core functions on tiny inputs in seconds
# (`make test-fast`); ``e2e`` drives a browser, the whole lineage or determinism across runs;
# everything else, and any new file until it is listed, is ``integration`` (Dagster
# materializations, DeepSpeed, Spark, PostgreSQL, the S3 server). Selected with ``-m unit`` etc.
TIERS = {
    "unit": {"test_clean.py", "test_config_reference.py", "test_dedup.py", "test_fs.py", "test_loaders.py",
             "test_model_card.py", "test_prep.py", "test_storage.py"},
    "e2e": {"test_webserver.py", "test_determinism.py", "test_pipeline.py", "test_recipes.py",
            "test_lineage_versions.py", "test_postgres.py"},
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.path.name
        tier = next((t for t, files in TIERS.items() if name in files), "integration")
        item.add_marker(getattr(pytest.mark, tier))
