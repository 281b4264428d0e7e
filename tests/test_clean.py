"""largetrain_core.clean: the training-text normalization and the Gopher quality rules."""

from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from largetrain_core.clean import QualityConfig, clean_corpus, normalize, quality_reason
from largetrain_core.corpus import ReaderConfig, ingest, read_corpus

DEFAULT = QualityConfig()
OFF = QualityConfig(min_words=None, max_words=None, min_mean_word_length=None, max_mean_word_length=None,
                    min_alpha_word_fraction=None, min_stop_words=None)

# 16 words, 59 characters: mean 3.69; stop words "the", "and", "to"; every word has a letter.
SENT = "The quick brown fox jumps over the lazy dog and then runs to the old mill."
SENT_WORDS = SENT.split()


def reasons(texts: list[str], cfg: QualityConfig = DEFAULT) -> list:
    return quality_reason(pl.DataFrame({"text": texts}, schema={"text": pl.Utf8}), cfg).to_list()


def words(n: int) -> str:
    """The first n words of SENT repeated: passes every rule except the word-count ones."""
    return " ".join((SENT_WORDS * (n // len(SENT_WORDS) + 1))[:n])


# ---------------------------------------------------------------------------------------------
# normalization


def test_normalize_removes_and_counts_controls_fixes_line_ends_and_composes():
    df = pl.DataFrame({"text": ["a\x00b\x00c", "x\r\ny\rz\n", "cafe\u0301", "\ufb01ne\tok\n", "bell\x07\x1b\x7fend",
                                "\x0b\x0c\x0e\x1f"]})
    out = normalize(df)
    assert out["text"].to_list() == ["abc", "x\ny\nz\n", "caf\u00e9", "\ufb01ne\tok\n", "bellend", ""]
    assert out["nul_removed"].to_list() == [2, 0, 0, 0, 0, 0]
    assert out["control_removed"].to_list() == [2, 0, 0, 0, 3, 4]
    assert out["nul_removed"].dtype == pl.UInt32 and out["control_removed"].dtype == pl.UInt32


def test_nul_bytes_case_removed_and_counted(cases, tmp_path):
    docs = pl.concat([pl.from_arrow(b.documents) for b in read_corpus(ReaderConfig(str(cases / "nul_bytes.txt")))])
    out = normalize(docs)
    assert out["text"].to_list() == ["This document has a NUL byte inside a sentence, and another here.\n"]
    assert out["nul_removed"].to_list() == [2]
    raw, cleaned = tmp_path / "raw", tmp_path / "cleaned"
    raw.mkdir(), cleaned.mkdir()
    ingest(ReaderConfig(str(cases / "nul_bytes.txt")), raw)
    totals = clean_corpus(raw, cleaned, replace(OFF))
    assert (totals["input"], totals["kept"], totals["nul_removed"], totals["control_removed"]) == (1, 1, 2, 2)
    kept = pl.read_parquet(cleaned / "part-00000.parquet")["text"].to_list()
    assert kept == ["This document has a NUL byte inside a sentence, and another here.\n"]


# ---------------------------------------------------------------------------------------------
# quality rules


def test_good_document_passes_default_rules():
    assert reasons([words(64), SENT * 4]) == [None, None]


def test_word_count_boundaries():
    assert reasons([words(49), words(50)]) == ["gopher_min_words", None]
    assert reasons([words(100_000), words(100_001)]) == [None, "gopher_max_words"]


def test_mean_word_length_boundaries():
    exactly_3 = "the and cat " * 20  # 60 words of 3 letters, stop words the/and
    low = "to be of an " * 15  # 60 words of 2 letters, stop words to/be/of
    exactly_10 = " ".join(["the"] * 10 + ["and"] * 10 + ["extraordinarily"] * 20 + ["abcdefghijkl"] * 20)
    assert (10 * 3 + 10 * 3 + 20 * 15 + 20 * 12) / 60 == 10.0
    high = exactly_10 + "m"  # one more character: 601 / 60
    assert reasons([exactly_3, low, exactly_10, high]) == [
        None, "gopher_mean_word_length_low", None, "gopher_mean_word_length_high"]


def test_alpha_word_fraction_boundary():
    base = SENT_WORDS * 3  # 48 alphabetic words
    at_80 = " ".join(base + ["1234"] * 12)  # 48 / 60 = 0.8 exactly: passes
    below = " ".join(base + ["1234"] * 13)  # 48 / 61
    mixed = " ".join(base + ["x1", "\u65e5\u672c", "caf\u00e9"] * 4)  # a letter anywhere makes an alphabetic word
    # "_" is not a letter; "___" is punctuation-only, so it is no word for the word count (64 words remain)
    underscores = " ".join(SENT_WORDS * 4 + ["___"] * 17)  # 64 / 81 = 0.79
    assert reasons([at_80, below, mixed, underscores]) == [
        None, "gopher_alpha_word_fraction", None, "gopher_alpha_word_fraction"]


def test_stop_words_need_two_distinct_case_sensitive_whole_tokens():
    """datatrove 0.10.1 GopherQualityFilter.filter (pipeline/filters/gopher_quality_filter.py):
    ``len(self.stop_words.intersection(set(words))) < self.min_stop_words`` -> distinct stop words
    among the word tokens, exact (case-sensitive) match; the Gopher paper (A.1.1): "at least two of".
    """
    no_stops = "quick brown fox jumps over lazy dog near old mill " * 6
    one_once = no_stops + "the "
    one_repeated = no_stops + "the " * 5          # 5 occurrences, 1 distinct: dropped
    substrings_only = no_stops + "theory another bother tooth offer "
    two_upper = no_stops + "The AND"               # case-sensitive: neither counts
    with_punct = no_stops + "the, and."            # whitespace tokens "the," and "and." are no stop words
    two_distinct = no_stops + "the and"
    assert reasons([no_stops, one_once, one_repeated, substrings_only, two_upper, with_punct, two_distinct]) == [
        "gopher_stop_words", "gopher_stop_words", "gopher_stop_words", "gopher_stop_words", "gopher_stop_words",
        "gopher_stop_words", None]
    # with the spaCy-like tokenization punctuation is split off, so "the," and "and." count
    spacy = replace(DEFAULT, words="spacy_like")
    assert reasons([with_punct, one_repeated], spacy) == [None, "gopher_stop_words"]


CRAFTED = [  # (document, the one rule it fails, the QualityConfig field that switches that rule off)
    (words(48), "gopher_min_words", "min_words"),
    (words(100_001), "gopher_max_words", "max_words"),
    ("to be of an " * 15, "gopher_mean_word_length_low", "min_mean_word_length"),
    ("the and " + "extraordinarily " * 58, "gopher_mean_word_length_high", "max_mean_word_length"),
    (" ".join(SENT_WORDS * 3 + ["1234"] * 13), "gopher_alpha_word_fraction", "min_alpha_word_fraction"),
    ("quick brown fox jumps over lazy dog near old mill " * 6, "gopher_stop_words", "min_stop_words"),
]


@pytest.mark.parametrize("doc,code,field", CRAFTED, ids=[c[1] for c in CRAFTED])
def test_each_rule_has_its_own_code_and_none_switches_it_off(doc, code, field):
    assert reasons([doc]) == [code]
    assert reasons([doc], replace(DEFAULT, **{field: None})) == [None]


def test_first_failing_rule_wins():
    # "hi": too few words, too short, no stop words -> the first rule in order
    assert reasons(["hi"]) == ["gopher_min_words"]
    assert reasons(["hi"], replace(DEFAULT, min_words=None)) == ["gopher_mean_word_length_low"]
    assert reasons(["hi"], replace(DEFAULT, min_words=None, min_mean_word_length=None)) == ["gopher_stop_words"]
    # mean length 2 and 20/60 non-alphabetic words: the length rule comes before the alpha rule
    doc = "to be " * 20 + "12 " * 20
    assert reasons([doc]) == ["gopher_mean_word_length_low"]
    assert reasons([doc], replace(DEFAULT, min_mean_word_length=None)) == ["gopher_alpha_word_fraction"]
    assert reasons([doc], replace(DEFAULT, min_mean_word_length=None, min_alpha_word_fraction=None)) == [None]


@pytest.mark.parametrize("cfg", [DEFAULT, OFF], ids=["default", "all_rules_off"])
def test_empty_and_whitespace_only_documents_are_empty(cfg):
    texts = ["", " ", "\n\t \r\n", "\u00a0\u2003\u3000", words(64)]
    assert reasons(texts, cfg) == ["empty", "empty", "empty", "empty", None]
    assert reasons(["", ""], cfg) == ["empty", "empty"]  # a batch of nothing but empties: no 0/0


def test_all_rules_off_keeps_every_non_empty_document():
    assert reasons(["hi", "1 2 3", "to " * 200_000], OFF) == [None, None, None]


def test_tiny_docs_case_all_filtered_with_reason(cases, tmp_path):
    raw, cleaned = tmp_path / "raw", tmp_path / "cleaned"
    raw.mkdir(), cleaned.mkdir()
    ingest(ReaderConfig(str(cases / "tiny_docs.jsonl"), id_field="id"), raw)
    totals = clean_corpus(raw, cleaned, DEFAULT)
    assert (totals["input"], totals["kept"], totals["filtered"]) == (5, 0, 5)
    assert totals["filtered_by_reason"] == {"empty": 2, "gopher_min_words": 3}
    filtered = pl.read_parquet(cleaned / "filtered.parquet")
    assert dict(zip(filtered["doc_id"], filtered["reason"])) == {
        "t0": "empty", "t1": "empty", "t2": "gopher_min_words", "t3": "gopher_min_words", "t4": "gopher_min_words"}
    assert sum(pl.read_parquet(p).height for p in cleaned.glob("part-*.parquet")) == 0


def test_clean_corpus_counts_and_keeps_input_order(tmp_path: Path):
    raw, cleaned = tmp_path / "raw", tmp_path / "cleaned"
    raw.mkdir(), cleaned.mkdir()
    texts = [words(64), "", "hi", SENT * 4 + "\r\n", "to be of an " * 15, words(70) + "\x00"]
    pl.DataFrame({"doc_id": ["d0", "d1", "d2"], "source": ["s"] * 3, "text": texts[:3]}).write_parquet(raw / "part-00000.parquet")
    pl.DataFrame({"doc_id": ["d3", "d4", "d5"], "source": ["s"] * 3, "text": texts[3:]}).write_parquet(raw / "part-00001.parquet")
    totals = clean_corpus(raw, cleaned, DEFAULT)
    assert totals["input"] == 6 and totals["kept"] == 3 and totals["filtered"] == 3
    assert totals["filtered_by_reason"] == {"empty": 1, "gopher_mean_word_length_low": 1, "gopher_min_words": 1}
    assert totals["nul_removed"] == 1 and totals["control_removed"] == 1
    kept = pl.concat([pl.read_parquet(p) for p in sorted(cleaned.glob("part-*.parquet"))])
    assert kept["doc_id"].to_list() == ["d0", "d3", "d5"]
    assert kept["text"].to_list() == [words(64), SENT * 4 + "\n", words(70)]
    assert totals["bytes_kept"] == sum(len(t.encode()) for t in kept["text"].to_list())
    assert set(kept.columns) == {"doc_id", "source", "text"}


def test_punctuation_only_tokens_do_not_count_as_words():
    """datatrove 0.10.1 GopherQualityFilter counts words and mean length over non_symbol_words (tokens
    with a character outside its PUNCTUATION_SET), even with a whitespace tokenizer."""
    base = words(48)                                   # 48 words: too short
    padded = base + " -- :: === ** |" * 4              # 20 punctuation-only tokens: still 48 words
    assert reasons([base, padded]) == ["gopher_min_words", "gopher_min_words"]
    long_words = "the and " + "extraordinarily " * 58  # mean length 14.5 over words
    # 200 "-" tokens would pull the mean under 10 if they counted
    assert reasons([long_words + "- " * 200], replace(DEFAULT, max_bullet_lines_ratio=None)) == [
        "gopher_mean_word_length_high"]


def test_spacy_like_keeps_dash_runs_as_one_token_as_spacy():
    """spaCy 3.8 blank("en") tokenizes "-----" as one token but "=====" as five (checked by hand);
    datatrove's alphabetic share divides by all tokens, so rst underlines weigh accordingly."""
    spacy = replace(DEFAULT, words="spacy_like")
    dashes = words(64) + "\n----------" * 8      # 64 alphabetic of 72 tokens: passes
    equals = words(64) + "\n==========" * 8      # 64 of 144 tokens: fails
    assert reasons([dashes, equals], spacy) == [None, "gopher_alpha_word_fraction"]
