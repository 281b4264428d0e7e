"""Verified near-duplicate removal (largetrain_core.dedup.verify_assignment): a candidate is removed only when
its shingle set is similar enough to a kept document's, so that a chain A ~ B ~ C does not remove C."""

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from largetrain_core.dedup import (
    UNVERIFIED,
    DedupConfig,
    VerifyConfig,
    deduplicate,
    pair_jaccard,
    shingle_sets,
)
from helpers.parts import write_parts

BASE = [f"w{i}" for i in range(200)]


def _sub(words: list[str], positions: list[int], tag: str) -> list[str]:
    out = list(words)
    for p in positions:
        out[p] = f"{tag}{p}"
    return out


# A ~ B (J 0.81) and B ~ C (J 0.81) are LSH candidates, J(A, C) = 0.66 is under the 0.7 threshold;
# D is C with one word changed (J(C, D) = 0.95), J(A, D) = 0.63.
A = BASE
B = _sub(A, [20, 50, 80, 110], "b")
C = _sub(B, [130, 150, 170, 190], "c")
D = _sub(C, [5], "d")
CHAIN = [(k, " ".join(w)) for k, w in (("a", A), ("b", B), ("c", C), ("d", D))]


def _shingles(text: str) -> set[tuple[str, ...]]:
    w = text.lower().split()
    return {tuple(w[i : i + 5]) for i in range(len(w) - 4)}


def _run(tmp_path: Path, parts: list, name: str, verify: VerifyConfig | None = VerifyConfig()):
    out = tmp_path / name
    out.mkdir()
    stats = deduplicate(write_parts(tmp_path / f"in-{name}", parts), out, DedupConfig(), verify)
    dups = pl.read_parquet(out / "duplicates.parquet")
    kept = pl.concat([pl.read_parquet(p) for p in sorted(out.glob("part-*.parquet"))])
    return stats, kept, dups, pl.read_parquet(out / UNVERIFIED)


def test_pair_jaccard_is_the_exact_jaccard_of_the_shingle_sets():
    rng = np.random.default_rng(0)
    texts = [" ".join(f"v{x}" for x in rng.integers(0, 12, size=rng.integers(5, 60))) for _ in range(40)]
    texts += ["", "one two"]  # no shingle of five words: one shingle of all of them, or none
    offsets, hashes = shingle_sets(pl.Series(texts))
    a, b = rng.integers(0, len(texts) - 2, 200), rng.integers(0, len(texts) - 2, 200)
    want = [
        len(_shingles(texts[i]) & _shingles(texts[j])) / len(_shingles(texts[i]) | _shingles(texts[j]))
        for i, j in zip(a, b)
    ]
    np.testing.assert_allclose(pair_jaccard(offsets, hashes, a, b), want)
    assert pair_jaccard(offsets, hashes, np.array([40, 41]), np.array([40, 0])).tolist() == [0.0, 0.0]


def test_chain_removes_only_what_is_verified_against_a_kept_copy(tmp_path):
    j = lambda x, y: len(_shingles(x) & _shingles(y)) / len(_shingles(x) | _shingles(y))  # noqa: E731
    texts = dict(CHAIN)
    assert j(texts["a"], texts["c"]) < 0.7 <= min(j(texts["a"], texts["b"]), j(texts["c"], texts["d"]))
    # without verification the connected component removes all but the first
    stats, kept, dups, _ = _run(tmp_path, [CHAIN], "components", verify=None)
    assert kept["doc_id"].to_list() == ["a"] and dups["duplicate_of"].to_list() == ["a", "a", "a"]
    stats, kept, dups, unverified = _run(tmp_path, [CHAIN], "verified")
    assert kept["doc_id"].to_list() == ["a", "c"]
    assert dict(zip(dups["doc_id"], dups["duplicate_of"])) == {"b": "a", "d": "c"}  # d: a copy of c, kept
    assert dups["similarity"].to_list() == pytest.approx([j(texts["a"], texts["b"]), j(texts["c"], texts["d"])])
    assert dups["kind"].to_list() == ["near", "near"] and dups["cluster_id"].to_list() == [0, 2]
    assert unverified.to_dicts() == [
        {"doc_id": "c", "source": "src", "candidate_of": "a", "similarity": pytest.approx(j(texts["a"], texts["c"]))}
    ]
    assert stats["near_unverified_kept"] == 1 and stats["duplicate_near"] == 2 and stats["clusters"] == 2
    # each removed document reaches the threshold against the kept copy it names
    assert all(j(texts[d], texts[k]) >= 0.7 for d, k in zip(dups["doc_id"], dups["duplicate_of"]))


def test_verification_does_not_depend_on_the_part_split_and_keeps_exact_copies_exact(tmp_path):
    rows = CHAIN + [("a2", CHAIN[0][1].upper()), ("c2", CHAIN[2][1] + "  ")]
    one = _run(tmp_path, [rows], "one")
    three = _run(tmp_path, [rows[:2], rows[2:5], rows[5:]], "three")
    assert one[2].equals(three[2]) and one[3].equals(three[3]) and one[1].equals(three[1])
    dups = one[2]
    assert dict(zip(dups["doc_id"], dups["kind"])) == {"b": "near", "d": "near", "a2": "exact", "c2": "exact"}
    assert dict(zip(dups["doc_id"], dups["duplicate_of"]))["c2"] == "c"
    assert dups.filter(pl.col("kind") == "exact")["similarity"].to_list() == [1.0, 1.0]


def test_a_bucket_cap_still_removes_every_exact_copy_of_the_first(tmp_path):
    rows = [(f"x{i}", CHAIN[0][1] + " " * i) for i in range(6)] + CHAIN[1:]
    stats, kept, dups, unverified = _run(tmp_path, [rows], "capped", VerifyConfig(max_bucket_pairs=1))
    assert kept["doc_id"].to_list() == ["x0", "c"]
    assert dict(zip(dups["doc_id"], dups["duplicate_of"])) == {
        **{f"x{i}": "x0" for i in range(1, 6)},
        "b": "x0",
        "d": "c",
    }
    assert unverified["doc_id"].to_list() == ["c"] and unverified["candidate_of"].to_list() == ["x0"]
