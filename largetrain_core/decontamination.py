"""Decontamination: training documents that share a word 13-gram with an evaluation item (Brown et al.
2020, GPT-3, appendix C; datatrove 0.10.1 NGramsDecontFilter, whose default n is 12).

Evaluation items are the prompt and answer of each record of a benchmark file (JSONL), joined by a
space: the n-grams of the prompt, of the answer and those across both (datatrove's
``find_query_ngrams`` and ``find_overlap_ngrams``). Text is normalized as the dedup key
(largetrain_core.dedup): NFKC, lower case, words = runs of ``\\w`` (punctuation and spacing ignored).
An item of fewer than ``n`` words cannot be checked (any of its words would be a match of nothing
it holds): it is listed apart (``too_short``), never silently passed.

The index is hashed: each n-gram a 64-bit hash of its words' xxh3 hashes (folded as the MinHash
shingles are), one sorted uint64 array with the item and word position of each; a match is then
checked word by word, so a hash collision never removes a document. Memory: 24 bytes per n-gram of
the evaluation sets, and one part file of training text at a time; the per-part scan is what a Spark
task runs (largetrain_core.executors), with the index broadcast.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import xxhash

from largetrain_core.dedup import fmix64
from largetrain_core.storage import part_files

N = 13
_M = np.uint64(0x100000001B3)
ITEM_SCHEMA = {"eval_set": pl.Utf8, "item_id": pl.Utf8, "prompt": pl.Utf8, "answer": pl.Utf8, "words": pl.List(pl.Utf8)}
MATCH_SCHEMA = {
    "doc_id": pl.Utf8,
    "source": pl.Utf8,
    "reason": pl.Utf8,
    "eval_set": pl.Utf8,
    "item_id": pl.Utf8,
    "ngram": pl.Utf8,
}


def normalized_words(texts: pl.Series) -> pl.Series:
    """The normalized words of each text (List[Utf8]): NFKC, lower case, runs of ``\\w``."""
    return pl.select(
        pl.lit(texts.cast(pl.Utf8)).str.normalize("NFKC").str.to_lowercase().str.extract_all(r"\w+")
    ).to_series()


def _word_hashes(words: pl.Series) -> np.ndarray:
    """xxh3-64 of each word (seed 0), stable across processes and library versions."""
    uniq = words.unique()
    table = pl.DataFrame(
        {"w": uniq, "h": pl.Series([xxhash.xxh3_64_intdigest(w.encode()) for w in uniq.to_list()], dtype=pl.UInt64)}
    )
    return pl.DataFrame({"w": words}).join(table, on="w", how="left", maintain_order="left")["h"].to_numpy()


def ngram_hashes(words: pl.Series, n: int = N) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The word n-grams of a Series of word lists (:func:`normalized_words`): (hashes uint64, row of
    each n-gram's list int64, its first word's position in that list int64), in order."""
    flat = pl.DataFrame({"w": words}).with_row_index("r").explode("w").drop_nulls("w")
    W = flat.height
    if W < n:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    wh = _word_hashes(flat["w"])
    row = flat["r"].to_numpy().astype(np.int64)
    h = wh[: W - n + 1].copy()
    for i in range(1, n):
        h = h * _M ^ wh[i : W - n + 1 + i]
    inside = row[: W - n + 1] == row[n - 1 :]
    starts = np.arange(W, dtype=np.int64) - np.searchsorted(row, row)  # position within the row's list
    return fmix64(h[inside]), row[: W - n + 1][inside], starts[: W - n + 1][inside]


def read_benchmark(path: str | Path, name: str | None = None) -> pl.DataFrame:
    """The items of a benchmark file: JSONL records with ``prompt`` and ``answer`` (strings; ``answer``
    may be empty) and an optional ``id`` (default: the line number). Returns :data:`ITEM_SCHEMA`
    rows (eval_set = ``name`` or the file's stem). Raises ValueError naming the file and line of a
    record that is not a JSON object or lacks a prompt."""
    path = Path(path)
    name = name or path.stem
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON: {e}") from e
            if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str) or not rec["prompt"].strip():
                raise ValueError(f'{path}:{n}: an evaluation item needs a non-empty string "prompt" (and an "answer")')
            answer = rec.get("answer", "")
            if not isinstance(answer, str):
                answer = json.dumps(answer)
            rows.append({"eval_set": name, "item_id": str(rec.get("id", n)), "prompt": rec["prompt"], "answer": answer})
    if not rows:
        raise ValueError(f"{path}: no evaluation items")
    df = pl.DataFrame(rows, schema={k: v for k, v in ITEM_SCHEMA.items() if k != "words"})
    return df.with_columns(words=normalized_words(df["prompt"] + " " + df["answer"]))


@dataclass
class Index:
    """The n-grams of the evaluation items: ``hashes`` (sorted uint64), for each the item's row in
    ``items`` and the n-gram's first word (int64 arrays), ``items`` (:data:`ITEM_SCHEMA`), ``n``;
    ``too_short``: the items of fewer than ``n`` words (eval_set, item_id, words: count)."""

    hashes: np.ndarray
    item_rows: np.ndarray
    starts: np.ndarray
    items: pl.DataFrame
    too_short: pl.DataFrame
    n: int = N

    def save(self, out_dir: Path) -> None:
        out_dir = Path(out_dir)
        self.items.write_parquet(out_dir / "items.parquet")
        self.too_short.write_parquet(out_dir / "too_short.parquet")
        pl.DataFrame({"hash": self.hashes, "item_row": self.item_rows, "start": self.starts}).write_parquet(
            out_dir / "ngrams.parquet"
        )
        (out_dir / "index.json").write_text(json.dumps({"n": self.n}))


def build_index(items: pl.DataFrame, n: int = N) -> Index:
    """The :class:`Index` of ``items`` (:data:`ITEM_SCHEMA` rows, e.g. :func:`read_benchmark`'s)."""
    lengths = items["words"].list.len()
    short = items.filter(lengths < n).select("eval_set", "item_id", words=pl.col("words").list.len())
    h, rows, starts = ngram_hashes(items["words"], n)
    order = np.argsort(h, kind="stable")
    return Index(h[order], rows[order], starts[order], items, short, n)


def load_index(directory: Path) -> Index:
    """The Index saved in ``directory`` (:meth:`Index.save`)."""
    d = Path(directory)
    g = pl.read_parquet(d / "ngrams.parquet")
    return Index(
        g["hash"].to_numpy(),
        g["item_row"].to_numpy(),
        g["start"].to_numpy(),
        pl.read_parquet(d / "items.parquet"),
        pl.read_parquet(d / "too_short.parquet"),
        json.loads((d / "index.json").read_text())["n"],
    )


def scan(df: pl.DataFrame, index: Index) -> pl.DataFrame:
    """The documents of ``df`` (doc_id, source, text) sharing an n-gram with an item of ``index``:
    one row per document (its first such n-gram in text order), :data:`MATCH_SCHEMA` (reason
    ``contaminated``, the item's eval_set and item_id, the n-gram's normalized words)."""
    if not len(index.hashes) or not df.height:
        return pl.DataFrame(schema=MATCH_SCHEMA)
    words = normalized_words(df["text"])
    h, rows, starts = ngram_hashes(words, index.n)
    pos = np.minimum(np.searchsorted(index.hashes, h), len(index.hashes) - 1)
    cand = np.flatnonzero(index.hashes[pos] == h)
    out, seen = [], set()
    item_words = index.items["words"]
    for c in cand:  # text order: the first verified match of each document
        r = int(rows[c])
        if r in seen:
            continue
        gram = words[r][int(starts[c]) : int(starts[c]) + index.n].to_list()
        k = int(pos[c])
        while k < len(index.hashes) and index.hashes[k] == h[c]:  # every item with this hash
            item = int(index.item_rows[k])
            s = int(index.starts[k])
            if item_words[item][s : s + index.n].to_list() == gram:
                out.append(
                    {
                        "doc_id": df["doc_id"][r],
                        "source": df["source"][r] if "source" in df.columns else None,
                        "reason": "contaminated",
                        "eval_set": index.items["eval_set"][item],
                        "item_id": index.items["item_id"][item],
                        "ngram": " ".join(gram),
                    }
                )
                seen.add(r)
                break
            k += 1
    return pl.DataFrame(out, schema=MATCH_SCHEMA)


def find_contamination(in_dirs: Path | list[Path], index: Index) -> pl.DataFrame:
    """The contaminated documents of the part files of ``in_dirs``: :func:`scan` of one part at a time
    against ``index`` (in memory: 24 bytes per n-gram of the evaluation sets), in corpus order,
    :data:`MATCH_SCHEMA`. The local executor's path of the n-gram join (largetrain_core.executors)."""
    found = [scan(pl.read_parquet(p, columns=["doc_id", "source", "text"]), index) for p in part_files(in_dirs)]
    return pl.concat(found) if found else pl.DataFrame(schema=MATCH_SCHEMA)


def contamination_counts(table: pl.DataFrame, index: Index) -> dict:
    """The counts of a :func:`find_contamination` table: ``contaminated`` (documents),
    ``contaminated_by_set`` {eval_set: documents}, ``too_short_items`` (of ``index``)."""
    return {
        "contaminated": table.height,
        "contaminated_by_set": dict(table.group_by("eval_set").len().sort("eval_set").iter_rows()),
        "too_short_items": index.too_short.height,
    }


def decontaminate_parts(in_dirs: list[Path], out_dir: Path, index: Index, remove: bool = True) -> dict:
    """:func:`scan` every part file of ``in_dirs``; write ``out_dir/part-NNNNN.parquet`` (all input
    columns; without the contaminated documents when ``remove``) and ``out_dir/contaminated.parquet``
    (:data:`MATCH_SCHEMA`, one row per contaminated document). Returns ``input``, ``kept``,
    ``filtered`` and ``filtered_by_reason`` (the contaminated, when removed), ``contaminated``,
    ``contaminated_by_set`` and ``too_short_items``."""
    out_dir = Path(out_dir)
    found, n = [], 0
    for i, p in enumerate(part_files(in_dirs)):
        df = pl.read_parquet(p)
        m = scan(df, index)
        found.append(m)
        n += df.height
        (df.filter(~pl.col("doc_id").is_in(m["doc_id"].implode())) if remove else df).write_parquet(
            out_dir / f"part-{i:05d}.parquet"
        )
    table = pl.concat(found) if found else pl.DataFrame(schema=MATCH_SCHEMA)
    table.write_parquet(out_dir / "contaminated.parquet")
    by_set = dict(table.group_by("eval_set").len().sort("eval_set").iter_rows())
    removed = table.height if remove else 0
    return {
        "input": n,
        "kept": n - removed,
        "filtered": removed,
        "filtered_by_reason": {"contaminated": removed} if removed else {},
        "contaminated": table.height,
        "contaminated_by_set": by_set,
        "too_short_items": index.too_short.height,
    }


def overlaps(corpora: dict[str, list[Path]], index: Index) -> pl.DataFrame:
    """Every document of every corpus ({name: its part-file directories}) that shares an n-gram with an
    item of ``index``: columns corpus, doc_id, eval_set, item_id, ngram (the lineage check's report)."""
    frames = []
    for name, dirs in corpora.items():
        for p in part_files(dirs):
            m = scan(pl.read_parquet(p, columns=["doc_id", "source", "text"]), index)
            frames.append(
                m.select(corpus=pl.lit(name), doc_id="doc_id", eval_set="eval_set", item_id="item_id", ngram="ngram")
            )
    return (
        pl.concat(frames)
        if frames
        else pl.DataFrame(
            schema={"corpus": pl.Utf8, "doc_id": pl.Utf8, "eval_set": pl.Utf8, "item_id": pl.Utf8, "ngram": pl.Utf8}
        )
    )


def trained_corpora(model_dirs: list[Path], root: Path) -> dict[str, list[Path]]:
    """Every corpus upstream of the models in ``model_dirs`` (a base model, a LoRA adapter), from their
    ``lineage.json`` (largetrain_core.model_card; an adapter's holds its base's): ``{"<role> <asset>
    <data version>": [<root>/<role>/<asset>/<data version>]}``, the text the shards each model was
    trained on were made from: ``filtered_text`` where the lineage names one (what was left after
    decontamination and the relevance filter), else ``deduplicated_text``. A model without a lineage
    (imported) adds none; a corpus directory that no longer exists is a ValueError naming it (the
    check could not see what the model was trained on)."""
    from largetrain_core.model_card import read_lineage

    found: dict[str, list[Path]] = {}
    todo = [read_lineage(d) for d in model_dirs]
    while todo:
        lineage = todo.pop()
        if not lineage:
            continue
        for c in lineage.get("corpora") or []:
            versions = c.get("data_versions") or {}
            asset = next((a for a in ("filtered_text", "deduplicated_text") if versions.get(a)), None)
            if not asset or not c.get("role"):
                continue
            dv = versions[asset]
            d = Path(root) / c["role"] / asset / dv
            if not d.is_dir():
                raise ValueError(
                    f"{c['role']}/{asset} {dv}, which a model was trained on, is not at {d} any more: "
                    "cannot check it for evaluation items"
                )
            found[f"{c['role']} {asset} {dv}"] = [d]
        if lineage.get("base"):
            todo.append(lineage["base"])
    return found


def describe_overlaps(found: pl.DataFrame, limit: int = 10) -> str:
    """The overlaps of :func:`overlaps` in words: how many, then corpus, document, item and n-gram of the first ``limit``."""
    shown = "; ".join(
        f"{c}: document {d!r} holds item {s}/{i} ({g!r})" for c, d, s, i, g in found.head(limit).iter_rows()
    )
    more = f"; and {found.height - limit} more" if found.height > limit else ""
    return f"{found.height} training documents share a {N}-word n-gram with an evaluation item: {shown}{more}"
