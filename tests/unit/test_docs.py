"""The documentation's commands are run: every code block of README.md and docs/ names the tests that run
it (tests/helpers/docblocks.py). This file checks that, that the links between the pages and their anchors
resolve, and runs the blocks that need no Dagster instance: the make targets (as a dry run: the targets
build the virtualenv and take minutes to an hour), the Spark settings (read by the executor resource
from the environment, as the code location reads them) and the multi-node commands (what
largetrain_core.launch generates; tests/integration/test_train.py runs a 2-node job from them).
tests/integration/test_docs_commands.py runs the CLI's commands and validates the run configs.
"""

import json
import re
import shlex
import subprocess
import sys


from helpers import docblocks
from helpers.docblocks import REPO, blocks, commands, documents, section_blocks


def test_every_code_block_names_the_test_that_runs_it():
    problems = []
    for doc in documents():
        for b in blocks(doc):
            if not b.lang:
                problems.append(f"{b}: a code block without a language (```sh, ```python, ```yaml; ```text for output)")
            if b.lang == "text":
                continue
            if not b.checked_by:
                problems.append(f"{b}: no '<!-- checked by tests/FILE.py::TEST -->' line above the block")
            for ref in b.checked_by:
                path, _, name = ref.partition("::")
                source = REPO / path
                if not source.is_file() or not re.search(rf"^def {re.escape(name)}\(", source.read_text(), re.M):
                    problems.append(f"{b}: {ref} is not a test function")
                elif doc not in source.read_text():
                    problems.append(f"{b}: {path} never reads {doc}")
    assert not problems, "\n".join(problems)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_links_between_the_pages_resolve():
    problems = []
    anchors = {}
    for doc in [*documents(), *docblocks.GENERATED]:
        text = re.sub(r"```.*?```", "", (REPO / doc).read_text(), flags=re.S)
        anchors[doc] = {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}
    for doc in documents():
        text = re.sub(r"```.*?```", "", (REPO / doc).read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (REPO / doc).parent / path if path else REPO / doc
            if not resolved.exists():
                problems.append(f"{doc}: link to {target}: no such file")
                continue
            rel = resolved.resolve().relative_to(REPO).as_posix()
            if anchor and anchor not in anchors.get(rel, set()):
                problems.append(f"{doc}: link to {target}: {rel} has no heading with the anchor #{anchor}")
    assert not problems, "\n".join(problems)


def test_make_targets():
    """README "Two commands" and "The lineage in the web UI", docs/guides/web-ui-and-cli.md: `make demo`,
    `make test` and `make dev`, and docs/guides/spark.md's `pip install -e '.[spark]'` (which `make test`
    runs), dry-run by make (-n: the commands printed, none run) in a copy of the Makefile without a
    virtualenv: each target reaches the command the docs say it runs."""
    documented = {
        c.split()[1]
        for doc, section in (
            ("README.md", "Two commands"),
            ("README.md", "The lineage in the web UI"),
            ("docs/guides/web-ui-and-cli.md", "The web UI"),
        )
        for b in section_blocks(doc, section, "sh")
        for c in commands(b)
    }
    assert documented == {"demo", "test", "dev"}
    expected = {  # what each target must run (README, docs/guides/web-ui-and-cli.md)
        "demo": ["scripts/fetch_corpora.sh", "-m largetrain_dagster.demo -c configs/demo.yaml -w workspace.yaml --log"],
        "test": ["scripts/install_system_deps.sh", "-m pip install -q -e '.[spark]'", "-m pytest"],
        "dev": ["dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000"],
    }
    for target in sorted(documented):
        r = subprocess.run(
            ["make", "-n", target, "VENV=/nonexistent-venv"], cwd=REPO, capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0, r.stderr
        for needle in expected[target]:
            assert needle in r.stdout, f"make {target} does not run {needle!r}:\n{r.stdout}"
    spark = section_blocks("docs/guides/spark.md", "Running on Spark", "sh")[0]
    assert "pip install -e '.[spark]'" in commands(spark)[0]


def test_spark_settings(monkeypatch):
    """docs/guides/spark.md: the environment of "Running on Spark" and the packed virtualenv's
    LARGETRAIN_SPARK_CONF of "Pointing it at an existing cluster", read by the executor resource as the code
    location reads them."""
    from largetrain_dagster.executor import DataExecutor

    settings = {}
    blocks_ = [
        *section_blocks("docs/guides/spark.md", "Running on Spark", "sh"),
        *section_blocks("docs/guides/spark.md", "Pointing it at an existing cluster", "sh"),
    ]
    for b in blocks_:
        for command in commands(b):
            for word in shlex.split(command):
                m = re.match(r"^(LARGETRAIN_[A-Z_]+)=(.*)$", word, re.S)
                if m:
                    settings.setdefault(m.group(1), []).append(m.group(2))
    assert set(settings) == {"LARGETRAIN_EXECUTOR", "LARGETRAIN_SPARK_MASTER", "LARGETRAIN_SPARK_CONF"}
    for conf in settings["LARGETRAIN_SPARK_CONF"]:
        monkeypatch.setenv("LARGETRAIN_EXECUTOR", settings["LARGETRAIN_EXECUTOR"][0])
        monkeypatch.setenv("LARGETRAIN_SPARK_MASTER", settings["LARGETRAIN_SPARK_MASTER"][0])
        monkeypatch.setenv("LARGETRAIN_SPARK_CONF", conf)
        executor = DataExecutor.from_env()
        assert (executor.name, executor.master) == ("spark", "local[*]")
        assert executor.conf == json.loads(conf) and executor.conf


def test_several_nodes_commands_are_what_launch_commands_generates():
    """docs/guides/training.md, "Several nodes": each command is what largetrain_core.launch.launch_commands
    generates for N nodes (static and c10d rendezvous, and the DeepSpeed launcher), with the doc's
    placeholders (node R of N, HOST0, CONFIG.json, 8 ranks per node) filled in."""
    from largetrain_core.launch import launch_commands

    (block,) = section_blocks("docs/guides/training.md", "Several nodes", "sh")
    static, c10d, ds = commands(block)
    fill = {"N": "3", "R": "1", "HOST0": "host0"}

    def filled(cmd: str) -> str:
        return re.sub(r"\b(N|R|HOST0)\b", lambda m: fill[m.group(1)], cmd)

    hosts = ["host0", "host1", "host2"]
    assert filled(static) == launch_commands("CONFIG.json", hosts, 8)["torchrun"][1]
    assert filled(c10d) == launch_commands("CONFIG.json", hosts, 8, rdzv_backend="c10d")["torchrun"][1]
    assert filled(ds) == launch_commands("CONFIG.json", hosts, 8)["deepspeed"]


def test_the_architecture_layout_is_the_tree():
    """docs/ARCHITECTURE.md's layout table lists every module of both packages with its docstring's first
    sentence, as scripts/architecture_layout.py generates it."""
    run = subprocess.run(
        [sys.executable, "scripts/architecture_layout.py", "--check"], cwd=REPO, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
