"""The accounting rule (docs/ARCHITECTURE.md, Accounting): every input document ends in exactly one of
``kept``, ``filtered``, ``duplicate`` or ``rejected``, and ``kept + filtered + duplicate + rejected == input``.

Class balancing (largetrain_core.balance, in deduplicated_text): documents left out by
down-sampling are *filtered* (reason ``balance_downsample``, ``balance_dropped.parquet``);
up-sampling is intended repetition, a ``copies`` weight on kept documents, never a row of its own, so
``kept`` counts distinct documents and the ``repeats`` (extra copies) are reported beside the sum,
never in it, and never as duplicates.

The filtering of the training text (largetrain_core.stages.filtered_text, after deduplicated_text)
removes documents as *filtered* too, with reason ``relevance`` or ``contaminated`` in its own
``filtered.parquet``; its kept part files are then the chain's ``kept``.

Counts are taken from the stage outputs on disk (Parquet row counts from the file footers), not
from what the stages said they wrote, so a lost or double-written part file breaks the balance.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from largetrain_core.balance import BALANCE_DROPPED, repeat_counts
from largetrain_core.parts import FILTERED
from largetrain_core.readers import WHOLE_FILE
from largetrain_core.storage import as_dirs, part_files


# Our default, no paper's: the demo removes a third of the kernel docs on purpose (configs/demo.yaml); more
# than half of a corpus gone is rarely what a user meant (93% of short records under the Gopher defaults).
WARN_REMOVED = 0.5


def _rows(files) -> int:
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def corpus_accounting(
    raw_dir: Path | list[Path], cleaned_dir: Path | list[Path], dedup_dir: Path, filtered_text_dir: Path | None = None
) -> dict:
    """Recount one corpus's chain raw_corpus -> cleaned_text -> deduplicated_text [-> filtered_text]
        (raw and cleaned: one directory, or one per partition; ``filtered_text_dir``: the filtered_text
        directory, whose kept part files are then the chain's kept documents).

        Returns ``input`` (documents read + records rejected), ``kept``, ``filtered``, ``duplicate``,
        ``rejected``, ``repeats`` (intended extra copies: the ``copies`` weights of the kept documents minus
    one each, outside the sum) and ``repeated_documents`` (kept documents with copies > 1),
        ``balanced`` (the rule holds for the whole chain and for each stage) and ``problems`` (one
        message per stage that does not balance).
    """
    dedup_dir = Path(dedup_dir)
    read = _rows(part_files(raw_dir))
    rejected = _rows(d / "rejected.parquet" for d in as_dirs(raw_dir))
    cleaned = _rows(part_files(cleaned_dir))
    filtered = _rows(d / "filtered.parquet" for d in as_dirs(cleaned_dir))
    repeated_documents, repeats = repeat_counts(dedup_dir)
    kept = _rows(part_files(dedup_dir))
    duplicate = _rows([dedup_dir / "duplicates.parquet"])
    downsampled = _rows(_present(dedup_dir / BALANCE_DROPPED))
    deduplicated, text_filtered = kept, 0
    if filtered_text_dir is not None:
        kept = _rows(part_files(filtered_text_dir))
        text_filtered = _rows([Path(filtered_text_dir) / FILTERED])
    problems = []
    if cleaned + filtered != read:
        problems.append(f"cleaned_text: {cleaned} kept + {filtered} filtered != {read} read by raw_corpus")
    if deduplicated + duplicate + downsampled != cleaned:
        problems.append(
            f"deduplicated_text: {deduplicated} kept + {duplicate} duplicate + {downsampled} balance_downsample"
            f" != {cleaned} from cleaned_text"
        )
    if kept + text_filtered != deduplicated:
        problems.append(
            f"filtered_text: {kept} kept + {text_filtered} filtered != {deduplicated} from deduplicated_text"
        )
    total = read + rejected
    filtered += downsampled + text_filtered
    return {
        "input": total,
        "kept": kept,
        "filtered": filtered,
        "duplicate": duplicate,
        "rejected": rejected,
        "repeats": repeats,
        "repeated_documents": repeated_documents,
        "balanced": not problems and kept + filtered + duplicate + rejected == total,
        "problems": problems,
    }


def _present(path: Path) -> list[Path]:
    return [path] if path.exists() else []


def _reject_code(reason: str) -> str:
    """A rejected record's reason without its positions: "line 3: invalid JSON: ..." -> "invalid JSON"; a
    record of a file rejected as a whole by the file's reason (readers.WHOLE_FILE left out)."""
    reason = re.sub(r"^(line|row) \d+: ", "", reason).removeprefix(f"{WHOLE_FILE}: ")
    return re.split(r"[:(]| at ", reason, maxsplit=1)[0].strip()


def outcome_table(
    raw_dir: Path | list[Path], cleaned_dir: Path | list[Path], dedup_dir: Path, filtered_text_dir: Path | None = None
) -> pl.DataFrame:
    """Documents per (outcome, reason): kept (reason null; distinct documents, whatever their copies;
    filtered_text's when ``filtered_text_dir`` is given), filtered (the rule's code, ``balance_downsample``,
    or filtered_text's ``relevance`` / ``contaminated``), duplicate
    ("exact"/"near"), rejected (the reader's reason without positions). Columns outcome, reason (Utf8),
    documents (Int64), sorted; the documents column sums to the accounting ``input``."""
    kept = _rows(part_files(filtered_text_dir if filtered_text_dir is not None else dedup_dir))
    text_filtered = [Path(filtered_text_dir) / FILTERED] if filtered_text_dir is not None else []
    frames = [
        pl.DataFrame(
            {"outcome": ["kept"], "reason": [None], "documents": [kept]},
            schema={"outcome": pl.Utf8, "reason": pl.Utf8, "documents": pl.Int64},
        ),
        _reason_counts([d / FILTERED for d in as_dirs(cleaned_dir)] + text_filtered).select(
            outcome=pl.lit("filtered"), reason="reason", documents=pl.col("len").cast(pl.Int64)
        ),
        *[
            pl.read_parquet(f, columns=["reason"])
            .group_by("reason")
            .len()
            .select(outcome=pl.lit("filtered"), reason="reason", documents=pl.col("len").cast(pl.Int64))
            for f in _present(Path(dedup_dir) / BALANCE_DROPPED)
        ],
        pl.scan_parquet(Path(dedup_dir) / "duplicates.parquet")
        .select(
            pl.col("kind")
            if "kind" in pl.read_parquet_schema(Path(dedup_dir) / "duplicates.parquet")
            else pl.lit("exact").alias("kind")
        )
        .group_by("kind")
        .len()
        .collect(engine="streaming")
        .select(outcome=pl.lit("duplicate"), reason="kind", documents=pl.col("len").cast(pl.Int64)),
        pl.read_parquet([d / "rejected.parquet" for d in as_dirs(raw_dir)], columns=["reason"])
        .select(reason=pl.col("reason").map_elements(_reject_code, return_dtype=pl.Utf8))
        .group_by("reason")
        .len()
        .select(outcome=pl.lit("rejected"), reason="reason", documents=pl.col("len").cast(pl.Int64)),
    ]
    return pl.concat(frames).filter(pl.col("documents") > 0).sort("outcome", "reason", nulls_last=False)


def _reason_counts(files: list[Path]) -> pl.DataFrame:
    """Rows per ``reason`` over Parquet ``files`` (columns reason, len), by polars' streaming engine: memory
    per distinct reason, not per row (a corpus's filtered.parquet files hold a row per removed document)."""
    if not files:
        return pl.DataFrame(schema={"reason": pl.Utf8, "len": pl.UInt32})
    scans = [
        pl.scan_parquet(f).select("reason") for f in files
    ]  # one scan each: the stages' files differ in their other columns
    return pl.concat(scans).group_by("reason").len().collect(engine="streaming")


def markdown_table(table: pl.DataFrame) -> str:
    """The outcome table as markdown: | outcome | reason | documents |, plus a total row."""
    rows = [f"| {o} | {r if r is not None else ''} | {d} |" for o, r, d in table.iter_rows()]
    return "\n".join(
        [
            "| outcome | reason | documents |",
            "|---|---|---|",
            *rows,
            f"| **total** | | **{int(table['documents'].sum() or 0)}** |",
        ]
    )


def reason_setting(outcome: str, reason: str | None) -> str:
    """The setting that decides whether documents of (``outcome``, ``reason``) are removed, in words
    (the step's config field as the run config names it), for the removal warning."""
    from largetrain_core.rules import GROUPS

    if outcome == "filtered":
        for group in GROUPS:
            for rule in group.rules:
                if rule.code == reason:
                    p = rule.params[0]
                    own = (
                        f"`{p.name}: false` switches the rule off"
                        if p.type is bool
                        else f"`{p.name}` (default {p.default}; null switches the rule off)"
                    )
                    return f"cleaned_text {own}, or `{group.name}: false` the whole group"
        if reason == "empty":
            return "no setting: the record has no text (raw_corpus `text_field` names the field read)"
        if reason == "relevance":
            return (
                "filtered_text `relevance_threshold` / `relevance_top_fraction` (null: keep every document, "
                "scored); relevance_classifier's examples decide the scores"
            )
        if reason == "contaminated":
            return (
                "filtered_text `decontamination: report` keeps them (the check on evaluation then fails); "
                "evaluation_sets `benchmark_files` names the sets"
            )
        if reason == "balance_downsample":
            return (
                "deduplicated_text `balance_mode: upsample` keeps every document, "
                "`balance_target: null` switches balancing off"
            )
    if outcome == "duplicate":
        if reason == "near":
            return "deduplicated_text `near: false` keeps near duplicates (MinHash, Jaccard ~0.72 at bands 14 x rows 8)"
        return "no setting: the same text up to Unicode NFKC, case and whitespace"
    if outcome == "rejected":
        return "raw_corpus: unreadable records, each with file, position and reason in rejected.parquet"
    return "no setting"


def removal_warning(
    what: str, input_documents: int, removed: list[tuple[str, str | None, int]], threshold: float | None, top: int = 5
) -> str | None:
    """A warning when the documents ``removed`` (rows of outcome, reason, documents) are more than
    ``threshold`` (a share, 0..1; None: never) of ``input_documents``: how many went, the ``top``
    reasons by count and the setting that would change each (:func:`reason_setting`). None otherwise."""
    gone = sum(n for _, _, n in removed)
    if threshold is None or not input_documents or gone <= threshold * input_documents:
        return None
    rows = sorted((r for r in removed if r[2] > 0), key=lambda r: (-r[2], r[0], r[1] or ""))
    reasons = "; ".join(
        f"{n:,} {outcome} {reason or ''} -> {reason_setting(outcome, reason)}".replace("  ", " ")
        for outcome, reason, n in rows[:top]
    )
    more = f"; {len(rows) - top} more reasons" if len(rows) > top else ""
    return (
        f"{what}: {gone:,} of {input_documents:,} documents removed ({gone / input_documents:.0%}, more than "
        f'warn_removed_fraction {threshold:g}). Top reasons: {reasons}{more}. docs/guides/your-data.md, "Which rules suit your text".'
    )
