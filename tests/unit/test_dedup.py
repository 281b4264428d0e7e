"""largetrain_core.dedup (exact dedup on the normalized key) and largetrain_core.accounting on a tiny chain."""

import json
import shutil
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
import xxhash

from largetrain_core.accounting import corpus_accounting
from largetrain_core.clean import QualityConfig, clean_corpus
from largetrain_core.corpus import ingest
from largetrain_core.readers import ReaderConfig
from largetrain_core.dedup import exact_dedup, key_hashes
from helpers.parts import write_parts

OFF = QualityConfig(
    min_words=None,
    max_words=None,
    min_mean_word_length=None,
    max_mean_word_length=None,
    min_alpha_word_fraction=None,
    min_stop_words=None,
)
SENT = "The quick brown fox jumps over the lazy dog and then runs to the old mill. "


def read_parts(d: Path) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(p) for p in sorted(d.glob("part-*.parquet"))])


def dedup(in_dir: Path, tmp_path: Path, name: str = "dedup") -> tuple[dict, pl.DataFrame, pl.DataFrame]:
    out = tmp_path / name
    out.mkdir()
    stats = exact_dedup(in_dir, out)
    return stats, read_parts(out), pl.read_parquet(out / "duplicates.parquet")


def test_unicode_variants_case_is_one_cluster(cases, tmp_path):
    raw, cleaned = tmp_path / "raw", tmp_path / "cleaned"
    raw.mkdir(), cleaned.mkdir()
    ingest(ReaderConfig(str(cases / "unicode_variants.jsonl"), id_field="id"), raw)
    clean_corpus(raw, cleaned, OFF)  # the short sentence would fail the Gopher word count; only dedup is tested here
    stats, kept, dups = dedup(cleaned, tmp_path)
    assert stats == {"input": 3, "kept": 1, "duplicate": 2, "clusters": 1}
    assert kept["doc_id"].to_list() == ["u0"]
    # the kept copy is training text: NFC, with its original spacing and case, not the dedup key
    assert kept["text"].to_list() == [
        "The caf\u00e9 on Rue Lepic opens at nine,   and the cr\u00e8me br\u00fbl\u00e9e sells out by noon."
    ]
    assert dups["doc_id"].to_list() == ["u1", "u2"]
    assert dups["duplicate_of"].to_list() == ["u0", "u0"]
    key = "the caf\u00e9 on rue lepic opens at nine, and the cr\u00e8me br\u00fbl\u00e9e sells out by noon."
    assert dups["key_hash"].to_list() == [xxhash.xxh3_64_intdigest(key.encode())] * 2


def test_key_normalization_covers_the_whole_kind(tmp_path):
    rows = [
        ("a0", "Die Stra\u00dfe ist lang."),
        ("a1", "Die Stra\u00dfe ist lang.".upper()),  # str.upper: STRASSE; only case folding maps both to "strasse"
        ("b0", "\uff21\uff22\uff23 full width"),  # NFKC folds full-width letters
        ("b1", "abc full width"),
        ("c0", "  tabs\tand\nnew\u00a0lines  "),
        ("c1", "tabs and new lines"),
        ("d0", "abd full width"),  # one letter differs: not a duplicate
    ]
    stats, kept, dups = dedup(write_parts(tmp_path / "in", [rows]), tmp_path)
    assert kept["doc_id"].to_list() == ["a0", "b0", "c0", "d0"]
    assert dict(zip(dups["doc_id"], dups["duplicate_of"])) == {"a1": "a0", "b1": "b0", "c1": "c0"}
    assert stats == {"input": 7, "kept": 4, "duplicate": 3, "clusters": 3}


def test_invisible_chars_case_copies_are_one_exact_cluster(cases, tmp_path):
    """The dedup key ignores format characters: the copies carrying soft hyphens, zero-width spaces, word
    joiners, a BOM or ZWJ/ZWNJ are exact duplicates of the original even before cleaning removes them."""
    raw = [json.loads(line) for line in (cases / "invisible_chars.jsonl").open(encoding="utf-8")]
    rows = [(r["id"], r["text"]) for r in raw]
    assert len({t for _, t in rows}) == len(rows)  # seven different strings
    stats, kept, dups = dedup(write_parts(tmp_path / "in", [rows]), tmp_path)
    copies = {"soft_hyphens", "zero_width_space", "word_joiner", "bom_inside", "zwj_zwnj"}
    assert kept["doc_id"].to_list() == ["original", "persian_zwnj"]
    assert dict(zip(dups["doc_id"], dups["duplicate_of"])) == {c: "original" for c in copies}
    assert stats == {"input": 7, "kept": 2, "duplicate": 5, "clusters": 1}
    # a Persian word with and without its ZWNJ has one key too (the key ignores every format character)
    persian = rows[-1][1]
    assert len(set(key_hashes(pl.Series([persian, persian.replace("\u200c", "")])))) == 1


def test_first_copy_in_corpus_order_kept_whatever_the_part_split(tmp_path):
    rows = [(f"d{i}", f"text {i % 4}") for i in range(10)]  # d0..d3 distinct; d4..d9 repeat them
    one = dedup(write_parts(tmp_path / "one", [rows]), tmp_path, "o1")
    three = dedup(write_parts(tmp_path / "three", [rows[:3], rows[3:7], rows[7:]]), tmp_path, "o3")
    for stats, kept, dups in (one, three):
        assert stats == {"input": 10, "kept": 4, "duplicate": 6, "clusters": 4}
        assert kept["doc_id"].to_list() == ["d0", "d1", "d2", "d3"]
        assert dict(zip(dups["doc_id"], dups["duplicate_of"])) == {
            "d4": "d0",
            "d5": "d1",
            "d6": "d2",
            "d7": "d3",
            "d8": "d0",
            "d9": "d1",
        }
    assert one[2].equals(three[2])


def test_many_documents_full_uint64_hash_range(tmp_path):
    texts = [f"document {i}" for i in range(300)]
    hashes = [xxhash.xxh3_64_intdigest(t.encode()) for t in texts]
    assert any(h >= 2**63 for h in hashes) and any(h < 2**63 for h in hashes)
    assert key_hashes(pl.Series(texts)).to_list() == hashes
    rows = [(f"a{i}", t) for i, t in enumerate(texts)] + [(f"b{i}", t.upper()) for i, t in enumerate(texts[:50])]
    stats, kept, dups = dedup(write_parts(tmp_path / "in", [rows[:170], rows[170:]]), tmp_path)
    assert stats == {"input": 350, "kept": 300, "duplicate": 50, "clusters": 50}
    assert dups["duplicate_of"].to_list() == [f"a{i}" for i in range(50)]


def test_tiny_docs_never_collapse_into_one_cluster(cases, tmp_path):
    raw, cleaned = tmp_path / "raw", tmp_path / "cleaned"
    raw.mkdir(), cleaned.mkdir()
    ingest(ReaderConfig(str(cases / "tiny_docs.jsonl"), id_field="id"), raw)
    totals = clean_corpus(raw, cleaned, OFF)  # even with every quality rule off, empty ones go as "empty"
    assert totals["filtered_by_reason"] == {"empty": 2}
    stats, kept, dups = dedup(cleaned, tmp_path)
    assert stats == {"input": 3, "kept": 3, "duplicate": 0, "clusters": 0}
    assert kept["doc_id"].to_list() == ["t2", "t3", "t4"] and dups.height == 0


def test_empty_input(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    stats = exact_dedup(tmp_path / "in", tmp_path / "out")
    assert stats == {"input": 0, "kept": 0, "duplicate": 0, "clusters": 0}
    assert pl.read_parquet(tmp_path / "out" / "duplicates.parquet").height == 0


# ---------------------------------------------------------------------------------------------
# the whole data chain and the accounting rule


@pytest.fixture
def chain(tmp_path) -> tuple[Path, Path, Path, dict]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "broken.txt").write_bytes(b"legacy caf\xe9")  # rejected: not UTF-8
    (src / "docs.jsonl").write_text(
        "\n".join(
            [
                json.dumps({"id": "g1", "text": SENT * 4}),  # kept
                # duplicate of g1 (case and spacing only); its stop words stay lower case, as the Gopher
                # stop-word rule is case-sensitive (datatrove 0.10.1)
                json.dumps(
                    {"id": "g2", "text": (SENT * 4).replace("quick brown fox", "QUICK BROWN FOX").replace(" ", "  ")}
                ),
                json.dumps({"id": "f1", "text": "hi"}),  # filtered: gopher_min_words
                "{not json",  # rejected
                json.dumps({"id": "g3", "text": "A different text about the river and the hills, " * 8}),  # kept
                json.dumps({"id": "f2", "text": "   "}),  # filtered: empty
                '{"id": "s", "text": "lone \\udc80"}',  # rejected
            ]
        )
        + "\n"
    )
    (src / "notes.txt").write_text("Notes on\x00 the mill and the river, written down by hand. " * 8)  # kept
    raw, cleaned, dd = tmp_path / "raw", tmp_path / "cleaned", tmp_path / "dedup"
    for d in (raw, cleaned, dd):
        d.mkdir()
    counts = {
        "ingest": ingest(ReaderConfig(str(src), id_field="id", batch_size=2), raw),
        "clean": clean_corpus(raw, cleaned, QualityConfig()),
        "dedup": exact_dedup(cleaned, dd),
    }
    return raw, cleaned, dd, counts


def test_chain_counts_balance(chain):
    raw, cleaned, dd, counts = chain
    assert (counts["ingest"]["documents"], counts["ingest"]["rejected"]) == (6, 3)
    c = counts["clean"]
    assert (c["input"], c["kept"], c["filtered"], c["nul_removed"]) == (6, 4, 2, 8)
    assert c["filtered_by_reason"] == {"empty": 1, "gopher_min_words": 1}
    assert counts["dedup"] == {"input": 4, "kept": 3, "duplicate": 1, "clusters": 1}
    assert read_parts(dd)["doc_id"].to_list() == ["g1", "g3", "notes.txt"]
    assert pl.read_parquet(dd / "duplicates.parquet")["duplicate_of"].to_list() == ["g1"]
    acc = corpus_accounting(raw, cleaned, dd)
    assert acc == {
        "input": 9,
        "kept": 3,
        "filtered": 2,
        "duplicate": 1,
        "rejected": 3,
        "repeats": 0,
        "repeated_documents": 0,
        "balanced": True,
        "problems": [],
    }
    assert acc["kept"] + acc["filtered"] + acc["duplicate"] + acc["rejected"] == acc["input"]


def _non_empty_part(d: Path) -> Path:
    return next(p for p in sorted(d.glob("part-*.parquet")) if pq.ParquetFile(p).metadata.num_rows)


@pytest.mark.parametrize("stage", [0, 1, 2], ids=["raw", "cleaned", "dedup"])
def test_deleting_a_part_file_unbalances(chain, stage):
    dirs = chain[:3]
    _non_empty_part(dirs[stage]).unlink()
    acc = corpus_accounting(*dirs)
    assert acc["balanced"] is False
    assert acc["problems"]


def test_a_double_written_part_file_unbalances(chain):
    raw, cleaned, dd, _ = chain
    shutil.copy(_non_empty_part(dd), dd / "part-99999.parquet")
    acc = corpus_accounting(raw, cleaned, dd)
    assert acc["balanced"] is False
    assert any("deduplicated_text" in p for p in acc["problems"])


# ---------------------------------------------------------------------------------------------
# the global step of near-dedup: hash ranges and the union-find of candidates only


def _naive_clusters(sig_files: list[Path], bands: int) -> dict[int, int]:
    """Every pair compared: a union when the key hashes or (both documents having words) any band match.
    Returns {row: smallest row of its component} for every row in a component of two or more."""
    t = pl.concat([pl.read_parquet(f) for f in sig_files])
    cols = [f"band_{b:02d}" for b in range(bands)]
    rows = t.select("key_hash", "n_words", *cols).rows()
    parent = list(range(len(rows)))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for i in range(len(rows)):
        for j in range(i):
            a, b = rows[i], rows[j]
            if a[0] == b[0] or (a[1] > 0 and b[1] > 0 and any(x == y for x, y in zip(a[2:], b[2:]))):
                ri, rj = find(i), find(j)
                parent[max(ri, rj)] = min(ri, rj)
    roots = [find(i) for i in range(len(rows))]
    return {i: r for i, r in enumerate(roots) if roots.count(r) > 1}


def test_global_step_same_clusters_in_any_number_of_hash_ranges(tmp_path):
    from largetrain_core.dedup import DedupConfig, cluster_signatures, deduplicate

    words = [f"w{i:03d}" for i in range(400)]
    base = [" ".join(words[k : k + 60]) for k in range(0, 300, 20)]  # 15 texts, neighbours overlap by 40 words
    rows = []
    for i, text in enumerate(base):
        rows.append((f"b{i}", text))
        if i % 3 == 0:
            rows.append((f"b{i}x", text.upper()))  # exact duplicate (case)
        if i % 4 == 0:
            rows.append((f"b{i}n", text.replace(words[20 * i + 30], "other")))  # near duplicate
    rows += [("e0", "   "), ("e1", ""), ("s0", "w001"), ("s1", "W001")]  # no words / one word
    src = write_parts(tmp_path / "in", [rows[:9], rows[9:20], rows[20:]])
    out = tmp_path / "out"
    out.mkdir()
    stats = deduplicate(src, out, DedupConfig())
    sig = sorted((out / "signatures").glob("part-*.parquet"))
    full = cluster_signatures(sig)
    assert stats["duplicate_exact"] and stats["duplicate_near"]
    assert dict(zip(full["row"], full["cluster_id"])) == {
        r: root for r, root in _naive_clusters(sig, DedupConfig().bands).items() if r != root
    }
    for rows_per_pass in (1, 3, 16):  # 64, 32 and 4 hash ranges, spilled to disk
        assert cluster_signatures(sig, rows_per_pass=rows_per_pass, spill_dir=tmp_path).equals(full)
    assert not list(tmp_path.glob("dedup-spill-*"))


def test_exact_duplicate_recount_is_the_same_in_any_number_of_hash_ranges(tmp_path):
    from largetrain_core.dedup import count_exact_duplicates

    texts = [f"document {i} " + SENT * (i % 3 + 1) for i in range(30)]
    rows = [(f"d{i}", t) for i, t in enumerate(texts)]
    rows += [("c0", texts[4].upper()), ("c1", "  " + texts[7].replace(" ", "\t")), ("c2", texts[4]), ("c3", texts[29])]
    src = write_parts(tmp_path / "in", [rows[:12], rows[12:31], rows[31:]])
    seen, naive = set(), []
    for doc_id, text in rows:  # the check's definition: a key hash met at an earlier document
        h = key_hashes(pl.Series([text]))[0]
        if h in seen:
            naive.append(doc_id)
        seen.add(h)
    assert naive == ["c0", "c1", "c2", "c3"]
    for rows_per_pass in (1, 5, 1 << 22):  # 64, 8 and 1 hash ranges
        assert count_exact_duplicates(src, examples=3, rows_per_pass=rows_per_pass, spill_dir=tmp_path) == (
            len(rows),
            4,
            naive[:3],
        )
    assert not list(tmp_path.glob("hash-ranges-*"))


def test_signatures_made_per_partition_leave_the_global_step_only_clustering(tmp_path):
    """write_partition_signatures in each partition (what cleaned_text does), then deduplicate: the same
    kept documents and duplicates as signatures computed in the global step, and none computed there;
    signatures made with other settings are not used."""
    from largetrain_core.dedup import DedupConfig, SIGNATURES, deduplicate, write_partition_signatures

    words = [f"w{i:03d}" for i in range(300)]
    texts = [" ".join(words[k : k + 40]) for k in range(0, 200, 10)]
    rows = [(f"d{i}", t) for i, t in enumerate(texts)]
    rows += [("x0", texts[3].upper()), ("n0", texts[5].replace(words[60], "zzz")), ("x1", texts[0] + "  ")]
    dirs = [write_parts(tmp_path / "p0", [rows[:8], rows[8:12]]), write_parts(tmp_path / "p1", [rows[12:]])]
    (tmp_path / "global").mkdir()
    computed = deduplicate(dirs, tmp_path / "global", DedupConfig())
    assert (
        (tmp_path / "global" / SIGNATURES).exists() and computed["duplicate_exact"] >= 1 and computed["duplicate"] >= 2
    )
    for d in dirs:
        write_partition_signatures(d, DedupConfig())
    (tmp_path / "clusters").mkdir()
    assert deduplicate(dirs, tmp_path / "clusters", DedupConfig()) == computed
    assert not (tmp_path / "clusters" / SIGNATURES).exists()  # only clustered
    for name in ("part-00000.parquet", "part-00001.parquet", "duplicates.parquet"):
        assert pl.read_parquet(tmp_path / "clusters" / name).equals(pl.read_parquet(tmp_path / "global" / name))
    (tmp_path / "other").mkdir()
    deduplicate(dirs, tmp_path / "other", DedupConfig(ngram=3))  # other settings: the global step computes its own
    assert (tmp_path / "other" / SIGNATURES).exists()


def test_cleaned_text_computes_the_signatures_and_deduplicated_text_only_clusters(tmp_path):
    """The stages: each cleaned_text partition carries its parts' signatures (made with its MinHash
    settings, recorded in its stats); deduplicated_text clusters them, with its own ``near``, and writes
    the documents a global signature pass would."""
    from largetrain_core.dedup import SIGNATURES, DedupConfig, deduplicate
    from largetrain_core.executors.local import LocalExecutor
    from largetrain_core.stages.base import StageRun
    from largetrain_core.stages.cleaned_text import cleaned_text
    from largetrain_core.stages.deduplicated_text import deduplicated_text
    from largetrain_core.stages.raw_corpus import raw_corpus

    src = tmp_path / "corpus"
    src.mkdir()
    base = [SENT * (3 + i % 4) + f" Item {i} of the list." for i in range(12)]
    for i, text in enumerate(base + [base[2].upper(), base[5].replace("lazy", "idle")]):
        (src / f"d{i:02d}.txt").write_text(text)
    root, ex = tmp_path / "root", LocalExecutor()
    raw, cleaned = {}, {}
    for pk in ("0", "1"):
        r = raw_corpus(
            ReaderConfig(str(src), partition=int(pk), partitions=2),
            StageRun(root, ("c", "raw_corpus"), pk, executor=ex),
        )
        raw[pk] = r
        cleaned[pk] = cleaned_text(
            OFF, r, StageRun(root, ("c", "cleaned_text"), pk, executor=ex), dedup=DedupConfig(ngram=3)
        )
        assert (cleaned[pk].path / SIGNATURES / "settings.json").exists() and cleaned[pk].stats["dedup"]["ngram"] == 3
    result = deduplicated_text(True, raw, cleaned, StageRun(root, ("c", "deduplicated_text"), executor=ex))
    assert result.checks["accounting"].passed and not (result.path / SIGNATURES).exists()  # only clustered
    again = tmp_path / "again"
    again.mkdir()
    computed = deduplicate([cleaned[k].path for k in ("0", "1")], again, DedupConfig(ngram=3, near=True))
    assert result.stats["duplicate"] == computed["duplicate"] >= 2
    assert pl.read_parquet(result.path / "duplicates.parquet").equals(pl.read_parquet(again / "duplicates.parquet"))
    exact = deduplicated_text(False, raw, cleaned, StageRun(root, ("c", "deduplicated_text"), executor=ex))
    assert exact.stats["duplicate_near"] == 0 and exact.data_version != result.data_version
