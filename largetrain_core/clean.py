"""Training-text normalization and the document quality filter, over Arrow/polars batches.

Normalization policy for the *training text* (what the model sees):

1. NUL bytes and the other C0 control characters U+0000-U+0008, U+000B, U+000C,
   U+000E-U+001F and U+007F are removed; tab and newline are kept. Removed characters are counted
   per document (``nul_removed``, ``control_removed``).
2. Line endings ``\\r\\n`` and lone ``\\r`` become ``\\n``.
3. Invisible format characters that carry no meaning are removed and counted per document
   (``format_removed``): soft hyphen U+00AD (a hyphenation hint), zero-width space U+200B, word
   joiner U+2060 and U+FEFF (a byte-order mark anywhere in a document's text; a file's leading BOM is
   already dropped by the reader). ZWNJ U+200C and ZWJ U+200D are removed only right after a letter
   of a script that never joins (Latin, Greek, Cyrillic), where they only hide a word from search and
   dedup; they are kept everywhere else, where a script uses them: Persian and Arabic word forms
   (``کتاب‌ها``), Indic conjuncts, emoji ZWJ sequences. Other format characters (bidi marks, tag
   characters of flag emoji) are kept. Unicode's list: the ``Cf`` general category (UAX #44); the
   roles of ZWJ/ZWNJ: The Unicode Standard, section 23.2.
4. Unicode NFC (canonical composition): visually identical text gets identical code points while
   compatibility characters (ligatures, full-width forms) are kept as written.

The *deduplication key* (largetrain_core.dedup) is stricter and never stored as training text: NFKC,
case-folded, every format character (``Cf``: soft hyphen, zero-width space and joiners, ZWJ/ZWNJ,
BOM, bidi marks) ignored, whitespace runs collapsed to one space, stripped.

Quality filter: a document without a non-whitespace character is ``empty``; then the rule groups
of largetrain_core.rules, each switched on or off in :class:`QualityConfig`, in order: language
identification (lid.176), Gopher quality (Rae et al. 2021, A.1.1), Gopher repetition (Table A1), C4
lines (Raffel et al. 2020, section 2.2), thresholds and order of checks as datatrove's filters. A
removed document gets the code of its first failing rule; the C4 rules also remove lines from the
documents they keep. Then PII in the kept documents is replaced by typed placeholders
(largetrain_core.pii), after the rules, so that the PII settings decide no document's fate.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, make_dataclass
from pathlib import Path

import polars as pl

from largetrain_core.language import check_languages
from largetrain_core.parts import map_parts
from largetrain_core.pii import NAMES as PII_KINDS, check_kinds, redact
from largetrain_core.pii import columns as pii_columns
from largetrain_core.readers import MESSAGES
from largetrain_core.rules import GROUPS, WORD_PATTERNS, blank_whitespace_lines
from largetrain_core.settings import described

_CONTROL = r"[\x00-\x08\x0B\x0C\x0E-\x1F\x7F]"
# soft hyphen, zero-width space, word joiner, BOM / zero-width no-break space: removed everywhere
_INVISIBLE = "[\u00ad\u200b\u2060\ufeff]"
# ZWNJ / ZWJ after a letter of a script without joining behaviour: removed (kept with the letter)
_LATIN_JOINER = r"([\p{Latin}\p{Greek}\p{Cyrillic}])[\x{200C}\x{200D}]+"


def _quality_fields() -> list[tuple]:
    """QualityConfig's fields: ``words``, then per rule group its switch, its own parameters and its rules' parameters."""
    fields = [
        (
            "words",
            str,
            field(
                default="whitespace",
                metadata=described(
                    "Word tokenization: whitespace (\\S+ runs, the Gopher paper's words) or spacy_like (approximates "
                    "the spaCy English tokenizer datatrove uses)."
                ),
            ),
        )
    ]
    for g in GROUPS:
        fields.append((g.name, bool, field(default=g.on, metadata=described(g.description))))
        for p in (*g.params, *(p for r in g.rules for p in r.params)):
            fields.append((p.name, p.type, field(default=p.default, metadata=described(p.description))))
    fields += [
        (
            "redact_pii",
            bool,
            field(
                default=True,
                metadata=described(
                    "Replace PII in the kept documents' text by typed placeholders (<EMAIL>, <IP_ADDRESS>, <PHONE>, <CARD_NUMBER>, "
                    "<IBAN>, <SECRET>), counted per kind (columns pii_<kind>); the rules decide on the text before it. The "
                    "patterns and what they leave alone (versions, dates, hashes): largetrain_core.pii, docs/guides/filtering.md."
                ),
            ),
        ),
        (
            "pii_kinds",
            tuple[str, ...],
            field(default=PII_KINDS, metadata=described(f"The kinds redact_pii replaces, of {', '.join(PII_KINDS)}.")),
        ),
    ]
    names = [f[0] for f in fields]
    if len(set(names)) != len(names):
        raise ValueError(f"two rules share a parameter name: {sorted(n for n in set(names) if names.count(n) > 1)}")
    return fields


def _check(self) -> None:
    if self.words not in WORD_PATTERNS:
        raise ValueError(f"words must be one of {sorted(WORD_PATTERNS)}, got {self.words!r}")
    if self.languages is not None:
        check_languages(self.languages)
    check_kinds(self.pii_kinds)
    if not 0.0 <= self.min_language_score < 1.0:
        raise ValueError(f"min_language_score must be in [0, 1), got {self.min_language_score}")
    if self.language_sample_chars is not None and self.language_sample_chars < 1:
        raise ValueError(f"language_sample_chars must be at least 1 or null, got {self.language_sample_chars}")


QualityConfig = make_dataclass(
    "QualityConfig",
    _quality_fields(),
    frozen=True,
    namespace={"to_dict": lambda self: asdict(self), "__post_init__": _check, "__module__": __name__},
)
QualityConfig.__doc__ = (
    "Settings of the quality filter, one field per rule parameter (largetrain_core.rules) and one on/off "
    "switch per rule group; None switches one rule off. Raises ValueError for an unknown ``words``.\n\n"
    + "\n".join(
        f"{f.name} = {f.default!r}: {f.metadata['description']}"
        for f in QualityConfig.__dataclass_fields__.values()
        if f.default is not MISSING
    )
)


def normalize(df: pl.DataFrame) -> pl.DataFrame:
    """Apply the training-text normalization to column ``text`` (Utf8).

    Returns the frame with ``text`` replaced and three new UInt32 columns ``nul_removed``,
    ``control_removed`` (control characters removed, NULs included) and ``format_removed`` (invisible
    format characters removed, the policy of this module's docstring).
    """
    text = pl.col("text")
    stripped = text.str.replace_all(_CONTROL, "")
    visible = stripped.str.replace_all(_INVISIBLE, "").str.replace_all(_LATIN_JOINER, "$1")
    return df.with_columns(
        nul_removed=text.str.count_matches("\x00", literal=True).cast(pl.UInt32),
        control_removed=text.str.count_matches(_CONTROL).cast(pl.UInt32),
        format_removed=(stripped.str.len_chars() - visible.str.len_chars()).cast(pl.UInt32),
        text=visible.str.replace_all("\r\n?", "\n").str.normalize("NFC"),
    )


def apply_rules(df: pl.DataFrame, cfg: QualityConfig) -> pl.DataFrame:
    """Run every enabled rule on a frame with a Utf8 column ``text`` (already normalized).

    The rules read the text with whitespace-only lines emptied (rules.blank_whitespace_lines); the
    training text keeps them. Returns the frame with ``reason`` (Utf8, null = kept; ``empty``, else
    the first failing rule in group and list order), ``text`` (for kept documents under a group that rewrites text, C4: the kept
    lines only), ``c4_lines_removed`` (UInt32, lines that group removed from a kept document; 0 otherwise)
    and the columns of the enabled groups (:func:`group_columns`: ``language`` Utf8, ``language_score``
    Float32; null for a document removed before its group ran).
    """
    n = df.height
    df = df.with_columns(
        reason=pl.when(pl.col("text").str.contains(r"\S")).then(pl.lit(None, dtype=pl.Utf8)).otherwise(pl.lit("empty")),
        **{f"{g.name}_lines_removed": pl.lit(0, dtype=pl.UInt32) for g in GROUPS if g.rewrites},
        **{c: pl.lit(None, dtype=t) for c, t in group_columns(cfg)},
    )
    for group in GROUPS:
        if not getattr(cfg, group.name):
            continue
        rules = [(r, v) for r in group.rules if (v := r.values(cfg)) is not None]
        alive = df.select(pl.int_range(n, dtype=pl.UInt32).alias("i"), "text", "reason").filter(
            pl.col("reason").is_null()
        )
        if not alive.height:
            break
        res = group.evaluate(
            pl.DataFrame({"text": blank_whitespace_lines(alive["text"]) if group.blank_lines else alive["text"]}),
            cfg,
            rules,
        )
        rows = alive["i"]
        df = df.with_columns(
            reason=pl.col("reason").fill_null(pl.Series([None] * n, dtype=pl.Utf8).scatter(rows, res["reason"])),
            **{c: df[c].clone().scatter(rows, res[c]) for c, _ in group.columns},
        )
        if group.rewrites:
            kept = res["reason"].is_null()
            rows = rows.filter(kept)
            df = df.with_columns(
                text=df["text"].clone().scatter(rows, res["text"].filter(kept)),
                **{
                    f"{group.name}_lines_removed": df[f"{group.name}_lines_removed"]
                    .clone()
                    .scatter(rows, res["lines_removed"].filter(kept))
                },
            )
    return df


def group_columns(cfg: QualityConfig) -> list[tuple[str, pl.DataType]]:
    """The columns the enabled rule groups add to every document (name, polars dtype), in group order."""
    return [c for g in GROUPS if getattr(cfg, g.name) for c in g.columns]


def quality_reason(df: pl.DataFrame, cfg: QualityConfig) -> pl.Series:
    """The reason code of the first failing rule for each document, or null if it passes.

    Input: a frame with a Utf8 column ``text``. Output: a Utf8 Series of the same length.
    """
    return apply_rules(df.select("text"), cfg)["reason"]


def part_counts(cfg: QualityConfig) -> tuple[str, ...]:
    """The counts :func:`clean_part` returns for ``cfg`` (besides the rows): ``nul_removed``,
    ``control_removed``, ``format_removed``, ``<group>_lines_removed`` of each rewriting group, ``bytes_kept`` and, with
    ``redact_pii``, ``pii_<kind>`` per kind and ``pii_documents``."""
    pii = (*pii_columns(cfg.pii_kinds), "pii_documents") if cfg.redact_pii else ()
    return (
        "nul_removed",
        "control_removed",
        "format_removed",
        *(f"{g.name}_lines_removed" for g in GROUPS if g.rewrites),
        "bytes_kept",
        *pii,
    )


def clean_part(df: pl.DataFrame, cfg: QualityConfig) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, int]]:
    """cleaned_text of one raw part (columns doc_id, source, text[, label]): normalization, the rules,
    then PII redaction of the kept documents. Returns (kept: doc_id, source, text[, label], the groups'
    columns, ``pii_<kind>`` UInt32 counts; removed: doc_id, source, reason, the groups' columns;
    :func:`part_counts`). Redactions change no count of the accounting."""
    df = apply_rules(normalize(df), cfg)
    extra = [c for c, _ in group_columns(cfg)]
    kept = df.filter(pl.col("reason").is_null())
    removed = df.filter(pl.col("reason").is_not_null()).select("doc_id", "source", "reason", *extra)
    counts = {k: int(df[k].sum() or 0) for k in part_counts(cfg) if k in df.columns}
    pii = pii_columns(cfg.pii_kinds) if cfg.redact_pii else []
    chat = MESSAGES in df.columns
    if chat:  # a conversation: its messages' contents are the training text (clean_messages)
        kept, found = clean_messages(kept, cfg)
    if cfg.redact_pii:
        if not chat:
            text, found = redact(kept["text"], cfg.pii_kinds)
            kept = kept.with_columns(text=text)
        kept = kept.hstack(found)
        counts.update({k: int(found[k].sum() or 0) for k in pii})
        counts["pii_documents"] = int((found.sum_horizontal() > 0).sum()) if pii else 0
    counts["bytes_kept"] = int(kept["text"].str.len_bytes().sum() or 0)
    labelled = ["label"] if "label" in df.columns else []
    kept = kept.select("doc_id", "source", "text", *labelled, *([MESSAGES] if chat else []), *extra, *pii)
    return kept, removed, counts


def clean_messages(kept: pl.DataFrame, cfg: QualityConfig) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """The conversations of ``kept`` (column ``messages``, largetrain_core.readers format chat) with each
    message's content normalized (:func:`normalize`) and, with ``redact_pii``, its PII replaced
    (largetrain_core.pii.redact), and ``text`` made again from them (largetrain_core.chat.conversation_text),
    so that the training text, the deduplication and the token shards see the cleaned contents. The
    rules decided each conversation's fate on its whole text before; they edit no message (the C4 rules'
    line removal applies to the text only). Returns (the frame, the PII counts per conversation: a frame
    of ``pii_<kind>`` UInt32 columns, or None without redaction)."""
    import json

    from largetrain_core.chat import conversation_text

    conversations = [json.loads(m) for m in kept[MESSAGES].to_list()]
    owner = [i for i, msgs in enumerate(conversations) for _ in msgs]
    contents = normalize(
        pl.DataFrame({"text": [m["content"] for msgs in conversations for m in msgs]}, schema={"text": pl.Utf8})
    )["text"]
    found = None
    if cfg.redact_pii:
        contents, per_message = redact(contents, cfg.pii_kinds)
        found = (
            per_message.with_columns(owner=pl.Series(owner, dtype=pl.UInt32))
            .group_by("owner")
            .sum()
            .join(
                pl.DataFrame({"owner": range(len(conversations))}, schema={"owner": pl.UInt32}), on="owner", how="right"
            )
            .sort("owner")
            .fill_null(0)
            .drop("owner")
            .cast(pl.UInt32)
        )
    it = iter(contents.to_list())
    for msgs in conversations:
        for m in msgs:
            m["content"] = next(it)
    return (
        kept.with_columns(
            text=pl.Series([conversation_text(msgs) for msgs in conversations], dtype=pl.Utf8),
            messages=pl.Series([json.dumps(msgs, ensure_ascii=False) for msgs in conversations], dtype=pl.Utf8),
        ),
        found,
    )


def pii_redactions(stats: list[dict]) -> dict[str, int]:
    """PII replacements per kind summed over cleaned_text counts (e.g. one per partition); {} when
    nothing was redacted (redact_pii off)."""
    out: dict[str, int] = {}
    for st in stats:
        for k, v in st.items():
            if k.startswith("pii_") and k != "pii_documents":
                out[k.removeprefix("pii_")] = out.get(k.removeprefix("pii_"), 0) + v
    return out


@dataclass(frozen=True)
class Cleaning:
    """cleaned_text's step over one part (largetrain_core.parts.PartStep): :func:`clean_part` of ``cfg``,
    its counts :func:`part_counts`."""

    cfg: QualityConfig
    description = "cleaned_text: normalize, filter and redact"

    @property
    def counts(self) -> tuple[str, ...]:
        return part_counts(self.cfg)

    def __call__(self, df: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, int]]:
        return clean_part(df, self.cfg)


def clean_corpus(in_dir: Path, out_dir: Path, cfg: QualityConfig) -> dict:
    """:func:`clean_part` of every ``part-*.parquet`` of a raw_corpus directory, one part at a time
    (:class:`Cleaning` through largetrain_core.parts.map_parts).

    Writes ``out_dir/part-NNNNN.parquet`` (the kept documents, in input order) and
    ``out_dir/filtered.parquet`` (the removed ones). Returns counts: ``input``, ``kept``,
    ``filtered``, ``filtered_by_reason`` and the sums of :func:`part_counts`.
    """
    return map_parts(Cleaning(cfg), in_dir, out_dir)
