"""The corpus roles and the hash partitions of the per-document steps (raw_corpus, cleaned_text).

Partition ``i`` of ``n`` holds the corpus files that largetrain_core.corpus.partition_of hashes to
``i`` (``n`` = LARGETRAIN_DATA_PARTITIONS, default 4; a terabyte corpus of ~1,000 files of ~1 GB sets
e.g. 256), so each partition is its own run (its own pod on Kubernetes) and a new or changed file
redoes one partition (docs/ARCHITECTURE.md, Lineage).

``python -m largetrain_dagster.partitions`` prints the data partition keys, one per line (what a shell
loop of one run per partition iterates over).
"""

import os

from dagster import AssetKey, AssetSelection, StaticPartitionsDefinition

ROLES = {
    "pretrain": ("corpora/linux-doc", "Pretraining corpus (demo: Linux kernel documentation, rst sources)."),
    "domain": ("corpora/shakespeare", "Domain corpus for the LoRA adapter (demo: Shakespeare's plays, markdown)."),
}


def data_partitions(count: str | int) -> StaticPartitionsDefinition:
    """``count`` partitions keyed ``000``, ``001``, ... (zero-padded to at least 3 digits).
    Raises ValueError naming LARGETRAIN_DATA_PARTITIONS unless count is an integer >= 1."""
    try:
        n = int(count)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"LARGETRAIN_DATA_PARTITIONS must be an integer >= 1, got {count!r}")
    width = max(3, len(str(n - 1)))
    return StaticPartitionsDefinition([f"{i:0{width}d}" for i in range(n)])


DATA_PARTITIONS = data_partitions(os.environ.get("LARGETRAIN_DATA_PARTITIONS", "4"))


# the partitioned per-document steps of both chains (DATA_PARTITIONS)
PARTITIONED_KEYS = [AssetKey([role, name]) for role in ROLES for name in ("raw_corpus", "cleaned_text")]
PARTITION_STEPS = AssetSelection.assets(*PARTITIONED_KEYS)


if __name__ == "__main__":
    print("\n".join(DATA_PARTITIONS.get_partition_keys()))
