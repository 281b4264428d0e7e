"""largetrain_core.clean and largetrain_core.rules: the training-text normalization, the rule registry and
the Gopher quality, Gopher repetition and C4 rules."""

import dataclasses
import json
import re
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from helpers import TESTS
from largetrain_core.clean import QualityConfig, apply_rules, clean_corpus, normalize, quality_reason
from largetrain_core.corpus import ingest, read_corpus
from largetrain_core.pii import NAMES as PII_KINDS
from largetrain_core.readers import ReaderConfig
from largetrain_core.rules import GROUPS

DEFAULT = QualityConfig()
OFF = QualityConfig(
    min_words=None,
    max_words=None,
    min_mean_word_length=None,
    max_mean_word_length=None,
    min_alpha_word_fraction=None,
    min_stop_words=None,
)

# 16 words, 59 characters: mean 3.69; stop words "the", "and", "to"; every word has a letter.
SENT = "The quick brown fox jumps over the lazy dog and then runs to the old mill."
SENT_WORDS = SENT.split()


NO_QUALITY = QualityConfig(gopher_quality=False)
REP = replace(NO_QUALITY, gopher_repetition=True)
C4 = replace(NO_QUALITY, c4=True)
NO_TOP = {f"top_{n}_gram_char_fraction": None for n in (2, 3, 4)}
NO_DUP = {f"dup_{n}_gram_char_fraction": None for n in range(5, 11)}
VOCAB = [f"w{i:03d}x" for i in range(1000)]  # 5-character distinct words


def distinct(n: int, start: int = 0) -> str:
    return " ".join(VOCAB[start : start + n])


def run(texts, cfg):
    return apply_rules(pl.DataFrame({"text": texts}, schema={"text": pl.Utf8}), cfg)


def reasons(texts: list[str], cfg: QualityConfig = DEFAULT) -> list:
    return quality_reason(pl.DataFrame({"text": texts}, schema={"text": pl.Utf8}), cfg).to_list()


def words(n: int) -> str:
    """The first n words of SENT repeated: passes every rule except the word-count ones."""
    return " ".join((SENT_WORDS * (n // len(SENT_WORDS) + 1))[:n])


# ---------------------------------------------------------------------------------------------
# normalization


def test_normalize_removes_and_counts_controls_fixes_line_ends_and_composes():
    df = pl.DataFrame(
        {
            "text": [
                "a\x00b\x00c",
                "x\r\ny\rz\n",
                "cafe\u0301",
                "\ufb01ne\tok\n",
                "bell\x07\x1b\x7fend",
                "\x0b\x0c\x0e\x1f",
            ]
        }
    )
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


def test_invisible_chars_case_meaningless_format_characters_removed_and_counted(cases, tmp_path):
    raw, cleaned = tmp_path / "raw", tmp_path / "cleaned"
    raw.mkdir(), cleaned.mkdir()
    ingest(ReaderConfig(str(cases / "invisible_chars.jsonl"), id_field="id"), raw)
    totals = clean_corpus(raw, cleaned, OFF)
    kept = pl.read_parquet(cleaned / "part-00000.parquet")
    text = dict(zip(kept["doc_id"], kept["text"]))
    assert totals["kept"] == 7
    for doc_id, t in text.items():
        assert not set(t) & {"\u00ad", "\u200b", "\u2060", "\ufeff"}, doc_id
    latin = [t for d, t in text.items() if d != "persian_zwnj"]
    assert set(latin) == {text["original"]}  # ZWJ/ZWNJ inside Latin words carry nothing: gone too
    assert text["persian_zwnj"].count("\u200c") == 2  # the ZWNJ of the Persian words stays
    # removed characters: 6 soft hyphens, 8 zero-width spaces, 5 word joiners, 1 BOM, 4 ZWJ + 1 ZWNJ
    assert totals["format_removed"] == 6 + 8 + 5 + 1 + 5
    by_doc = normalize(pl.read_parquet(raw / "part-00000.parquet"))
    assert dict(zip(by_doc["doc_id"], by_doc["format_removed"])) == {
        "original": 0,
        "soft_hyphens": 6,
        "zero_width_space": 8,
        "word_joiner": 5,
        "bom_inside": 1,
        "zwj_zwnj": 5,
        "persian_zwnj": 0,
    }


def test_joiners_stay_where_a_script_uses_them():
    texts = [
        "\U0001f468\u200d\U0001f469\u200d\U0001f467 family",  # an emoji ZWJ sequence
        "\u0915\u094d\u200d\u0937 and \u0d28\u0d4d\u200d",  # Devanagari half form, Malayalam chillu
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",  # Persian
        "\ufeffleading BOM, a\u200db\u200cc, \u0436\u200d\u0436",  # Latin and Cyrillic: no joining
    ]
    out = normalize(pl.DataFrame({"text": texts}))
    assert out["text"].to_list()[:3] == texts[:3]
    assert out["text"][3] == "leading BOM, abc, \u0436\u0436"
    assert out["format_removed"].to_list() == [0, 0, 0, 4]


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
        None,
        "gopher_mean_word_length_low",
        None,
        "gopher_mean_word_length_high",
    ]


def test_alpha_word_fraction_boundary():
    base = SENT_WORDS * 3  # 48 alphabetic words
    at_80 = " ".join(base + ["1234"] * 12)  # 48 / 60 = 0.8 exactly: passes
    below = " ".join(base + ["1234"] * 13)  # 48 / 61
    mixed = " ".join(base + ["x1", "\u65e5\u672c", "caf\u00e9"] * 4)  # a letter anywhere makes an alphabetic word
    # "_" is not a letter; "___" is punctuation-only, so it is no word for the word count (64 words remain)
    underscores = " ".join(SENT_WORDS * 4 + ["___"] * 17)  # 64 / 81 = 0.79
    assert reasons([at_80, below, mixed, underscores]) == [
        None,
        "gopher_alpha_word_fraction",
        None,
        "gopher_alpha_word_fraction",
    ]


def test_stop_words_need_two_distinct_case_sensitive_whole_tokens():
    """datatrove 0.10.1 GopherQualityFilter.filter (pipeline/filters/gopher_quality_filter.py):
    ``len(self.stop_words.intersection(set(words))) < self.min_stop_words`` -> distinct stop words
    among the word tokens, exact (case-sensitive) match; the Gopher paper (A.1.1): "at least two of".
    """
    no_stops = "quick brown fox jumps over lazy dog near old mill " * 6
    one_once = no_stops + "the "
    one_repeated = no_stops + "the " * 5  # 5 occurrences, 1 distinct: dropped
    substrings_only = no_stops + "theory another bother tooth offer "
    two_upper = no_stops + "The AND"  # case-sensitive: neither counts
    with_punct = no_stops + "the, and."  # whitespace tokens "the," and "and." are no stop words
    two_distinct = no_stops + "the and"
    assert reasons([no_stops, one_once, one_repeated, substrings_only, two_upper, with_punct, two_distinct]) == [
        "gopher_stop_words",
        "gopher_stop_words",
        "gopher_stop_words",
        "gopher_stop_words",
        "gopher_stop_words",
        "gopher_stop_words",
        None,
    ]
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
        "t0": "empty",
        "t1": "empty",
        "t2": "gopher_min_words",
        "t3": "gopher_min_words",
        "t4": "gopher_min_words",
    }
    assert sum(pl.read_parquet(p).height for p in cleaned.glob("part-*.parquet")) == 0


def test_clean_corpus_counts_and_keeps_input_order(tmp_path: Path):
    raw, cleaned = tmp_path / "raw", tmp_path / "cleaned"
    raw.mkdir(), cleaned.mkdir()
    texts = [words(64), "", "hi", SENT * 4 + "\r\n", "to be of an " * 15, words(70) + "\x00"]
    pl.DataFrame({"doc_id": ["d0", "d1", "d2"], "source": ["s"] * 3, "text": texts[:3]}).write_parquet(
        raw / "part-00000.parquet"
    )
    pl.DataFrame({"doc_id": ["d3", "d4", "d5"], "source": ["s"] * 3, "text": texts[3:]}).write_parquet(
        raw / "part-00001.parquet"
    )
    totals = clean_corpus(raw, cleaned, DEFAULT)
    assert totals["input"] == 6 and totals["kept"] == 3 and totals["filtered"] == 3
    assert totals["filtered_by_reason"] == {"empty": 1, "gopher_mean_word_length_low": 1, "gopher_min_words": 1}
    assert totals["nul_removed"] == 1 and totals["control_removed"] == 1
    kept = pl.concat([pl.read_parquet(p) for p in sorted(cleaned.glob("part-*.parquet"))])
    assert kept["doc_id"].to_list() == ["d0", "d3", "d5"]
    assert kept["text"].to_list() == [words(64), SENT * 4 + "\n", words(70)]
    assert totals["bytes_kept"] == sum(len(t.encode()) for t in kept["text"].to_list())
    assert set(kept.columns) == {
        "doc_id",
        "source",
        "text",
        "language",
        "language_score",
        *(f"pii_{k}" for k in PII_KINDS),
    }


def test_punctuation_only_tokens_do_not_count_as_words():
    """datatrove 0.10.1 GopherQualityFilter counts words and mean length over non_symbol_words (tokens
    with a character outside its PUNCTUATION_SET), even with a whitespace tokenizer."""
    base = words(48)  # 48 words: too short
    padded = base + " -- :: === ** |" * 4  # 20 punctuation-only tokens: still 48 words
    assert reasons([base, padded]) == ["gopher_min_words", "gopher_min_words"]
    long_words = "the and " + "extraordinarily " * 58  # mean length 14.5 over words
    # 200 "-" tokens would pull the mean under 10 if they counted
    assert reasons([long_words + "- " * 200], replace(DEFAULT, max_bullet_lines_ratio=None)) == [
        "gopher_mean_word_length_high"
    ]


def test_spacy_like_keeps_dash_runs_as_one_token_as_spacy():
    """spaCy 3.8 blank("en") tokenizes "-----" as one token but "=====" as five (checked by hand);
    datatrove's alphabetic share divides by all tokens, so rst underlines weigh accordingly."""
    spacy = replace(DEFAULT, words="spacy_like")
    dashes = words(64) + "\n----------" * 8  # 64 alphabetic of 72 tokens: passes
    equals = words(64) + "\n==========" * 8  # 64 of 144 tokens: fails
    assert reasons([dashes, equals], spacy) == [None, "gopher_alpha_word_fraction"]


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
        "gopher_dup_line_fraction",
        "gopher_dup_line_char_fraction",
        "gopher_dup_para_fraction",
    ]
    no_line_rules = replace(
        REP,
        dup_line_fraction=None,
        dup_line_char_fraction=None,
        dup_para_fraction=None,
        dup_para_char_fraction=None,
        **NO_TOP,
        **NO_DUP,
    )
    assert run([lines4, lines3, paras], no_line_rules)["reason"].to_list() == [None, None, None]


def test_top_ngram_is_count_times_spaced_length_of_the_most_frequent():
    # "ab cd" x 3 among distinct words: top 2-gram "ab cd" (5 chars) x 3 = 15 chars
    doc = " ".join(["ab cd"] * 3 + VOCAB[:11])  # 6 + 66 words... length = 3*6 + 11*6 - 1 = 83
    assert len(doc) == 83
    # 15/83 = 0.18 < 0.20: passes 2-gram; the 3-gram "ab cd ab" occurs twice = 16 chars, 0.193 > 0.18
    assert run([doc], replace(REP, **NO_DUP))["reason"].to_list() == ["gopher_top_3_gram"]
    assert run([doc], replace(REP, **{**NO_DUP, **NO_TOP, "top_2_gram_char_fraction": 0.18}))["reason"].to_list() == [
        "gopher_top_2_gram"
    ]


def test_duplicate_ngrams_use_datatrove_greedy_count():
    # words a b c d e a b c d e + 30 distinct: one repeated 5-gram "abcde" (5 chars, no spaces), then skip 5
    doc = "a b c d e a b c d e " + distinct(30)
    assert len(doc) == 20 + 30 * 6 - 1
    cfg = replace(REP, **{**NO_TOP, **NO_DUP, "dup_5_gram_char_fraction": 5 / 199 - 1e-9})
    assert run([doc], cfg)["reason"].to_list() == ["gopher_dup_5_gram_char_fraction"]
    cfg = replace(REP, **{**NO_TOP, **NO_DUP, "dup_5_gram_char_fraction": 5 / 199})
    assert run([doc], cfg)["reason"].to_list() == [None]


def test_repetition_never_divides_by_zero_and_tiny_docs_pass():
    out = run(["", "   ", "one", "a b", distinct(50)], REP)["reason"].to_list()
    # "a b": its only 2-gram is 3 of 3 characters (> 0.20); datatrove counts a top n-gram seen once too
    assert out == ["empty", "empty", None, "gopher_top_2_gram", None]


# ------------------------------------------------------------------------------------------------ C4


SENTS = "This is the first sentence. Here is another one! And a third one? Then a fourth one. Finally a fifth one."


def test_c4_keeps_only_good_lines_and_counts_removed():
    doc = "\n".join(
        [
            "  " + SENTS + "  ",
            "A heading",
            "enable javascript to see this page.",
            "Read our privacy policy today.",
            "cite this [1] and that [edit].",
            "trailing dots here...",
        ]
    )
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
        "c4_lorem_ipsum",
        "c4_curly_bracket",
        "c4_too_few_sentences",
        None,
    ]
    assert run([curly], replace(C4, c4_curly_bracket=False))["reason"].to_list() == ["c4_lorem_ipsum"]


def test_c4_sentences_not_ended_by_ellipsis_or_letter_abbreviation():
    """spaCy's sentencizer (datatrove's English splitter) sees one sentence in each of these lines
    (kernel docs hwmon/sht21, leds/leds-sc27xx, peci/peci, checked with datatrove 0.10.1)."""
    three = "One is here. Two is here. Three is here."  # + 1 = 4 < 5; + 2 = 5 would pass
    abbrev = three + "\nWe use it e.g. maximum two measurements per second."
    ellipsis = three + "\nA multiplier of 125, like 125ms, 250ms ... 31875ms."
    five = three + "\nThen a fourth one. And a fifth."
    assert run([abbrev, ellipsis, five], C4)["reason"].to_list() == [
        "c4_too_few_sentences",
        "c4_too_few_sentences",
        None,
    ]


def test_other_gopher_quality_rules():
    base = distinct(60)
    hashes = base + " #" * 7  # 7 '#' / 67 words > 0.1
    bullets = "\n".join(["- item " + VOCAB[i] for i in range(10)] + [base])  # 10/11 > 0.9
    ellipsis_lines = "\n".join(
        [VOCAB[i] + "..." for i in range(4)] + [base] * 6
    )  # 4/10 > 0.3 (and 4 '...' / 64 words < 0.1)
    cfg = replace(
        OFF,
        max_hash_word_ratio=0.1,
        max_ellipsis_word_ratio=0.1,
        max_bullet_lines_ratio=0.9,
        max_ellipsis_lines_ratio=0.3,
    )
    assert run([hashes, bullets, ellipsis_lines, base], cfg)["reason"].to_list() == [
        "gopher_hash_ratio",
        "gopher_bullet_lines",
        "gopher_ellipsis_lines",
        None,
    ]


# ------------------------------------------------------------------------------------------------ the registry

ONLY = {g.name: replace(QualityConfig(gopher_quality=False), **{g.name: True}) for g in GROUPS}
FIVE = SENTS + "\n"  # five sentences on one kept C4 line
# every registered rule: (its group, a document that fails it[, settings that leave it alone in its group]);
# a rule added to a group needs its case here
GERMAN = next(
    r["text"]
    for r in map(json.loads, (TESTS / "data" / "language_id.jsonl").open())
    if r["language"] == "de" and r["kind"] == "paragraph"
)
RULE_CASES = {
    "language": ("language_id", GERMAN, {"languages": ("en",)}),
    "gopher_min_words": ("gopher_quality", words(48)),
    "gopher_max_words": ("gopher_quality", words(100_001)),
    "gopher_mean_word_length_low": ("gopher_quality", "to be of an " * 15),
    "gopher_mean_word_length_high": ("gopher_quality", "the and " + "extraordinarily " * 58),
    "gopher_hash_ratio": ("gopher_quality", words(64) + " #" * 8),  # 8 / 72 tokens
    "gopher_ellipsis_ratio": ("gopher_quality", words(32) + " ..." * 8 + " " + words(32)),
    "gopher_bullet_lines": ("gopher_quality", "\n".join(["- " + SENT] * 10 + [SENT])),
    "gopher_ellipsis_lines": ("gopher_quality", "\n".join([SENT + "..."] * 4 + [SENT] * 6)),
    "gopher_alpha_word_fraction": ("gopher_quality", " ".join(SENT_WORDS * 3 + ["1234"] * 13)),
    "gopher_stop_words": ("gopher_quality", "quick brown fox jumps over lazy dog near old mill " * 6),
    "gopher_dup_para_fraction": ("gopher_repetition", "\n\n".join([distinct(4, 0), distinct(4, 0), distinct(4, 10)])),
    "gopher_dup_para_char_fraction": (
        "gopher_repetition",
        "\n\n".join([distinct(20), distinct(20), distinct(3, 30), distinct(3, 40)]),
    ),
    "gopher_dup_line_fraction": (
        "gopher_repetition",
        "\n".join([distinct(3, 0)] * 5 + [distinct(3, 3 * i) for i in range(1, 6)]),
    ),
    "gopher_dup_line_char_fraction": (
        "gopher_repetition",
        "\n".join([distinct(3, 0)] * 4 + [distinct(3, 3 * i) for i in range(1, 7)]),
    ),
    "gopher_top_2_gram": ("gopher_repetition", " ".join(["ab cd"] * 4 + VOCAB[:11])),
    "gopher_top_3_gram": ("gopher_repetition", " ".join(["ab cd"] * 3 + VOCAB[:11])),
    "gopher_top_4_gram": ("gopher_repetition", " ".join(["ab cd ef gh"] * 2 + VOCAB[:12])),
    # one repeated n-gram: 5n of 30n - 1 characters (> 0.15); shorter repeats and top n-grams would fail first
    **{
        f"gopher_dup_{n}_gram_char_fraction": (
            "gopher_repetition",
            " ".join(VOCAB[200 : 200 + n] * 2 + VOCAB[: 3 * n]),
            {**NO_TOP, **NO_DUP, f"dup_{n}_gram_char_fraction": 0.15 - 0.01 * (n - 5)},
        )
        for n in range(5, 11)
    },
    "c4_max_word_length": ("c4", FIVE + "A line with a " + "x" * 1001 + " word."),
    "c4_terminal_punctuation": ("c4", FIVE + "A line without an end"),
    "c4_min_words_per_line": ("c4", FIVE + "Two words."),
    "c4_lorem_ipsum": ("c4", FIVE + "Lorem ipsum dolor sit amet."),
    "c4_javascript": ("c4", FIVE + "Please enable javascript to read."),
    "c4_curly_bracket": ("c4", FIVE + "The struct {int x;} is here."),
    "c4_policy": ("c4", FIVE + "Read our privacy policy today."),
    "c4_too_few_sentences": ("c4", "Only one sentence in this document."),
}
RULES = {r.code: (g, r) for g in GROUPS for r in g.rules}


def test_every_registered_rule_has_a_case_and_a_unique_code():
    assert sorted(RULE_CASES) == sorted(RULES)
    assert len(RULES) == sum(len(g.rules) for g in GROUPS)


def test_every_rule_parameter_is_a_quality_config_field_with_its_default_and_source():
    fields = {f.name: f for f in dataclasses.fields(QualityConfig)}
    for g in GROUPS:
        assert fields[g.name].type is bool and fields[g.name].default is g.on
        for p in (*g.params, *(p for r in g.rules for p in r.params)):
            f = fields[p.name]
            assert (f.default, f.type, f.metadata["description"]) == (p.default, p.type, p.description)
            assert re.search(r"\b(19|20)\d\d\b", p.description), p  # the paper (or measurement) the default comes from
    assert all(f.metadata.get("description") for f in fields.values())


@pytest.mark.parametrize("code", sorted(RULE_CASES))
def test_each_rule_fails_its_case_and_its_first_parameter_switches_it_off(code):
    group, rule = RULES[code]
    name, doc, *settings = RULE_CASES[code]
    assert name == group.name
    cfg = replace(ONLY[group.name], **(settings[0] if settings else {}))
    off = replace(cfg, **{rule.params[0].name: False if rule.params[0].type is bool else None})
    on_out, off_out = run([doc], cfg), run([doc], off)
    if rule.removes == "line":  # C4 line rules: the line goes, the document stays
        line = doc.split("\n")[-1]
        assert on_out["reason"].to_list() == [None] and on_out["c4_lines_removed"].to_list() == [1]
        assert line not in on_out["text"][0]
        assert off_out["reason"].to_list() == [None] and off_out["text"][0] == doc.strip()
    else:
        assert on_out["reason"].to_list() == [code]
        assert off_out["reason"][0] != code
        # and the group's switch turns the whole group off
        assert run([doc], replace(cfg, **{group.name: False}))["reason"].to_list() == [None]


def test_empty_is_checked_whatever_the_switches():
    none = QualityConfig(gopher_quality=False)
    assert reasons(["", " \u2003\n", "x"], none) == ["empty", "empty", None]
    with pytest.raises(ValueError, match="words must be one of"):
        QualityConfig(words="spacy")


# ------------------------------------------------------------------------------------------------ whitespace-only lines

EVERY_GROUP = replace(DEFAULT, gopher_repetition=True, c4=True)


def test_unicode_space_lines_case_is_not_a_duplicate_line_document(cases):
    text = (cases / "unicode_space_lines.txt").read_text()
    sentences = [line for line in text.split("\n") if line.strip()]
    assert len(sentences) == 60 and len(set(sentences)) == 60
    assert all(set(line) == {"\u2003"} for line in text.split("\n") if line and not line.strip())
    # "Sentence number" opens every line: 900 of 4,384 characters in the top 2-gram (> 0.20), a rule
    # datatrove applies too; with the n-gram rules off, nothing else fails it
    assert run([text], REP)["reason"].to_list() == ["gopher_top_2_gram"]
    for cfg in (REP, replace(REP, c4=True), replace(REP, words="spacy_like")):
        assert run([text], replace(cfg, **NO_TOP, **NO_DUP))["reason"].to_list() == [None]
    c4 = run([text], C4)
    assert c4["text"].to_list() == ["\n".join(sentences)] and c4["c4_lines_removed"][0] == text.count("\u2003\u2003\n")
    # the same separators as a repeated line of content are what the rule is for
    assert run([text.replace("\u2003\u2003", "Filler.")], REP)["reason"].to_list() == ["gopher_dup_line_fraction"]


BLANK_LINE_DOCS = [
    "\n\n".join([distinct(4, 0), distinct(4, 0), distinct(4, 10)]),
    "\n\n".join(distinct(6, 6 * i) for i in range(20)) + "\n\n",
    "\n" + "\n\n\n".join([SENT] * 2 + [words(64)]),
    words(64) + "\n\n- one item\n\n- two items\n",
    FIVE + "\n\n" + SENTS + "\n\n\n" + SENTS,
    "\n\n".join(["Lorem ipsum dolor sit amet, it said.", SENTS]),
    "\n".join(["- " + SENT] * 10 + ["", SENT]),
    " ".join(["ab cd"] * 4 + VOCAB[:11]) + "\n\n" + " ".join(VOCAB[:11]),
]


@pytest.mark.parametrize(
    "space", [" ", "\t", "\u2003\u2003", "\u00a0", "\u3000", "\u2009\u202f", "\u2028", "\u0085", "\u1680"]
)
def test_a_line_of_any_unicode_whitespace_is_a_blank_line_in_every_rule(space):
    """Filling every empty line with Unicode White_Space characters changes no rule's decision, no C4 text."""
    import re

    spaced = [re.sub(r"(?m)^$", space, d) for d in BLANK_LINE_DOCS]
    assert all(a != b for a, b in zip(spaced, BLANK_LINE_DOCS))
    for cfg in (EVERY_GROUP, replace(EVERY_GROUP, words="spacy_like"), DEFAULT, REP, C4):
        a, b = run(BLANK_LINE_DOCS, cfg), run(spaced, cfg)
        assert a["reason"].to_list() == b["reason"].to_list()
        assert a["c4_lines_removed"].to_list() == b["c4_lines_removed"].to_list()
        if cfg.c4:  # the kept documents' texts, rewritten by C4
            kept = a["reason"].is_null()
            assert a["text"].filter(kept).to_list() == b["text"].filter(kept).to_list()
            assert kept.any() or cfg.gopher_quality
    assert (
        run(spaced, DEFAULT)["text"].to_list() == spaced
    )  # the training text keeps its lines; only the rules read them blank


def test_the_rules_leave_no_reference_cycle_holding_a_batch():
    """Nothing a rule builds for a batch (the repetition features, their n-gram steps) is kept alive by a
    reference cycle: such a batch's arrays are freed only when Python's cyclic collector runs, which
    polars and numpy work rarely triggers, so cleaning's memory grew with the corpus."""
    import gc

    texts = BLANK_LINE_DOCS + [words(200), "\n\n".join([SENT] * 5)]
    gc.collect()
    gc.disable()
    try:
        run(texts, EVERY_GROUP)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        ours = sorted({type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("largetrain_core")})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert ours == []


def test_the_asset_page_shows_a_removed_document_of_each_top_reason_with_its_text(tmp_path):
    """cleaned_text's ``removed_examples``: the reasons that removed most documents, most first, each with its
    count, the document's source and the start of its raw text (line breaks and pipes kept readable in a table)."""
    from largetrain_core.executors.local import LocalExecutor
    from largetrain_core.stages.base import StageRun
    from largetrain_core.stages.cleaned_text import cleaned_text
    from largetrain_core.stages.raw_corpus import raw_corpus

    src = tmp_path / "corpus"
    src.mkdir()
    prose = "The kernel schedules each task on a processor and keeps the run queue of every core in order. " * 12
    for i in range(4):
        (src / f"good{i}.txt").write_text(prose + f"Document {i} ends here.")
    for i in range(3):
        (src / f"short{i}.txt").write_text(f"too short | line one\nline two {i}")  # gopher: too few words
    root, ex = tmp_path / "root", LocalExecutor()
    raw = raw_corpus(ReaderConfig(str(src)), StageRun(root, ("c", "raw_corpus"), "0", executor=ex))
    cleaned = cleaned_text(NO_QUALITY, raw, StageRun(root, ("c", "cleaned_text"), "0", executor=ex))
    assert "removed_examples" not in cleaned.metadata  # nothing removed
    cleaned = cleaned_text(DEFAULT, raw, StageRun(root, ("c", "cleaned_text"), "0", executor=ex))
    reasons = cleaned.stats["filtered_by_reason"]
    assert sum(reasons.values()) == cleaned.stats["filtered"] == 3
    table = cleaned.metadata["removed_examples"].splitlines()
    assert table[0] == "| reason | removed | example document | its text, first characters |"
    top = max(reasons, key=lambda r: (reasons[r], r))
    assert table[2].startswith(f"| {top} | {reasons[top]} | short") and len(table) == 2 + len(reasons)
    assert "too short \\| line one⏎line two " in table[2]
