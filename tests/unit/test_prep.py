"""MinHash-LSH near-dedup across partitions, per-reason accounting, .jsonl.zst."""

import json

import numpy as np
import polars as pl
import zstandard

from largetrain_core.accounting import corpus_accounting, markdown_table, outcome_table
from largetrain_core.clean import QualityConfig, clean_corpus
from largetrain_core.corpus import ingest, read_corpus
from largetrain_core.readers import ReaderConfig
from largetrain_core.dedup import DedupConfig, _components, cluster_signatures, deduplicate, minhash, write_signatures

VOCAB = [f"w{i:03d}x" for i in range(1000)]  # 5-character distinct words


def distinct(n: int, start: int = 0) -> str:
    return " ".join(VOCAB[start : start + n])


# ------------------------------------------------------------------------------------------------ near dedup


def _write(d, rows):
    d.mkdir(parents=True, exist_ok=True)
    for i, part in enumerate(rows):
        pl.DataFrame(
            {"doc_id": [r[0] for r in part], "source": ["s"] * len(part), "text": [r[1] for r in part]},
            schema={"doc_id": pl.Utf8, "source": pl.Utf8, "text": pl.Utf8},
        ).write_parquet(d / f"part-{i:05d}.parquet")
    return d


def test_components_union_find():
    root = _components(7, np.array([1, 6, 3, 5]), np.array([2, 2, 4, 3]))
    assert root.tolist() == [0, 1, 1, 3, 3, 3, 1]


def test_near_duplicates_across_partitions_and_tiny_docs(tmp_path):
    a = distinct(200)
    a_edit = a.replace(VOCAB[100], "changed", 1)  # one word of 200 differs: Jaccard of 5-gram sets ~ 0.95
    b = distinct(200, 300)
    rows = [
        [("a", a), ("b", b)] + [(f"t{i}", VOCAB[i]) for i in range(20)],  # 20 distinct one-word docs
        [("b2", b.upper().replace(" ", "\n")), ("a2", a_edit), ("t0bis", VOCAB[0]), ("p", "!!! ???")],
    ]
    src = _write(tmp_path / "in", rows)
    out = tmp_path / "out"
    out.mkdir()
    stats = deduplicate(src, out, DedupConfig())
    assert stats == {
        "input": 26,
        "kept": 23,
        "duplicate": 3,
        "clusters": 3,
        "duplicate_exact": 2,
        "duplicate_near": 1,
        "near_unverified_kept": 0,
    }
    dups = pl.read_parquet(out / "duplicates.parquet")
    assert dict(zip(dups["doc_id"], dups["duplicate_of"])) == {"b2": "b", "a2": "a", "t0bis": "t0"}
    assert dict(zip(dups["doc_id"], dups["kind"])) == {"b2": "exact", "a2": "near", "t0bis": "exact"}
    assert dups.filter(pl.col("doc_id") == "a2")["cluster_id"].to_list() == [0]
    kept = pl.concat([pl.read_parquet(p) for p in sorted(out.glob("part-*.parquet"))])["doc_id"].to_list()
    assert kept == ["a", "b"] + [f"t{i}" for i in range(20)] + ["p"]
    # the same through per-partition signature files, clustered globally
    s0, s1 = tmp_path / "s0.parquet", tmp_path / "s1.parquet"
    write_signatures([src / "part-00000.parquet"], s0)
    write_signatures([src / "part-00001.parquet"], s1)
    asg = cluster_signatures([s0, s1])
    assert asg.filter(pl.col("doc_id") == "a2")["duplicate_of"].to_list() == ["a"]
    assert asg["duplicate_of"].drop_nulls().len() == 3 == asg.height  # one row per duplicate


def test_minhash_estimates_jaccard_and_is_seeded():
    a, b = distinct(400), distinct(400, 200)  # 5-gram sets: 396 each, 196 shared -> J = 196/596
    sig, n = minhash(pl.Series([a, b, ""]))
    assert n.tolist() == [400, 400, 0]
    est = (sig[0] == sig[1]).mean()
    assert abs(est - 196 / 596) < 0.15
    assert (sig[2] == np.iinfo(np.uint64).max).all()
    assert np.array_equal(minhash(pl.Series([a]))[0], sig[:1])
    assert not np.array_equal(minhash(pl.Series([a]), DedupConfig(seed=2))[0], sig[:1])


# ------------------------------------------------------------------------------------------------ accounting, zst


def test_outcomes_per_reason_sum_to_input_with_zst_reader(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    good = "The mill stands by the river and the wind turns it. " * 10
    # "d" differs from "k" in case only (an exact duplicate under the case-folded key); its stop words
    # stay lower case, as the Gopher stop-word rule is case-sensitive (datatrove)
    lines = [
        json.dumps({"id": "k", "text": good}),
        json.dumps({"id": "d", "text": good.replace("mill", "MILL").replace("wind", "WIND")}),
        json.dumps({"id": "f", "text": "hi"}),
        "{broken",
        json.dumps({"id": "e", "text": ""}),
    ]
    (src / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(("\n".join(lines) + "\n").encode()))
    (src / "bad.jsonl.zst").write_bytes(b"not zstd at all")  # no zstd magic: read as plain, not one JSON line
    docs = [
        d for b in read_corpus(ReaderConfig(str(src), id_field="id")) for d in b.documents.column("doc_id").to_pylist()
    ]
    assert docs == ["k", "d", "f", "e"]
    raw, cleaned, dd = (tmp_path / n for n in ("raw", "cleaned", "dd"))
    for d in (raw, cleaned, dd):
        d.mkdir()
    ingest(ReaderConfig(str(src), id_field="id"), raw)
    clean_corpus(raw, cleaned, QualityConfig())
    deduplicate(cleaned, dd)
    t = outcome_table(raw, cleaned, dd)
    assert t.rows() == [
        ("duplicate", "exact", 1),
        ("filtered", "empty", 1),
        ("filtered", "gopher_min_words", 1),
        ("kept", None, 1),
        ("rejected", "invalid JSON", 1),
        ("rejected", "no readable JSON line", 1),
    ]
    assert t["documents"].sum() == corpus_accounting(raw, cleaned, dd)["input"] == 6
    assert "| **total** | | **6** |" in markdown_table(t)


def test_minhash_is_exact_min_whatever_the_block_size():
    """Signatures equal a direct min over each document's shingles, for blocks that split documents."""
    import numpy as np

    from largetrain_core.dedup import DedupConfig, _permutations, _permute_min

    rng = np.random.default_rng(0)
    sdoc = np.sort(rng.integers(0, 7, size=50)).astype(np.int64)  # doc 7 (and any unlucky one) has no shingle
    h = rng.integers(0, 2**64, size=50, dtype=np.uint64)
    a, b = _permutations(DedupConfig(bands=2, rows=3))
    expect = np.full((8, 6), np.iinfo(np.uint64).max, dtype=np.uint64)
    for d in range(8):
        if (sdoc == d).any():
            expect[d] = (h[sdoc == d][:, None] * a[None, :] + b[None, :]).min(axis=0)
    for chunk in (1, 3, 8, 50, 8192):
        assert np.array_equal(_permute_min(h, sdoc, 8, DedupConfig(bands=2, rows=3, chunk_shingles=chunk)), expect)
