"""docs/CONFIG.md is what `python -m largetrain_dagster.config_reference` prints from the config classes,
and every field of every configurable step has a type, a default and a meaning there."""

import inspect
from pathlib import Path

from largetrain_dagster.config_reference import field_rows, render, steps
from largetrain_dagster.definitions import lineage_assets
from largetrain_dagster.optimization import optimization_report

DOC = Path(__file__).resolve().parents[1] / "docs" / "CONFIG.md"


def test_committed_reference_is_up_to_date():
    assert DOC.read_text() == render(), (
        "docs/CONFIG.md is out of date: python -m largetrain_dagster.config_reference > docs/CONFIG.md")


def test_every_step_and_field_is_described():
    named = {n for _, names, _ in steps() for n in names}
    configurable = {a.op.name for a in [*lineage_assets(), optimization_report]
                    if "config" in inspect.signature(a.op.compute_fn.decorated_fn).parameters}
    assert named == configurable and {"domain__raw_corpus", "lora_adapter", "evaluation", "optimization_report"} <= named
    for name, _, cls in steps():
        rows = field_rows(cls)
        assert rows, name
        for field, tp, default, meaning in rows:
            assert tp and meaning.strip(), f"{name}.{field} has no type or description"
            assert default or tp == "mapping", f"{name}.{field} has no default"
            assert f"| `{field}` |" in DOC.read_text(), f"{name}.{field} missing from docs/CONFIG.md"
