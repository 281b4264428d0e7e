"""Connected components of a graph of candidate-duplicate edges on Spark, by alternating large-star and
small-star (Kiveris, Lattanzi, Mirrokni, Rastogi, Vassilvitskii, "Connected Components in MapReduce
and Beyond", SoCC 2014), whose fixed point is one star per component centred on its smallest node:
the first document in corpus order, the local executor's kept copy."""

from __future__ import annotations

from typing import Callable

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def connected_components(edges: DataFrame, log: Callable[[str], None] = lambda m: None) -> tuple[DataFrame, dict]:
    """Connected components of the undirected graph ``edges`` (u, v), u > v, by alternating large-star
    and small-star (Kiveris et al. 2014, algorithm "Alternating", O(log^2 n) rounds): returns (u, v)
    with one row per node that is not the smallest of its component, v = that smallest node, and the
    counts ``leaves`` (its rows) and ``centres`` (the components).

    Large-star: every node x links each larger neighbour y to m(x), the smallest of x and its
    neighbours. Small-star: every node u links itself and each smaller neighbour to the smallest of
    them. Stops at the fixed point, when the graph is a set of stars (no node is both a leaf and a
    centre, no leaf has two centres), whose centres are then the components' smallest nodes.
    Each round's edges are persisted (the plan of the next round reads them, not their lineage; a
    lost block is recomputed from the lineage, deterministically). The result stays persisted."""
    u, v = F.col("u"), F.col("v")

    def stars_or_not(e: DataFrame, rnd: int) -> dict | None:
        """One job: materializes the round's edges and tests the fixed point, a set of stars (no node
        is a leaf twice, none both a leaf and a centre); the candidate pairs often are one already.
        Returns the stars' ``leaves`` (edges) and ``centres`` at the fixed point, else None."""
        nodes = (
            e.select(u.alias("n"), F.lit(1).alias("leaf"), F.lit(0).alias("centre"))
            .unionByName(e.select(v.alias("n"), F.lit(0).alias("leaf"), F.lit(1).alias("centre")))
            .groupBy("n")
            .agg(F.sum("leaf").alias("l"), F.sum("centre").alias("c"))
        )
        check = nodes.agg(
            F.sum("l").alias("edges"),
            F.sum(F.when((F.col("l") > 1) | ((F.col("l") > 0) & (F.col("c") > 0)), 1).otherwise(0)).alias("bad"),
            F.sum(F.when(F.col("c") > 0, 1).otherwise(0)).alias("centres"),
        ).first()
        log(f"connected components: round {rnd}, {check['edges'] or 0} edges, {check['bad'] or 0} nodes not in a star")
        return None if check["bad"] else {"leaves": int(check["edges"] or 0), "centres": int(check["centres"] or 0)}

    e = edges.persist(StorageLevel.MEMORY_AND_DISK)
    for rnd in range(200):
        if (found := stars_or_not(e, rnd)) is not None:
            return e, found
        both = e.select(u.alias("x"), v.alias("y")).unionByName(e.select(v.alias("x"), u.alias("y")))
        m = both.groupBy("x").agg(F.least(F.min("y"), F.col("x")).alias("m"))
        large = (
            both.join(m, "x")
            .where(F.col("y") > F.col("x"))
            .select(F.col("y").alias("u"), F.col("m").alias("v"))
            .distinct()
        )
        m2 = large.groupBy("u").agg(F.min("v").alias("m"))
        small = (
            large.join(m2, "u")
            .where(v != F.col("m"))
            .select(v.alias("u"), F.col("m").alias("v"))
            .unionByName(m2.select("u", F.col("m").alias("v")))
            .distinct()
        ).persist(StorageLevel.MEMORY_AND_DISK)
        small.count()  # computed from the cached edges of this round before they are dropped
        e.unpersist()
        e = small
    raise RuntimeError("connected components did not converge in 200 rounds")
