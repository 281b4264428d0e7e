"""Text normalization and document quality filters, vectorized with polars and numpy over Arrow batches.

Normalization policy for the *training text* (what the model sees):

1. NUL bytes and the other C0 control characters U+0000-U+0008, U+000B, U+000C,
   U+000E-U+001F and U+007F are removed; tab and newline are kept. Removed characters are counted
   per document (``nul_removed``, ``control_removed``).
2. Line endings ``\\r\\n`` and lone ``\\r`` become ``\\n``.
3. Unicode NFC (canonical composition): visually identical text gets identical code points while
   compatibility characters (ligatures, full-width forms) are kept as written.

The *deduplication key* (largetrain_core.dedup) is stricter and never stored as training text: NFKC,
case-folded, whitespace runs collapsed to one space, stripped.

Rules, in the order they are checked (a removed document gets the code of the *first* failing
rule; an empty or whitespace-only document always gets ``empty``, so no rule divides by zero):

* Gopher quality rules (Rae et al. 2021, "Scaling Language Models: Methods, Analysis & Insights
  from Training Gopher", appendix A.1.1), thresholds and order as datatrove's ``GopherQualityFilter``:
  word count, mean word length, '#' and ellipsis per word, bullet lines, ellipsis-ending lines,
  alphabetic words, stop words (distinct, case-sensitive tokens, as datatrove).
* Gopher repetition rules (same paper, Table A1), as datatrove's ``GopherRepetitionFilter``:
  duplicate paragraphs / lines (share of elements and of characters), top 2/3/4-gram character
  share, duplicate 5..10-gram character share (datatrove's greedy count: a repeated n-gram's
  characters without spaces, then skip n words).
* C4 line rules (Raffel et al. 2020, section 2.2), as datatrove's ``C4QualityFilter``
  (``split_paragraph=True``): lines are stripped; a line is dropped when it has a word over 1,000
  characters, does not end in terminal punctuation ``. ? ! " '`` (or ends in ``...``) after removing
  ``[1]``/``[edit]``/``[citation needed]``, has fewer than 3 words, mentions "javascript" or a
  policy phrase; the document is dropped on "lorem ipsum" or "{" in a kept line, or when the kept
  lines hold fewer than 5 sentences. Kept documents keep only the kept lines (``c4_lines_removed``).

Words are whitespace-separated tokens (``\\S+``). datatrove splits words with spaCy's English
tokenizer (punctuation becomes separate tokens); see benchmarks/prep.py for the agreement this gives.
Sentences (C4) are counted as runs of ``. ! ?`` followed by whitespace and more text, plus one:
spaCy's sentencizer (datatrove's English sentence splitter) splits at the same characters, except
after an ellipsis ``...`` or a letter-dot abbreviation such as ``e.g.``/``i.e.`` (one token each for
spaCy's tokenizer, not a sentence-final one), which we skip too. Other abbreviations ("etc.", "Dr.")
still end a sentence here and not in spaCy: benchmarks/prep.py measures what remains.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from largetrain_core.dedup import fmix64
from largetrain_core.storage import part_files

# Gopher paper, A.1.1; datatrove GopherQualityFilter.stop_words default.
GOPHER_STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
# datatrove c4_filters.POLICY_SUBSTRINGS
C4_POLICY_SUBSTRINGS = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")

# Word tokenization. "whitespace": \S+ runs (the Gopher paper's words). "spacy_like": approximates the
# spaCy English tokenizer datatrove uses (punctuation characters become tokens of their own, "..." one
# token, word-internal . and ' kept as in "e.g" or "3.14"). With either, the word count and the mean word
# length use only tokens holding a character that is not punctuation or a symbol (so "--", "::" or "==="
# do not count), as datatrove 0.10.1 GopherQualityFilter's non_symbol_words (its PUNCTUATION_SET; ours is
# the Unicode classes P and S); the hash/ellipsis ratios and the alphabetic share divide by all tokens, as there.
# Runs of "-", "~" or "^" stay one token, as in spaCy 3.8 (rst underlines "-----"; "=====" and "****" split).
WORD_PATTERNS = {"whitespace": r"\S+", "spacy_like": r"\.\.\.|\w+(?:[.'\u2019]\w+)*|-+|~+|\^+|[^\w\s]"}
_NON_SYMBOL = r"[^\p{P}\p{S}]"

_CONTROL = r"[\x00-\x08\x0B\x0C\x0E-\x1F\x7F]"
_SEP = "\x00"  # removed by normalize(), so safe as a split marker


@dataclass(frozen=True)
class QualityConfig:
    """Thresholds of the document rules; ``None`` switches one rule off, ``False`` a whole group.

    words: the word tokenization, a key of WORD_PATTERNS.
    Gopher quality (Gopher A.1.1; datatrove GopherQualityFilter defaults):
      min_words/max_words: 50..100,000 words. min/max_mean_word_length: 3..10 characters per word
        (words: tokens with a character outside Unicode P/S, as datatrove non_symbol_words).
      max_hash_word_ratio / max_ellipsis_word_ratio: '#' / ('...' + '…') occurrences per word <= 0.1.
      max_bullet_lines_ratio: <= 90% of lines start with '•' or '-' (after leading whitespace).
      max_ellipsis_lines_ratio: <= 30% of lines end with '...' or '…'.
      min_alpha_word_fraction: >= 80% of words contain an alphabetic character.
      min_stop_words: >= 2 *distinct* words of ``stop_words`` among the word tokens, compared exactly
        (case-sensitive: "The" is not "the"; "the," is one whitespace token and no stop word), as
        datatrove 0.10.1 ``GopherQualityFilter.filter``:
        ``len(self.stop_words.intersection(set(words))) < self.min_stop_words`` (the Gopher paper
        says "at least two of the following English words", A.1.1).
    Gopher repetition (``gopher_repetition``, Gopher Table A1; datatrove GopherRepetitionFilter):
      dup_para_fraction 0.3, dup_para_char_fraction 0.2, dup_line_fraction 0.3,
      dup_line_char_fraction 0.2, top_ngram_char_fractions {2: 0.20, 3: 0.18, 4: 0.16},
      dup_ngram_char_fractions {5: 0.15, ..., 10: 0.10}; fractions of elements or of characters.
    C4 lines (``c4``; Raffel et al. 2020 section 2.2, datatrove C4QualityFilter defaults):
      c4_max_word_length 1,000, c4_min_words_per_line 3, c4_min_sentences 5, and the switches below.

    The repetition and C4 groups are opt-in here (C4 rewrites the text, repetition costs the most);
    the Dagster config turns them on per corpus.
    """

    words: str = "whitespace"
    min_words: int | None = 50
    max_words: int | None = 100_000
    min_mean_word_length: float | None = 3.0
    max_mean_word_length: float | None = 10.0
    max_hash_word_ratio: float | None = 0.1
    max_ellipsis_word_ratio: float | None = 0.1
    max_bullet_lines_ratio: float | None = 0.9
    max_ellipsis_lines_ratio: float | None = 0.3
    min_alpha_word_fraction: float | None = 0.8
    min_stop_words: int | None = 2
    stop_words: tuple[str, ...] = field(default=GOPHER_STOP_WORDS)
    gopher_repetition: bool = False
    dup_para_fraction: float | None = 0.3
    dup_para_char_fraction: float | None = 0.2
    dup_line_fraction: float | None = 0.3
    dup_line_char_fraction: float | None = 0.2
    top_ngram_char_fractions: tuple[tuple[int, float], ...] = ((2, 0.20), (3, 0.18), (4, 0.16))
    dup_ngram_char_fractions: tuple[tuple[int, float], ...] = (
        (5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))
    c4: bool = False
    c4_max_word_length: int | None = 1000
    c4_remove_citations: bool = True
    c4_terminal_punctuation: bool = True
    c4_min_words_per_line: int | None = 3
    c4_lorem_ipsum: bool = True
    c4_javascript: bool = True
    c4_curly_bracket: bool = True
    c4_policy: bool = True
    c4_min_sentences: int | None = 5

    def to_dict(self) -> dict:
        return asdict(self)


def normalize(df: pl.DataFrame) -> pl.DataFrame:
    """Apply the training-text normalization to column ``text`` (Utf8).

    Returns the frame with ``text`` replaced and two new UInt32 columns ``nul_removed`` and
    ``control_removed`` (control characters removed, NULs included).
    """
    text = pl.col("text")
    return df.with_columns(
        nul_removed=text.str.count_matches("\x00", literal=True).cast(pl.UInt32),
        control_removed=text.str.count_matches(_CONTROL).cast(pl.UInt32),
        text=text.str.replace_all(_CONTROL, "").str.replace_all("\r\n?", "\n").str.normalize("NFC"),
    )


def _first(rules: list[tuple[pl.Expr, str]]) -> pl.Expr:
    if not rules:
        return pl.lit(None, dtype=pl.Utf8)
    expr = pl.when(rules[0][0]).then(pl.lit(rules[0][1]))
    for cond, code in rules[1:]:
        expr = expr.when(cond).then(pl.lit(code))
    return expr.otherwise(pl.lit(None, dtype=pl.Utf8))


def _gopher_quality_reason(df: pl.DataFrame, cfg: QualityConfig) -> pl.Series:
    text = pl.col("text")
    if cfg.words not in WORD_PATTERNS:
        raise ValueError(f"words must be one of {sorted(WORD_PATTERNS)}, got {cfg.words!r}")
    words = text.str.extract_all(WORD_PATTERNS[cfg.words])
    counted = words.list.eval(pl.element().filter(pl.element().str.contains(_NON_SYMBOL)))
    lines = text.str.strip_suffix("\n").str.split("\n")  # str.splitlines(): no empty last line after a final \n
    stats = df.lazy().select(
        n_tokens=words.list.len(),
        n_words=counted.list.len(),
        mean_len=counted.list.eval(pl.element().str.len_chars()).list.mean(),
        alpha=words.list.eval(pl.element().str.contains(r"[^\W\d_]")).list.mean(),
        # datatrove 0.10.1 GopherQualityFilter: len(set(stop_words) & set(words)), distinct and case-sensitive
        stops=words.list.eval(pl.element().filter(pl.element().is_in(list(cfg.stop_words)))).list.n_unique(),
        hashes=text.str.count_matches("#", literal=True),
        ellipses=text.str.count_matches("...", literal=True) + text.str.count_matches("\u2026", literal=True),
        bullets=lines.list.eval(pl.element().str.contains(r"^\s*[\u2022-]")).list.mean(),
        end_ellipsis=lines.list.eval(pl.element().str.contains(r"(?:\.\.\.|\u2026)\s*$")).list.mean(),
    )
    c = pl.col
    rules: list[tuple[pl.Expr, str]] = [(c("n_tokens") == 0, "empty")]
    checks = [
        (cfg.min_words, lambda t: c("n_words") < t, "gopher_min_words"),
        (cfg.max_words, lambda t: c("n_words") > t, "gopher_max_words"),
        (cfg.min_mean_word_length, lambda t: c("mean_len") < t, "gopher_mean_word_length_low"),
        (cfg.max_mean_word_length, lambda t: c("mean_len") > t, "gopher_mean_word_length_high"),
        (cfg.max_hash_word_ratio, lambda t: c("hashes") / c("n_tokens") > t, "gopher_hash_ratio"),
        (cfg.max_ellipsis_word_ratio, lambda t: c("ellipses") / c("n_tokens") > t, "gopher_ellipsis_ratio"),
        (cfg.max_bullet_lines_ratio, lambda t: c("bullets") > t, "gopher_bullet_lines"),
        (cfg.max_ellipsis_lines_ratio, lambda t: c("end_ellipsis") > t, "gopher_ellipsis_lines"),
        (cfg.min_alpha_word_fraction, lambda t: c("alpha") < t, "gopher_alpha_word_fraction"),
        (cfg.min_stop_words, lambda t: c("stops") < t, "gopher_stop_words"),
    ]
    rules += [(cond(t), code) for t, cond, code in checks if t is not None]
    return stats.select(reason=_first(rules)).collect().to_series()


# ------------------------------------------------------------------------------------------------
# Gopher repetition


def _dup_elements(df: pl.DataFrame, pieces: pl.Expr) -> pl.DataFrame:
    """Per row ``i``: number of pieces, duplicate pieces (every occurrence after the first) and their characters."""
    ex = df.select("i", p=pieces).explode("p")
    per = ex.group_by("i", "p").agg(n=pl.len()).with_columns(d=pl.col("n") - 1, dc=(pl.col("n") - 1) * pl.col("p").str.len_chars())
    return per.group_by("i").agg(total=pl.col("n").sum(), dup=pl.col("d").sum(), dup_chars=pl.col("dc").sum())


def _greedy_dup_chars(keys: np.ndarray, lens: np.ndarray, n: int) -> int:
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


def _repetition_reason(df: pl.DataFrame, cfg: QualityConfig) -> pl.Series:
    """Reason codes of the Gopher repetition rules for the non-empty documents of ``df`` (columns i, text)."""
    text = pl.col("text")
    n_docs = df.height
    chars = df["text"].str.len_chars().cast(pl.Float64).to_numpy()
    fails: list[tuple[np.ndarray, str]] = []

    def flag(frame: pl.DataFrame, value: np.ndarray) -> np.ndarray:
        out = np.zeros(n_docs, dtype=np.float64)
        out[frame["i"].to_numpy()] = value
        return out

    paras = _dup_elements(df, text.str.strip_chars().str.replace_all(r"\n{2,}", _SEP).str.split(_SEP))
    lines = _dup_elements(df, text.str.replace_all(r"\n+", _SEP).str.split(_SEP))
    for frame, frac, char_frac, name in ((paras, cfg.dup_para_fraction, cfg.dup_para_char_fraction, "para"),
                                         (lines, cfg.dup_line_fraction, cfg.dup_line_char_fraction, "line")):
        total, dup, dup_chars = (flag(frame, frame[k].to_numpy()) for k in ("total", "dup", "dup_chars"))
        if frac is not None:
            fails.append((dup > frac * total, f"gopher_dup_{name}_fraction"))
        if char_frac is not None:
            fails.append((dup_chars > char_frac * chars, f"gopher_dup_{name}_char_fraction"))

    w = df.select("i", w=text.str.extract_all(WORD_PATTERNS[cfg.words])).explode("w").drop_nulls("w")
    doc = w["i"].to_numpy().astype(np.int64)
    wh = w["w"].hash(seed=0).to_numpy()
    wl = w["w"].str.len_chars().to_numpy().astype(np.int64)
    W = len(doc)
    keys, lens = wh.copy(), wl.copy()
    top = dict(cfg.top_ngram_char_fractions)
    dupf = dict(cfg.dup_ngram_char_fractions)
    cand = None  # per n-gram start: does this n-gram occur more than once in its document?
    for n in range(2, 11):
        if W < n:
            break
        keys = keys[:-1] * np.uint64(0x100000001B3) ^ wh[n - 1:]
        lens = lens[:-1] + wl[n - 1:]
        valid = doc[n - 1:] == doc[:W - n + 1]
        # an n-gram can repeat only where both of its (n-1)-grams repeat: only those are hashed and grouped
        cs = np.flatnonzero(valid if cand is None else valid & cand[:-1] & cand[1:])
        sd = doc[cs]
        # one 64-bit key per (document, n-gram): hashing a single column is much cheaper than a struct
        dk = fmix64(keys[cs] ^ fmix64(sd.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)))
        dup = pl.Series(dk, dtype=pl.UInt64).is_duplicated().to_numpy() if len(cs) else np.zeros(0, bool)
        ds, dkd = cs[dup], dk[dup]  # every occurrence of a repeated n-gram, in text order
        cand = np.zeros(len(valid), dtype=bool)
        cand[ds] = True
        starts = np.flatnonzero(valid)
        if n in top:
            # datatrove find_top_duplicate: the most frequent n-gram (first seen among ties), len(" ".join) * count;
            # without a repeated n-gram that is the document's first n-gram, seen once
            val = np.zeros(n_docs)
            sdoc = doc[starts]
            first = starts[np.r_[True, sdoc[1:] != sdoc[:-1]]] if len(starts) else starts
            val[doc[first]] = lens[first] + n - 1
            if len(ds):
                g = pl.DataFrame({"d": doc[ds], "k": dkd, "pos": ds, "l": lens[ds]})
                t = (g.group_by("k").agg(d=pl.col("d").first(), c=pl.len(), first=pl.col("pos").min(), l=pl.col("l").first())
                     .with_columns(score=pl.col("c").cast(pl.Int64) * (1 << 40) - pl.col("first"))
                     .group_by("d").agg(c=pl.col("c").get(pl.col("score").arg_max()), l=pl.col("l").get(pl.col("score").arg_max())))
                val[t["d"].to_numpy()] = t["c"].to_numpy() * (t["l"].to_numpy() + n - 1)
            fails.append((val > top[n] * chars, f"gopher_top_{n}_gram"))
        if n in dupf:
            # upper bound: characters of words inside any repeated occurrence; exact greedy count only where it matters
            s = ds[~pl.Series(dkd, dtype=pl.UInt64).is_first_distinct().to_numpy()] if len(ds) else ds
            cover = np.cumsum(np.bincount(s, minlength=W + 1)[:W] - np.bincount(s + n, minlength=W + n + 1)[:W]) > 0
            bound = np.bincount(doc[cover], weights=wl[cover], minlength=n_docs)
            exact = np.zeros(n_docs)
            sdoc = doc[starts]
            for d in np.flatnonzero(bound > dupf[n] * chars):
                sel = starts[np.searchsorted(sdoc, d):np.searchsorted(sdoc, d, side="right")]
                exact[d] = _greedy_dup_chars(keys[sel].tolist(), lens[sel], n)
            fails.append((exact > dupf[n] * chars, f"gopher_dup_{n}_gram_char_fraction"))
    # appended in datatrove's order: paragraphs, lines, top 2..4-grams, duplicate 5..10-grams
    reason = np.full(n_docs, None, dtype=object)
    for mask, code in reversed(fails):
        reason[mask] = code
    return pl.Series("reason", reason.tolist(), dtype=pl.Utf8)


# ------------------------------------------------------------------------------------------------
# C4 lines


_CITATION = r"\[\d*\]|\[edit\]|\[citation needed\]"


def _c4(df: pl.DataFrame, cfg: QualityConfig) -> pl.DataFrame:
    """Per document ``i``: reason (or null), the text of the kept lines and the number of removed lines."""
    L = df.select("i", line=pl.col("text").str.strip_suffix("\n").str.split("\n")).with_columns(
        ln=pl.int_ranges(pl.col("line").list.len())).explode("line", "ln").drop_nulls("line")
    s = pl.col("line").str.strip_chars()
    L = L.with_columns(s=s)
    c = pl.col("s").str.replace_all(_CITATION, "") if cfg.c4_remove_citations else pl.col("s")
    L = L.with_columns(c=c, nw=pl.col("s").str.count_matches(r"\S+"))
    low = pl.col("c").str.to_lowercase()
    cand = pl.lit(True)
    if cfg.c4_max_word_length is not None:
        cand = cand & ~pl.col("s").str.contains(r"\S{" + str(cfg.c4_max_word_length + 1) + "}")
    if cfg.c4_terminal_punctuation:
        cand = cand & pl.col("c").str.contains(r"[.?!\"']$") & ~pl.col("c").str.ends_with("...")
    if cfg.c4_min_words_per_line is not None:
        cand = cand & (pl.col("nw") >= cfg.c4_min_words_per_line)
    js = low.str.contains("javascript", literal=True) if cfg.c4_javascript else pl.lit(False)
    lorem = cand & low.str.contains("lorem ipsum", literal=True) if cfg.c4_lorem_ipsum else pl.lit(False)
    curly = cand & ~lorem & ~js & pl.col("c").str.contains("{", literal=True) if cfg.c4_curly_bracket else pl.lit(False)
    policy = pl.any_horizontal([low.str.contains(p, literal=True) for p in C4_POLICY_SUBSTRINGS]) if cfg.c4_policy else pl.lit(False)
    L = L.with_columns(lorem=lorem, curly=curly, keep=cand & ~lorem & ~js & ~curly & ~policy)
    # a sentence ends at a run of . ! ? (then closing quotes/brackets) followed by more text, except where
    # spaCy's sentencizer sees no sentence end: an ellipsis "..." and a letter-dot abbreviation ("e.g.",
    # "i.e."), which its tokenizer keeps as one token that is not a sentence-final punctuation token
    end = r"[\"')\]]*\s+\S"
    sent = (pl.col("c").str.count_matches(r"[.!?]+" + end) - pl.col("c").str.count_matches(r"(?:^|[^.!?])\.{3,}" + end)
            - pl.col("c").str.count_matches(r"\b\p{L}\.\p{L}\." + end) + 1)
    L = L.with_columns(sent=pl.when("keep").then(sent).otherwise(0))
    big = 1 << 40
    per = L.group_by("i").agg(
        first_lorem=pl.when("lorem").then("ln").otherwise(big).min(),
        first_curly=pl.when("curly").then("ln").otherwise(big).min(),
        sentences=pl.col("sent").sum(),
        text=pl.col("c").filter("keep").str.join("\n").str.strip_chars(),
        removed=(~pl.col("keep")).sum(),
    )
    out = df.select("i").join(per, on="i", how="left").with_columns(
        pl.col("text").fill_null(""), pl.col("sentences").fill_null(0), pl.col("removed").fill_null(0),
        pl.col("first_lorem").fill_null(big), pl.col("first_curly").fill_null(big))
    few = pl.col("sentences") < cfg.c4_min_sentences if cfg.c4_min_sentences is not None else pl.lit(False)
    reason = (pl.when(pl.col("first_lorem") < pl.col("first_curly")).then(pl.lit("c4_lorem_ipsum"))
              .when(pl.col("first_curly") < big).then(pl.lit("c4_curly_bracket"))
              .when(few).then(pl.lit("c4_too_few_sentences")).otherwise(pl.lit(None, dtype=pl.Utf8)))
    return out.select("i", reason=reason, text="text", c4_lines_removed=pl.col("removed").cast(pl.UInt32))


# ------------------------------------------------------------------------------------------------


def apply_rules(df: pl.DataFrame, cfg: QualityConfig) -> pl.DataFrame:
    """Run every enabled rule on a frame with a Utf8 column ``text`` (already normalized).

    Returns the frame with ``reason`` (Utf8, null = kept; the first failing rule in the order of the
    module docstring), ``text`` (for kept documents under the C4 rules: the kept lines only) and
    ``c4_lines_removed`` (UInt32, lines the C4 rules removed from a kept document; 0 otherwise).
    """
    df = df.with_row_index("i")
    reason = _gopher_quality_reason(df, cfg)
    df = df.with_columns(reason=reason, c4_lines_removed=pl.lit(0, dtype=pl.UInt32))
    if cfg.gopher_repetition:
        alive = df.filter(pl.col("reason").is_null()).select("i", "text")
        if alive.height:
            rep = _repetition_reason(alive.with_row_index("j").drop("i").rename({"j": "i"}), cfg)
            df = df.with_columns(reason=pl.col("reason").fill_null(
                pl.Series(df.height * [None], dtype=pl.Utf8).scatter(alive["i"].to_numpy(), rep)))
    if cfg.c4:
        alive = df.filter(pl.col("reason").is_null()).select("i", "text")
        if alive.height:
            c4 = _c4(alive, cfg)
            df = df.join(c4.rename({"reason": "c4_reason", "text": "c4_text", "c4_lines_removed": "c4_rm"}), on="i", how="left")
            df = df.with_columns(reason=pl.col("reason").fill_null(pl.col("c4_reason")))
            kept = pl.col("reason").is_null() & pl.col("c4_text").is_not_null()
            df = df.with_columns(text=pl.when(kept).then("c4_text").otherwise("text"),
                                 c4_lines_removed=pl.when(kept).then("c4_rm").otherwise("c4_lines_removed")
                                 ).drop("c4_reason", "c4_text", "c4_rm")
    return df.drop("i")


def quality_reason(df: pl.DataFrame, cfg: QualityConfig) -> pl.Series:
    """The reason code of the first failing rule for each document, or null if it passes.

    Input: a frame with a Utf8 column ``text``. Output: a Utf8 Series of the same length.
    """
    return apply_rules(df.select("text"), cfg)["reason"]


def clean_corpus(in_dir: Path, out_dir: Path, cfg: QualityConfig) -> dict:
    """Normalize and filter every ``part-*.parquet`` of a raw_corpus directory, one part at a time.

    Writes ``out_dir/part-NNNNN.parquet`` (doc_id, source, text, and label where the raw parts have
    one, of kept documents, in input order)
    and ``out_dir/filtered.parquet`` (doc_id, source, reason). Returns counts: ``input``, ``kept``,
    ``filtered``, ``filtered_by_reason``, ``nul_removed``, ``control_removed``, ``c4_lines_removed``,
    ``bytes_kept``.
    """
    parts = part_files(in_dir)
    totals = {"input": 0, "kept": 0, "filtered": 0, "nul_removed": 0, "control_removed": 0, "c4_lines_removed": 0,
              "bytes_kept": 0}
    filtered: list[pl.DataFrame] = []
    for i, part in enumerate(parts):
        df = apply_rules(normalize(pl.read_parquet(part)), cfg)
        kept = df.filter(pl.col("reason").is_null())
        removed = df.filter(pl.col("reason").is_not_null()).select("doc_id", "source", "reason")
        kept.select("doc_id", "source", "text", *(["label"] if "label" in df.columns else [])).write_parquet(
            out_dir / f"part-{i:05d}.parquet")
        filtered.append(removed)
        totals["input"] += df.height
        totals["kept"] += kept.height
        totals["filtered"] += removed.height
        for k in ("nul_removed", "control_removed", "c4_lines_removed"):
            totals[k] += int(df[k].sum() or 0)
        totals["bytes_kept"] += int(kept["text"].str.len_bytes().sum() or 0)
    table = pl.concat(filtered) if filtered else pl.DataFrame(schema={"doc_id": pl.Utf8, "source": pl.Utf8, "reason": pl.Utf8})
    table.write_parquet(out_dir / "filtered.parquet")
    counts = table.group_by("reason").len().sort("reason")
    totals["filtered_by_reason"] = dict(zip(counts["reason"].to_list(), counts["len"].to_list()))
    return totals
