"""cleaned_text: one raw_corpus partition normalized and filtered by the quality rules
(largetrain_core.clean.Cleaning, a largetrain_core.parts.PartStep, on the run's executor); every
removed document with its reason code in filtered.parquet; and the MinHash signatures of the kept
documents, per part in ``signatures/`` (largetrain_core.parts.WithSignatures: in the same pass, on the
same executor), so that the global deduplicated_text only clusters.

Data version: the code version, the quality and MinHash settings and raw_corpus's data version.
"""

from __future__ import annotations

from pathlib import Path

from largetrain_core.accounting import WARN_REMOVED, removal_warning
from largetrain_core.artifacts import CODE_VERSIONS
from largetrain_core.clean import Cleaning, QualityConfig, pii_redactions
from largetrain_core.dedup import DedupConfig
from largetrain_core.parts import WithSignatures
from largetrain_core.executors import steps
from largetrain_core.stages.base import (
    Artifact,
    Markdown,
    StageResult,
    StageRun,
    count_table,
    executor_metadata,
    mib,
    percent,
)
from largetrain_core.storage import data_version


def cleaned_text(
    quality: QualityConfig,
    raw: Artifact,
    run: StageRun,
    warn_removed_fraction: float | None = WARN_REMOVED,
    dedup: DedupConfig = DedupConfig(),
) -> StageResult:
    """Clean the raw_corpus partition ``raw`` into ``<root>/<asset>/<partition>/<version>/``.

    Stats: the step's counts (input, kept, filtered, filtered_by_reason, nul_removed,
    control_removed, format_removed, c4_lines_removed, bytes_kept, pii_<kind>, pii_documents), raw's
    partition and ``quality`` (the quality settings, compared across partitions by the global steps). Warns (metadata
    ``removal_warning``) when more than ``warn_removed_fraction`` of the partition is filtered, with
    the top reasons and the setting of each (largetrain_core.accounting.removal_warning). ``dedup``: the
    MinHash settings of the signatures (recorded in the stats as ``dedup``, which deduplicated_text uses)."""
    version = data_version(CODE_VERSIONS["cleaned_text"], quality.to_dict(), raw.data_version, dedup.to_dict())
    part = {k: raw.stats[k] for k in ("partition", "partitions")}
    step = WithSignatures(Cleaning(quality), dedup)
    built = run.build_or_reuse(
        version,
        lambda out: {
            **run.executor.run_global(steps.map_parts, out, step=step, in_dir=raw.path),
            **part,
            "dedup": dedup.to_dict(),
        },
        documents=True,
    )
    stats = built.stats
    result = StageResult.built(
        built,
        version,
        metadata={
            "filtered_by_reason": count_table(stats["filtered_by_reason"]),
            "kept_percent": percent(stats["kept"], stats["input"]),
            "kept_mib": mib(stats["bytes_kept"]),
            **executor_metadata(stats),
        },
    )
    if stats["filtered"]:
        result.metadata["removed_examples"] = removed_examples(raw.path, built.path)
    if quality.redact_pii:  # replacements in the kept text, beside the accounting (they remove no document)
        result.metadata["pii_redacted"] = count_table(pii_redactions([stats]), ("kind", "replacements"))
    result.warn(
        removal_warning(
            run.name,
            stats["input"],
            [("filtered", r, n) for r, n in stats["filtered_by_reason"].items()],
            warn_removed_fraction,
        ),
        key="removal_warning",
    )
    result.stats = {**stats, "quality": quality.to_dict()}  # compared across partitions by the global steps
    return result


def removed_examples(raw_dir: Path, out_dir: Path, top: int = 5, chars: int = 160) -> Markdown:
    """A few removed documents as a person judges them on the asset page: for each of the ``top`` reasons
    that removed most documents (``out_dir/filtered.parquet``), its first document there, with its source
    and the first ``chars`` characters of its raw text (``raw_dir``'s parts; line breaks shown as ⏎), as a
    Markdown table. Reads the ``text`` column of only the raw parts' row groups that hold one of them."""
    import polars as pl
    import pyarrow.parquet as pq

    removed = pl.read_parquet(out_dir / "filtered.parquet", columns=["doc_id", "source", "reason"])
    order = removed.group_by("reason").agg(pl.len().alias("n"), pl.first("doc_id"), pl.first("source"))
    order = order.sort(["n", "reason"], descending=[True, False]).head(top)
    ids = order["doc_id"].to_list()
    texts = {}
    for part in sorted(raw_dir.glob("part-*.parquet")):  # the text of the row groups that hold one of them only
        f = pq.ParquetFile(part)
        for g in range(f.num_row_groups):
            found = set(ids).intersection(f.read_row_group(g, columns=["doc_id"]).column("doc_id").to_pylist())
            if found:
                t = f.read_row_group(g, columns=["doc_id", "text"]).to_pydict()
                texts.update((d, x) for d, x in zip(t["doc_id"], t["text"]) if d in found)

    def cell(text: str) -> str:
        head = text[:chars] + ("…" if len(text) > chars else "")
        return head.replace("\\", "\\\\").replace("|", "\\|").replace("\r\n", "⏎").replace("\n", "⏎").replace("\r", "⏎")

    rows = [
        f"| {r['reason']} | {r['n']} | {cell(r['source'] or r['doc_id'])} | {cell(texts.get(r['doc_id']) or '')} |"
        for r in order.iter_rows(named=True)
    ]
    return Markdown(
        "| reason | removed | example document | its text, first characters |\n|---|---|---|---|\n" + "\n".join(rows)
    )
