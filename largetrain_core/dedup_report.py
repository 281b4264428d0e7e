"""What deduplication removed, per source, for people and for the ``no_source_wiped_out`` check.

A source is what the documents carry: the corpus of a mixture (``corpus``), the top-level folder of the
``source`` path (``folder``; files at the top level together form ``<top level>``) and, when the corpus has
labels, the label class (``label``). Per source: documents read (entering deduplicated_text), removed as exact
duplicates, removed as near duplicates (verified: largetrain_core.dedup.verify_assignment), and near
candidates kept because verification failed (``unverified.parquet``).

Wipeout default, :data:`MAX_SOURCE_REMOVED`: 0.5. Marin's run lost sources from 859,092 documents to 2
(marin#6854); a help-center corpus lost 70 % (issue 45). Half of a source gone to dedup is far above what
web-scale dedup removes from one source (RefinedWeb, Penedo et al. 2023, table 2: MinHash removes ~20-25 %
of a dump) and is worth a person's look before training on the rest. Sources of fewer than
:data:`MIN_SOURCE_DOCUMENTS` (20) documents are shown but not judged: in a folder of 3 documents, 2 copies of
a document elsewhere are 67 % and say nothing about the dedup.
"""

from __future__ import annotations

import base64
from pathlib import Path

import polars as pl

from largetrain_core.dedup import UNVERIFIED
from largetrain_core.stages.base import text_block
from largetrain_core.storage import part_files
from largetrain_core.training import plots

MAX_SOURCE_REMOVED = 0.5
MIN_SOURCE_DOCUMENTS = 20
TOP_LEVEL = "<top level>"
SETTING = "max_source_removed_fraction"
LABEL = "label"


def _documents(dirs: dict[str | None, list[Path]]) -> pl.DataFrame:
    """doc_id, folder, label (null without labels) and corpus (null outside a mixture) of every document
    of the cleaned_text part files of ``dirs`` ({corpus or None: partition directories})."""
    frames = []
    for corpus, ds in dirs.items():
        for part in part_files(ds):
            names = pl.read_parquet_schema(part)
            cols = ["doc_id", "source", *([LABEL] if LABEL in names else [])]
            df = pl.read_parquet(part, columns=cols)
            frames.append(
                df.select(
                    "doc_id",
                    folder=pl.when(pl.col("source").str.contains("/", literal=True))
                    .then(pl.col("source").str.split("/").list.first())
                    .otherwise(pl.lit(TOP_LEVEL)),
                    label=pl.col(LABEL).cast(pl.Utf8) if LABEL in names else pl.lit(None, pl.Utf8),
                    corpus=pl.lit(corpus, pl.Utf8),
                )
            )
    schema = {"doc_id": pl.Utf8, "folder": pl.Utf8, "label": pl.Utf8, "corpus": pl.Utf8}
    return pl.concat(frames) if frames else pl.DataFrame(schema=schema)


def outcomes(dirs: dict[str | None, list[Path]], out: Path) -> pl.DataFrame:
    """Every document entering deduplicated_text (``dirs``: :func:`_documents`) with its dedup ``outcome``
    (kept, exact, near, unverified: a near candidate kept because verification failed) and, for removed
    ones, duplicate_of, cluster_id and similarity (from ``out``'s duplicates.parquet and unverified.parquet)."""
    docs = _documents(dirs)
    dups = pl.read_parquet(
        out / "duplicates.parquet", columns=["doc_id", "duplicate_of", "cluster_id", "kind", "similarity"]
    )
    unverified = pl.read_parquet(out / UNVERIFIED, columns=["doc_id"]) if (out / UNVERIFIED).exists() else None
    docs = docs.join(dups, on="doc_id", how="left")
    outcome = pl.col("kind").fill_null("kept")
    if unverified is not None and unverified.height:
        outcome = (
            pl.when(pl.col("doc_id").is_in(unverified["doc_id"].implode()))
            .then(pl.lit("unverified"))
            .otherwise(outcome)
        )
    return docs.with_columns(outcome=outcome).drop("kind")


def source_table(docs: pl.DataFrame) -> pl.DataFrame:
    """Per source (:func:`outcomes`' frame grouped by corpus, folder and label, whichever the documents
    carry): dimension, source, read, removed_exact, removed_near, kept_unverified, removed_fraction;
    the largest removed fraction first."""
    frames = []
    for dim in ("corpus", "folder", "label"):
        if docs[dim].null_count() == docs.height:
            continue
        frames.append(
            docs.group_by(pl.col(dim).fill_null("<null>").alias("source"))
            .agg(
                read=pl.len(),
                removed_exact=(pl.col("outcome") == "exact").sum(),
                removed_near=(pl.col("outcome") == "near").sum(),
                kept_unverified=(pl.col("outcome") == "unverified").sum(),
            )
            .with_columns(dimension=pl.lit(dim))
        )
    if not frames:
        return pl.DataFrame(
            schema={
                "dimension": pl.Utf8,
                "source": pl.Utf8,
                "read": pl.UInt32,
                "removed_exact": pl.UInt32,
                "removed_near": pl.UInt32,
                "kept_unverified": pl.UInt32,
                "removed_fraction": pl.Float64,
            }
        )
    return (
        pl.concat(frames)
        .with_columns(removed_fraction=(pl.col("removed_exact") + pl.col("removed_near")) / pl.col("read"))
        .select("dimension", "source", "read", "removed_exact", "removed_near", "kept_unverified", "removed_fraction")
        .sort(["removed_fraction", "dimension", "source"], descending=[True, False, False])
    )


def markdown(table: pl.DataFrame) -> str:
    """:func:`source_table` as a markdown table."""
    head = "| source | read | removed exact | removed near (verified) | candidates kept (verification failed) | removed |\n"
    head += "|---|---|---|---|---|---|\n"
    return head + "\n".join(
        f"| {r['dimension']}: {r['source']} | {r['read']:,} | {r['removed_exact']:,} | {r['removed_near']:,} | "
        f"{r['kept_unverified']:,} | {100 * r['removed_fraction']:.1f} % |"
        for r in table.iter_rows(named=True)
    )


def cluster_sizes(docs: pl.DataFrame) -> dict[str, dict[int, int]]:
    """Clusters by size and kind (:func:`outcomes`' frame): ``{"exact": {size: clusters}, "near": {...}}``,
    a cluster being a kept document and the documents removed as its copies (size = removed + 1)."""
    removed = docs.filter(pl.col("outcome").is_in(["exact", "near"]))
    sizes = removed.group_by("duplicate_of", "outcome").agg(size=pl.len() + 1)
    counts = sizes.group_by("outcome", "size").agg(clusters=pl.len()).sort("outcome", "size")
    out: dict[str, dict[int, int]] = {"exact": {}, "near": {}}
    for r in counts.iter_rows(named=True):
        out[r["outcome"]][int(r["size"])] = int(r["clusters"])
    return out


def cluster_sizes_markdown(sizes: dict[str, dict[int, int]]) -> str:
    """:func:`cluster_sizes` as a log-log chart (a PNG inside the markdown) and a table of the largest sizes."""
    png = plots.cluster_sizes_png(sizes, "duplicate clusters by size")
    rows = sorted(((size, kind, n) for kind, c in sizes.items() for size, n in c.items()), reverse=True)[:10]
    table = "| kind | cluster size | clusters |\n|---|---|---|\n" + "\n".join(
        f"| {kind} | {size:,} | {n:,} |" for size, kind, n in rows
    )
    return f"![duplicate clusters by size](data:image/png;base64,{base64.b64encode(png).decode()})\n\n{table}"


def top_sources(table: pl.DataFrame, n: int = 3) -> list[dict]:
    """The ``n`` sources of :func:`source_table` that lost the largest fraction (those with removals only):
    source (``dimension: name``), read, removed, removed_fraction."""
    return [
        {
            "source": f"{r['dimension']}: {r['source']}",
            "read": r["read"],
            "removed": r["removed_exact"] + r["removed_near"],
            "removed_fraction": round(r["removed_fraction"], 4),
        }
        for r in table.filter(pl.col("removed_fraction") > 0).head(n).iter_rows(named=True)
    ]


def largest_clusters(docs: pl.DataFrame, dimension: str, source: str, k: int = 3, sample: int = 3) -> list[dict]:
    """The ``k`` kept copies with the most removed documents of one source: kept (its doc_id), removed
    (how many of the source's), members (the first ``sample`` removed doc_ids)."""
    mine = docs.filter((pl.col(dimension).fill_null("<null>") == source) & pl.col("duplicate_of").is_not_null())
    return (
        mine.group_by("duplicate_of", maintain_order=True)
        .agg(removed=pl.len(), members=pl.col("doc_id").head(sample))
        .sort(["removed", "duplicate_of"], descending=[True, False])
        .head(k)
        .rename({"duplicate_of": "kept"})
        .to_dicts()
    )


def wiped_out(docs: pl.DataFrame, table: pl.DataFrame, max_fraction: float | None) -> tuple[bool, str]:
    """(passed, message) of the ``no_source_wiped_out`` check: fails when a source of ``table`` lost more
    than ``max_fraction`` of its documents to dedup (None: never); the message names each such source, its
    fraction, its three largest clusters with a sample of their members, and the setting. Sources of fewer
    than :data:`MIN_SOURCE_DOCUMENTS` documents are not judged."""
    if max_fraction is None:
        return True, f"not checked ({SETTING} is null)"
    bad = table.filter((pl.col("removed_fraction") > max_fraction) & (pl.col("read") >= MIN_SOURCE_DOCUMENTS))
    if not bad.height:
        worst = table.row(0, named=True) if table.height else None
        return True, (
            f"no source lost more than {max_fraction:.0%} to dedup"
            + (f" (most: {worst['dimension']} {worst['source']!r}, {worst['removed_fraction']:.1%})" if worst else "")
        )
    lines = []
    for r in bad.iter_rows(named=True):
        clusters = "; ".join(
            f"{c['removed']} removed as copies of {c['kept']!r} (e.g. {', '.join(repr(m) for m in c['members'])})"
            for c in largest_clusters(docs, r["dimension"], r["source"])
        )
        lines.append(
            f"{r['dimension']} {r['source']!r} lost {r['removed_fraction']:.1%} of its {r['read']:,} documents to dedup "
            f"({r['removed_exact']:,} exact, {r['removed_near']:,} near); largest clusters: {clusters}"
        )
    return False, (
        "\n".join(lines) + f"\nAbove {SETTING}={max_fraction}. If this is intended, raise {SETTING} in the "
        "deduplicated_text config (null: never check)."
    )


def removed_sample(docs: pl.DataFrame, dirs: dict[str | None, list[Path]], n: int = 5, chars: int = 400) -> str:
    """Markdown: up to ``n`` near duplicates removed (the lowest similarity first, the ones most worth a
    look), each beside the kept copy it duplicates, their first ``chars`` characters as text."""
    pick = docs.filter(pl.col("outcome") == "near").sort(["similarity", "doc_id"]).head(n)
    if not pick.height:
        return "none"
    want = set(pick["doc_id"]) | set(pick["duplicate_of"])
    texts = {}
    for ds in dirs.values():
        for part in part_files(ds):
            df = pl.read_parquet(part, columns=["doc_id", "text"]).filter(pl.col("doc_id").is_in(list(want)))
            texts.update(zip(df["doc_id"], df["text"]))
    out = []
    for r in pick.iter_rows(named=True):
        out.append(
            f"**{r['doc_id']}** removed as a copy of **{r['duplicate_of']}** (Jaccard {r['similarity']:.2f})\n\n"
            f"removed:\n{text_block(texts.get(r['doc_id'], '')[:chars])}\n\nkept:\n"
            f"{text_block(texts.get(r['duplicate_of'], '')[:chars])}"
        )
    return "\n\n".join(out)
