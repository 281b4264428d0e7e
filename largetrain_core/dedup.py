"""Deduplication: exact (hash of a normalized key) and near-duplicate (MinHash + LSH), one pass of clustering.

Exact key (the policy in largetrain_core.clean): NFKC, case-folded (``str.casefold``, then NFKC again, so
that "STRASSE" and "Straße" match), whitespace runs collapsed to one space, stripped. Two documents
are exact duplicates when the 64-bit xxh3 hashes of their keys match (xxhash, seed 0; by the
birthday bound n^2 / 2^65 the chance of any false match among 10^9 documents is about 2.7%).

Near duplicates (Broder 1997 MinHash; banding as in Leskovec et al., "Mining of Massive Datasets" ch. 3,
and datatrove's MinhashDedup defaults): the key with punctuation turned into spaces is split into
words; shingles are word 5-grams; each word is hashed with xxh3_64 (seeded), a shingle's hash folds
its words' hashes (multiply-xor) and finishes with the murmur3 64-bit finalizer; 112 permutations
``a_i * h + b_i mod 2^64`` (a_i odd, both from numpy's PCG64 seeded with ``seed``) give the signature,
cut into 14 bands of 8 rows: two documents become candidates when one band matches entirely, which
happens with probability 1 - (1 - J^8)^14 for Jaccard similarity J (0.5 at J ~ 0.72).
A document with fewer words than the shingle size has one shingle, its whole word sequence, so short
documents match only documents with the same words; a document with no word has no signature and
takes part in exact deduplication only (never in a near-duplicate cluster).

Clusters are the connected components of exact and band matches (union-find in numpy: min-label
hooking with pointer jumping). The copy kept is the first in corpus order (sorted partition / part
file, then row); every other member is a duplicate recorded with ``duplicate_of`` (the kept copy's
doc_id), ``cluster_id`` (its global row) and ``kind`` ("exact" when its key equals the kept copy's,
else "near"). The result does not depend on batch size or on how the corpus is partitioned.

Partitions: :func:`write_signatures` runs per partition (one Parquet file of key and LSH band hashes);
:func:`cluster_signatures` reads all signature files, so a pair split across partitions is found;
:func:`write_deduplicated` writes one partition's kept documents from the global assignment.
"""

from __future__ import annotations

import unicodedata
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from largetrain_core.storage import part_files

_M = np.uint64(0x100000001B3)
DUP_SCHEMA = {"doc_id": pl.Utf8, "source": pl.Utf8, "duplicate_of": pl.Utf8, "cluster_id": pl.Int64,
              "kind": pl.Utf8, "key_hash": pl.UInt64}


@dataclass(frozen=True)
class DedupConfig:
    """Exact and MinHash-LSH near-duplicate removal (the deduplicated_text settings).

    chunk_shingles: shingles hashed per numpy block; two threads each hold one block (memory:
    2 * chunk_shingles * bands * rows * 8 bytes = 14.7 MiB at the defaults; 8192 keeps a block in a
    typical L2/L3 cache, faster than the former 32768 with the same signatures) and one signature array per part."""

    near: bool = field(default=True, metadata={"description": "Also remove near duplicates (MinHash-LSH); else exact only."})
    ngram: int = field(default=5, metadata={"description": "Words per shingle (datatrove MinhashConfig default 5)."})
    bands: int = field(default=14, metadata={"description": (
        "LSH bands; bands x rows permutations (14 x 8, datatrove MinhashConfig defaults: candidates at Jaccard ~0.72).")})
    rows: int = field(default=8, metadata={"description": "Rows (permutations) per LSH band."})
    seed: int = field(default=1, metadata={"description": "Seed of the word hashes and the permutations."})
    chunk_shingles: int = field(default=8192, metadata={"description": "Shingles hashed per numpy block (memory, not results)."})

    def to_dict(self) -> dict:
        return asdict(self)


def dedup_key(text: pl.Expr) -> pl.Expr:
    """The deduplication key of a Utf8 expression up to full case folding, which polars lacks
    (``to_lowercase`` leaves "ß" as is); :func:`key_hashes` applies ``casefold`` + NFKC on top."""
    return text.str.normalize("NFKC").str.to_lowercase().str.replace_all(r"\s+", " ").str.strip_chars()


def key_hashes(texts: pl.Series, keys: pl.Series | None = None) -> pl.Series:
    """UInt64 xxh3_64 hash of each text's dedup key (``keys``: ``dedup_key`` of ``texts`` if already computed)."""
    if keys is None:
        keys = pl.select(dedup_key(pl.lit(texts))).to_series()
    return pl.Series("key_hash", [xxhash.xxh3_64_intdigest(unicodedata.normalize("NFKC", k.casefold()).encode())
                                  for k in keys.to_list()], dtype=pl.UInt64)


def fmix64(x: np.ndarray) -> np.ndarray:
    """murmur3's 64-bit finalizer (Appleby, MurmurHash3 fmix64), elementwise on uint64."""
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xFF51AFD7ED558CCD)
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> np.uint64(33))


def _permutations(cfg: DedupConfig) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(cfg.seed)
    p = cfg.bands * cfg.rows
    a = rng.integers(0, 2**64, size=p, dtype=np.uint64) | np.uint64(1)
    b = rng.integers(0, 2**64, size=p, dtype=np.uint64)
    return a, b


def _shingle_hashes(wh: np.ndarray, doc: np.ndarray, n_words: np.ndarray, ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of the word n-grams (fold h = h * M ^ word_hash over the n-gram's words, then fmix64) and
    their documents; a document with fewer than ``ngram`` words has one shingle of all its words."""
    W = len(doc)
    hs, ds = [], []
    if W >= ngram:
        h = wh[:W - ngram + 1].copy()
        for i in range(1, ngram):  # sliding windows by slices: no gathers
            h = h * _M ^ wh[i:W - ngram + 1 + i]
        inside = doc[:W - ngram + 1] == doc[ngram - 1:]
        hs.append(h[inside])
        ds.append(doc[:W - ngram + 1][inside])
    short = np.flatnonzero((n_words > 0) & (n_words < ngram))
    if len(short):
        first = np.searchsorted(doc, short)
        h = wh[first].copy()
        for i in range(1, ngram - 1):
            more = i < n_words[short]
            h = np.where(more, h * _M ^ wh[np.minimum(first + i, W - 1)], h)
        hs.append(h)
        ds.append(short)
    if not hs:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    h, d = np.concatenate(hs), np.concatenate(ds)
    order = np.argsort(d, kind="stable")  # short documents' shingles back into document order
    return fmix64(h[order]), d[order]


def _permute_min(h: np.ndarray, sdoc: np.ndarray, n_docs: int, cfg: DedupConfig) -> np.ndarray:
    """Per document and permutation i: min over its shingles of a_i * h + b_i (mod 2^64), in blocks of
    ``cfg.chunk_shingles`` shingles with one preallocated buffer. ``sdoc`` must be sorted (as
    :func:`_shingle_hashes` returns it), so the documents of one block are distinct runs.

    The block is laid out permutation-major (bands*rows, chunk): the multiply, add and the per-document
    ``minimum.reduceat`` then run over contiguous rows, about 4x faster than shingle-major on the
    kernel docs (same result, bit for bit)."""
    a, b = _permutations(cfg)
    p = len(a)
    sig_t = np.full((p, n_docs), np.iinfo(np.uint64).max, dtype=np.uint64)
    buf = np.empty((p, min(cfg.chunk_shingles, len(h))), dtype=np.uint64)
    for c0 in range(0, len(h), cfg.chunk_shingles):
        c1 = min(c0 + cfg.chunk_shingles, len(h))
        hc, dc, v = h[c0:c1], sdoc[c0:c1], buf[:, :c1 - c0]
        np.multiply(a[:, None], hc[None, :], out=v)
        np.add(v, b[:, None], out=v)
        bounds = np.flatnonzero(np.r_[True, dc[1:] != dc[:-1]])
        docs = dc[bounds]  # distinct: sdoc is sorted
        m = np.minimum.reduceat(v, bounds, axis=1)
        np.minimum(m, sig_t[:, docs], out=m)  # a document whose shingles span two blocks
        sig_t[:, docs] = m
    return np.ascontiguousarray(sig_t.T)


def _minhash_serial(keys: pl.Series, cfg: DedupConfig) -> tuple[np.ndarray, np.ndarray]:
    n, p = len(keys), cfg.bands * cfg.rows
    # words = runs of \w in the key: the same as turning punctuation into spaces and splitting at whitespace
    words = pl.DataFrame({"t": keys}).with_row_index("d").select("d", w=pl.col("t").str.extract_all(r"\w+")
                                                                ).explode("w").drop_nulls("w")
    n_words = np.bincount(words["d"].to_numpy(), minlength=n).astype(np.int64) if words.height else np.zeros(n, np.int64)
    if not words.height:
        return np.full((n, p), np.iinfo(np.uint64).max, dtype=np.uint64), n_words
    uniq = words["w"].unique()
    table = pl.DataFrame({"w": uniq, "h": pl.Series([xxhash.xxh3_64_intdigest(w.encode(), cfg.seed) for w in uniq.to_list()],
                                                    dtype=pl.UInt64)})
    wh = words.join(table, on="w", how="left", maintain_order="left")["h"].to_numpy()
    doc = words["d"].to_numpy().astype(np.int64)
    h, sdoc = _shingle_hashes(wh, doc, n_words, cfg.ngram)
    return _permute_min(h, sdoc, n, cfg), n_words


_POOL: list = []


def _in_two_threads(texts: pl.Series, fn):
    """fn(first half of texts) and fn(second half) in two threads (polars and numpy release the GIL);
    returns the two results in order (one call on the whole Series under 64 texts).

    The two threads are created once per process and reused: fresh threads per part made glibc hand
    out new malloc arenas whose freed memory stayed resident (peak RSS grew with the number of parts;
    benchmarks/prep_memory.py)."""
    n = len(texts)
    if n < 64:
        return [fn(texts)]
    if not _POOL:
        from concurrent.futures import ThreadPoolExecutor

        _POOL.append(ThreadPoolExecutor(2, thread_name_prefix="minhash"))
    return list(_POOL[0].map(fn, [texts.slice(0, n // 2), texts.slice(n // 2)]))


def minhash(texts: pl.Series, cfg: DedupConfig = DedupConfig()) -> tuple[np.ndarray, np.ndarray]:
    """MinHash signatures of a Utf8 Series of N texts.

    Returns ``(signatures, n_words)``: uint64 (N, bands*rows) and int64 (N,). Rows of documents
    without words are all 2^64-1 and must not be banded (``n_words == 0``). The two halves of the
    documents are hashed in two threads; the result does not depend on the split.
    """
    halves = _in_two_threads(texts, lambda t: _minhash_serial(pl.select(dedup_key(pl.lit(t))).to_series(), cfg))
    return np.concatenate([h[0] for h in halves]), np.concatenate([h[1] for h in halves])


def _signature_columns(texts: pl.Series, cfg: DedupConfig) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(key hashes, signatures, n_words) of texts, the dedup key computed once, halves in two threads."""
    def half(t: pl.Series):
        keys = pl.select(dedup_key(pl.lit(t))).to_series()
        kh = key_hashes(t, keys).to_numpy()
        return (kh, *_minhash_serial(keys, cfg)) if cfg.near else (kh, None, None)

    parts = _in_two_threads(texts, half)
    if not cfg.near:
        return np.concatenate([p[0] for p in parts]), None, None
    return tuple(np.concatenate([p[k] for p in parts]) for k in range(3))


# ------------------------------------------------------------------------------------------------
# per partition


def band_hashes(sig: np.ndarray, cfg: DedupConfig) -> np.ndarray:
    """One uint64 per LSH band: the band's ``rows`` signature values folded (multiply-xor, then the
    murmur3 finalizer). (n, bands*rows) uint64 -> (n, bands) uint64. Two documents share a band's
    hash when the band's rows are equal (up to 64-bit hash collisions, ~n^2 / 2^65 per band)."""
    out = np.empty((sig.shape[0], cfg.bands), dtype=np.uint64)
    for band in range(cfg.bands):
        cols = sig[:, band * cfg.rows:(band + 1) * cfg.rows]
        h = np.zeros(sig.shape[0], dtype=np.uint64)
        for r in range(cfg.rows):
            h = fmix64(h * _M ^ cols[:, r])
        out[:, band] = h
    return out


def write_signatures(part_files: list[Path], out_file: Path, cfg: DedupConfig = DedupConfig()) -> int:
    """LSH data of one partition's documents (its ``part_files`` in order) to a Parquet file with
    doc_id, key_hash (UInt64), n_words (Int64) and, when ``cfg.near``, band_hash
    (fixed_size_list<uint64>[bands], :func:`band_hashes`): what the global step reads, 8 bytes per
    band instead of 8 per permutation (112 B instead of 896 B per document at 14 x 8). Returns the
    number of documents."""
    tables = []
    for part in part_files:
        df = pl.read_parquet(part, columns=["doc_id", "text"])
        kh, sig, n_words = _signature_columns(df["text"], cfg)
        cols = {"doc_id": pa.array(df["doc_id"].to_list(), pa.large_string()), "key_hash": pa.array(kh, pa.uint64())}
        if cfg.near:
            cols["n_words"] = pa.array(n_words, pa.int64())
            bh = band_hashes(sig, cfg)
            cols["band_hash"] = pa.FixedSizeListArray.from_arrays(pa.array(bh.ravel(), pa.uint64()), cfg.bands)
        tables.append(pa.table(cols))
    table = pa.concat_tables(tables) if tables else pa.table({"doc_id": pa.array([], pa.large_string()),
                                                            "key_hash": pa.array([], pa.uint64())})
    tmp = Path(str(out_file) + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(out_file)
    return table.num_rows


# ------------------------------------------------------------------------------------------------
# global


def _components(n: int, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Connected components of the graph on 0..n-1 with edges (u, v): the smallest node of each
    node's component (union-find by min-label hooking and pointer jumping, all in numpy)."""
    parent = np.arange(n, dtype=np.int64)
    if not len(u):
        return parent
    while True:
        pu, pv = parent[u], parent[v]
        if np.array_equal(pu, pv):
            return parent
        m = np.minimum(pu, pv)
        np.minimum.at(parent, pu, m)
        np.minimum.at(parent, pv, m)
        while True:
            nxt = parent[parent]
            if np.array_equal(nxt, parent):
                break
            parent = nxt


def _same_value_edges(values: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edges (row, first row with the same value) for every row whose value occurred before."""
    if not len(values):
        return rows[:0], rows[:0]
    order = np.argsort(values, kind="stable")
    sv, sr = values[order], rows[order]
    start = np.r_[True, sv[1:] != sv[:-1]]
    first = sr[np.flatnonzero(start)][np.cumsum(start) - 1]
    dup = ~start
    return sr[dup], first[dup]


def cluster_signatures(signature_files: list[Path], cfg: DedupConfig = DedupConfig()) -> pl.DataFrame:
    """Cluster all documents of all signature files (global row = order of files, then rows).

    Returns one row per document: row (Int64), doc_id, cluster_id (Int64: the kept copy's row),
    duplicate_of (Utf8: the kept copy's doc_id, null for kept documents), kind (null, "exact" or "near").
    """
    tables = [pq.read_table(f) for f in signature_files]
    n = sum(t.num_rows for t in tables)
    doc_ids = pl.concat([pl.from_arrow(t.column("doc_id")).cast(pl.Utf8) for t in tables]) if tables else pl.Series([], dtype=pl.Utf8)
    keys = np.concatenate([t.column("key_hash").to_numpy() for t in tables]) if tables else np.zeros(0, np.uint64)
    rows = np.arange(n, dtype=np.int64)
    u, v = _same_value_edges(keys, rows)
    us, vs = [u], [v]
    if cfg.near and n:
        bands = np.concatenate([t.column("band_hash").combine_chunks().flatten().to_numpy().reshape(-1, cfg.bands)
                                for t in tables])
        n_words = np.concatenate([t.column("n_words").to_numpy() for t in tables])
        live = rows[n_words > 0]
        for band in range(cfg.bands):
            u, v = _same_value_edges(bands[live, band], live)
            us.append(u)
            vs.append(v)
    root = _components(n, np.concatenate(us), np.concatenate(vs))
    is_dup = root != rows
    kind = np.where(~is_dup, None, np.where(keys == keys[root], "exact", "near"))
    return pl.DataFrame({"row": rows, "doc_id": doc_ids, "cluster_id": root,
                         "duplicate_of": doc_ids.gather(root).zip_with(pl.Series(is_dup), pl.Series([None] * n, dtype=pl.Utf8)),
                         "kind": pl.Series(kind.tolist(), dtype=pl.Utf8), "key_hash": pl.Series(keys, dtype=pl.UInt64)})


def write_deduplicated(part_files: list[Path], assignment: pl.DataFrame, first_row: int, out_dir: Path,
                       first_part: int = 0) -> tuple[int, pl.DataFrame]:
    """Write the kept documents of ``part_files`` (whose first document has global row ``first_row``)
    to ``out_dir/part-NNNNN.parquet`` numbered from ``first_part`` (doc_id, source, text, and label where
    the input has one). Returns (rows read, duplicates frame)."""
    dups, row = [], first_row
    for i, part in enumerate(part_files):
        df = pl.read_parquet(part)
        a = assignment.slice(row, df.height)
        df = df.with_columns(a["duplicate_of"], a["cluster_id"], a["kind"], a["key_hash"])
        keep = ["doc_id", "source", "text", *(["label"] if "label" in df.columns else [])]
        df.filter(pl.col("duplicate_of").is_null()).select(keep).write_parquet(
            out_dir / f"part-{first_part + i:05d}.parquet")
        dups.append(df.filter(pl.col("duplicate_of").is_not_null()).select(*DUP_SCHEMA))
        row += df.height
    return row - first_row, pl.concat(dups) if dups else pl.DataFrame(schema=DUP_SCHEMA)


def deduplicate(in_dir: Path | list[Path], out_dir: Path, cfg: DedupConfig = DedupConfig()) -> dict:
    """Exact and (with ``cfg.near``) near-duplicate removal over the ``part-*.parquet`` files of a
    cleaned_text directory, or of several (one per partition, in partition order: corpus order is
    partition, then part file, then row), signatures per part file, clustering over all of them.

    Writes ``out_dir/signatures/part-NNNNN.parquet``, the kept documents to ``out_dir/part-NNNNN.parquet``
    (same columns, input order) and every removed copy to ``out_dir/duplicates.parquet``
    (doc_id, source, duplicate_of, cluster_id, kind, key_hash). Returns counts ``input``, ``kept``,
    ``duplicate``, ``clusters`` (kept copies with at least one duplicate), ``duplicate_exact``, ``duplicate_near``.
    """
    parts = part_files(in_dir)
    sig_dir = Path(out_dir) / "signatures"
    sig_dir.mkdir(exist_ok=True)
    sig_files = []
    for i, part in enumerate(parts):
        f = sig_dir / f"part-{i:05d}.parquet"
        write_signatures([part], f, cfg)
        sig_files.append(f)
    assignment = cluster_signatures(sig_files, cfg)
    n, dups = write_deduplicated(parts, assignment, 0, Path(out_dir))
    dups.write_parquet(Path(out_dir) / "duplicates.parquet")
    return {"input": n, "kept": n - dups.height, "duplicate": dups.height,
            "clusters": dups["duplicate_of"].n_unique() if dups.height else 0,
            "duplicate_exact": int((dups["kind"] == "exact").sum()), "duplicate_near": int((dups["kind"] == "near").sum())}


def exact_dedup(in_dir: Path | list[Path], out_dir: Path) -> dict:
    """Exact duplicates only (:func:`deduplicate` with ``near=False``); counts ``input``, ``kept``, ``duplicate``, ``clusters``."""
    stats = deduplicate(in_dir, out_dir, DedupConfig(near=False))
    return {k: stats[k] for k in ("input", "kept", "duplicate", "clusters")}
