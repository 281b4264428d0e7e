"""largetrain_core.corpus: readers, the encoding policy (against tests/cases) and ingest subsetting."""

import gzip
import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash

from largetrain_core.clean import normalize
from largetrain_core.corpus import DOC_SCHEMA, REJECT_SCHEMA, ReaderConfig, ingest, read_corpus


def read_all(path, **kw) -> tuple[pa.Table, pa.Table]:
    batches = list(read_corpus(ReaderConfig(str(path), **kw)))
    docs = pa.concat_tables([b.documents for b in batches]) if batches else DOC_SCHEMA.empty_table()
    rej = pa.concat_tables([b.rejected for b in batches]) if batches else REJECT_SCHEMA.empty_table()
    return docs, rej


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


# ---------------------------------------------------------------------------------------------
# the shared cases


def test_bom_crlf_three_documents_first_intact(cases):
    docs, rej = read_all(cases / "bom_crlf.jsonl", id_field="id")
    assert rej.num_rows == 0
    assert docs.column("doc_id").to_pylist() == ["a", "b", "c"]
    texts = docs.column("text").to_pylist()
    assert texts[0] == "The first record follows the byte-order mark."
    assert texts[1] == "A second record, ended by CR LF."
    assert texts[2] == "The third and last record."
    assert not any("\ufeff" in t for t in texts)
    cleaned = normalize(pl.from_arrow(docs))
    assert not any("\r" in t for t in cleaned["text"].to_list())


def test_bom_and_crlf_in_text_files_and_inside_json_strings(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"\xef\xbb\xbfline one\r\nline two\rthree\r\n")
    (tmp_path / "b.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "x\\r\\ny"}\r\n{"text": "z\\rw"}\r\n')
    docs, rej = read_all(tmp_path)
    assert rej.num_rows == 0
    assert docs.column("doc_id").to_pylist() == ["a.txt", "b.jsonl:1", "b.jsonl:2"]
    assert docs.column("source").to_pylist() == ["a.txt", "b.jsonl", "b.jsonl"]
    texts = docs.column("text").to_pylist()
    assert texts[0] == "line one\r\nline two\rthree\r\n"  # BOM dropped; line ends are the cleaner's job
    assert normalize(pl.from_arrow(docs))["text"].to_list() == ["line one\nline two\nthree\n", "x\ny", "z\nw"]


def test_lone_surrogate_rejected_with_file_line_reason_and_rest_survives_parquet(cases, tmp_path):
    docs, rej = read_all(cases / "lone_surrogate.jsonl", id_field="id")
    assert docs.column("doc_id").to_pylist() == ["ok1", "ok2"]
    assert docs.column("text").to_pylist() == ["A normal line of text.", "Another normal line of text."]
    assert rej.num_rows == 1
    r = rej.to_pylist()[0]
    assert r["source"] == "lone_surrogate.jsonl"
    assert r["position"] == 2  # 1-based line of the "bad" record
    assert "line 2" in r["reason"] and "surrogate" in r["reason"]
    # no crash later: Arrow -> Parquet -> polars -> normalize all work on what was kept
    pq.write_table(docs, tmp_path / "kept.parquet")
    back = pl.read_parquet(tmp_path / "kept.parquet")
    assert normalize(back)["text"].to_list() == ["A normal line of text.", "Another normal line of text."]
    (tmp_path / "raw").mkdir()
    stats = ingest(ReaderConfig(str(cases / "lone_surrogate.jsonl"), id_field="id"), tmp_path / "raw")
    assert (stats["documents"], stats["rejected"]) == (2, 1)
    assert pq.read_table(tmp_path / "raw" / "rejected.parquet").to_pylist() == [r]
    assert pl.read_parquet(tmp_path / "raw" / "part-00000.parquet")["doc_id"].to_list() == ["ok1", "ok2"]


def test_surrogates_and_bad_bytes_everywhere_are_rejected_not_crashing(tmp_path):
    (tmp_path / "pair.jsonl").write_text('{"id": "emoji", "text": "smile \\ud83d\\ude00 ok"}\n'
                                         '{"id": "\\udc80", "text": "bad id"}\n'
                                         '{"id": "c", "text": "lone \\ud800"}\n')
    (tmp_path / "raw.jsonl").write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\nnot json\n[1, 2]\n{"other": 1}\n')
    (tmp_path / "surrogate.txt").write_bytes(b"encoded surrogate \xed\xa0\x80 here")  # CESU-style, not UTF-8
    docs, rej = read_all(tmp_path, id_field="id")
    assert docs.column("text").to_pylist() == ["smile \U0001F600 ok", "fine"]
    got = {(r["source"], r["position"]) for r in rej.to_pylist()}
    assert got == {("pair.jsonl", 2), ("pair.jsonl", 3), ("raw.jsonl", 2), ("raw.jsonl", 3), ("raw.jsonl", 4),
                   ("raw.jsonl", 5), ("surrogate.txt", 18)}
    reasons = {(r["source"], r["position"]): r["reason"] for r in rej.to_pylist()}
    assert "invalid UTF-8" in reasons[("raw.jsonl", 2)]
    assert "invalid JSON" in reasons[("raw.jsonl", 3)]
    assert "no string field 'text'" in reasons[("raw.jsonl", 4)]
    assert "invalid UTF-8 at byte 18" in reasons[("surrogate.txt", 18)]


def test_invalid_utf8_rejected_with_file_byte_offset_and_reason(cases, tmp_path):
    data = (cases / "invalid_utf8.txt").read_bytes()
    # "Kernel notes written in a legacy encoding: caf" is 46 ASCII bytes, then Latin-1 0xE9 ("é").
    assert data[:46] == b"Kernel notes written in a legacy encoding: caf" and data[46] == 0xE9
    docs, rej = read_all(cases / "invalid_utf8.txt")
    assert docs.num_rows == 0  # never decoded with replacement
    assert rej.to_pylist() == [{"source": "invalid_utf8.txt", "position": 46,
                                "reason": "invalid UTF-8 at byte 46: invalid continuation byte"}]
    out = tmp_path / "raw"
    out.mkdir()
    stats = ingest(ReaderConfig(str(cases / "invalid_utf8.txt")), out)
    assert (stats["documents"], stats["rejected"], stats["parts"]) == (0, 1, 0)
    assert pq.read_table(out / "rejected.parquet").column("position").to_pylist() == [46]


def test_nul_bytes_are_read_as_is(cases):
    docs, rej = read_all(cases / "nul_bytes.txt")
    assert rej.num_rows == 0
    assert docs.column("text").to_pylist() == [
        "This document has a NUL\x00 byte inside a sentence, and another\x00 here.\n"]


def test_mixed_parquet_text_read_from_every_file(cases, tmp_path):
    docs, rej = read_all(cases / "mixed_parquet")
    assert rej.num_rows == 0
    assert docs.column("text").to_pylist() == ["first file, first row", "first file, second row",
                                               "second file, first row", "second file, second row"]
    assert docs.column("doc_id").to_pylist() == ["part-0.parquet:0", "part-0.parquet:1",
                                                 "part-1.parquet:0", "part-1.parquet:1"]
    assert docs.schema == DOC_SCHEMA
    out = tmp_path / "raw"
    out.mkdir()
    stats = ingest(ReaderConfig(str(cases / "mixed_parquet")), out)
    assert (stats["documents"], stats["rejected"], stats["files"]) == (4, 0, 3)
    assert pl.read_parquet(out / "part-00000.parquet").height == 4


def test_parquet_bad_files_and_rows_are_rejected(tmp_path):
    pq.write_table(pa.table({"text": ["a", None, "c"], "id": [1, 2, 3]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "b.parquet")
    (tmp_path / "c.parquet").write_bytes(b"this is not parquet at all")
    docs, rej = read_all(tmp_path, id_field="id")
    assert docs.column("doc_id").to_pylist() == ["1", "3"]
    assert docs.column("text").to_pylist() == ["a", "c"]
    assert [(r["source"], r["position"]) for r in rej.to_pylist()] == [("a.parquet", 1), ("b.parquet", -1),
                                                                        ("c.parquet", -1)]
    assert "no column 'text'" in rej.column("reason")[1].as_py()
    assert "cannot open Parquet file" in rej.column("reason")[2].as_py()


def test_truncated_gzip_is_a_rejected_record(tmp_path):
    blob = gzip.compress(b"".join(json.dumps({"text": f"document {i} " * 20}).encode() + b"\n" for i in range(200)))
    (tmp_path / "a.jsonl.gz").write_bytes(blob[: len(blob) // 2])
    docs, rej = read_all(tmp_path)
    assert [(r["source"], r["position"]) for r in rej.to_pylist()] == [("a.jsonl.gz", -1)]
    assert "cannot read file" in rej.column("reason")[0].as_py()
    assert docs.num_rows < 200  # whatever was complete before the cut; counted, not silently dropped


def test_batches_never_exceed_batch_size_and_keep_every_document_once(tmp_path):
    (tmp_path / "a.txt").write_text("text file")
    write_jsonl(tmp_path / "b.jsonl", [{"text": f"j{i}"} for i in range(4)])
    pq.write_table(pa.table({"text": [f"p{i}" for i in range(7)]}), tmp_path / "c.parquet")
    (tmp_path / "d.md").write_text("markdown file")
    (tmp_path / "ignored.csv").write_text("not a corpus file")
    batches = list(read_corpus(ReaderConfig(str(tmp_path), batch_size=2)))
    assert all(b.documents.num_rows <= 2 for b in batches), [b.documents.num_rows for b in batches]
    texts = [t for b in batches for t in b.documents.column("text").to_pylist()]
    assert texts == ["text file"] + [f"j{i}" for i in range(4)] + [f"p{i}" for i in range(7)] + ["markdown file"]


def test_missing_or_empty_corpus_path(tmp_path):
    with pytest.raises(FileNotFoundError):
        list(read_corpus(ReaderConfig(str(tmp_path / "nope"))))
    (tmp_path / "notes.csv").write_text("x")
    with pytest.raises(ValueError):
        list(read_corpus(ReaderConfig(str(tmp_path))))


# ---------------------------------------------------------------------------------------------
# ingest subsetting


@pytest.fixture
def forty_docs(tmp_path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    write_jsonl(src / "a.jsonl", [{"id": f"d{i:02d}", "text": f"document number {i}"} for i in range(25)])
    write_jsonl(src / "b.jsonl", [{"id": f"d{i:02d}", "text": f"document number {i}"} for i in range(25, 40)]
                + ["{broken"])
    return src


def run_ingest(src: Path, out: Path, **kw) -> tuple[dict, list[str]]:
    batch_size = kw.pop("batch_size", 1024)
    out.mkdir(parents=True)
    stats = ingest(ReaderConfig(str(src), id_field="id", batch_size=batch_size), out, **kw)
    ids = [i for p in sorted(out.glob("part-*.parquet")) for i in pl.read_parquet(p)["doc_id"].to_list()]
    return stats, ids


def test_ingest_everything(forty_docs, tmp_path):
    stats, ids = run_ingest(forty_docs, tmp_path / "all")
    assert ids == [f"d{i:02d}" for i in range(40)]
    assert (stats["documents"], stats["rejected"], stats["not_sampled"], stats["files"]) == (40, 1, 0, 2)
    assert stats["bytes"] == sum(len(f"document number {i}") for i in range(40))


def test_ingest_sample_fraction_is_deterministic_and_counted(forty_docs, tmp_path):
    # the documented rule, computed here independently: keep when xxh64(doc_id, seed) / 2**64 < fraction
    expected = [f"d{i:02d}" for i in range(40) if xxhash.xxh64_intdigest(f"d{i:02d}".encode(), 7) / 2**64 < 0.5]
    assert 0 < len(expected) < 40
    s1, ids1 = run_ingest(forty_docs, tmp_path / "one", sample_fraction=0.5, seed=7)
    s2, ids2 = run_ingest(forty_docs, tmp_path / "two", sample_fraction=0.5, seed=7, batch_size=3)
    assert ids1 == ids2 == expected
    for s in (s1, s2):
        assert s["documents"] == len(expected)
        assert s["not_sampled"] == 40 - len(expected)
        assert s["rejected"] == 1
    _, other = run_ingest(forty_docs, tmp_path / "three", sample_fraction=0.5, seed=8)
    assert other != expected


def test_ingest_max_documents_keeps_first_n_in_corpus_order(forty_docs, tmp_path):
    s, ids = run_ingest(forty_docs, tmp_path / "m", max_documents=5, batch_size=2)
    assert ids == ["d00", "d01", "d02", "d03", "d04"]
    assert (s["documents"], s["not_sampled"], s["rejected"]) == (5, 35, 1)
    s2, ids2 = run_ingest(forty_docs, tmp_path / "m2", max_documents=5, batch_size=2)
    assert (s2, ids2) == (s, ids)
    sampled = [f"d{i:02d}" for i in range(40) if xxhash.xxh64_intdigest(f"d{i:02d}".encode(), 7) / 2**64 < 0.5]
    s3, ids3 = run_ingest(forty_docs, tmp_path / "both", sample_fraction=0.5, seed=7, max_documents=3)
    assert ids3 == sampled[:3]
    assert s3["documents"] + s3["not_sampled"] == 40


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5])
def test_ingest_rejects_bad_fraction(forty_docs, tmp_path, fraction):
    with pytest.raises(ValueError):
        ingest(ReaderConfig(str(forty_docs)), tmp_path, sample_fraction=fraction)


# ---------------------------------------------------------------------------------------------
# label_field


def test_label_field_jsonl_and_parquet(tmp_path):
    from largetrain_core.corpus import LABELLED_DOC_SCHEMA

    d = tmp_path / "c"
    d.mkdir()
    write_jsonl(d / "a.jsonl", [{"text": "one", "y": "pos"}, {"text": "two"}, {"text": "three", "y": 1},
                                {"text": "four", "y": None}, {"text": "five", "y": True}])
    pq.write_table(pa.table({"text": ["six", "seven"], "y": [3, None]}), d / "b.parquet")
    pq.write_table(pa.table({"text": ["eight"]}), d / "c.parquet")   # no label column: null
    (d / "d.txt").write_text("nine")                                   # text files carry no label
    docs, rej = read_all(d, label_field="y")
    assert rej.num_rows == 0 and docs.schema == LABELLED_DOC_SCHEMA
    assert docs.column("text").to_pylist() == ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    assert docs.column("label").to_pylist() == ["pos", None, "1", None, "true", "3", None, None, None]
    # without label_field the schema is unchanged and the field is ignored
    docs, _ = read_all(d)
    assert docs.schema == DOC_SCHEMA


def test_label_column_survives_clean_and_dedup(tmp_path):
    from largetrain_core.clean import QualityConfig, clean_corpus
    from largetrain_core.dedup import deduplicate

    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "same words here", "y": "a"}, {"text": "same words here", "y": "b"},
                                              {"text": "other words there", "y": "c"}])
    raw, clean, dedup = (tmp_path / n for n in ("raw", "clean", "dedup"))
    for p in (raw, clean, dedup):
        p.mkdir()
    ingest(ReaderConfig(str(src), label_field="y"), raw)
    off = {k: None for k in ("min_words", "max_words", "min_mean_word_length", "max_mean_word_length",
                             "max_hash_word_ratio", "max_ellipsis_word_ratio", "max_bullet_lines_ratio",
                             "max_ellipsis_lines_ratio", "min_alpha_word_fraction", "min_stop_words")}
    clean_corpus(raw, clean, QualityConfig(**off))
    deduplicate(clean, dedup)
    out = pl.read_parquet(dedup / "part-00000.parquet")
    assert out.columns == ["doc_id", "source", "text", "label"] and out["label"].to_list() == ["a", "c"]


# ---------------------------------------------------------------------------------------------
# hash partitions (the raw_corpus partitions of the Dagster chains)


def test_hash_partitions_cover_the_corpus_once_and_a_new_file_changes_one_partition(tmp_path):
    from largetrain_core.corpus import fingerprint, list_files, partition_of

    src = tmp_path / "corpus"
    (src / "sub").mkdir(parents=True)
    for i in range(24):
        (src / ("sub" if i % 3 else ".") / f"doc{i:02d}.txt").write_text(f"document number {i}\n")
    n = 4
    parts = [list_files(src, i, n) for i in range(n)]
    assert sorted(f for p in parts for f in p) == list_files(src)  # every file in exactly one partition
    assert sum(bool(p) for p in parts) >= 2
    assert all(partition_of(f.relative_to(src).as_posix(), n) == i for i, p in enumerate(parts) for f in p)

    # ingest partition by partition reads every document once, with the ids of the unpartitioned read
    whole = pq.read_table(_ingest(src, tmp_path / "whole", ReaderConfig(str(src)))).column("doc_id").to_pylist()
    parted = []
    for i in range(n):
        out = tmp_path / f"p{i}"
        stats = ingest(ReaderConfig(str(src), partition=i, partitions=n), out.mkdir() or out)
        assert stats["files"] == len(parts[i]) and stats["documents"] == len(parts[i])
        parted += [d for f in sorted(out.glob("part-*.parquet")) for d in pq.read_table(f).column("doc_id").to_pylist()]
        assert pq.read_table(out / "rejected.parquet").num_rows == 0
    assert sorted(parted) == sorted(whole) and len(parted) == 24

    # a new file changes the fingerprint (so the data version) of the one partition it falls into
    before = [fingerprint(src, i, n) for i in range(n)]
    (src / "sub" / "new.txt").write_text("a new document\n")
    after = [fingerprint(src, i, n) for i in range(n)]
    assert [i for i in range(n) if before[i] != after[i]] == [partition_of("sub/new.txt", n)]

    with pytest.raises(ValueError, match="partition must be in"):
        ReaderConfig(str(src), partition=4, partitions=4)


def _ingest(src, out, cfg):
    out.mkdir()
    ingest(cfg, out)
    return [str(f) for f in sorted(out.glob("part-*.parquet"))]


def test_files_no_reader_knows_are_counted_and_listed_not_dropped(tmp_path):
    from largetrain_core.corpus import list_files, scan

    src = tmp_path / "corpus"
    src.mkdir()
    for name in ("a.txt", "B.TXT", "c.json", "d.txt.gz", "e.markdown", ".gitignore"):
        (src / name).write_text("some words in a file\n")
    real = tmp_path / "elsewhere"
    real.mkdir()
    (real / "f.md").write_text("a linked directory's file\n")
    (src / "linked").symlink_to(real, target_is_directory=True)
    (real / "loop").symlink_to(src, target_is_directory=True)  # a cycle ends: each real directory once

    files, skipped = scan(src)
    assert [f.relative_to(src).as_posix() for f in files] == ["B.TXT", "a.txt", "linked/f.md"]
    assert sorted(f.name for f in skipped) == [".gitignore", "c.json", "d.txt.gz", "e.markdown"]
    out = tmp_path / "raw"
    out.mkdir()
    stats = ingest(ReaderConfig(str(src)), out)
    assert (stats["files"], stats["documents"], stats["skipped_files"]) == (3, 3, 4)
    assert sorted((out / "skipped_files.txt").read_text().split()) == [".gitignore", "c.json", "d.txt.gz", "e.markdown"]
    # a single file is held to the same suffix rules as a directory's files
    with pytest.raises(ValueError, match=r"c\.json: not a corpus file"):
        list_files(src / "c.json")


def test_a_file_name_that_is_not_utf8_becomes_a_rejected_record(tmp_path):
    import os

    src = tmp_path / "corpus"
    src.mkdir()
    (src / "good.txt").write_text("a readable document\n")
    with open(os.path.join(os.fsencode(src), b"caf\xe9.txt"), "w") as f:
        f.write("the name is Latin-1\n")
    for partitions in (1, 4):
        docs = pa.concat_tables([b.documents for i in range(partitions)
                                 for b in read_corpus(ReaderConfig(str(src), partition=i, partitions=partitions))])
        rej = pa.concat_tables([b.rejected for i in range(partitions)
                                for b in read_corpus(ReaderConfig(str(src), partition=i, partitions=partitions))])
        assert docs.column("doc_id").to_pylist() == ["good.txt"]
        assert rej.column("source").to_pylist() == ["caf\\xe9.txt"]
        assert rej.column("position").to_pylist() == [-1] and "file name is not valid UTF-8" in rej.column("reason")[0].as_py()
