"""The corpus roles, their corpora, and the hash partitions of the per-document steps (raw_corpus,
cleaned_text).

A role reads one corpus (``<role>/raw_corpus``), or a weighted mixture of several named corpora:
``LARGETRAIN_<ROLE>_CORPORA`` (e.g. ``LARGETRAIN_PRETRAIN_CORPORA=kernel_docs,plays``) names them,
and each gets its own ``<role>/<corpus>/raw_corpus`` and ``<role>/<corpus>/cleaned_text`` (its own reader
and rule settings), all deduplicated together by ``<role>/deduplicated_text`` and sampled to their
weights by ``<role>/token_shards`` (docs/guides/your-data.md, "A mixture of corpora"). The names shape
the asset graph, so they are a deployment setting, like the partition count.

Partition ``i`` of ``n`` holds the corpus files that largetrain_core.corpus.partition_of hashes to
``i`` (``n`` = LARGETRAIN_DATA_PARTITIONS, default 4; a terabyte corpus of ~1,000 files of ~1 GB sets
e.g. 256), so each partition is its own run (its own pod on Kubernetes) and a new or changed file
redoes one partition (docs/ARCHITECTURE.md, Lineage).

``python -m largetrain_dagster.partitions`` prints the data partition keys, one per line (what a shell
loop of one run per partition iterates over).
"""

import os
import re

from dagster import AssetKey, AssetSelection, StaticPartitionsDefinition
from largetrain_core.settings import positive_int

ROLES = {
    "pretrain": ("corpora/linux-doc", "Pretraining corpus (demo: Linux kernel documentation, rst sources)."),
    "domain": ("corpora/shakespeare", "Domain corpus for the LoRA adapter (demo: Shakespeare's plays, markdown)."),
}


def data_partitions(count: str | int) -> StaticPartitionsDefinition:
    """``count`` partitions keyed ``000``, ``001``, ... (zero-padded to at least 3 digits).
    Raises ValueError naming LARGETRAIN_DATA_PARTITIONS unless count is an integer >= 1."""
    n = positive_int(count, "LARGETRAIN_DATA_PARTITIONS")
    width = max(3, len(str(n - 1)))
    return StaticPartitionsDefinition([f"{i:0{width}d}" for i in range(n)])


DATA_PARTITIONS = data_partitions(os.environ.get("LARGETRAIN_DATA_PARTITIONS", "4"))


CORPUS_NAME = re.compile(r"[a-z][a-z0-9_]*")


def role_corpora(role: str, environ=os.environ) -> tuple[str, ...]:
    """The named corpora of ``role``'s mixture, from ``LARGETRAIN_<ROLE>_CORPORA`` (comma-separated, in
    order); () for a role that reads one corpus. Raises ValueError naming the variable for a name that
    is not lower-case letters, digits and _ (it becomes part of asset keys and step names), a name given
    twice, or a single name (a mixture needs two corpora)."""
    var = f"LARGETRAIN_{role.upper()}_CORPORA"
    names = tuple(n.strip() for n in environ.get(var, "").split(",") if n.strip())
    bad = [n for n in names if not CORPUS_NAME.fullmatch(n)]
    if bad or len(set(names)) != len(names) or len(names) == 1:
        raise ValueError(
            f"{var}={environ.get(var)!r}: name two or more distinct corpora, each lower-case letters, "
            f"digits and _ starting with a letter (they become asset keys {role}/<corpus>/raw_corpus)"
        )
    return names


CORPORA = {role: role_corpora(role) for role in ROLES}


def chain_prefixes() -> list[tuple[str, ...]]:
    """The key prefix of every partitioned chain: (role,) or, for a mixture, (role, corpus) per corpus."""
    return [(role, c) if c else (role,) for role in ROLES for c in (CORPORA[role] or (None,))]


# the per-document steps of every chain, partitioned (the roles' chains: DATA_PARTITIONS; the landed chain: a file each)
PER_PARTITION = ("raw_corpus", "cleaned_text")
PARTITIONED_KEYS = [AssetKey([*prefix, name]) for prefix in chain_prefixes() for name in PER_PARTITION]
PARTITION_STEPS = AssetSelection.assets(*PARTITIONED_KEYS)


def global_steps(steps) -> list[str]:
    """The steps (node names, ``domain__deduplicated_text``) among ``steps`` that are no chain's per-partition
    step: the global steps, which read every partition of their inputs and have no partition. Sorted."""
    return sorted(s for s in steps if s.rsplit("__", 1)[-1] not in PER_PARTITION)


if __name__ == "__main__":
    print("\n".join(DATA_PARTITIONS.get_partition_keys()))


# the roles whose text is filtered for training (largetrain_dagster.filtering: <role>/filtered_text between
# deduplicated_text and token_shards); the others' token_shards read their deduplicated_text
FILTERED_ROLES = ("pretrain",)


def filters_text(role: str) -> bool:
    """Whether ``role`` has a filtered_text step: a role of :data:`FILTERED_ROLES`, of one corpus or a
    mixture of corpora (:data:`CORPORA`)."""
    return role in FILTERED_ROLES


def shards_text(role: str) -> str:
    """The asset whose documents ``role``'s token_shards are made of: filtered_text or deduplicated_text."""
    return "filtered_text" if filters_text(role) else "deduplicated_text"
