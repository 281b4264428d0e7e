"""Decontamination: training documents that share a word 13-gram with an evaluation item (Brown et al.
2020, GPT-3, appendix C; datatrove 0.10.1 NGramsDecontFilter, whose default n is 12), and documents
that hold a short item's prompt with its answer close behind.

Evaluation items are the prompt and answer of each record of a benchmark file (JSONL), joined by a
space: the n-grams of the prompt, of the answer and those across both (datatrove's
``find_query_ngrams`` and ``find_overlap_ngrams``).

Words (:func:`normalized_words`, the same for items and documents): format characters (Unicode
``Cf``: soft hyphens, zero-width spaces, word joiners, ZWJ/ZWNJ, BOMs) removed, as the dedup key
ignores them (largetrain_core.dedup); a hyphen at a line end between two letters is a hyphenated
line break (``emp-\\nties`` is "empties"); then NFKC, lower case, words = runs of ``\\w``
(punctuation, spacing and labels such as ``Q:`` are words or nothing, never glue). A compound split
at a line end (``self-\\ncontained``) becomes one word and no longer matches the item's two.

Short prompts. The n-grams across prompt and answer match only where the two are verbatim
neighbours, which web pages seldom keep: ``Q:``/``A:`` and ``Question ... Answer:`` labels,
multiple-choice options or "The answer is" come between. So an item whose prompt has fewer than
``n`` words is matched by a second, documented method: the prompt's whole word sequence (at least
:data:`MIN_PROMPT_WORDS` words), followed by the answer's whole word sequence starting within
:data:`ANSWER_WINDOW` words after the prompt's end (room for four or five options with their labels;
measured in benchmarks/decontamination_forms.py: recall 1.0 on the planted forms, no clean document
flagged). An item whose prompt has fewer than ``n`` words and that this method cannot check either
(prompt under :data:`MIN_PROMPT_WORDS` words, or no answer words) is listed apart (``too_short``)
and warned about, never silently passed; its n-grams across prompt and answer still match where it
has any.

The index is hashed: each n-gram a 64-bit hash of its words' xxh3 hashes (folded as the MinHash
shingles are), one sorted uint64 array with the item and word position of each; a short prompt's
first :data:`MIN_PROMPT_WORDS` words are hashed the same way. A match is then checked word by word,
so a hash collision never removes a document. Memory: 24 bytes per n-gram of the evaluation sets,
and one part file of training text at a time; the per-part scan is what a Spark task runs
(largetrain_core.executors), with the index broadcast.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import xxhash

from largetrain_core.dedup import fmix64
from largetrain_core.storage import part_files

N = 13
MIN_PROMPT_WORDS = 6  # a short prompt's fewest words for the prompt + answer method (5-word prompts such as
# "what is two plus two" are matched by chance in clean text; benchmarks/decontamination_forms.py)
ANSWER_WINDOW = 50  # words between a short prompt's end and its answer's start, at most
_M = np.uint64(0x100000001B3)
ITEM_SCHEMA = {
    "eval_set": pl.Utf8,
    "item_id": pl.Utf8,
    "prompt": pl.Utf8,
    "answer": pl.Utf8,
    "words": pl.List(pl.Utf8),
    "prompt_words": pl.Int64,
}
MATCH_SCHEMA = {
    "doc_id": pl.Utf8,
    "source": pl.Utf8,
    "reason": pl.Utf8,
    "eval_set": pl.Utf8,
    "item_id": pl.Utf8,
    "ngram": pl.Utf8,
}


def normalized_words(texts: pl.Series) -> pl.Series:
    """The normalized words of each text (List[Utf8]): format characters removed, hyphenated line breaks
    joined, NFKC, lower case, runs of ``\\w`` (the module's docstring)."""
    return pl.select(
        pl.lit(texts.cast(pl.Utf8))
        .str.replace_all(r"\p{Cf}", "")
        .str.replace_all(r"(\pL)-[ \t]*\r?\n[ \t]*(\pL)", "$1$2")
        .str.normalize("NFKC")
        .str.to_lowercase()
        .str.extract_all(r"\w+")
    ).to_series()


def _word_hashes(words: pl.Series) -> np.ndarray:
    """xxh3-64 of each word (seed 0), stable across processes and library versions."""
    uniq = words.unique()
    table = pl.DataFrame(
        {"w": uniq, "h": pl.Series([xxhash.xxh3_64_intdigest(w.encode()) for w in uniq.to_list()], dtype=pl.UInt64)}
    )
    return pl.DataFrame({"w": words}).join(table, on="w", how="left", maintain_order="left")["h"].to_numpy()


def ngram_hashes(words: pl.Series, n: int | tuple[int, ...] = N):
    """The word n-grams of a Series of word lists (:func:`normalized_words`): (hashes uint64, row of
    each n-gram's list int64, its first word's position in that list int64), in order. With a tuple
    of sizes, one such triple per size (the words are hashed once)."""
    sizes = n if isinstance(n, tuple) else (n,)
    flat = pl.DataFrame({"w": words}).with_row_index("r").explode("w").drop_nulls("w")
    W = flat.height
    wh = _word_hashes(flat["w"]) if W else np.zeros(0, np.uint64)
    row = flat["r"].to_numpy().astype(np.int64)
    starts = np.arange(W, dtype=np.int64) - np.searchsorted(row, row)  # position within the row's list
    out = []
    for k in sizes:
        if k <= 0 or W < k:  # 0: not asked for
            out.append((np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.int64)))
            continue
        h = wh[: W - k + 1].copy()
        for i in range(1, k):
            h = h * _M ^ wh[i : W - k + 1 + i]
        inside = row[: W - k + 1] == row[k - 1 :]
        out.append((fmix64(h[inside]), row[: W - k + 1][inside], starts[: W - k + 1][inside]))
    return tuple(out) if isinstance(n, tuple) else out[0]


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
    df = pl.DataFrame(rows, schema={k: v for k, v in ITEM_SCHEMA.items() if k not in ("words", "prompt_words")})
    return df.with_columns(
        words=normalized_words(df["prompt"] + " " + df["answer"]),
        prompt_words=normalized_words(df["prompt"]).list.len().cast(pl.Int64),
    )


@dataclass
class Index:
    """The n-grams of the evaluation items: ``hashes`` (sorted uint64), for each the item's row in
    ``items`` and the n-gram's first word (int64 arrays), ``items`` (:data:`ITEM_SCHEMA`), ``n``;
    ``too_short``: the items that neither method can check (eval_set, item_id, words: count);
    ``short_hashes`` (sorted uint64) and ``short_rows`` (int64): the hash of the first
    :data:`MIN_PROMPT_WORDS` words of each prompt shorter than ``n`` words that has an answer, and its
    item's row (:func:`short_anchors`)."""

    hashes: np.ndarray
    item_rows: np.ndarray
    starts: np.ndarray
    items: pl.DataFrame
    too_short: pl.DataFrame
    n: int = N
    short_hashes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    short_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def save(self, out_dir: Path) -> None:
        out_dir = Path(out_dir)
        self.items.write_parquet(out_dir / "items.parquet")
        self.too_short.write_parquet(out_dir / "too_short.parquet")
        pl.DataFrame({"hash": self.hashes, "item_row": self.item_rows, "start": self.starts}).write_parquet(
            out_dir / "ngrams.parquet"
        )
        (out_dir / "index.json").write_text(
            json.dumps({"n": self.n, "min_prompt_words": MIN_PROMPT_WORDS, "answer_window": ANSWER_WINDOW})
        )


def _short(items: pl.DataFrame, n: int) -> pl.Series:
    """Boolean Series: the items whose prompt is shorter than ``n`` words but checkable by prompt + answer."""
    p = items["prompt_words"]
    return (p < n) & (p >= MIN_PROMPT_WORDS) & (items["words"].list.len() > p)


def short_anchors(items: pl.DataFrame, n: int = N) -> tuple[np.ndarray, np.ndarray]:
    """(sorted uint64 hashes of the first :data:`MIN_PROMPT_WORDS` words of each short prompt that has an
    answer, int64 row of its item in ``items``)."""
    rows = np.flatnonzero(_short(items, n).to_numpy())
    if not len(rows):
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    heads = items["words"].gather(rows).list.head(MIN_PROMPT_WORDS)
    h, r, _ = ngram_hashes(heads, MIN_PROMPT_WORDS)
    order = np.argsort(h, kind="stable")
    return h[order], rows[r[order]].astype(np.int64)


def build_index(items: pl.DataFrame, n: int = N) -> Index:
    """The :class:`Index` of ``items`` (:data:`ITEM_SCHEMA` rows, e.g. :func:`read_benchmark`'s)."""
    prompt = items["prompt_words"]
    short = items.filter((prompt < n) & ~_short(items, n)).select(
        "eval_set", "item_id", words=pl.col("words").list.len()
    )
    h, rows, starts = ngram_hashes(items["words"], n)
    order = np.argsort(h, kind="stable")
    return Index(h[order], rows[order], starts[order], items, short, n, *short_anchors(items, n))


def load_index(directory: Path) -> Index:
    """The Index saved in ``directory`` (:meth:`Index.save`). Raises ValueError for an index written
    with other short-prompt parameters (rebuild it: evaluation_sets makes a new version)."""
    d = Path(directory)
    g = pl.read_parquet(d / "ngrams.parquet")
    meta = json.loads((d / "index.json").read_text())
    if (meta.get("min_prompt_words"), meta.get("answer_window")) != (MIN_PROMPT_WORDS, ANSWER_WINDOW):
        raise ValueError(f"{d}: an evaluation index of an older code version; materialize evaluation_sets again")
    items = pl.read_parquet(d / "items.parquet")
    return Index(
        g["hash"].to_numpy(),
        g["item_row"].to_numpy(),
        g["start"].to_numpy(),
        items,
        pl.read_parquet(d / "too_short.parquet"),
        meta["n"],
        *short_anchors(items, meta["n"]),
    )


def _follows(words: list[str], start: int, answer: list[str]) -> bool:
    """Whether ``answer`` occurs in ``words`` starting within :data:`ANSWER_WINDOW` words of ``start``."""
    k = len(answer)
    stop = min(len(words) - k, start + ANSWER_WINDOW)
    first = answer[0]
    for i in range(start, stop + 1):
        if words[i] == first and words[i : i + k] == answer:
            return True
    return False


def _short_matches(words: pl.Series, grams: tuple, index: Index, skip: set[int]) -> dict[int, tuple[int, str]]:
    """{document row: (item row, "prompt words ... answer words")} of the documents not in ``skip``
    holding a short item's prompt with its answer within :data:`ANSWER_WINDOW` words after it
    (``grams``: :func:`ngram_hashes` of ``words`` for :data:`MIN_PROMPT_WORDS`)."""
    found: dict[int, tuple[int, str]] = {}
    if not len(index.short_hashes):
        return found
    h, rows, starts = grams
    pos = np.minimum(np.searchsorted(index.short_hashes, h), len(index.short_hashes) - 1)
    cand = np.flatnonzero(index.short_hashes[pos] == h)
    item_words = index.items["words"]
    plen = index.items["prompt_words"]
    cache: dict[int, list[str]] = {}
    for c in cand:
        r = int(rows[c])
        if r in skip or r in found:
            continue
        doc = cache.setdefault(r, words[r].to_list())
        s = int(starts[c])
        k = int(pos[c])
        while k < len(index.short_hashes) and index.short_hashes[k] == h[c]:
            item = int(index.short_rows[k])
            iw = item_words[item].to_list()
            p = int(plen[item])
            if doc[s : s + p] == iw[:p] and _follows(doc, s + p, iw[p:]):
                found[r] = (item, " ".join(iw[:p]) + " ... " + " ".join(iw[p:]))
                break
            k += 1
    return found


def scan(df: pl.DataFrame, index: Index) -> pl.DataFrame:
    """The documents of ``df`` (doc_id, source, text) holding an item of ``index``: one row per document,
    in document order, :data:`MATCH_SCHEMA` (reason ``contaminated``, the item's eval_set and item_id,
    and in ``ngram`` the normalized words that matched: the document's first shared n-gram in text
    order, else a short item's "prompt ... answer")."""
    if not (len(index.hashes) or len(index.short_hashes)) or not df.height:
        return pl.DataFrame(schema=MATCH_SCHEMA)
    words = normalized_words(df["text"])
    found: dict[int, tuple[int, str]] = {}
    (h, rows, starts), short = ngram_hashes(words, (index.n, MIN_PROMPT_WORDS if len(index.short_hashes) else 0))
    if len(index.hashes):
        pos = np.minimum(np.searchsorted(index.hashes, h), len(index.hashes) - 1)
        cand = np.flatnonzero(index.hashes[pos] == h)
        item_words = index.items["words"]
        for c in cand:  # text order: the first verified match of each document
            r = int(rows[c])
            if r in found:
                continue
            gram = words[r][int(starts[c]) : int(starts[c]) + index.n].to_list()
            k = int(pos[c])
            while k < len(index.hashes) and index.hashes[k] == h[c]:  # every item with this hash
                item = int(index.item_rows[k])
                s = int(index.starts[k])
                if item_words[item][s : s + index.n].to_list() == gram:
                    found[r] = (item, " ".join(gram))
                    break
                k += 1
    found.update(_short_matches(words, short, index, set(found)))
    out = [
        {
            "doc_id": df["doc_id"][r],
            "source": df["source"][r] if "source" in df.columns else None,
            "reason": "contaminated",
            "eval_set": index.items["eval_set"][item],
            "item_id": index.items["item_id"][item],
            "ngram": gram,
        }
        for r, (item, gram) in sorted(found.items())
    ]
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
    return (
        f"{found.height} training documents hold an evaluation item (a shared {N}-word n-gram, or a short "
        f"item's prompt and answer): {shown}{more}"
    )
