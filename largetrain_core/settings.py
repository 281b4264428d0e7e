"""What every settings dataclass of the core shares: a field's description (what the Dagster launchpad
and docs/CONFIG.md show for it), building a dataclass from JSON-like data with unknown keys refused,
the check that a ``Literal``-typed field holds one of its choices, and a positive integer setting's parse."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal


# What a setting's value changes, marked once at its field (``described(..., identity=...)``) and read by the
# identity of a run (largetrain_core.training.config.TrainConfig.identity), as marin marks ``versioned`` fields:
WEIGHTS = "weights"  # what is trained: the weights (and so every output) change with it
OUTPUTS = "outputs"  # what the run writes beside the weights (checkpoint cadence, evaluations, exports)
INPUT = "input"  # set by the stage from an input (a path), whose data version stands for it
IDENTITIES = (WEIGHTS, OUTPUTS, INPUT, None)  # None: neither (where the run reports, how it resumes, stops, is judged)


def described(text: str, identity: str | None = WEIGHTS, omit_default: bool = False, set_by: str | None = None) -> dict:
    """The ``metadata`` of a dataclass field: its description (``field(default=..., metadata=described("..."))``),
    what its value changes (``identity``, one of :data:`IDENTITIES`), ``omit_default``: the identity leaves
    the setting out at its default (a setting added later keeps the versions recorded before it), and
    ``set_by``: ``"stage"`` or ``"resource"`` when the run config does not set it."""
    if identity not in IDENTITIES or set_by not in (None, "stage", "resource"):
        raise ValueError(f"identity must be one of {IDENTITIES} and set_by stage, resource or None")
    return {"description": text, "identity": identity, "omit_default": omit_default, "set_by": set_by}


def positive_int(value: str | int, name: str) -> int:
    """``value`` (an environment variable's text, or an int) as an integer >= 1. Raises ValueError
    naming ``name`` and the value otherwise."""
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return n


def merged(base: dict, extra: dict) -> dict:
    """``base`` with ``extra``'s values, nested dicts merged key by key."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def from_dict(cls: type, d: dict, what: str):
    """Dataclass ``cls`` from JSON-like ``d``, nested dataclass fields from nested dicts. Raises
    ValueError naming unknown keys (at any depth) and the known ones; ``what`` names the whole in the
    message ("training config")."""
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(d) - set(known)
    if unknown:
        raise ValueError(f"unknown {what} keys {sorted(unknown)}; known: {sorted(known)}")
    hints = typing.get_type_hints(cls)
    d = dict(d)
    for name in known:
        if isinstance(d.get(name), dict) and dataclasses.is_dataclass(hints[name]):
            d[name] = from_dict(hints[name], d[name], f"{what} {name}")
    return cls(**d)


def choices(tp: Any) -> tuple | None:
    """The values a ``Literal[...]`` (or ``Optional[Literal[...]]``) annotation allows, else None."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return choices(args[0]) if len(args) == 1 and typing.get_origin(tp) is not None else None


def choice_problems(obj: Any, prefix: str = "") -> list[str]:
    """``<prefix><name> must be one of a, b, not 'x'`` for every ``Literal``-typed field of dataclass
    ``obj`` whose value is not among its choices (None is allowed where the type is Optional)."""
    out = []
    for name, tp in typing.get_type_hints(type(obj)).items():
        allowed = choices(tp)
        value = getattr(obj, name)
        if allowed is not None and value not in allowed and not (value is None and type(None) in typing.get_args(tp)):
            out.append(f"{prefix}{name} must be one of {', '.join(map(str, allowed))}, not {value!r}")
    return out
