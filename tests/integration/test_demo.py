"""``make demo``'s driver on its own (largetrain_dagster.demo without ``--url``): it starts ``dagster dev`` on
127.0.0.1 for a fresh instance, submits one prepare_partitions run through Dagster's GraphQL client, follows
its event log on the terminal, and stops the server's whole process group when it is done. The run is the
code location's (its remote origin names the ``largetrain`` location), and nothing of the server is left.
tests/e2e/test_webserver.py runs the driver against a running server (``--url``) and checks the web UI's view.
"""

import json
import os
import re
import shutil
import subprocess
import sys

from dagster import DagsterInstance, DagsterRunStatus

from helpers import REPO, TICKETS
from helpers.processes import processes_mentioning
from largetrain_dagster.partitions import DATA_PARTITIONS


def test_demo_starts_dagster_dev_submits_the_run_and_stops_the_server(tmp_path):
    home, root = tmp_path / "home", tmp_path / "root"
    home.mkdir(), root.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    config = tmp_path / "demo.yaml"
    rules_off = {"gopher_quality": False, "gopher_repetition": False, "c4": False}  # short records
    config.write_text(
        json.dumps(
            {
                "ops": {
                    **{
                        f"{role}__raw_corpus": {"config": {"path": str(TICKETS), "max_documents": 20}}
                        for role in ("pretrain", "domain")
                    },
                    **{f"{role}__cleaned_text": {"config": rules_off} for role in ("pretrain", "domain")},
                    # a graph-backed asset's key (its ops are token_shards.plan, ...): a step of the code location, not of this job
                    "pretrain__token_shards": {"config": {"seq_len": 64}},
                }
            }
        )
    )
    partition = DATA_PARTITIONS.get_partition_keys()[0]
    env = {**os.environ, "DAGSTER_HOME": str(home), "LARGETRAIN_ROOT": str(root), "LARGETRAIN_WANDB_MODE": "disabled"}
    log = tmp_path / "demo.log"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "largetrain_dagster.demo",
            "-c",
            str(config),
            "--jobs",
            "prepare_partitions",
            "--partitions",
            partition,
            "--log",
            str(log),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = r.stdout
    assert r.returncode == 0, out[-3000:] + log.read_text(errors="replace")[-3000:]
    assert "starting dagster dev" in out and "stopping dagster dev" in out
    assert f"[1/1] prepare_partitions, partition {partition}" in out
    assert "raw_corpus (domain, pretrain) -> cleaned_text (domain, pretrain)" in out
    for key in ("domain/raw_corpus", "domain/cleaned_text", "pretrain/raw_corpus", "pretrain/cleaned_text"):
        assert f"✓ {key} [{partition}]" in out
    assert "runs: 1 succeeded" in out and f"full log: {log}" in out
    (prefix,) = re.findall(r"\(run ([0-9a-f]{8})\)", out)
    text = log.read_text(errors="replace")
    assert "Serving dagster-webserver on http://127.0.0.1:" in text and "RUN_SUCCESS" in text

    # the server's processes (webserver, daemon, code server, run worker) all name the instance's home
    assert not processes_mentioning(str(home)), "dagster dev left processes behind"

    instance = DagsterInstance.from_config(str(home))
    try:
        (record,) = instance.get_run_records()
        run = record.dagster_run
        assert run.run_id.startswith(prefix) and run.status == DagsterRunStatus.SUCCESS
        assert run.job_name == "prepare_partitions" and run.tags["dagster/partition"] == partition
        assert run.tags["largetrain/config"] == str(config)  # the Runs page tells runs apart by these
        assert run.tags["largetrain/corpus/domain"] == str(TICKETS)
        assert run.remote_job_origin.location_name == "largetrain"  # submitted to the code location, as the UI does
    finally:
        instance.dispose()
