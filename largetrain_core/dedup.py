"""Exact deduplication on a normalized key.

Key (the policy in largetrain_core.clean): NFKC, case-folded (``str.casefold``, then NFKC again, so
that "STRASSE" and "Straße" match), whitespace runs collapsed to one space, stripped. Two documents
are exact duplicates when the 64-bit xxh3 hashes of their keys match (xxhash, seed 0; by the
birthday bound n^2 / 2^65 the chance of any false match among 10^9 documents is about 2.7%). The
copy kept is the first in corpus order (sorted file path, then line/row), so the result does not
depend on batch size or on how many processes ran.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import polars as pl
import xxhash


def dedup_key(text: pl.Expr) -> pl.Expr:
    """The deduplication key of a Utf8 expression up to full case folding, which polars lacks
    (``to_lowercase`` leaves "ß" as is); :func:`key_hashes` applies ``casefold`` + NFKC on top."""
    return text.str.normalize("NFKC").str.to_lowercase().str.replace_all(r"\s+", " ").str.strip_chars()


def key_hashes(texts: pl.Series) -> pl.Series:
    """UInt64 xxh3_64 hash of each text's dedup key."""
    keys = pl.select(dedup_key(pl.lit(texts))).to_series()
    return pl.Series("key_hash", [xxhash.xxh3_64_intdigest(unicodedata.normalize("NFKC", k.casefold()).encode())
                                  for k in keys.to_list()], dtype=pl.UInt64)


def exact_dedup(in_dir: Path, out_dir: Path) -> dict:
    """Remove exact duplicates from the ``part-*.parquet`` files of a cleaned_text directory.

    Writes kept documents to ``out_dir/part-NNNNN.parquet`` (same columns, input order) and every
    removed copy to ``out_dir/duplicates.parquet`` (doc_id, source, duplicate_of, key_hash).
    Two passes over the input: the first builds the hash -> first doc_id table, the second writes.
    Returns counts ``input``, ``kept``, ``duplicate``, ``clusters`` (keys with more than one copy).
    """
    parts = sorted(Path(in_dir).glob("part-*.parquet"))
    first: dict[int, tuple[int, str]] = {}  # key hash -> (global row, doc_id) of the first copy
    hashes: list[pl.Series] = []
    row = 0
    for part in parts:
        df = pl.read_parquet(part, columns=["doc_id", "text"])
        h = key_hashes(df["text"])
        hashes.append(h)
        for doc_id, k in zip(df["doc_id"].to_list(), h.to_list()):
            first.setdefault(k, (row, doc_id))
            row += 1
    first_row = {k: v[0] for k, v in first.items()}
    first_id = {k: v[1] for k, v in first.items()}
    stats = {"input": 0, "kept": 0, "duplicate": 0}
    dups: list[pl.DataFrame] = []
    for i, (part, h) in enumerate(zip(parts, hashes)):
        df = pl.read_parquet(part).with_columns(key_hash=h)
        df = df.with_columns(
            row=pl.int_range(stats["input"], stats["input"] + df.height, dtype=pl.Int64),
            first_row=pl.col("key_hash").replace_strict(first_row, return_dtype=pl.Int64),
            duplicate_of=pl.col("key_hash").replace_strict(first_id, return_dtype=pl.Utf8),
        )
        is_first = pl.col("row") == pl.col("first_row")
        df.filter(is_first).select("doc_id", "source", "text").write_parquet(out_dir / f"part-{i:05d}.parquet")
        removed = df.filter(~is_first).select("doc_id", "source", "duplicate_of", "key_hash")
        dups.append(removed)
        stats["input"] += df.height
        stats["duplicate"] += removed.height
    stats["kept"] = stats["input"] - stats["duplicate"]
    table = pl.concat(dups) if dups else pl.DataFrame(
        schema={"doc_id": pl.Utf8, "source": pl.Utf8, "duplicate_of": pl.Utf8, "key_hash": pl.UInt64})
    table.write_parquet(out_dir / "duplicates.parquet")
    stats["clusters"] = table["duplicate_of"].n_unique() if table.height else 0
    return stats
