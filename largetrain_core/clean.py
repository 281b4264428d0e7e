"""Training-text normalization and the document quality filter, over Arrow/polars batches.

Normalization policy for the *training text* (what the model sees):

1. NUL bytes and the other C0 control characters U+0000-U+0008, U+000B, U+000C,
   U+000E-U+001F and U+007F are removed; tab and newline are kept. Removed characters are counted
   per document (``nul_removed``, ``control_removed``).
2. Line endings ``\\r\\n`` and lone ``\\r`` become ``\\n``.
3. Unicode NFC (canonical composition): visually identical text gets identical code points while
   compatibility characters (ligatures, full-width forms) are kept as written.

The *deduplication key* (largetrain_core.dedup) is stricter and never stored as training text: NFKC,
case-folded, whitespace runs collapsed to one space, stripped.

Quality filter: a document without a non-whitespace character is ``empty``; then the rule groups
of largetrain_core.rules, each switched on or off in :class:`QualityConfig`, in order: Gopher
quality (Rae et al. 2021, A.1.1), Gopher repetition (Table A1), C4 lines (Raffel et al. 2020,
section 2.2), thresholds and order of checks as datatrove's filters. A removed document gets the
code of its first failing rule; the C4 rules also remove lines from the documents they keep.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, field, make_dataclass
from pathlib import Path

import polars as pl

from largetrain_core.rules import GROUPS, WORD_PATTERNS, blank_whitespace_lines
from largetrain_core.storage import part_files

_CONTROL = r"[\x00-\x08\x0B\x0C\x0E-\x1F\x7F]"


def _quality_fields() -> list[tuple]:
    """QualityConfig's fields: ``words``, then per rule group its switch, its own parameters and its rules' parameters."""
    fields = [("words", str, field(default="whitespace", metadata={"description": (
        "Word tokenization: whitespace (\\S+ runs, the Gopher paper's words) or spacy_like (approximates "
        "the spaCy English tokenizer datatrove uses).")}))]
    for g in GROUPS:
        fields.append((g.name, bool, field(default=g.on, metadata={"description": g.description})))
        for p in (*g.params, *(p for r in g.rules for p in r.params)):
            fields.append((p.name, p.type, field(default=p.default, metadata={"description": p.description})))
    names = [f[0] for f in fields]
    if len(set(names)) != len(names):
        raise ValueError(f"two rules share a parameter name: {sorted(n for n in set(names) if names.count(n) > 1)}")
    return fields


def _check(self) -> None:
    if self.words not in WORD_PATTERNS:
        raise ValueError(f"words must be one of {sorted(WORD_PATTERNS)}, got {self.words!r}")


QualityConfig = make_dataclass("QualityConfig", _quality_fields(), frozen=True, namespace={
    "to_dict": lambda self: asdict(self), "__post_init__": _check, "__module__": __name__})
QualityConfig.__doc__ = (
    "Settings of the quality filter, one field per rule parameter (largetrain_core.rules) and one on/off "
    "switch per rule group; None switches one rule off. Raises ValueError for an unknown ``words``.\n\n"
    + "\n".join(f"{f.name} = {f.default!r}: {f.metadata['description']}"
                 for f in QualityConfig.__dataclass_fields__.values() if f.default is not MISSING))


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


def apply_rules(df: pl.DataFrame, cfg: QualityConfig) -> pl.DataFrame:
    """Run every enabled rule on a frame with a Utf8 column ``text`` (already normalized).

    The rules read the text with whitespace-only lines emptied (rules.blank_whitespace_lines); the
    training text keeps them. Returns the frame with ``reason`` (Utf8, null = kept; ``empty``, else
    the first failing rule in group and list order), ``text`` (for kept documents under a group that rewrites text, C4: the kept
    lines only) and ``c4_lines_removed`` (UInt32, lines that group removed from a kept document; 0 otherwise).
    """
    n = df.height
    df = df.with_columns(reason=pl.when(pl.col("text").str.contains(r"\S")).then(pl.lit(None, dtype=pl.Utf8))
                         .otherwise(pl.lit("empty")),
                         **{f"{g.name}_lines_removed": pl.lit(0, dtype=pl.UInt32) for g in GROUPS if g.rewrites})
    for group in GROUPS:
        if not getattr(cfg, group.name):
            continue
        rules = [(r, v) for r in group.rules if (v := r.values(cfg)) is not None]
        alive = df.select(pl.int_range(n, dtype=pl.UInt32).alias("i"), "text", "reason").filter(pl.col("reason").is_null())
        if not alive.height:
            break
        res = group.evaluate(pl.DataFrame({"text": blank_whitespace_lines(alive["text"])}), cfg, rules)
        rows = alive["i"]
        df = df.with_columns(reason=pl.col("reason").fill_null(pl.Series([None] * n, dtype=pl.Utf8).scatter(rows, res["reason"])))
        if group.rewrites:
            kept = res["reason"].is_null()
            rows = rows.filter(kept)
            df = df.with_columns(text=df["text"].clone().scatter(rows, res["text"].filter(kept)),
                                 **{f"{group.name}_lines_removed": df[f"{group.name}_lines_removed"].clone().scatter(
                                     rows, res["lines_removed"].filter(kept))})
    return df


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
    counted = ("nul_removed", "control_removed", *(f"{g.name}_lines_removed" for g in GROUPS if g.rewrites))
    totals = {"input": 0, "kept": 0, "filtered": 0, **{k: 0 for k in counted}, "bytes_kept": 0}
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
        for k in counted:
            totals[k] += int(df[k].sum() or 0)
        totals["bytes_kept"] += int(kept["text"].str.len_bytes().sum() or 0)
    table = pl.concat(filtered) if filtered else pl.DataFrame(schema={"doc_id": pl.Utf8, "source": pl.Utf8, "reason": pl.Utf8})
    table.write_parquet(out_dir / "filtered.parquet")
    counts = table.group_by("reason").len().sort("reason")
    totals["filtered_by_reason"] = dict(zip(counts["reason"].to_list(), counts["len"].to_list()))
    return totals
