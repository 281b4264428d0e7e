"""Dagster's current CLI, dg (dagster-dg-cli), on the project as pyproject.toml's [tool.dg] declares it:
`dg list defs --json` lists exactly the definitions of largetrain_dagster.definitions.defs, and
`dg check defs` (run by .ci/run beside `dagster definitions validate`) loads them without error."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO

DG = Path(sys.executable).parent / "dg"


@pytest.fixture
def dg_env(tmp_path) -> dict:
    """A throwaway instance (the repository's dagster.yaml), storage root and no W&B, as .ci/run sets them."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    return {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "LARGETRAIN_ROOT": str(tmp_path / "root"),
        "LARGETRAIN_WANDB_MODE": "disabled",
    }


def dg(args: list[str], env: dict) -> subprocess.CompletedProcess:
    assert DG.is_file(), f"{DG}: dagster-dg-cli is not installed (pip install -e '.[dev]')"
    r = subprocess.run([str(DG), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def test_dg_list_defs_lists_the_code_locations_definitions(dg_env):
    from largetrain_dagster.definitions import defs

    listed = json.loads(dg(["list", "defs", "--json"], dg_env).stdout)
    graph = defs.resolve_asset_graph()
    assets = sorted(tuple(a["asset_key_parts"]) for a in listed["assets"])
    assert assets == sorted(tuple(k.path) for k in graph.get_all_asset_keys())
    checks = sorted((tuple(c["asset_key"].split("/")), c["name"]) for c in listed["asset_checks"])
    assert checks == sorted((tuple(k.asset_key.path), k.name) for k in graph.asset_check_keys)
    assert sorted(j["name"] for j in listed["jobs"]) == sorted(j.name for j in defs.jobs)
    assert sorted(s["name"] for s in listed["schedules"]) == sorted(s.name for s in defs.schedules)
    assert sorted(s["name"] for s in listed["sensors"]) == sorted(s.name for s in defs.sensors)
    assert sorted(r["name"] for r in listed["resources"]) == sorted(defs.resources)
    # the counts dg reports, from the definitions (not written down here: the code location grows)
    assert [len(listed[k]) for k in ("assets", "asset_checks", "jobs", "schedules", "sensors")] == [
        len(graph.get_all_asset_keys()),
        len(graph.asset_check_keys),
        len(defs.jobs),
        len(defs.schedules),
        len(defs.sensors),
    ]
    assert ("lora_adapter",) in assets and (("lora_adapter",), "beats_majority_baseline") in checks


def test_dg_check_defs_loads_the_definitions(dg_env):
    r = dg(["check", "defs"], dg_env)
    assert "All definitions loaded successfully." in r.stdout + r.stderr
