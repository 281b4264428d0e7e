"""Gopher repetition + C4 line rules, MinHash-LSH near-dedup across partitions, per-reason accounting, .jsonl.zst."""

import json
from dataclasses import replace

import numpy as np
import polars as pl
import pytest
import zstandard

from largetrain_core.accounting import corpus_accounting, markdown_table, outcome_table
from largetrain_core.clean import QualityConfig, apply_rules, clean_corpus
from largetrain_core.corpus import ReaderConfig, ingest, read_corpus
from largetrain_core.dedup import DedupConfig, _components, cluster_signatures, deduplicate, minhash, write_signatures

OFF = QualityConfig(min_words=None, max_words=None, min_mean_word_length=None, max_mean_word_length=None,
                    max_hash_word_ratio=None, max_ellipsis_word_ratio=None, max_bullet_lines_ratio=None,
                    max_ellipsis_lines_ratio=None, min_alpha_word_fraction=None, min_stop_words=None)
REP = replace(OFF, gopher_repetition=True)
C4 = replace(OFF, c4=True)
VOCAB = [f"w{i:03d}x" for i in range(1000)]  # 5-character distinct words


def distinct(n: int, start: int = 0) -> str:
    return " ".join(VOCAB[start:start + n])


def run(texts, cfg):
    return apply_rules(pl.DataFrame({"text": texts}, schema={"text": pl.Utf8}), cfg)


# ------------------------------------------------------------------------------------------------ repetition


def test_duplicate_lines_and_paragraphs_by_count_and_by_characters():
    # 10 lines, 4 of them repeats of line 0: 4/10 > 0.3 duplicate-line fraction
    lines4 = "\n".join([distinct(3, 0)] * 5 + [distinct(3, 3 * i) for i in range(1, 6)])
    # 10 lines, 3 repeats (3/10 = 0.3, not above): passes on count, and the repeats hold 3*17=51 of 179 chars (> 0.2)
    lines3 = "\n".join([distinct(1, 0) + " " + distinct(2, 1)] * 4 + [distinct(3, 3 * i) for i in range(1, 7)])
    assert len(lines3) == 10 * 18 - 1
    # paragraphs: 2 of 3 equal -> 1/3 > 0.3 duplicate paragraphs (checked before lines)
    paras = "\n\n".join([distinct(4, 0), distinct(4, 0), distinct(4, 10)])
    assert run([lines4, lines3, paras], REP)["reason"].to_list() == [
        "gopher_dup_line_fraction", "gopher_dup_line_char_fraction", "gopher_dup_para_fraction"]
    no_line_rules = replace(REP, dup_line_fraction=None, dup_line_char_fraction=None, dup_para_fraction=None,
                            dup_para_char_fraction=None, top_ngram_char_fractions=(), dup_ngram_char_fractions=())
    assert run([lines4, lines3, paras], no_line_rules)["reason"].to_list() == [None, None, None]


def test_top_ngram_is_count_times_spaced_length_of_the_most_frequent():
    # "ab cd" x 3 among distinct words: top 2-gram "ab cd" (5 chars) x 3 = 15 chars
    doc = " ".join(["ab cd"] * 3 + VOCAB[:11])  # 6 + 66 words... length = 3*6 + 11*6 - 1 = 83
    assert len(doc) == 83
    # 15/83 = 0.18 < 0.20: passes 2-gram; the 3-gram "ab cd ab" occurs twice = 16 chars, 0.193 > 0.18
    assert run([doc], replace(REP, dup_ngram_char_fractions=()))["reason"].to_list() == ["gopher_top_3_gram"]
    assert run([doc], replace(REP, dup_ngram_char_fractions=(), top_ngram_char_fractions=((2, 0.18),)))["reason"].to_list() == ["gopher_top_2_gram"]


def test_duplicate_ngrams_use_datatrove_greedy_count():
    # words a b c d e a b c d e + 30 distinct: one repeated 5-gram "abcde" (5 chars, no spaces), then skip 5
    doc = "a b c d e a b c d e " + distinct(30)
    assert len(doc) == 20 + 30 * 6 - 1
    cfg = replace(REP, top_ngram_char_fractions=(), dup_ngram_char_fractions=((5, 5 / 199 - 1e-9),))
    assert run([doc], cfg)["reason"].to_list() == ["gopher_dup_5_gram_char_fraction"]
    cfg = replace(REP, top_ngram_char_fractions=(), dup_ngram_char_fractions=((5, 5 / 199),))
    assert run([doc], cfg)["reason"].to_list() == [None]


def test_repetition_never_divides_by_zero_and_tiny_docs_pass():
    out = run(["", "   ", "one", "a b", distinct(50)], REP)["reason"].to_list()
    # "a b": its only 2-gram is 3 of 3 characters (> 0.20); datatrove counts a top n-gram seen once too
    assert out == ["empty", "empty", None, "gopher_top_2_gram", None]


# ------------------------------------------------------------------------------------------------ C4


SENTS = "This is the first sentence. Here is another one! And a third one? Then a fourth one. Finally a fifth one."


def test_c4_keeps_only_good_lines_and_counts_removed():
    doc = "\n".join(["  " + SENTS + "  ", "A heading", "enable javascript to see this page.",
                     "Read our privacy policy today.", "cite this [1] and that [edit].", "trailing dots here..."])
    out = run([doc], C4)
    assert out["reason"].to_list() == [None]
    assert out["text"].to_list() == [SENTS + "\ncite this  and that ."]
    assert out["c4_lines_removed"].to_list() == [4]


def test_c4_document_rules_first_failure_wins():
    lorem = SENTS + "\nLorem ipsum dolor sit amet."
    curly = "int x = {0}; is the code here.\n" + lorem
    few = "Only one sentence in this document."
    js_curly = "Enable javascript { here please.\n" + SENTS  # the javascript line goes before the curly check
    assert run([lorem, curly, few, js_curly], C4)["reason"].to_list() == [
        "c4_lorem_ipsum", "c4_curly_bracket", "c4_too_few_sentences", None]
    assert run([curly], replace(C4, c4_curly_bracket=False))["reason"].to_list() == ["c4_lorem_ipsum"]


def test_c4_sentences_not_ended_by_ellipsis_or_letter_abbreviation():
    """spaCy's sentencizer (datatrove's English splitter) sees one sentence in each of these lines
    (kernel docs hwmon/sht21, leds/leds-sc27xx, peci/peci, checked with datatrove 0.10.1)."""
    three = "One is here. Two is here. Three is here."  # + 1 = 4 < 5; + 2 = 5 would pass
    abbrev = three + "\nWe use it e.g. maximum two measurements per second."
    ellipsis = three + "\nA multiplier of 125, like 125ms, 250ms ... 31875ms."
    five = three + "\nThen a fourth one. And a fifth."
    assert run([abbrev, ellipsis, five], C4)["reason"].to_list() == ["c4_too_few_sentences", "c4_too_few_sentences", None]


def test_other_gopher_quality_rules():
    base = distinct(60)
    hashes = base + " #" * 7  # 7 '#' / 67 words > 0.1
    bullets = "\n".join(["- item " + VOCAB[i] for i in range(10)] + [base])  # 10/11 > 0.9
    ellipsis_lines = "\n".join([VOCAB[i] + "..." for i in range(4)] + [base] * 6)  # 4/10 > 0.3 (and 4 '...' / 64 words < 0.1)
    cfg = replace(OFF, max_hash_word_ratio=0.1, max_ellipsis_word_ratio=0.1, max_bullet_lines_ratio=0.9,
                  max_ellipsis_lines_ratio=0.3)
    assert run([hashes, bullets, ellipsis_lines, base], cfg)["reason"].to_list() == [
        "gopher_hash_ratio", "gopher_bullet_lines", "gopher_ellipsis_lines", None]


# ------------------------------------------------------------------------------------------------ near dedup


def _write(d, rows):
    d.mkdir(parents=True, exist_ok=True)
    for i, part in enumerate(rows):
        pl.DataFrame({"doc_id": [r[0] for r in part], "source": ["s"] * len(part), "text": [r[1] for r in part]},
                     schema={"doc_id": pl.Utf8, "source": pl.Utf8, "text": pl.Utf8}).write_parquet(d / f"part-{i:05d}.parquet")
    return d


def test_components_union_find():
    root = _components(7, np.array([1, 6, 3, 5]), np.array([2, 2, 4, 3]))
    assert root.tolist() == [0, 1, 1, 3, 3, 3, 1]


def test_near_duplicates_across_partitions_and_tiny_docs(tmp_path):
    a = distinct(200)
    a_edit = a.replace(VOCAB[100], "changed", 1)  # one word of 200 differs: Jaccard of 5-gram sets ~ 0.95
    b = distinct(200, 300)
    rows = [[("a", a), ("b", b)] + [(f"t{i}", VOCAB[i]) for i in range(20)],  # 20 distinct one-word docs
            [("b2", b.upper().replace(" ", "\n")), ("a2", a_edit), ("t0bis", VOCAB[0]), ("p", "!!! ???")]]
    src = _write(tmp_path / "in", rows)
    out = tmp_path / "out"
    out.mkdir()
    stats = deduplicate(src, out, DedupConfig())
    assert stats == {"input": 26, "kept": 23, "duplicate": 3, "clusters": 3, "duplicate_exact": 2, "duplicate_near": 1}
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
    assert asg["duplicate_of"].drop_nulls().len() == 3


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
    lines = [json.dumps({"id": "k", "text": good}), json.dumps({"id": "d", "text": good.replace("mill", "MILL").replace("wind", "WIND")}),
             json.dumps({"id": "f", "text": "hi"}), "{broken", json.dumps({"id": "e", "text": ""})]
    (src / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(("\n".join(lines) + "\n").encode()))
    (src / "bad.jsonl.zst").write_bytes(b"not zstd at all")
    docs = [d for b in read_corpus(ReaderConfig(str(src), id_field="id")) for d in b.documents.column("doc_id").to_pylist()]
    assert docs == ["k", "d", "f", "e"]
    raw, cleaned, dd = (tmp_path / n for n in ("raw", "cleaned", "dd"))
    for d in (raw, cleaned, dd):
        d.mkdir()
    ingest(ReaderConfig(str(src), id_field="id"), raw)
    clean_corpus(raw, cleaned, QualityConfig())
    deduplicate(cleaned, dd)
    t = outcome_table(raw, cleaned, dd)
    assert t.rows() == [("duplicate", "exact", 1), ("filtered", "empty", 1), ("filtered", "gopher_min_words", 1),
                        ("kept", None, 1), ("rejected", "cannot read file", 1), ("rejected", "invalid JSON", 1)]
    assert t["documents"].sum() == corpus_accounting(raw, cleaned, dd)["input"] == 6
    assert "| **total** | | **6** |" in markdown_table(t)


def test_minhash_is_exact_min_whatever_the_block_size():
    """Signatures equal a direct min over each document's shingles, for blocks that split documents."""
    import numpy as np

    from largetrain_core.dedup import DedupConfig, _permutations, _permute_min

    rng = np.random.default_rng(0)
    sdoc = np.sort(rng.integers(0, 7, size=50)).astype(np.int64)     # doc 7 (and any unlucky one) has no shingle
    h = rng.integers(0, 2**64, size=50, dtype=np.uint64)
    a, b = _permutations(DedupConfig(bands=2, rows=3))
    expect = np.full((8, 6), np.iinfo(np.uint64).max, dtype=np.uint64)
    for d in range(8):
        if (sdoc == d).any():
            expect[d] = (h[sdoc == d][:, None] * a[None, :] + b[None, :]).min(axis=0)
    for chunk in (1, 3, 8, 50, 8192):
        assert np.array_equal(_permute_min(h, sdoc, 8, DedupConfig(bands=2, rows=3, chunk_shingles=chunk)), expect)
