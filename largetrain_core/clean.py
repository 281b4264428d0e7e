"""Text normalization and document quality filters, vectorized with polars over Arrow batches.

Normalization policy for the *training text* (what the model sees):

1. NUL bytes and the other C0 control characters U+0000-U+0008, U+000B, U+000C,
   U+000E-U+001F and U+007F are removed; tab and newline are kept. Removed characters are counted
   per document (``nul_removed``, ``control_removed``).
2. Line endings ``\\r\\n`` and lone ``\\r`` become ``\\n``.
3. Unicode NFC (canonical composition): visually identical text gets identical code points while
   compatibility characters (ligatures, full-width forms) are kept as written.

The *deduplication key* (largetrain_core.dedup) is stricter and never stored as training text: NFKC,
case-folded, whitespace runs collapsed to one space, stripped.

Quality rules: the document-level rules of the Gopher paper (Rae et al. 2021, "Scaling Language
Models: Methods, Analysis & Insights from Training Gopher", appendix A.1.1) with its thresholds, as
datatrove's ``GopherQualityFilter`` implements them. Words are whitespace-separated tokens. Each rule
can be switched off by setting its threshold to ``None``. A removed document gets the code of the
*first* failing rule in the order below; an empty or whitespace-only document always gets
``empty`` (no rule divides by its zero word count).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import polars as pl

# Gopher paper, A.1.1; datatrove GopherQualityFilter.stop_words default.
GOPHER_STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")

_CONTROL = r"[\x00-\x08\x0B\x0C\x0E-\x1F\x7F]"


@dataclass(frozen=True)
class QualityConfig:
    """Thresholds of the Gopher document rules; ``None`` switches a rule off.

    min_words/max_words: 50..100,000 words (Gopher A.1.1).
    min/max_mean_word_length: 3..10 characters per word (Gopher A.1.1).
    min_alpha_word_fraction: at least 80% of words contain an alphabetic character (Gopher A.1.1).
    min_stop_words: at least 2 occurrences of words of ``stop_words`` (Gopher A.1.1; counted per occurrence,
        as datatrove's GopherQualityFilter does: ``sum(w in stop_words for w in words)``).
    """

    min_words: int | None = 50
    max_words: int | None = 100_000
    min_mean_word_length: float | None = 3.0
    max_mean_word_length: float | None = 10.0
    min_alpha_word_fraction: float | None = 0.8
    min_stop_words: int | None = 2
    stop_words: tuple[str, ...] = field(default=GOPHER_STOP_WORDS)

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


def quality_reason(df: pl.DataFrame, cfg: QualityConfig) -> pl.Series:
    """The reason code of the first failing rule for each document, or null if it passes.

    Input: a frame with a Utf8 column ``text``. Output: a Utf8 Series of the same length.
    """
    words = pl.col("text").str.extract_all(r"\S+")
    stats = df.lazy().select(
        n_words=words.list.len(),
        mean_len=words.list.eval(pl.element().str.len_chars()).list.mean(),
        alpha=words.list.eval(pl.element().str.contains(r"[^\W\d_]")).list.mean(),
        stops=pl.col("text")
        .str.to_lowercase()
        .str.extract_all(r"\b(?:" + "|".join(re.escape(w) for w in cfg.stop_words) + r")\b")
        .list.len(),
    )
    rules: list[tuple[pl.Expr, str]] = [(pl.col("n_words") == 0, "empty")]
    if cfg.min_words is not None:
        rules.append((pl.col("n_words") < cfg.min_words, "gopher_min_words"))
    if cfg.max_words is not None:
        rules.append((pl.col("n_words") > cfg.max_words, "gopher_max_words"))
    if cfg.min_mean_word_length is not None:
        rules.append((pl.col("mean_len") < cfg.min_mean_word_length, "gopher_mean_word_length_low"))
    if cfg.max_mean_word_length is not None:
        rules.append((pl.col("mean_len") > cfg.max_mean_word_length, "gopher_mean_word_length_high"))
    if cfg.min_alpha_word_fraction is not None:
        rules.append((pl.col("alpha") < cfg.min_alpha_word_fraction, "gopher_alpha_word_fraction"))
    if cfg.min_stop_words is not None:
        rules.append((pl.col("stops") < cfg.min_stop_words, "gopher_stop_words"))
    expr = pl.when(rules[0][0]).then(pl.lit(rules[0][1]))
    for cond, code in rules[1:]:
        expr = expr.when(cond).then(pl.lit(code))
    return stats.select(reason=expr.otherwise(pl.lit(None, dtype=pl.Utf8))).collect().to_series()


def clean_corpus(in_dir: Path, out_dir: Path, cfg: QualityConfig) -> dict:
    """Normalize and filter every ``part-*.parquet`` of a raw_corpus directory.

    Writes ``out_dir/part-NNNNN.parquet`` (doc_id, source, text of kept documents, in input order)
    and ``out_dir/filtered.parquet`` (doc_id, source, reason). Returns counts: ``input``, ``kept``,
    ``filtered``, ``filtered_by_reason``, ``nul_removed``, ``control_removed``, ``bytes_kept``.
    """
    parts = sorted(Path(in_dir).glob("part-*.parquet"))
    totals = {"input": 0, "kept": 0, "filtered": 0, "nul_removed": 0, "control_removed": 0, "bytes_kept": 0}
    filtered: list[pl.DataFrame] = []
    for i, part in enumerate(parts):
        df = normalize(pl.read_parquet(part))
        df = df.with_columns(reason=quality_reason(df, cfg))
        kept = df.filter(pl.col("reason").is_null())
        removed = df.filter(pl.col("reason").is_not_null()).select("doc_id", "source", "reason")
        kept.select("doc_id", "source", "text").write_parquet(out_dir / f"part-{i:05d}.parquet")
        filtered.append(removed)
        totals["input"] += df.height
        totals["kept"] += kept.height
        totals["filtered"] += removed.height
        totals["nul_removed"] += int(df["nul_removed"].sum() or 0)
        totals["control_removed"] += int(df["control_removed"].sum() or 0)
        totals["bytes_kept"] += int(kept["text"].str.len_bytes().sum() or 0)
    table = pl.concat(filtered) if filtered else pl.DataFrame(schema={"doc_id": pl.Utf8, "source": pl.Utf8, "reason": pl.Utf8})
    table.write_parquet(out_dir / "filtered.parquet")
    counts = table.group_by("reason").len().sort("reason")
    totals["filtered_by_reason"] = dict(zip(counts["reason"].to_list(), counts["len"].to_list()))
    return totals
