"""Dagster run-config classes derived from the core's dataclasses, so every setting is defined once.

A stage's settings live in a ``largetrain_core`` dataclass; each field's default, type and
``metadata={"description": ...}`` become the Dagster ``Config`` field that the launchpad shows.
``dagster_config(QualityConfig, "CleanedTextConfig")`` returns such a class; an instance's
``to_core(**extra)`` gives the dataclass back (``extra``: fields excluded from the Dagster config,
such as paths the asset fills in).

Types: ``tuple[X, ...]`` becomes ``list[X]`` (and back), a nested dataclass a nested Config, ``X | None``
``Optional[X]``, a ``Literal`` of strings a Dagster enum (a choice in the launchpad) and one of other
values its values' type; other types are passed to pydantic as they are (Dagster accepts str, int, float, bool,
list, dict with str keys, Optional and nested Config).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Optional, Union

from dagster import Config
from pydantic import Field, create_model

from largetrain_core.settings import merged as deep_merge

_CACHE: dict[tuple, type] = {}


def _config_type(tp: Any) -> Any:
    """The pydantic/Dagster type for a dataclass field type."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return dagster_config(tp)
    if origin is Literal:  # Dagster shows a choice of strings as an enum; other choices as their type
        return tp if all(isinstance(a, str) for a in args) else type(args[0])
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        inner = _config_type(rest[0]) if len(rest) == 1 else Union[tuple(_config_type(a) for a in rest)]
        return Optional[inner] if len(rest) < len(args) else inner
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return list[_config_type(args[0])]
        raise TypeError(f"fixed-length tuple {tp} has no Dagster config type; use tuple[X, ...] or a dataclass")
    if origin in (list, dict):
        return origin[tuple(_config_type(a) for a in args)] if args else origin
    return tp


def _to_core_value(tp: Any, value: Any) -> Any:
    """A config value (plain JSON-like data) as the dataclass field type wants it."""
    if value is None:
        return None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{k: _to_core_value(hints[k], v) for k, v in value.items()})
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return _to_core_value(rest[0], value) if len(rest) == 1 else value
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return tuple(_to_core_value(args[0], v) for v in value)
    if origin is list and args:
        return [_to_core_value(args[0], v) for v in value]
    return value


def _split(names) -> tuple[set, dict[str, list]]:
    """Dotted names (``schedule.max_steps``) as (the top-level ones, {section: [names inside it]})."""
    top, inner = set(), {}
    for n in names:
        head, _, rest = n.partition(".")
        if rest:
            inner.setdefault(head, []).append(rest)
        else:
            top.add(head)
    return top, inner


def dagster_config(
    cls: type,
    name: str | None = None,
    *,
    defaults: dict | None = None,
    exclude: tuple[str, ...] = (),
    base: type = Config,
) -> type[Config]:
    """A ``dagster.Config`` subclass (or a subclass of ``base``, e.g. ``ConfigurableResource``) with the
    fields of dataclass ``cls`` (minus ``exclude``).

    ``defaults`` overrides a field's default for this stage (e.g. a LoRA run's learning rate); a
    field without a default stays required. Names in ``exclude`` and ``defaults`` may be dotted to
    reach into a nested dataclass (``schedule.max_steps``). Raises TypeError for a field type Dagster
    cannot show or a default for a field ``cls`` does not have. The class has ``to_core(**extra) ->
    cls`` (``extra``: the excluded fields, nested ones as dicts, merged into the config's values).
    Classes are cached per (cls, name, defaults, exclude, base).
    """
    defaults = defaults or {}
    key = (cls, name, tuple(sorted(defaults.items(), key=lambda kv: kv[0])), tuple(exclude), base)
    try:
        if key in _CACHE:
            return _CACHE[key]
    except TypeError:  # unhashable default value: build a fresh class
        key = None
    hints = typing.get_type_hints(cls)
    top_exclude, inner_exclude = _split(exclude)
    top_defaults, inner_defaults = _split(defaults)
    unknown = (top_defaults | set(inner_defaults) | set(inner_exclude)) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise TypeError(f"defaults or excludes for fields {sorted(unknown)} that {cls.__name__} does not have")
    name = name or f"{cls.__name__}Dagster"
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in top_exclude:
            continue
        desc = f.metadata.get("description")
        if dataclasses.is_dataclass(hints[f.name]) and (f.name in inner_exclude or f.name in inner_defaults):
            sub = hints[f.name]
            tp = dagster_config(
                sub,
                f"{name}_{f.name}",
                exclude=tuple(inner_exclude.get(f.name, ())),
                defaults={k.partition(".")[2]: v for k, v in defaults.items() if k.partition(".")[0] == f.name},
            )
        else:
            tp = _config_type(hints[f.name])
        fields[f.name] = (tp, _field(f, tp, defaults, desc))

    def to_core(self, **extra) -> Any:
        values = deep_merge(self.model_dump(), extra)
        return cls(**{k: _to_core_value(hints[k], v) for k, v in values.items() if k in hints})

    model = create_model(name, __base__=base, __doc__=(cls.__doc__ or "").strip() or None, **fields)
    model.to_core = to_core
    if key is not None:
        _CACHE[key] = model
    return model


def _field(f: dataclasses.Field, tp: Any, defaults: dict, desc: str | None) -> Any:
    """The pydantic Field of dataclass field ``f`` (Dagster type ``tp``): its default from ``defaults``,
    else the dataclass's (a nested dataclass made by ``tp``, a tuple as a list); none: required."""
    if f.name in defaults:
        default = defaults[f.name]
    elif f.default is not dataclasses.MISSING:
        default = f.default
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    else:
        return Field(description=desc)
    if dataclasses.is_dataclass(default):
        return Field(default_factory=tp, description=desc)
    if isinstance(default, tuple):
        return Field(default=list(default), description=desc)
    return Field(default=default, description=desc)


class RunConfigError(ValueError):
    """A run config key under ``ops`` that names no step (the message lists the valid names)."""


def check_ops_keys(
    run_config: dict | None, selected: typing.Collection[str], known: typing.Collection[str]
) -> list[str]:
    """The rule for the keys under a run config's ``ops`` (docs/guides/your-data.md, "Run config keys").

    A key is a step's name: the asset key with ``__`` between its parts (``domain__raw_corpus`` for
    ``domain/raw_corpus``). ``selected``: the steps of this run; ``known``: every step of the job or code
    location the run was selected from. A key of a selected step applies. A key of a known step outside
    the selection is allowed and not used by this run (one config file serves every run of a recipe:
    the per-partition runs and the run of the rest; Dagster treats a named job's unselected steps the
    same way). Returns those keys, sorted. Raises RunConfigError naming every key that is no step at
    all, with the ``__`` spelling of a key written with ``/`` or ``.``, the closest names, and the steps
    of the run.
    """
    import difflib

    ops = (run_config or {}).get("ops") or {}
    known = set(known) | set(selected)
    unknown = [k for k in ops if k not in known]
    if unknown:
        hints = []
        for k in unknown:
            spelled = k.replace("/", "__").replace(".", "__")
            if spelled in known:
                hints.append(
                    f"{k!r}: write {spelled!r} (run config names a step by its asset key with __ between the parts)"
                )
            else:
                close = difflib.get_close_matches(spelled, sorted(known), n=3, cutoff=0.6)
                hints.append(
                    f"{k!r}: no such step"
                    + (f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else "")
                )
        raise RunConfigError(
            f"run config: {len(unknown)} key(s) under ops name no step, so their settings would be ignored: "
            + "; ".join(hints)
            + f". Steps of this run: {', '.join(sorted(selected))}. "
            f"Every step: {', '.join(sorted(known))}."
        )
    return sorted(k for k in ops if k not in set(selected))
