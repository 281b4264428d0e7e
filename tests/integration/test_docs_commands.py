"""The documentation's commands that need the code location: the CLI block of docs/guides/web-ui-and-cli.md,
the run configs of docs/guides/training.md and the bucket recipe of docs/guides/your-data.md
(tests/helpers/docblocks.py; tests/unit/test_docs.py checks that every block names the tests that run it)."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.docblocks import REPO, blocks, commands, documents, section_blocks

BIN = Path(sys.executable).parent


def test_cli_commands(tmp_path):
    """docs/guides/web-ui-and-cli.md, "make demo's driver": `dagster definitions validate -w workspace.yaml`
    run as written (the code location loads, its definitions are valid); the driver's job and partition
    names are the code location's (tests/e2e/test_webserver.py runs the partition command)."""
    (block,) = section_blocks("docs/guides/web-ui-and-cli.md", "make demo's driver", "sh")
    validate, partition, lineage = commands(block)
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "LARGETRAIN_ROOT": str(tmp_path / "root"),
        "LARGETRAIN_WANDB_MODE": "disabled",
    }
    r = subprocess.run(
        shlex.split(validate.replace(".venv/bin/", f"{BIN}/")),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Validation successful" in r.stdout + r.stderr

    from largetrain_dagster.definitions import build_definitions
    from largetrain_dagster.partitions import DATA_PARTITIONS

    defs = build_definitions(root=str(tmp_path / "root"))
    for command in (partition, lineage):
        args = shlex.split(command)
        jobs = args[args.index("--jobs") + 1].split(",")
        for job in jobs:
            defs.resolve_job_def(job)
        if "--partitions" in args:
            assert set(args[args.index("--partitions") + 1].split(",")) <= set(DATA_PARTITIONS.get_partition_keys())
        if "-c" in args:
            assert (REPO / args[args.index("-c") + 1]).is_file()


def _run_config_blocks() -> list:
    return [b for doc in documents() for b in blocks(doc) if b.lang == "yaml" and "ops:" in b.text]


@pytest.mark.parametrize("block", _run_config_blocks(), ids=str)
def test_run_config_blocks_are_valid(block, tmp_path):
    """Each run config of docs/guides/training.md ("How training runs": a model of your own;
    "the optimization report") and docs/guides/filtering.md (language identification, PII redaction)
    is valid for its job: every key names a step (configs.check_ops_keys) and Dagster's config schema
    of the job accepts it (paths need not exist for that)."""
    from dagster import validate_run_config

    from largetrain_dagster.configs import check_ops_keys
    from largetrain_dagster.definitions import build_definitions

    assert block.doc in ("docs/guides/training.md", "docs/guides/filtering.md")
    config = yaml.safe_load(block.text)
    defs = build_definitions(root=str(tmp_path))
    prepare = set(defs.resolve_job_def("prepare_partitions").graph.node_dict)
    job_name = (
        "optimization_ablation"
        if "optimization_report" in config["ops"]
        else "prepare_partitions"
        if set(config["ops"]) <= prepare
        else "lineage"
    )
    job = defs.resolve_job_def(job_name)
    steps = {
        n
        for j in ("lineage", "optimization_ablation", "prepare_partitions")
        for n in defs.resolve_job_def(j).graph.node_dict
    }
    check_ops_keys(config, set(job.graph.node_dict), steps)
    validate_run_config(job, config)


def test_bucket_recipe_commands(tmp_path, s3_server, s3_bucket):
    """docs/guides/your-data.md, "Your corpus and the storage root in a bucket": its commands run as written (the
    Dagster CLI, one run per data partition, then deduplicated_text, then the summary) against the S3 API server on
    127.0.0.1, with configs/lora_on_my_corpus.yaml's corpus path at the bucket (120 of the support tickets, uploaded
    there) and LARGETRAIN_ROOT in it. Every version lands in the bucket, committed (its manifest and marker verify);
    nothing but the Dagster instance and the cache is written locally; the secret key is in no output."""
    import fsspec

    from helpers import TICKETS
    from largetrain_core.storage import verify_manifest

    bucket = s3_bucket.removeprefix("s3://")
    tickets = "".join(TICKETS.read_text().splitlines(keepends=True)[:120])
    s3 = fsspec.filesystem("s3", endpoint_url=s3_server, skip_instance_cache=True)
    s3.pipe_file(f"{bucket}/corpora/tickets.jsonl", tickets.encode())

    config = yaml.safe_load((REPO / "configs" / "lora_on_my_corpus.yaml").read_text())
    raw = config["ops"]["domain__raw_corpus"]["config"]
    assert raw["path"] == "my_data/tickets.jsonl"  # the line the recipe says to edit
    raw["path"] = f"{s3_bucket}/corpora/tickets.jsonl"
    recipe = tmp_path / "lora_on_my_corpus.yaml"
    recipe.write_text(yaml.safe_dump(config))

    (block,) = section_blocks("docs/guides/your-data.md", "Your corpus and the storage root in a bucket", "sh")
    assert "s3://my-bucket/corpora/tickets.jsonl" in (REPO / "docs/guides/your-data.md").read_text()
    script = (
        block.text.replace("http://127.0.0.1:9000", s3_server)
        .replace("s3://my-bucket", s3_bucket)
        .replace("$PWD/.largetrain", str(tmp_path / "lt"))
        .replace(".venv/bin/", f"{BIN}/")
        .replace("configs/lora_on_my_corpus.yaml", str(recipe))
    )
    assert script.count(str(recipe)) == 2 and f"LARGETRAIN_ROOT={s3_bucket}/largetrain" in script
    assert f"AWS_ENDPOINT_URL={s3_server}" in script
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "LARGETRAIN_"))}
    # Two data partitions keep it short (the loop runs over what the partitions command prints); the local cache
    # in tmp_path, so that what is written locally can be listed.
    env.update(
        LARGETRAIN_WANDB_MODE="disabled",
        OMP_NUM_THREADS="1",
        LARGETRAIN_DATA_PARTITIONS="2",
        LARGETRAIN_CACHE=str(tmp_path / "cache"),
    )
    assert env["AWS_SECRET_ACCESS_KEY"]  # the credentials come from the environment, as the recipe says
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        start_new_session=True,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert out.count("RUN_SUCCESS") == 3, out[-4000:]
    assert env["AWS_SECRET_ACCESS_KEY"] not in out

    lines = run.stdout.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("domain corpus (domain):"))
    assert lines[at].endswith(f"{s3_bucket}/corpora/tickets.jsonl"), lines[at]
    line = next(x.strip() for x in lines[at + 1 :] if x.strip().startswith("documents read"))
    assert line.startswith("documents read 120 / kept ") and "rejected 0 (2 partitions)" in line, line

    versions = {}
    for asset in ("raw_corpus", "cleaned_text", "deduplicated_text"):
        markers = s3.glob(f"{bucket}/largetrain/domain/{asset}/**/_COMMITTED.json")
        assert markers, f"no committed version of domain/{asset} in the bucket"
        versions[asset] = [f"s3://{m.rsplit('/', 1)[0]}" for m in markers]
    assert len(versions["raw_corpus"]) == len(versions["cleaned_text"]) == 2  # one per partition
    for urls in versions.values():
        for url in urls:
            assert verify_manifest(url, full=True) == [], url
    assert sorted(p.name for p in (tmp_path / "lt").iterdir()) == ["dagster_home"]  # no local storage root
