"""Deduplication: exact (hash of a normalized key) and near-duplicate (MinHash + LSH), one pass of clustering.

Exact key (the policy in largetrain_core.clean): format characters (Unicode ``Cf``: soft hyphens,
zero-width spaces, word joiners, ZWJ/ZWNJ, BOMs, bidi marks) removed, NFKC, case-folded (``str.casefold``,
then NFKC again, so that "STRASSE" and "Straße" match), whitespace runs collapsed to one space, stripped. Two documents
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

Candidate clusters are the connected components of exact and band matches. Components are
transitive (A ~ B and B ~ C join A and C however little they share), so with near duplicates they are
verified (:func:`verify_assignment`, :class:`VerifyConfig`): in corpus order (sorted partition / part
file, then row) a document is removed only when the exact Jaccard similarity of its shingle set to an
earlier *kept* document's reaches the threshold (or their keys are equal); a duplicate is recorded
with ``duplicate_of`` (that kept copy's doc_id), ``cluster_id`` (its global row), ``kind`` ("exact"
when its key equals the kept copy's, else "near") and ``similarity`` (the measured Jaccard); the
candidates kept because verification failed go to ``unverified.parquet``. Without verification
(``verify=None``) the first of each component is kept and every other member removed. The result does
not depend on batch size, on how the corpus is partitioned, or on an executor
(largetrain_core.executors.spark computes the same on Spark).

Partitions: :func:`write_signatures` runs per partition (one Parquet file of key and LSH band hashes);
:func:`cluster_signatures` reads all signature files, so a pair split across partitions is found, with
memory bounded per pass and not per corpus: one column (the key, then each band) at a time, in hash
ranges spilled to disk beyond ``rows_per_pass`` documents (datatrove's stage 2 works per bucket and
hash range the same way), and a union-find (numpy min-label hooking with pointer jumping) only over the
documents that have a candidate pair; :func:`write_deduplicated` writes one partition's kept
documents from the global assignment.
"""

from __future__ import annotations

import json
import tempfile
import unicodedata
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from largetrain_core.settings import described
from largetrain_core.storage import as_dirs, part_files

_M = np.uint64(0x100000001B3)
DUP_SCHEMA = {
    "doc_id": pl.Utf8,
    "source": pl.Utf8,
    "duplicate_of": pl.Utf8,
    "cluster_id": pl.Int64,
    "kind": pl.Utf8,
    "key_hash": pl.UInt64,
    "similarity": pl.Float64,
}
UNVERIFIED_SCHEMA = {"doc_id": pl.Utf8, "source": pl.Utf8, "candidate_of": pl.Utf8, "similarity": pl.Float64}


@dataclass(frozen=True)
class VerifyConfig:
    """Verification of near-duplicate candidates (:func:`verify_assignment`): a candidate is removed only
    when the Jaccard similarity of its word-shingle set to a kept document's reaches ``threshold``.

    threshold 0.7: the LSH's own design point, (1/bands)^(1/rows) = (1/14)^(1/8) ~ 0.72 (Leskovec et al.,
    "Mining of Massive Datasets" 3.4.3), rounded down so that pairs the banding was built to find pass.
    max_bucket_pairs 64: a document sharing a band hash with many others is compared with the first 64 of
    them only (a cap on the work of one bucket, m * 64 pairs instead of m^2 / 2, as marin caps its
    clusters, marin PR#8114); a copy beyond them is kept unless another band or its key pairs it."""

    threshold: float = field(
        default=0.7,
        metadata=described("Jaccard (word 5-gram shingle sets) to a kept copy needed to remove a candidate."),
    )
    max_bucket_pairs: int = field(
        default=64, metadata=described("Earlier documents of one LSH bucket a candidate is compared with, at most.")
    )

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DedupConfig:
    """Exact and MinHash-LSH near-duplicate removal (the deduplicated_text settings).

    chunk_shingles: shingles hashed per numpy block; two threads each hold one block (memory:
    2 * chunk_shingles * bands * rows * 8 bytes = 14.7 MiB at the defaults; 8192 keeps a block in a
    typical L2/L3 cache; the signatures do not depend on it) and one signature array per part."""

    near: bool = field(default=True, metadata=described("Also remove near duplicates (MinHash-LSH); else exact only."))
    ngram: int = field(default=5, metadata=described("Words per shingle (datatrove MinhashConfig default 5)."))
    bands: int = field(
        default=14,
        metadata=described(
            "LSH bands; bands x rows permutations (14 x 8, datatrove MinhashConfig defaults: candidates at Jaccard ~0.72)."
        ),
    )
    rows: int = field(default=8, metadata=described("Rows (permutations) per LSH band."))
    seed: int = field(default=1, metadata=described("Seed of the word hashes and the permutations."))
    chunk_shingles: int = field(
        default=8192, metadata=described("Shingles hashed per numpy block (memory, not results).")
    )

    def to_dict(self) -> dict:
        return asdict(self)


def dedup_key(text: pl.Expr) -> pl.Expr:
    """The deduplication key of a Utf8 expression up to full case folding, which polars lacks
    (``to_lowercase`` leaves "ß" as is); :func:`key_hashes` applies ``casefold`` + NFKC on top."""
    return (
        text.str.replace_all(r"\p{Cf}", "")
        .str.normalize("NFKC")
        .str.to_lowercase()
        .str.replace_all(r"\s+", " ")
        .str.strip_chars()
    )


def key_hashes(texts: pl.Series, keys: pl.Series | None = None) -> pl.Series:
    """UInt64 xxh3_64 hash of each text's dedup key (``keys``: ``dedup_key`` of ``texts`` if already computed)."""
    if keys is None:
        keys = pl.select(dedup_key(pl.lit(texts))).to_series()
    return pl.Series(
        "key_hash",
        [xxhash.xxh3_64_intdigest(unicodedata.normalize("NFKC", k.casefold()).encode()) for k in keys.to_list()],
        dtype=pl.UInt64,
    )


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
        h = wh[: W - ngram + 1].copy()
        for i in range(1, ngram):  # sliding windows by slices: no gathers
            h = h * _M ^ wh[i : W - ngram + 1 + i]
        inside = doc[: W - ngram + 1] == doc[ngram - 1 :]
        hs.append(h[inside])
        ds.append(doc[: W - ngram + 1][inside])
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
        hc, dc, v = h[c0:c1], sdoc[c0:c1], buf[:, : c1 - c0]
        np.multiply(a[:, None], hc[None, :], out=v)
        np.add(v, b[:, None], out=v)
        bounds = np.flatnonzero(np.r_[True, dc[1:] != dc[:-1]])
        docs = dc[bounds]  # distinct: sdoc is sorted
        m = np.minimum.reduceat(v, bounds, axis=1)
        np.minimum(m, sig_t[:, docs], out=m)  # a document whose shingles span two blocks
        sig_t[:, docs] = m
    return np.ascontiguousarray(sig_t.T)


def _shingles_of_keys(keys: pl.Series, cfg: DedupConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(shingle hashes uint64, their documents int64 ascending, n_words int64 per document) of dedup keys:
    the shingles the MinHash signatures are computed from (module docstring)."""
    n = len(keys)
    # words = runs of \w in the key: the same as turning punctuation into spaces and splitting at whitespace
    words = (
        pl.DataFrame({"t": keys})
        .with_row_index("d")
        .select("d", w=pl.col("t").str.extract_all(r"\w+"))
        .explode("w")
        .drop_nulls("w")
    )
    n_words = (
        np.bincount(words["d"].to_numpy(), minlength=n).astype(np.int64) if words.height else np.zeros(n, np.int64)
    )
    if not words.height:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64), n_words
    uniq = words["w"].unique()
    table = pl.DataFrame(
        {
            "w": uniq,
            "h": pl.Series([xxhash.xxh3_64_intdigest(w.encode(), cfg.seed) for w in uniq.to_list()], dtype=pl.UInt64),
        }
    )
    wh = words.join(table, on="w", how="left", maintain_order="left")["h"].to_numpy()
    doc = words["d"].to_numpy().astype(np.int64)
    h, sdoc = _shingle_hashes(wh, doc, n_words, cfg.ngram)
    return h, sdoc, n_words


def _minhash_serial(keys: pl.Series, cfg: DedupConfig) -> tuple[np.ndarray, np.ndarray]:
    n, p = len(keys), cfg.bands * cfg.rows
    h, sdoc, n_words = _shingles_of_keys(keys, cfg)
    if not len(h):
        return np.full((n, p), np.iinfo(np.uint64).max, dtype=np.uint64), n_words
    return _permute_min(h, sdoc, n, cfg), n_words


_POOL: list = []


def _in_two_threads(texts: pl.Series, fn):
    """fn(first half of texts) and fn(second half) in two threads (polars and numpy release the GIL);
    returns the two results in order (one call on the whole Series under 64 texts, or when polars'
    pool has one thread: POLARS_MAX_THREADS=1, as in a Spark executor of one core, whose task must
    not use a second core).

    The two threads are created once per process and reused: fresh threads per part made glibc hand
    out new malloc arenas whose freed memory stayed resident (peak RSS grew with the number of parts;
    benchmarks/prep_memory.py)."""
    n = len(texts)
    if n < 64 or pl.thread_pool_size() < 2:
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
        cols = sig[:, band * cfg.rows : (band + 1) * cfg.rows]
        h = np.zeros(sig.shape[0], dtype=np.uint64)
        for r in range(cfg.rows):
            h = fmix64(h * _M ^ cols[:, r])
        out[:, band] = h
    return out


def band_column(band: int) -> str:
    """The signature-file column of one LSH band: ``band_00``, ``band_01``, ..."""
    return f"band_{band:02d}"


def signature_table(df: pl.DataFrame, cfg: DedupConfig = DedupConfig()) -> pa.Table:
    """LSH data of the documents of ``df`` (columns doc_id, text), in order: doc_id (large_string),
    key_hash (uint64, :func:`key_hashes`) and, when ``cfg.near``, n_words (int64) and one uint64 column per
    band, ``band_00`` .. (:func:`band_hashes`; one column each, so that the global step reads one band at
    a time). 8 bytes per band instead of 8 per permutation: 112 B instead of 896 B per document at 14 x 8."""
    kh, sig, n_words = _signature_columns(df["text"], cfg)
    cols = {"doc_id": pa.array(df["doc_id"].to_list(), pa.large_string()), "key_hash": pa.array(kh, pa.uint64())}
    if cfg.near:
        cols["n_words"] = pa.array(n_words, pa.int64())
        bh = band_hashes(sig, cfg)
        for band in range(cfg.bands):
            cols[band_column(band)] = pa.array(bh[:, band], pa.uint64())
    return pa.table(cols)


def write_signatures(part_files: list[Path], out_file: Path, cfg: DedupConfig = DedupConfig()) -> int:
    """:func:`signature_table` of one partition's documents (its ``part_files`` in order) to the Parquet
    file ``out_file`` (written to a temporary name, then renamed). Returns the number of documents."""
    tables = [signature_table(pl.read_parquet(part, columns=["doc_id", "text"]), cfg) for part in part_files]
    table = (
        pa.concat_tables(tables)
        if tables
        else signature_table(pl.DataFrame(schema={"doc_id": pl.Utf8, "text": pl.Utf8}), cfg)
    )
    tmp = Path(str(out_file) + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(out_file)
    return table.num_rows


# ------------------------------------------------------------------------------------------------
# global
#
# The global step holds no per-document array. It reads the signature files one column at a time
# (the key hash, then each band), cut into hash ranges of at most ``rows_per_pass`` values (the values
# of one range spilled to disk when there are several, as datatrove's MinhashDedup stage 2 works per
# bucket and hash range), finds within each range the rows whose value occurred before, and keeps only
# the union-find of the documents that have a candidate pair, reduced after every pass to one edge
# (member, smallest row of its component) per such document.


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


def same_value_edges(values: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edges (row, first row with the same value) for every row whose value occurred before
    (``rows`` ascending, so the first is the smallest)."""
    if not len(values):
        return rows[:0], rows[:0]
    order = np.argsort(values, kind="stable")
    sv, sr = values[order], rows[order]
    start = np.r_[True, sv[1:] != sv[:-1]]
    first = sr[np.flatnonzero(start)][np.cumsum(start) - 1]
    dup = ~start
    return sr[dup], first[dup]


def _stars(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The components of the edges (u, v) (global rows) as edges (member, root): one per node that is
    not the smallest of its component, root = that smallest row; members ascending. Memory: a few
    int64 per node that has an edge, none for the other documents."""
    if not len(u):
        return u, v
    nodes = np.unique(np.concatenate([u, v]))
    root = _components(len(nodes), np.searchsorted(nodes, u), np.searchsorted(nodes, v))
    member = root != np.arange(len(nodes))
    return nodes[member], nodes[root[member]]


class _Edges:
    """Candidate pairs of the global step, kept reduced to (member, root) stars."""

    def __init__(self) -> None:
        self.u, self.v, self.pending = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], 0

    def add(self, u: np.ndarray, v: np.ndarray) -> None:
        self.u.append(u)
        self.v.append(v)
        self.pending += len(u)
        if self.pending > 2 * len(self.u[0]) + (1 << 16):  # reduce once the new edges outnumber the stars
            self.reduce()

    def reduce(self) -> tuple[np.ndarray, np.ndarray]:
        u, v = _stars(np.concatenate(self.u), np.concatenate(self.v))
        self.u, self.v, self.pending = [u], [v], 0
        return u, v


def _file_rows(signature_files: list[Path]) -> np.ndarray:
    """Global row of the first document of each signature file, and the total at the end (from the footers)."""
    counts = [pq.ParquetFile(f).metadata.num_rows for f in signature_files]
    return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)


def hash_ranges(n: int, rows_per_pass: int) -> int:
    """How many hash ranges (a power of two) keep each range of ``n`` uniformly hashed values at about
    ``rows_per_pass`` values or fewer: 1 up to ``rows_per_pass``, else 2^ceil(log2(n / rows_per_pass))."""
    return 1 << max(0, int(np.ceil(np.log2(n / rows_per_pass)))) if n > rows_per_pass else 1


class _Spill:
    """Rows of uint64 hash values with aligned payload arrays (``dtypes``: the value's, then each
    payload's; default one int64 payload, the global row), per (column, hash range) appended in the
    order added to one binary file per array under ``directory``; at most ``buffer_bytes`` held in
    memory between writes. The range of a value is its top log2(``ranges``) bits."""

    def __init__(
        self, directory: Path, ranges: int, buffer_bytes: int = 1 << 24, dtypes: tuple = (np.uint64, np.int64)
    ) -> None:
        self.dir, self.ranges, self.limit = Path(directory), ranges, buffer_bytes
        self.dtypes = tuple(np.dtype(d) for d in dtypes)
        self.shift = np.uint64(64 - (ranges.bit_length() - 1))
        self.buffers: dict[tuple[str, int], list[tuple[np.ndarray, ...]]] = {}
        self.held = 0

    def add(self, column: str, values: np.ndarray, *payload: np.ndarray) -> None:
        arrays = (values, *payload)
        if len(arrays) != len(self.dtypes):
            raise ValueError(f"{len(arrays)} arrays for a spill of {len(self.dtypes)} (value and payloads)")
        if self.ranges == 1:
            self.buffers.setdefault((column, 0), []).append(arrays)
        else:
            rng = (values >> self.shift).astype(np.int64) if len(values) else np.zeros(0, np.int64)
            order = np.argsort(rng, kind="stable")
            bounds = np.searchsorted(rng[order], np.arange(self.ranges + 1))
            for r in np.flatnonzero(np.diff(bounds)):
                sel = order[bounds[r] : bounds[r + 1]]
                self.buffers.setdefault((column, int(r)), []).append(tuple(a[sel] for a in arrays))
        self.held += sum(d.itemsize for d in self.dtypes) * len(values)
        if self.held > self.limit:
            self.flush()

    def _path(self, column: str, r: int, k: int) -> Path:
        return self.dir / f"{column}.{r}.{k}"

    def flush(self) -> None:
        for (column, r), chunks in self.buffers.items():
            for k, dtype in enumerate(self.dtypes):
                with open(self._path(column, r, k), "ab") as fh:
                    for chunk in chunks:
                        fh.write(np.ascontiguousarray(chunk[k], dtype=dtype).tobytes())
        self.buffers, self.held = {}, 0

    def take(self, column: str, r: int) -> tuple[np.ndarray, ...]:
        """The arrays of one (column, range), in the order added; its files are deleted."""
        self.flush()
        out = []
        for k, dtype in enumerate(self.dtypes):
            f = self._path(column, r, k)
            out.append(np.fromfile(f, dtype=dtype) if f.exists() else np.zeros(0, dtype))
            f.unlink(missing_ok=True)
        return tuple(out)


def _range_edges(spill: _Spill, column: str, r: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`same_value_edges` of one (column, range) of ``spill`` (value, row; rows added ascending),
    freeing each array as soon as it is used (peak about 40 bytes per pair instead of 60)."""
    values, rows = spill.take(column, r)
    order = np.argsort(values, kind="stable")
    values = values[order]
    rows = rows[order]
    del order
    start = np.empty(len(values), dtype=bool)
    start[:1] = True
    np.not_equal(values[1:], values[:-1], out=start[1:])
    del values
    dup = ~start
    group = np.cumsum(start)[dup] - 1  # for each repeated value: its group among the distinct values
    return rows[dup], rows[start][group]


def gather_rows(files: list[Path], offsets: np.ndarray, rows: np.ndarray, columns: list[str]) -> pa.Table:
    """``columns`` of the global ``rows`` (sorted, distinct) of Parquet ``files`` whose first rows are
    ``offsets`` (:func:`_file_rows`), in row order, reading only the files that hold one of them."""
    tables = []
    for i, f in enumerate(files):
        lo, hi = np.searchsorted(rows, offsets[i]), np.searchsorted(rows, offsets[i + 1])
        if lo < hi:
            tables.append(pq.ParquetFile(f).read(columns=columns).take(pa.array(rows[lo:hi] - offsets[i])))
    return pa.concat_tables(tables) if tables else pa.table({c: [] for c in columns})


def _gather(signature_files: list[Path], offsets: np.ndarray, rows: np.ndarray) -> tuple[pl.Series, np.ndarray]:
    """doc_id and key_hash of the global ``rows`` (sorted, distinct), reading one file at a time."""
    if not len(rows):
        return pl.Series([], dtype=pl.Utf8), np.zeros(0, np.uint64)
    t = gather_rows(signature_files, offsets, rows, ["doc_id", "key_hash"])
    return pl.from_arrow(t.column("doc_id")).cast(pl.Utf8), t.column("key_hash").to_numpy()


def by_hash_range(
    chunks: Iterable[tuple[np.ndarray, ...]],
    n: int,
    *,
    dtypes: tuple = (np.uint64, np.int64),
    rows_per_pass: int = 1 << 22,
    spill_dir: Path | None = None,
) -> Iterator[tuple[np.ndarray, ...]]:
    """The rows of ``chunks`` (each a uint64 hash array and its aligned payloads, ``dtypes`` giving
    every array's dtype) regrouped by hash range: yields, for each of :func:`hash_ranges` (``n``,
    ``rows_per_pass``) ranges, its arrays in the order added, so equal hashes meet in one range.

    For checks over a whole corpus without one entry per document in memory: the chunks are spilled to
    ``spill_dir`` (default: the system's temporary directory; deleted at the end), one range is held at
    a time (about ``rows_per_pass`` rows, plus a 16 MiB write buffer). ``n``: the total row count
    (an estimate only sizes the ranges)."""
    ranges = hash_ranges(n, rows_per_pass)
    with tempfile.TemporaryDirectory(prefix="hash-ranges-", dir=spill_dir) as tmp:
        spill = _Spill(Path(tmp), ranges, dtypes=dtypes)
        for chunk in chunks:
            spill.add("h", *chunk)
        for r in range(ranges):
            yield spill.take("h", r)


ASSIGNMENT_SCHEMA = {
    "row": pl.Int64,
    "doc_id": pl.Utf8,
    "cluster_id": pl.Int64,
    "duplicate_of": pl.Utf8,
    "kind": pl.Utf8,
    "key_hash": pl.UInt64,
    "similarity": pl.Float64,
}


def cluster_signatures(
    signature_files: list[Path],
    cfg: DedupConfig = DedupConfig(),
    *,
    rows_per_pass: int = 1 << 22,
    spill_dir: Path | None = None,
) -> pl.DataFrame:
    """Cluster all documents of all signature files (global row = order of files, then rows): the
    connected components of exact-key and band matches, each document's cluster being the smallest
    row of its component.

    Returns one row per *duplicate* (every document of a cluster except its first), ascending by row:
    row (Int64), doc_id, cluster_id (Int64: the kept copy's row), duplicate_of (Utf8: the kept copy's
    doc_id), kind ("exact" when its key hash equals the kept copy's, else "near"), key_hash (UInt64).

    Each signature file is read once; its key and band columns are spilled to ``spill_dir`` (default: the
    system's temporary directory; 16 bytes per document and column, deleted at the end), cut into
    hash ranges of at most ``rows_per_pass`` documents. Memory: one (column, range) at a time, about 60
    bytes per document of it (value, row, sort order, sorted copies), a 16 MiB write buffer, and a few
    int64 per document that has a duplicate candidate; nothing for the others. The result does not
    depend on ``rows_per_pass``.
    """
    offsets = _file_rows(signature_files)
    n = int(offsets[-1])
    ranges = hash_ranges(n, rows_per_pass)
    bands = [band_column(b) for b in range(cfg.bands)] if cfg.near else []
    edges = _Edges()
    with tempfile.TemporaryDirectory(prefix="dedup-spill-", dir=spill_dir) as tmp:
        spill = _Spill(Path(tmp), ranges)
        for f, first in zip(signature_files, offsets[:-1]):  # each file read once; its columns go to the spill
            t = pq.ParquetFile(f).read(columns=["key_hash", *(["n_words", *bands] if bands else [])])
            rows = np.arange(first, first + t.num_rows, dtype=np.int64)
            spill.add("key_hash", t.column("key_hash").to_numpy(), rows)
            if bands:
                live = t.column("n_words").to_numpy() > 0  # documents without words join no band
                for c in bands:
                    spill.add(c, t.column(c).to_numpy()[live], rows[live])
        for c in ["key_hash", *bands]:
            for r in range(ranges):
                edges.add(*_range_edges(spill, c, r))
    member, root = edges.reduce()
    need = np.unique(np.concatenate([member, root]))
    ids, keys = _gather(signature_files, offsets, need)
    mi, ri = np.searchsorted(need, member), np.searchsorted(need, root)
    return pl.DataFrame(
        {
            "row": member,
            "doc_id": ids.gather(mi),
            "cluster_id": root,
            "duplicate_of": ids.gather(ri),
            "kind": np.where(keys[mi] == keys[ri], "exact", "near").tolist(),
            "key_hash": pl.Series(keys[mi], dtype=pl.UInt64),
            "similarity": pl.Series(np.where(keys[mi] == keys[ri], 1.0, np.nan)).fill_nan(None),
        },
        schema=ASSIGNMENT_SCHEMA,
    )


# ------------------------------------------------------------------------------------------------
# verification
#
# Connected components are transitive: A ~ B and B ~ C put A and C in one component however little they
# share (marin#6854). :func:`verify_assignment` removes a candidate only when its own shingle set is
# similar enough to the shingle set of a document that is kept.


def shingle_sets(texts: pl.Series, cfg: DedupConfig = DedupConfig()) -> tuple[np.ndarray, np.ndarray]:
    """The distinct shingle hashes of each of N texts (the shingles of their MinHash signatures):
    ``(offsets, hashes)``, int64 (N+1,) and uint64, document i's set sorted in
    ``hashes[offsets[i]:offsets[i+1]]``."""
    keys = pl.select(dedup_key(pl.lit(texts))).to_series()
    h, sdoc, _ = _shingles_of_keys(keys, cfg)
    order = np.lexsort((h, sdoc))
    h, sdoc = h[order], sdoc[order]
    keep = np.r_[True, (h[1:] != h[:-1]) | (sdoc[1:] != sdoc[:-1])] if len(h) else np.zeros(0, bool)
    h, sdoc = h[keep], sdoc[keep]
    offsets = np.zeros(len(texts) + 1, np.int64)
    offsets[1:] = np.cumsum(np.bincount(sdoc, minlength=len(texts)))
    return offsets, h


def _doc_shingle(doc: np.ndarray, h: np.ndarray) -> np.ndarray:
    """One uint64 per (document, shingle hash): fmix64 of the hash xor the document's fmix64; a false
    match among S shingles has probability about S / 2^64 per lookup."""
    return fmix64(h ^ fmix64(doc.astype(np.uint64) + np.uint64(1)))


def pair_jaccard(offsets: np.ndarray, hashes: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact Jaccard similarity |A n B| / |A u B| of the shingle sets of documents ``a[i]`` and ``b[i]``
    (int64 indices into :func:`shingle_sets`' ``offsets``); float64, 0 where both sets are empty.
    Vectorized: each shingle of ``a[i]`` is looked up among ``b[i]``'s (:func:`_doc_shingle`), O(S log S)
    for the S shingles of the ``a`` side."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    if not len(a):
        return np.zeros(0)
    n_docs = len(offsets) - 1
    index = np.sort(_doc_shingle(np.repeat(np.arange(n_docs), np.diff(offsets)), hashes))
    size_a, size_b = offsets[a + 1] - offsets[a], offsets[b + 1] - offsets[b]
    pair = np.repeat(np.arange(len(a)), size_a)
    starts = np.repeat(offsets[a] - np.r_[0, np.cumsum(size_a)[:-1]], size_a)
    shingle = hashes[np.arange(len(pair)) + starts]
    q = _doc_shingle(b[pair], shingle)
    pos = np.minimum(np.searchsorted(index, q), max(len(index) - 1, 0))
    found = index[pos] == q if len(index) else np.zeros(len(q), bool)
    inter = np.bincount(pair[found], minlength=len(a))
    union = size_a + size_b - inter
    return np.where(union > 0, inter / np.maximum(union, 1), 0.0)


ESTIMATE_MARGIN = 0.15  # see _pair_similarity


def _pair_similarity(
    offsets: np.ndarray,
    hashes: np.ndarray,
    sig: np.ndarray,
    kh: np.ndarray,
    u: np.ndarray,
    v: np.ndarray,
    threshold: float,
    block: int = 1 << 16,
) -> np.ndarray:
    """Similarity of the candidate pairs (u, v): 1 where the keys are equal, else the exact Jaccard
    (:func:`pair_jaccard`) where the MinHash estimate (share of equal signature values in ``sig``) is
    at least ``threshold - ESTIMATE_MARGIN``, and the estimate itself below that (surely under the
    threshold: with 112 permutations the estimate's standard error at J = 0.7 is 0.043, so a pair at
    the threshold falls 0.15 under it with probability ~3e-4). Every removal rests on an exact value."""
    est = np.empty(len(u))
    for b0 in range(0, len(u), block):
        b1 = min(b0 + block, len(u))
        est[b0:b1] = (sig[u[b0:b1]] == sig[v[b0:b1]]).mean(axis=1)
    same = kh[u] == kh[v]
    sim = np.where(same, 1.0, est)
    exact = np.flatnonzero(~same & (est >= threshold - ESTIMATE_MARGIN))
    sim[exact] = pair_jaccard(offsets, hashes, u[exact], v[exact])
    return sim


def bucket_pairs(values: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (u, v), u > v, of the positions of equal ``values`` (uint64): each position paired with every
    earlier position of its value, the first ``cap`` of them at most (a bucket of m equal values gives
    about m * min(m, cap) pairs, not m^2 / 2)."""
    order = np.argsort(values, kind="stable")
    sv = values[order]
    start = np.r_[True, sv[1:] != sv[:-1]] if len(sv) else np.zeros(0, bool)
    first = np.flatnonzero(start)[np.cumsum(start) - 1]  # per sorted position: its bucket's first
    k = np.arange(len(sv)) - first
    c = np.minimum(k, cap)
    u = np.repeat(np.arange(len(sv)), c)
    v = first[u] + np.arange(len(u)) - np.repeat(np.cumsum(c) - c, c)
    return order[u], order[v]


def verify_assignment(
    parts: list[Path], assignment: pl.DataFrame, cfg: DedupConfig, verify: VerifyConfig | None = VerifyConfig()
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Remove a candidate of :func:`cluster_signatures` (``assignment``, over the documents of ``parts`` in
    corpus order) only where it is similar to a document that is kept.

    The candidate documents' texts are read once; their shingle sets (:func:`shingle_sets`) give their
    MinHash band hashes again (the signature files' values) and their exact Jaccard similarities. Candidate
    pairs are the documents sharing a band hash, each paired with the first ``verify.max_bucket_pairs``
    earlier documents of its bucket, and those sharing the dedup key (similarity 1); a pair is verified
    when its exact Jaccard similarity (:func:`pair_jaccard`) reaches ``verify.threshold`` (pairs whose
    MinHash estimate is far under it are not measured: :func:`_pair_similarity`). Then, in corpus
    order, a document is removed when it has a verified pair with an earlier document that is kept (its
    ``duplicate_of``: the first such), and kept otherwise: every removed document is similar to a kept
    copy, and a chain A ~ B ~ C with J(A, C) under the threshold keeps C. Exact rather than
    MinHash-estimated similarity: only candidate documents are read, and an estimate from 112
    permutations has a standard error of ~0.04 at J = 0.7, enough to pass pairs under the threshold.

    Returns (the verified assignment: :data:`ASSIGNMENT_SCHEMA`, ascending by row, ``cluster_id`` and
    ``duplicate_of`` the kept copy's, ``similarity`` the measured Jaccard; the candidates kept because
    verification failed, :data:`UNVERIFIED_SCHEMA` plus ``row``: kept documents with a candidate pair to an
    earlier document, ``candidate_of`` the most similar kept one of those (else the most similar) and
    ``similarity`` to it). ``verify``
    None, or no near candidate: the assignment as it is, nothing kept. Memory, for the candidate
    documents only: their texts, then their shingle sets (8 bytes per shingle, a few times), their
    MinHash signatures (896 bytes each at 14 x 8) and their pairs (at most bands * max_bucket_pairs
    per document, 16 bytes each plus a similarity)."""
    none_kept = pl.DataFrame(schema={"row": pl.Int64, **UNVERIFIED_SCHEMA})
    if verify is None or not assignment.height or not (assignment["kind"] == "near").any():
        return assignment.select(*ASSIGNMENT_SCHEMA), none_kept
    rows = np.unique(np.concatenate([assignment["row"].to_numpy(), assignment["cluster_id"].to_numpy()]))
    t = gather_rows(parts, _file_rows(parts), rows, ["doc_id", "source", "text"])
    texts = pl.from_arrow(t.column("text")).cast(pl.Utf8)
    ids = pl.from_arrow(t.column("doc_id")).cast(pl.Utf8)
    sources = pl.from_arrow(t.column("source")).cast(pl.Utf8)
    kh = key_hashes(texts).to_numpy()
    offsets, hashes = shingle_sets(texts, cfg)
    del texts, t
    sig, u, v = _candidate_pairs(offsets, hashes, kh, cfg, verify.max_bucket_pairs)
    sim = _pair_similarity(offsets, hashes, sig, kh, u, v, verify.threshold)
    kept, dup_of, dsim = _keep_first_copies(len(rows), u, v, sim, verify.threshold)
    is_dup = ~kept
    d, k = np.flatnonzero(is_dup), dup_of[is_dup]
    verified = pl.DataFrame(
        {
            "row": rows[d],
            "doc_id": ids.gather(d),
            "cluster_id": rows[k],
            "duplicate_of": ids.gather(k),
            "kind": np.where(kh[d] == kh[k], "exact", "near").tolist(),
            "key_hash": pl.Series(kh[d], dtype=pl.UInt64),
            "similarity": dsim[d],
        },
        schema=ASSIGNMENT_SCHEMA,
    )
    return verified, _unverified(rows, ids, sources, u, v, sim, kept)


def _candidate_pairs(
    offsets: np.ndarray, hashes: np.ndarray, kh: np.ndarray, cfg: DedupConfig, max_bucket_pairs: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The candidates' MinHash signatures (n x bands*rows uint64, all-max for a document without words)
    and their candidate pairs (u, v): int64 document indices, u later than v, unique, sorted by u then v;
    pairs share a band hash or the dedup key ``kh`` (:func:`bucket_pairs`, at most ``max_bucket_pairs``
    per document and bucket)."""
    n = len(kh)
    sizes = np.diff(offsets)
    live = np.flatnonzero(sizes > 0)  # documents without words join no band (cluster_signatures)
    us, vs = [], []
    sig = np.full((n, cfg.bands * cfg.rows), np.iinfo(np.uint64).max, dtype=np.uint64)
    if len(live):
        sdoc = np.repeat(np.arange(len(live)), sizes[live])
        sig[live] = _permute_min(hashes, sdoc, len(live), cfg)
        bands = band_hashes(sig[live], cfg)
        for band in range(cfg.bands):
            u, v = bucket_pairs(bands[:, band], max_bucket_pairs)
            us.append(live[u])
            vs.append(live[v])
    u, v = bucket_pairs(kh, max_bucket_pairs)
    us.append(u)
    vs.append(v)
    u, v = np.concatenate(us), np.concatenate(vs)
    u, v = np.maximum(u, v), np.minimum(u, v)  # u later in corpus order (rows ascending)
    pair = np.unique(u * n + v)
    return sig, pair // n, pair % n  # by u, then v: each document's earlier candidates in corpus order


def _keep_first_copies(
    n: int, u: np.ndarray, v: np.ndarray, sim: np.ndarray, threshold: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """In corpus order, remove a document with a verified pair (``sim`` >= ``threshold``) to an earlier kept
    one; (kept: bool per document, duplicate_of: index of that kept copy or -1, its similarity or NaN)."""
    ok = sim >= threshold
    kept = np.ones(n, bool)
    dup_of = np.full(n, -1, np.int64)
    dsim = np.full(n, np.nan)
    vu, vv, vsim = u[ok], v[ok], sim[ok]
    bounds = np.flatnonzero(np.r_[True, vu[1:] != vu[:-1], True]) if len(vu) else np.zeros(1, np.int64)
    for a, b in zip(bounds[:-1], bounds[1:]):  # documents with a verified earlier pair, in corpus order
        alive = np.flatnonzero(kept[vv[a:b]])
        if len(alive):
            d, k = vu[a], a + alive[0]
            kept[d], dup_of[d], dsim[d] = False, vv[k], vsim[k]
    return kept, dup_of, dsim


def _unverified(
    rows: np.ndarray,
    ids: pl.Series,
    sources: pl.Series,
    u: np.ndarray,
    v: np.ndarray,
    sim: np.ndarray,
    kept: np.ndarray,
) -> pl.DataFrame:
    """The candidates kept because verification failed (see :func:`verify_assignment`)."""
    # kept documents that had a candidate pair with an earlier document: the most similar kept such
    # candidate (the copy verification failed against), else the most similar one
    order = np.lexsort((v, -sim, ~kept[v], u))
    fu, fv, fs = u[order], v[order], sim[order]
    head = np.r_[True, fu[1:] != fu[:-1]] if len(fu) else np.zeros(0, bool)
    fu, fv, fs = fu[head], fv[head], fs[head]
    failed = kept[fu]
    fu, fv, fs = fu[failed], fv[failed], fs[failed]
    return pl.DataFrame(
        {
            "row": rows[fu],
            "doc_id": ids.gather(fu),
            "source": sources.gather(fu),
            "candidate_of": ids.gather(fv),
            "similarity": fs,
        },
        schema={"row": pl.Int64, **UNVERIFIED_SCHEMA},
    )


def write_kept(part: Path, duplicates: pl.DataFrame, out_file: Path) -> pl.DataFrame:
    """Write the documents of one part file that are not duplicates to ``out_file`` (every column of
    the part: doc_id, source, text, and label, language, ... where the input has them; in input order). ``duplicates``: this part's rows of the
    :func:`cluster_signatures` result with ``row`` counted from the part's first document. Returns the
    part's duplicates frame (:data:`DUP_SCHEMA`). Raises ValueError when a duplicate's doc_id is not
    the part's (the part changed since its signatures were computed)."""
    df = pl.read_parquet(part)
    is_dup = np.zeros(df.height, dtype=bool)
    is_dup[duplicates["row"].to_numpy()] = True
    df.filter(~pl.Series(is_dup)).write_parquet(out_file)
    dups = df.filter(pl.Series(is_dup)).select("doc_id", "source")
    if not dups["doc_id"].equals(duplicates["doc_id"]):
        raise ValueError(f"{part}: its documents differ from those its signatures were computed from")
    return dups.with_columns(
        duplicates["duplicate_of"],
        duplicates["cluster_id"],
        duplicates["kind"],
        duplicates["key_hash"],
        duplicates["similarity"],
    ).select(*DUP_SCHEMA)


def write_deduplicated(
    part_files: list[Path], assignment: pl.DataFrame, first_row: int, out_dir: Path, first_part: int = 0
) -> tuple[int, pl.DataFrame]:
    """Write the kept documents of ``part_files`` (whose first document has global row ``first_row``)
    to ``out_dir/part-NNNNN.parquet`` numbered from ``first_part`` (:func:`write_kept`), given the
    :func:`cluster_signatures` result. Returns (rows read, duplicates frame)."""
    dups, row = [], first_row
    rows = assignment["row"].to_numpy()
    for i, part in enumerate(part_files):
        n = pq.ParquetFile(part).metadata.num_rows
        lo, hi = np.searchsorted(rows, row), np.searchsorted(rows, row + n)
        mine = assignment.slice(lo, hi - lo).with_columns(pl.col("row") - row)
        dups.append(write_kept(part, mine, out_dir / f"part-{first_part + i:05d}.parquet"))
        row += n
    return row - first_row, pl.concat(dups) if dups else pl.DataFrame(schema=DUP_SCHEMA)


UNVERIFIED = "unverified.parquet"  # beside duplicates.parquet: the candidates kept because verification failed


def dedup_stats(dups: pl.DataFrame, n: int, unverified: int = 0) -> dict:
    """The counts of :func:`deduplicate` from the duplicates frame of ``n`` input documents and the
    number of candidates kept because verification failed."""
    return {
        "near_unverified_kept": unverified,
        "input": n,
        "kept": n - dups.height,
        "duplicate": dups.height,
        "clusters": dups["duplicate_of"].n_unique() if dups.height else 0,
        "duplicate_exact": int((dups["kind"] == "exact").sum()),
        "duplicate_near": int((dups["kind"] == "near").sum()),
    }


SIGNATURES = "signatures"  # a partition's per-part signature files (written by cleaned_text), or the global step's
SIGNATURE_SETTINGS = "settings.json"  # beside them: the DedupConfig they were made with


def write_partition_signatures(parts_dir: Path, cfg: DedupConfig = DedupConfig()) -> int:
    """The signatures of every ``part-*.parquet`` of ``parts_dir`` (a cleaned_text partition), each to
    ``parts_dir/signatures/<the part's name>`` (:func:`write_signatures`), and ``signatures/settings.json``
    (``cfg``), so that the global step only clusters (:func:`deduplicate`). Returns the documents."""
    d = Path(parts_dir) / SIGNATURES
    d.mkdir(exist_ok=True)
    n = sum(write_signatures([part], d / part.name, cfg) for part in part_files(parts_dir))
    write_signature_settings(parts_dir, cfg)
    return n


def write_signature_settings(parts_dir: Path, cfg: DedupConfig) -> None:
    """``parts_dir/signatures/settings.json``: the settings its signature files were made with."""
    (Path(parts_dir) / SIGNATURES).mkdir(exist_ok=True)
    (Path(parts_dir) / SIGNATURES / SIGNATURE_SETTINGS).write_text(json.dumps(cfg.to_dict(), sort_keys=True))


SIGNATURE_FIELDS = ("ngram", "bands", "rows", "seed")  # what a signature depends on (chunk_shingles: memory only)


def signatures_serve(made: dict, cfg: DedupConfig) -> bool:
    """Whether signatures made with the settings ``made`` (a DedupConfig as a dict) serve a clustering
    with ``cfg``: the same shingles, permutations and bands, and band hashes when ``cfg.near``."""
    return all(made.get(k) == getattr(cfg, k) for k in SIGNATURE_FIELDS) and (made.get("near", True) or not cfg.near)


def partition_signatures(in_dir: Path | list[Path], cfg: DedupConfig) -> list[Path] | None:
    """The signature files of every part of ``in_dir`` (one directory or one per partition), in part order,
    when each part has one written with settings that serve ``cfg`` (:func:`write_partition_signatures`,
    :func:`signatures_serve`); else None."""
    files = []
    for d in as_dirs(in_dir):
        settings = d / SIGNATURES / SIGNATURE_SETTINGS
        if not settings.exists() or not signatures_serve(json.loads(settings.read_text()), cfg):
            return None
        for part in part_files(d):
            f = d / SIGNATURES / part.name
            if not f.exists():
                return None
            files.append(f)
    return files


def deduplicate(
    in_dir: Path | list[Path],
    out_dir: Path,
    cfg: DedupConfig = DedupConfig(),
    verify: VerifyConfig | None = VerifyConfig(),
) -> dict:
    """Exact and (with ``cfg.near``) near-duplicate removal over the ``part-*.parquet`` files of a
    cleaned_text directory, or of several (one per partition, in partition order: corpus order is
    partition, then part file, then row), signatures per part file, clustering over all of them.

    The signatures are the partitions' own when each carries them, made with ``cfg``
    (:func:`partition_signatures`: cleaned_text computes them per partition, so this global step only
    clusters); else they are computed here into ``out_dir/signatures/part-NNNNN.parquet``. Writes the
    kept documents to ``out_dir/part-NNNNN.parquet`` (same columns, input order) and every removed copy
    to ``out_dir/duplicates.parquet`` (doc_id, source, duplicate_of, cluster_id, kind, key_hash, similarity).
    Near-duplicate candidates are verified (:func:`verify_assignment` with ``verify``; None: the connected
    components unverified); the candidates kept because verification failed go to ``out_dir/unverified.parquet``
    (doc_id, source, candidate_of, similarity).
    Returns counts ``input``, ``kept``, ``duplicate``, ``clusters`` (kept copies with at least one
    duplicate), ``duplicate_exact``, ``duplicate_near``, ``near_unverified_kept``.
    """
    parts = part_files(in_dir)
    sig_files = partition_signatures(in_dir, cfg)
    if sig_files is None:
        sig_dir = Path(out_dir) / SIGNATURES
        sig_dir.mkdir(exist_ok=True)
        sig_files = []
        for i, part in enumerate(parts):
            f = sig_dir / f"part-{i:05d}.parquet"
            write_signatures([part], f, cfg)
            sig_files.append(f)
    assignment = cluster_signatures(sig_files, cfg, spill_dir=Path(out_dir))
    assignment, unverified = verify_assignment(parts, assignment, cfg, verify if cfg.near else None)
    n, dups = write_deduplicated(parts, assignment, 0, Path(out_dir))
    dups.write_parquet(Path(out_dir) / "duplicates.parquet")
    unverified.drop("row").write_parquet(Path(out_dir) / UNVERIFIED)
    return dedup_stats(dups, n, unverified.height)


def exact_dedup(in_dir: Path | list[Path], out_dir: Path) -> dict:
    """Exact duplicates only (:func:`deduplicate` with ``near=False``); counts ``input``, ``kept``, ``duplicate``, ``clusters``."""
    stats = deduplicate(in_dir, out_dir, DedupConfig(near=False))
    return {k: stats[k] for k in ("input", "kept", "duplicate", "clusters")}


def count_exact_duplicates(
    directory: Path,
    *,
    examples: int = 5,
    batch: int = 10_000,
    rows_per_pass: int = 1 << 22,
    spill_dir: Path | None = None,
) -> tuple[int, int, list[str]]:
    """Recount the ``part-*.parquet`` documents under ``directory``: (documents, documents whose dedup key
    hash (:func:`key_hashes`) occurred at an earlier document, the doc ids of the first ``examples`` of
    those in corpus order). Memory: one hash range of (key hash, row) pairs at a time
    (:func:`by_hash_range`, 16 bytes per document of the range), not a set over the corpus."""
    parts = part_files(directory)
    offsets = _file_rows(parts)

    def chunks():
        for part, first in zip(parts, offsets[:-1]):
            row = int(first)
            for df in pl.read_parquet(part, columns=["text"]).iter_slices(batch):
                yield key_hashes(df["text"]).to_numpy(), np.arange(row, row + df.height, dtype=np.int64)
                row += df.height

    dups, first_rows = 0, np.zeros(0, np.int64)
    for values, rows in by_hash_range(chunks(), int(offsets[-1]), rows_per_pass=rows_per_pass, spill_dir=spill_dir):
        order = np.lexsort((rows, values))
        v, r = values[order], rows[order]
        repeat = r[1:][v[1:] == v[:-1]]  # every row after the first of its value
        dups += len(repeat)
        first_rows = np.sort(np.concatenate([first_rows, repeat]))[:examples]
    ids = gather_rows(parts, offsets, first_rows, ["doc_id"]).column("doc_id").to_pylist() if len(first_rows) else []
    return int(offsets[-1]), dups, ids
