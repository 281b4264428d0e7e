"""largetrain_dagster.configs: Dagster run configs derived from the core dataclasses, through a real run."""

from dataclasses import dataclass, field

import pytest
from dagster import asset, materialize

from largetrain_dagster.configs import dagster_config


@dataclass(frozen=True)
class Inner:
    r: int = 8


@dataclass(frozen=True)
class Settings:
    path: str
    count: int = field(default=3, metadata={"description": "how many"})
    names: tuple[str, ...] = ("a", "b")
    limit: float | None = None
    inner: Inner = field(default_factory=Inner)


def test_fields_defaults_descriptions_and_round_trip_through_a_run():
    cls = dagster_config(Settings, "SettingsConfig", defaults={"count": 5}, exclude=("path",))
    assert cls.model_fields["count"].description == "how many" and cls().count == 5
    assert "path" not in cls.model_fields
    got = {}

    @asset
    def uses(config: cls):
        got["core"] = config.to_core(path="/data")

    run = {"ops": {"uses": {"config": {"names": ["x"], "limit": 0.5, "inner": {"r": 2}}}}}
    assert materialize([uses], run_config=run).success
    assert got["core"] == Settings(path="/data", count=5, names=("x",), limit=0.5, inner=Inner(r=2))


def test_unknown_default_and_unshowable_type_raise():
    with pytest.raises(TypeError, match="does not have"):
        dagster_config(Settings, "Bad", defaults={"nope": 1})

    @dataclass
    class Pair:
        p: tuple[int, float] = (1, 0.5)

    with pytest.raises(TypeError, match="fixed-length tuple"):
        dagster_config(Pair, "PairConfig")
