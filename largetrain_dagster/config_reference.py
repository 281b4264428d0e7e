"""The configuration reference, generated from the steps' config classes:
``python -m largetrain_dagster.config_reference > docs/CONFIG.md``.

Every asset of the lineage that takes a run config (its ``config`` parameter's ``dagster.Config``
class), and ``optimization_report`` (job ``optimization_ablation``), gets a table of its fields: name (nested fields as ``lora.r``), type, default and the
field's description, which is what the Dagster launchpad shows. tests/test_config_reference.py
fails when docs/CONFIG.md differs from what this prints, so the document cannot drift from the code.
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
`tests/test_config_reference.py` fails when this file is out of date. The same descriptions are in
the Dagster launchpad.

A run config names each step by its asset key with `__` between the parts (`domain/raw_corpus` is
`domain__raw_corpus`); a key that names no step fails the run before it starts, a key of a step
the run does not select is not used by it (README, "Your own data and model"):

```yaml
ops:
  domain__raw_corpus:
    config: {path: /data/tickets, label_field: category}
  lora_adapter:
    config: {max_steps: 200, lora: {r: 16, lora_alpha: 32}}
```
"""


def _type(tp) -> str:
    """A field annotation in words: ``int``, ``list[str]``, ``float or null``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
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
        param = inspect.signature(a.op.compute_fn.decorated_fn).parameters.get("config")
        if param is None:
            continue
        key = next(iter(a.keys))
        name = key.path[-1]
        out.setdefault(name, ([], param.annotation))[0].append(a.op.name)
    return [(name, names, cls) for name, (names, cls) in out.items()]


def render() -> str:
    """docs/CONFIG.md: the header, a contents line and one table per step."""
    entries = steps()
    lines = [HEADER, "Steps: " + ", ".join(f"[{name}](#{name})" for name, _, _ in entries), ""]
    for name, names, cls in entries:
        lines += [f"## {name}", "", f"Run config keys: {', '.join(f'`{n}`' for n in names)} "
                  f"(config class `{cls.__module__}.{cls.__name__}`).", ""]
        doc = inspect.getdoc(cls)
        if doc and cls.__doc__:
            lines += [_cell(doc.split("\n\n")[0]), ""]
        lines += ["| field | type | default | meaning |", "|---|---|---|---|"]
        lines += [f"| `{n}` | {_cell(t)} | {_cell(d)} | {_cell(desc)} |" for n, t, d, desc in field_rows(cls)]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render())
