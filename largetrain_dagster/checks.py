"""Standalone blocking asset checks (in addition to those declared inside the assets)."""

from pathlib import Path

import polars as pl
from dagster import AssetCheckResult, MetadataValue, asset_check

from largetrain_core.dedup import key_hashes
from largetrain_core.storage import part_files


def count_exact_duplicates(directory: Path, batch: int = 10_000) -> tuple[int, int, list[str]]:
    """Recount ``part-*.parquet`` under ``directory``: (documents, documents whose dedup key was seen
    before, up to 5 of their doc ids). Memory: 8 bytes per distinct key (a set of xxh3-64 hashes)."""
    seen: set[int] = set()
    docs, dups, examples = 0, 0, []
    for part in part_files(directory):
        for df in pl.read_parquet(part, columns=["doc_id", "text"]).iter_slices(batch):
            for doc_id, h in zip(df["doc_id"].to_list(), key_hashes(df["text"]).to_list()):
                docs += 1
                if h in seen:
                    dups += 1
                    if len(examples) < 5:
                        examples.append(doc_id)
                seen.add(h)
    return docs, dups, examples


def no_exact_duplicates_check(key: list[str]):
    """A blocking check on ``key`` (a deduplicated_text asset): no two kept documents share a dedup key."""

    @asset_check(asset=key, name="no_exact_duplicates", blocking=True,
                 description="Recounted from the files: no two kept documents have the same dedup key (NFKC, case-folded, whitespace-collapsed).")
    def _check(handle: dict) -> AssetCheckResult:
        docs, dups, examples = count_exact_duplicates(Path(handle["path"]))
        return AssetCheckResult(passed=dups == 0, metadata={"documents": docs, "duplicates": dups,
                                                            "examples": MetadataValue.json(examples)})

    return _check


def dedup_checks(roles) -> list:
    return [no_exact_duplicates_check([role, "deduplicated_text"]) for role in roles]
