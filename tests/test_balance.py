"""largetrain_core.balance: class histogram and seeded down/up-sampling to a target distribution."""

import polars as pl
import pytest

from largetrain_core.balance import balance, class_histogram

DF = pl.DataFrame({"id": list(range(12)), "y": ["a"] * 6 + ["b"] * 2 + ["c"] * 4})


def test_histogram_counts_null_as_its_own_class():
    assert class_histogram(pl.Series(["b", "a", None, "a"])) == {"<null>": 1, "a": 2, "b": 1}


def test_down_sample_uniform_and_weighted():
    out, meta = balance(DF, "y")
    assert meta["before"] == {"a": 6, "b": 2, "c": 4} and meta["after"] == {"a": 2, "b": 2, "c": 2}
    assert out["id"].n_unique() == 6 and out["id"].is_sorted()      # no row twice, input order
    # N = min(6/.5, 2/.25, 4/.25) = 8 -> a 4, b 2, c 2
    out, meta = balance(DF, "y", {"a": 0.5, "b": 0.25, "c": 0.25})
    assert meta["after"] == {"a": 4, "b": 2, "c": 2}


def test_up_sample_keeps_every_row_and_fills_minorities():
    out, meta = balance(DF, "y", mode="up", seed=3)
    assert meta["after"] == {"a": 6, "b": 6, "c": 6}
    assert set(out["id"].to_list()) == set(range(12))
    extra = out.filter(pl.col("y") == "b")["id"].to_list()
    assert sorted(set(extra)) == [6, 7] and len(extra) == 6


def test_seeded_and_zero_target_drops_a_class():
    a = balance(DF, "y", seed=1)[0]["id"].to_list()
    assert a == balance(DF, "y", seed=1)[0]["id"].to_list()
    assert any(balance(DF, "y", seed=s)[0]["id"].to_list() != a for s in range(2, 12))
    out, meta = balance(DF, "y", {"a": 1, "b": 0, "c": 1})
    assert meta["after"] == {"a": 4, "c": 4}


def test_errors():
    with pytest.raises(ValueError, match="absent"):
        balance(DF, "y", {"z": 1})
    with pytest.raises(ValueError, match="mode"):
        balance(DF, "y", mode="sideways")
    with pytest.raises(ValueError, match="empty"):
        balance(DF.clear(), "y")
