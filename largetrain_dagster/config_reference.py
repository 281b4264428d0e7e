"""The configuration reference, generated from the steps' config classes:
``python -m largetrain_dagster.config_reference > docs/CONFIG.md``.

Every asset of the lineage that takes a run config (its ``config`` parameter's ``dagster.Config``
class), and ``optimization_report`` (job ``optimization_ablation``), gets a table of its fields: name (nested fields as ``lora.r``), type, default and the
field's description, which is what the Dagster launchpad shows; so does every resource of the
Definitions that has settings (the deployment-wide ones: storage root, training launcher, trackers,
data-prep executor). tests/unit/test_config_reference.py fails when docs/CONFIG.md differs from what this prints,
so the document cannot drift from the code.
"""

from __future__ import annotations

import inspect
import json
import sys
import types
import typing

from dagster import Config
from pydantic_core import PydanticUndefined

HEADER = """# Configuration reference

Every field of every step's run config: its type, default and meaning. Generated from the config
classes by `python -m largetrain_dagster.config_reference > docs/CONFIG.md`;
`tests/unit/test_config_reference.py` fails when this file is out of date. The same descriptions are in
the Dagster launchpad.

A run config names each step by its asset key with `__` between the parts (`domain/raw_corpus` is
`domain__raw_corpus`); a key that names no step fails the run before it starts, a key of a step
the run does not select is not used by it (docs/guides/your-data.md):

```yaml
ops:
  domain__raw_corpus:
    config: {path: /data/tickets, label_field: category}
  lora_adapter:
    config: {schedule: {max_steps: 200}, lora: {r: 16, lora_alpha: 32}}
```

The training steps' settings are in sections (`schedule.max_steps`, `parallelism.zero_stage`); a
run config written before the sections, with every setting at the top level (`max_steps: 200`),
still runs: each such setting is moved into its section, with a WARNING in the run log.
"""


def _type(tp) -> str:
    """A field annotation in words: ``int``, ``list[str]``, ``float or null``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(map(str, args))
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        text = " or ".join(_type(a) for a in rest)
        return text + " or null" if len(rest) < len(args) else text
    if origin in (list, dict, tuple):
        return f"{origin.__name__}[{', '.join(_type(a) for a in args)}]" if args else origin.__name__
    if inspect.isclass(tp) and issubclass(tp, Config):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(field) -> str:
    if field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        value = field.default_factory()
    else:
        return "(required)"
    if isinstance(value, Config):
        value = value.model_dump()
    return f"`{json.dumps(value)}`"


def field_rows(cls: type[Config], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(name, type, default, description) of every field of ``cls``, nested Config fields expanded
    as ``parent.child`` rows, in declaration order."""
    rows = []
    for name, f in cls.model_fields.items():
        tp = f.annotation
        inner = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        nested = next((a for a in inner if inspect.isclass(a) and issubclass(a, Config)), None)
        if nested is not None:
            rows.append((prefix + name, _type(tp), "", f.description or ""))
            rows += field_rows(nested, prefix + name + ".")
        else:
            rows.append((prefix + name, _type(tp), _default(f), f.description or ""))
    return rows


def steps() -> list[tuple[str, list[str], type[Config]]]:
    """(asset name, the step names that take it, its config class) for every configurable step of
    the lineage, in lineage order, then ``optimization_report``; the steps of both corpus roles share one entry."""
    from largetrain_dagster.definitions import lineage_assets
    from largetrain_dagster.optimization import optimization_report

    out: dict[str, tuple[list[str], type]] = {}
    for a in [*lineage_assets(), optimization_report]:
        step, cls = step_config(a)
        if cls is None:
            continue
        name = next(iter(a.keys)).path[-1]
        out.setdefault(name, ([], cls))[0].append(step)
    return [(name, names, cls) for name, (names, cls) in out.items()]


def step_config(a) -> tuple[str, type[Config] | None]:
    """(the step name a run config gives ``a``, the Config class of its ``config``, or None): an asset's
    op, or a graph-backed asset (its config mapped onto its ops: the class its ops take); an asset check
    has none."""
    from dagster import AssetChecksDefinition, GraphDefinition

    if isinstance(a, AssetChecksDefinition):
        return "", None
    node = a.node_def
    ops = node.iterate_op_defs() if isinstance(node, GraphDefinition) else [node]
    for op_def in ops:
        param = inspect.signature(op_def.compute_fn.decorated_fn).parameters.get("config")
        if param is not None:
            return node.name, param.annotation
    return node.name, None


RESOURCES_HEADER = """## Resources

Settings of the whole deployment, shared by every run: the Dagster resources of the code location.
Each field's default is below; the environment variables that set some of them are named in their
descriptions (docs/guides/web-ui-and-cli.md, "Environment"). A run can override them in its run config under
`resources`, each resource by its key:

```yaml
resources:
  trackers:
    config: {report_to: [wandb, mlflow], mlflow: {tracking_uri: "sqlite:///mlruns.db"}}
```
"""


def resources() -> list[tuple[str, type[Config]]]:
    """(resource key, its config class) of every resource of the code location's Definitions that
    has settings, in the Definitions' order."""
    from largetrain_dagster.definitions import defs

    return [(key, type(r)) for key, r in defs.resources.items() if isinstance(r, Config) and type(r).model_fields]


def _table(cls: type[Config]) -> list[str]:
    """The first paragraph of the class's docstring (its own, not inherited) and its fields' table."""
    doc = inspect.getdoc(cls)
    lines = [_cell(doc.split("\n\n")[0]), ""] if doc and cls.__doc__ else []
    lines += ["| field | type | default | meaning |", "|---|---|---|---|"]
    lines += [f"| `{n}` | {_cell(t)} | {_cell(d)} | {_cell(desc)} |" for n, t, d, desc in field_rows(cls)]
    return lines + [""]


def render() -> str:
    """docs/CONFIG.md: the header, a contents line, one table per step, then one per resource."""
    entries, shared = steps(), resources()
    lines = [
        HEADER,
        "Steps: "
        + ", ".join(f"[{name}](#{name})" for name, _, _ in entries)
        + ". Resources: "
        + ", ".join(f"[{key}](#{key})" for key, _ in shared)
        + ".",
        "",
    ]
    for name, names, cls in entries:
        lines += [
            f"## {name}",
            "",
            f"Run config keys: {', '.join(f'`{n}`' for n in names)} (config class `{cls.__module__}.{cls.__name__}`).",
            "",
        ]
        lines += _table(cls)
    lines.append(RESOURCES_HEADER)
    for key, cls in shared:
        lines += [f"### {key}", "", f"Run config key: `resources.{key}` (class `{cls.__module__}.{cls.__name__}`).", ""]
        lines += _table(cls)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render())
