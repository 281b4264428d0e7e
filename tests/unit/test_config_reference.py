"""docs/CONFIG.md is what `python -m largetrain_dagster.config_reference` prints from the config classes,
and every field of every configurable step and of every resource with settings (the trackers among them)
has a type, a default and a meaning there; its run config example of the resources is valid."""

import re

import yaml
from dagster import validate_run_config

from helpers import REPO
from largetrain_dagster.config_reference import RESOURCES_HEADER, field_rows, render, resources, step_config, steps
from largetrain_dagster.definitions import defs, lineage_assets
from largetrain_dagster.optimization import optimization_report

DOC = REPO / "docs" / "CONFIG.md"


def test_committed_reference_is_up_to_date():
    assert DOC.read_text() == render(), (
        "docs/CONFIG.md is out of date: python -m largetrain_dagster.config_reference > docs/CONFIG.md"
    )


def test_every_step_and_field_is_described():
    named = {n for _, names, _ in steps() for n in names}
    configurable = {step for step, cls in map(step_config, [*lineage_assets(), optimization_report]) if cls is not None}
    assert (
        named == configurable and {"domain__raw_corpus", "lora_adapter", "evaluation", "optimization_report"} <= named
    )
    for name, _, cls in steps():
        rows = field_rows(cls)
        assert rows, name
        for field, tp, default, meaning in rows:
            assert tp and meaning.strip(), f"{name}.{field} has no type or description"
            assert default or tp == "mapping", f"{name}.{field} has no default"
            assert f"| `{field}` |" in DOC.read_text(), f"{name}.{field} missing from docs/CONFIG.md"


def test_every_resource_setting_is_described_the_trackers_included():
    doc = DOC.read_text()
    shared = dict(resources())
    assert {"storage", "launcher", "trackers", "executor"} <= set(shared)
    assert shared.keys() == {k for k, r in defs.resources.items() if type(r).model_fields}
    for key, cls in shared.items():
        section = doc.split(f"\n### {key}\n", 1)[1].split("\n### ", 1)[0]
        for field, tp, default, meaning in field_rows(cls):
            assert tp and meaning.strip() and (default or tp == "mapping"), f"resource {key}: {field}"
            assert f"| `{field}` |" in section, f"resource {key}: {field} missing from docs/CONFIG.md"
    trackers = doc.split("\n### trackers\n", 1)[1].split("\n### ", 1)[0]
    for field in ("report_to", "wandb.mode", "mlflow.tracking_uri", "mlflow.experiment_name"):
        assert f"| `{field}` |" in trackers
    assert "LARGETRAIN_REPORT_TO" in trackers and "MLFLOW_TRACKING_URI" in trackers


def test_the_resources_example_is_a_run_config_the_jobs_accept():
    (block,) = re.findall(r"```yaml\n(.*?)```", RESOURCES_HEADER, flags=re.S)
    example = yaml.safe_load(block)
    resolved = validate_run_config(defs.resolve_job_def("lineage"), example)["resources"]["trackers"]["config"]
    assert resolved["report_to"] == ["wandb", "mlflow"] and resolved["mlflow"]["tracking_uri"] == "sqlite:///mlruns.db"
    assert (
        resolved["wandb"]["mode"] == defs.resources["trackers"].wandb.mode
    )  # the fields left out keep the deployment's values
