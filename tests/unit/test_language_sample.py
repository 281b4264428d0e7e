"""Language ID on a bounded sample (largetrain_core.language.sample / identify, setting
language_sample_chars): what the sample holds, null as the whole text, and the decisions on
tests/data/language_id.jsonl and on long documents built from it equal to the whole text's."""

import json
import random
from dataclasses import replace

import numpy as np
import polars as pl
import pytest

from helpers import TESTS
from largetrain_core import language
from largetrain_core.clean import QualityConfig, apply_rules
from largetrain_core.rules import LANGUAGE_SAMPLE_CHARS

ROWS = [json.loads(line) for line in (TESTS / "data" / "language_id.jsonl").open(encoding="utf-8")]
LANGS = sorted({r["language"] for r in ROWS})
ONLY_LID = QualityConfig(gopher_quality=False)


def _long(lang: str, chars: int, seed: int) -> str:
    """A document of at least ``chars`` characters of ``lang``'s sentences and paragraphs, seeded order."""
    body = [r["text"] for r in ROWS if r["language"] == lang and r["kind"] in ("sentence", "paragraph")]
    rng, parts = random.Random(seed), []
    while sum(map(len, parts)) < chars:
        parts += rng.sample(body, len(body))
    return "\n\n".join(parts)


def test_short_documents_are_read_whole_and_null_is_the_whole_text():
    text = "word " * 200  # 1,000 characters
    assert language.sample(text, 1000) == text and language.sample(text, None) == text
    assert language.sample(text * 50, None) == text * 50
    assert ONLY_LID.language_sample_chars == LANGUAGE_SAMPLE_CHARS
    with pytest.raises(ValueError, match="language_sample_chars"):
        QualityConfig(language_sample_chars=0)


def test_a_long_document_is_bounded_windows_from_beginning_middle_and_end_cut_to_whole_words():
    words = [f"w{i:05d}" for i in range(20_000)]  # 6-character words, 140k characters
    text = " ".join(words)
    out = language.sample(text, 2000)
    windows = out.split("\n")
    assert len(windows) == language.WINDOWS and len(out) <= 2000 + language.WINDOWS
    assert windows[0].startswith("w00000 ") and windows[-1].endswith("w19999")
    for w in windows:  # whole words only, each window a contiguous run of the text
        assert all(t in words for t in w.split()) and w in text and not w.startswith(" ") and not w.endswith(" ")
    starts = [words.index(w.split()[0]) for w in windows]
    assert starts == sorted(starts) and starts[len(starts) // 2] in range(8_000, 12_000)  # one in the middle
    assert language.sample(text, 2000, windows=1) == text[:2000].rsplit(" ", 1)[0]  # the prefix method
    # text without spaces (Chinese): windows are kept as cut, same bound
    zh = "这个古老的港口小镇" * 1000
    out = language.sample(zh, 800)
    assert len(out.split("\n")) == 800 // 64 and len(out) <= 800 + language.WINDOWS and set(out) <= set(zh + "\n")


def test_on_the_handed_texts_and_long_documents_of_them_sampled_decisions_equal_the_whole_texts():
    """Every row of tests/data/language_id.jsonl (each shorter than the default sample: read whole)
    and, per language, two long documents (6,000-9,000 characters) of its sentences and paragraphs:
    the top label and the keep decision for its language at 0.65 are those of the whole text."""
    texts = [r["text"] for r in ROWS] + [_long(la, 6000 + 3000 * s, s) for la in LANGS for s in (0, 1)]
    wanted = [r["language"] for r in ROWS] + [la for la in LANGS for _ in (0, 1)]
    assert max(len(r["text"]) for r in ROWS) <= LANGUAGE_SAMPLE_CHARS < min(len(t) for t in texts[len(ROWS) :])
    whole = apply_rules(pl.DataFrame({"text": texts}), replace(ONLY_LID, language_sample_chars=None))
    sampled = apply_rules(pl.DataFrame({"text": texts}), ONLY_LID)
    assert sampled["language"].to_list() == whole["language"].to_list()
    short = len(ROWS)
    assert sampled["language_score"][:short].to_list() == whole["language_score"][:short].to_list()
    for la in LANGS:
        idx = [i for i, w in enumerate(wanted) if w == la]
        cfg = replace(ONLY_LID, languages=(la,))
        frame = pl.DataFrame({"text": [texts[i] for i in idx]})
        assert (
            apply_rules(frame, cfg)["reason"].to_list()
            == apply_rules(frame, replace(cfg, language_sample_chars=None))["reason"].to_list()
        )


def test_identify_takes_an_unsure_sampled_decision_again_on_the_whole_text():
    """A long English document whose end is German: the sample (beginning, middle, end) sees more German
    than the whole text holds, so its score for en is near the threshold; identify reads it whole."""
    en = _long("en", 9000, 0)
    de = _long("de", 1500, 0)
    text = en + "\n\n" + de
    whole_labels, whole_scores = language.detect([text])
    sampled_labels, sampled_scores = language.detect([text], 1000)
    assert whole_labels == sampled_labels == ["en"] and sampled_scores[0] < whole_scores[0]
    labels, scores, again = language.identify([text], 1000, ("en",), float(sampled_scores[0]) - 0.05)
    assert again == 1 and scores[0] == whole_scores[0]
    labels, scores, again = language.identify([text], 1000, None)  # nothing to decide: the sample's
    assert again == 0 and scores[0] == sampled_scores[0]
    # de wanted above 0.8: the sample's top label en (0.54) leaves de at most 0.46, 0.2 or more from 0.8: sure
    labels, scores, again = language.identify([text], 1000, ("de",), 0.8)
    assert again == 0 and labels == ["en"] and np.isclose(scores[0], sampled_scores[0])
