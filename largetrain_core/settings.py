"""What every settings dataclass of the core shares: a field's description (what the Dagster launchpad
and docs/CONFIG.md show for it), building a dataclass from JSON-like data with unknown keys refused,
the check that a ``Literal``-typed field holds one of its choices, and a positive integer setting's parse."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal


def described(text: str) -> dict:
    """The ``metadata`` of a dataclass field with its description: ``field(default=..., metadata=described("..."))``."""
    return {"description": text}


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
