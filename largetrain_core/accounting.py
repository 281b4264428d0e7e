"""The accounting rule (DESIGN.md section 3): every input document ends in exactly one of
``kept``, ``filtered``, ``duplicate`` or ``rejected``, and ``kept + filtered + duplicate + rejected == input``.

Counts are taken from the stage outputs on disk (Parquet row counts from the file footers), not
from what the stages said they wrote, so a lost or double-written part file breaks the balance.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq


def _rows(files) -> int:
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def corpus_accounting(raw_dir: Path, cleaned_dir: Path, dedup_dir: Path) -> dict:
    """Recount one corpus's chain raw_corpus -> cleaned_text -> deduplicated_text.

    Returns ``input`` (documents read + records rejected), ``kept``, ``filtered``, ``duplicate``,
    ``rejected``, ``balanced`` (the rule holds for the whole chain and for each stage) and
    ``problems`` (one message per stage that does not balance).
    """
    raw_dir, cleaned_dir, dedup_dir = Path(raw_dir), Path(cleaned_dir), Path(dedup_dir)
    read = _rows(sorted(raw_dir.glob("part-*.parquet")))
    rejected = _rows([raw_dir / "rejected.parquet"])
    cleaned = _rows(sorted(cleaned_dir.glob("part-*.parquet")))
    filtered = _rows([cleaned_dir / "filtered.parquet"])
    kept = _rows(sorted(dedup_dir.glob("part-*.parquet")))
    duplicate = _rows([dedup_dir / "duplicates.parquet"])
    problems = []
    if cleaned + filtered != read:
        problems.append(f"cleaned_text: {cleaned} kept + {filtered} filtered != {read} read by raw_corpus")
    if kept + duplicate != cleaned:
        problems.append(f"deduplicated_text: {kept} kept + {duplicate} duplicate != {cleaned} from cleaned_text")
    total = read + rejected
    return {"input": total, "kept": kept, "filtered": filtered, "duplicate": duplicate, "rejected": rejected,
            "balanced": not problems and kept + filtered + duplicate + rejected == total, "problems": problems}
