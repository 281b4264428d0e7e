"""Two runs of one partition at once (tests/cases README, "two runs of one partition"; issue 23, item
5): two CLI runs materializing raw_corpus + cleaned_text of the same partition, started at the same
moment, both succeed; a committed version directory is never replaced under a reader."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from dagster import AssetKey

from helpers import REPO
from largetrain_dagster.resources import read_handle

DAGSTER = str(Path(sys.executable).with_name("dagster"))


def _corpus(path: Path, documents: int = 30_000) -> None:
    """A JSONL corpus big enough that reading and cleaning take seconds, so the two runs overlap."""
    words = (
        "the a river small house green field market road station morning train quiet garden red barn village".split()
    )
    with open(path, "w") as f:
        for i in range(documents):
            text = " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(60 + i % 40)) + f". Record {i}."
            f.write(json.dumps({"id": f"r{i}", "text": text}) + "\n")


def _watch(root: Path, seen: dict, stop: threading.Event) -> None:
    """Record the inode of every committed version directory of both steps as long as the runs last."""
    while not stop.is_set():
        for d in root.glob("domain/*/000/*"):
            if not d.name.startswith("."):
                try:
                    seen.setdefault(str(d), set()).add(d.stat().st_ino)
                except FileNotFoundError:
                    seen.setdefault(str(d), set()).add(None)  # it vanished: a reader would fail here
        time.sleep(0.02)


def test_two_runs_of_one_partition_at_once_both_succeed_on_local_disk(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    _corpus(corpus)
    root = tmp_path / "root"
    env = {
        **os.environ,
        "LARGETRAIN_ROOT": str(root),
        "DAGSTER_HOME": str(tmp_path / "home"),
        "LARGETRAIN_DATA_PARTITIONS": "1",
        "PYTHONPATH": str(REPO),
    }
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        json.dumps(
            {
                "ops": {
                    "domain__raw_corpus": {"config": {"path": str(corpus)}},
                    "domain__cleaned_text": {"config": {"gopher_quality": False, "c4": False}},
                }
            }
        )
    )
    # the instance exists already, as after `make demo` (two CLIs creating one SQLite store at once race in Dagster)
    subprocess.run([DAGSTER, "instance", "migrate"], cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
    cmd = [
        DAGSTER,
        "asset",
        "materialize",
        "-m",
        "largetrain_dagster.definitions",
        "--select",
        "domain/raw_corpus,domain/cleaned_text",
        "--partition",
        "000",
        "-c",
        str(cfg),
    ]
    seen: dict = {}
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(root, seen, stop), daemon=True)
    watcher.start()
    logs = [open(tmp_path / f"run{i}.log", "w") for i in range(2)]  # noqa: SIM115 (closed below)
    try:
        procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT) for log in logs]
        codes = [p.wait(timeout=900) for p in procs]
    finally:
        stop.set()
        watcher.join(5)
        for log in logs:
            log.close()
    out = [(tmp_path / f"run{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], "\n=====\n".join(o[-3000:] for o in out)
    assert all("RUN_SUCCESS" in o for o in out)
    assert "FileNotFoundError" not in out[0] + out[1]
    # one version per step, each directory the same one from its commit to the end
    assert len(seen) == 2 and all(len(inodes) == 1 and None not in inodes for inodes in seen.values()), seen
    # each step was built by one run and reused by the other (the later to finish discards its result)
    said = [
        o.count("reusing that one, this run's identical result discarded") + o.count("matches its manifest")
        for o in out
    ]
    assert sum(said) == 2, said
    handle = read_handle(root, AssetKey(["domain", "cleaned_text"]), "000")
    assert handle["stats"]["input"] == 30_000 and str(Path(handle["path"])) in seen
