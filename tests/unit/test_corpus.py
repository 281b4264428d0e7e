"""largetrain_core.corpus: readers, the encoding policy (against tests/cases) and ingest subsetting."""

import gzip
import json
import random
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash
import zstandard

from helpers.corpora import read_all, write_jsonl
from largetrain_core.clean import normalize
from largetrain_core.corpus import DOC_SCHEMA, ingest, read_corpus
from largetrain_core.readers import ReaderConfig


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
    (tmp_path / "pair.jsonl").write_text(
        '{"id": "emoji", "text": "smile \\ud83d\\ude00 ok"}\n'
        '{"id": "\\udc80", "text": "bad id"}\n'
        '{"id": "c", "text": "lone \\ud800"}\n'
    )
    (tmp_path / "raw.jsonl").write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\nnot json\n[1, 2]\n{"other": 1}\n')
    (tmp_path / "surrogate.txt").write_bytes(b"encoded surrogate \xed\xa0\x80 here")  # CESU-style, not UTF-8
    docs, rej = read_all(tmp_path, id_field="id")
    assert docs.column("text").to_pylist() == ["smile \U0001f600 ok", "fine"]
    got = {(r["source"], r["position"]) for r in rej.to_pylist()}
    assert got == {
        ("pair.jsonl", 2),
        ("pair.jsonl", 3),
        ("raw.jsonl", 2),
        ("raw.jsonl", 3),
        ("raw.jsonl", 4),
        ("raw.jsonl", 5),
        ("surrogate.txt", 18),
    }
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
    assert rej.to_pylist() == [
        {"source": "invalid_utf8.txt", "position": 46, "reason": "invalid UTF-8 at byte 46: invalid continuation byte"}
    ]
    out = tmp_path / "raw"
    out.mkdir()
    stats = ingest(ReaderConfig(str(cases / "invalid_utf8.txt")), out)
    assert (stats["documents"], stats["rejected"], stats["parts"]) == (0, 1, 0)
    assert pq.read_table(out / "rejected.parquet").column("position").to_pylist() == [46]


def test_nul_bytes_are_read_as_is(cases):
    docs, rej = read_all(cases / "nul_bytes.txt")
    assert rej.num_rows == 0
    assert docs.column("text").to_pylist() == [
        "This document has a NUL\x00 byte inside a sentence, and another\x00 here.\n"
    ]


def test_mixed_parquet_text_read_from_every_file(cases, tmp_path):
    docs, rej = read_all(cases / "mixed_parquet")
    assert rej.num_rows == 0
    assert docs.column("text").to_pylist() == [
        "first file, first row",
        "first file, second row",
        "second file, first row",
        "second file, second row",
    ]
    assert docs.column("doc_id").to_pylist() == [
        "part-0.parquet:0",
        "part-0.parquet:1",
        "part-1.parquet:0",
        "part-1.parquet:1",
    ]
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
    # a file without the text column counts as its rows (the footer's count); one that cannot be opened,
    # whose rows are unknown, as one record
    assert [(r["source"], r["position"]) for r in rej.to_pylist()] == [
        ("a.parquet", 1),
        ("b.parquet", 0),
        ("c.parquet", -1),
    ]
    assert rej.column("reason")[1].as_py().startswith("row 0: the whole file is rejected: no column 'text'")
    assert "cannot open Parquet file" in rej.column("reason")[2].as_py()


def test_truncated_gzip_is_a_rejected_record(tmp_path):
    blob = gzip.compress(b"".join(json.dumps({"text": f"document {i} " * 20}).encode() + b"\n" for i in range(200)))
    (tmp_path / "a.jsonl.gz").write_bytes(blob[: len(blob) // 2])
    docs, rej = read_all(tmp_path)
    # whatever was complete before the cut is kept; the rest is one record at the next line, saying where
    assert 0 < docs.num_rows < 200
    assert [(r["source"], r["position"]) for r in rej.to_pylist()] == [("a.jsonl.gz", docs.num_rows + 1)]
    n = docs.num_rows
    assert (
        rej.column("reason")[0]
        .as_py()
        .startswith(
            f"line {n + 1}: cannot read the file past line {n} ({n} records read before it): the reading ended at "
            f"byte {len(blob) // 2:,} of {len(blob) // 2:,} of the file, after "
        )
    )


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
    write_jsonl(
        src / "b.jsonl", [{"id": f"d{i:02d}", "text": f"document number {i}"} for i in range(25, 40)] + ["{broken"]
    )
    return src


def run_ingest(src: Path, out: Path, **kw) -> tuple[dict, list[str]]:
    batch_size = kw.pop("batch_size", 1024)
    out.mkdir(parents=True)
    stats = ingest(ReaderConfig(str(src), id_field="id", batch_size=batch_size, **kw), out)
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
def test_ingest_rejects_bad_fraction(forty_docs, fraction):
    with pytest.raises(ValueError, match="sample_fraction must be in"):
        ReaderConfig(str(forty_docs), sample_fraction=fraction)


# ---------------------------------------------------------------------------------------------
# label_field


def test_label_field_jsonl_and_parquet(tmp_path):
    from largetrain_core.corpus import LABELLED_DOC_SCHEMA

    d = tmp_path / "c"
    d.mkdir()
    write_jsonl(
        d / "a.jsonl",
        [
            {"text": "one", "y": "pos"},
            {"text": "two"},
            {"text": "three", "y": 1},
            {"text": "four", "y": None},
            {"text": "five", "y": True},
        ],
    )
    pq.write_table(pa.table({"text": ["six", "seven"], "y": [3, None]}), d / "b.parquet")
    pq.write_table(pa.table({"text": ["eight"]}), d / "c.parquet")  # no label column: null
    (d / "d.txt").write_text("nine")  # text files carry no label
    docs, rej = read_all(d, label_field="y")
    assert rej.num_rows == 0 and docs.schema == LABELLED_DOC_SCHEMA
    assert docs.column("text").to_pylist() == ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    assert docs.column("label").to_pylist() == ["pos", None, "1", None, "true", "3", None, None, None]
    # without label_field the schema is unchanged and the field is ignored
    docs, _ = read_all(d)
    assert docs.schema == DOC_SCHEMA


def labelled_corpus(d):
    """One JSONL and one Parquet file of labelled records: good ones, and each fault of a label."""
    d.mkdir()
    write_jsonl(
        d / "a.jsonl",
        [
            {"text": "one", "y": "pos"},
            {"text": "two"},  # line 2: no label
            {"text": "three", "y": "neg"},
            {"text": "four", "y": None},  # line 4: null label
            {"text": "five", "y": "maybe"},  # line 5: outside the set
            {"text": "six", "y": "  "},  # line 6: empty label
        ],
    )
    pq.write_table(pa.table({"text": ["seven", "eight", "nine"], "y": ["neg", None, "other"]}), d / "b.parquet")
    return d


def test_declared_label_set_rejects_missing_and_unknown_labels(tmp_path):
    d = labelled_corpus(tmp_path / "c")
    docs, rej = read_all(d, label_field="y", labels=["pos", "neg"])
    assert docs.column("text").to_pylist() == ["one", "three", "seven"]
    assert docs.column("label").to_pylist() == ["pos", "neg", "neg"]
    assert list(zip(rej.column("source").to_pylist(), rej.column("position").to_pylist())) == [
        ("a.jsonl", 2),
        ("a.jsonl", 4),
        ("a.jsonl", 5),
        ("a.jsonl", 6),
        ("b.parquet", 1),
        ("b.parquet", 2),
    ]
    assert rej.column("reason").to_pylist() == [
        "line 2: no label: field 'y' is missing or null",
        "line 4: no label: field 'y' is missing or null",
        "line 5: label 'maybe' is not in the declared label set ['pos', 'neg']",
        "line 6: no label: field 'y' is empty ('  ')",
        "row 1: no label: field 'y' is missing or null",
        "row 2: label 'other' is not in the declared label set ['pos', 'neg']",
    ]


def test_require_label_rejects_unlabelled_records_and_keeps_any_label(tmp_path):
    d = labelled_corpus(tmp_path / "c")
    docs, rej = read_all(d, label_field="y", require_label=True)
    assert docs.column("label").to_pylist() == ["pos", "neg", "maybe", "neg", "other"]
    assert [r.split(":")[0] for r in rej.column("reason").to_pylist()] == ["line 2", "line 4", "line 6", "row 1"]
    docs, rej = read_all(d, label_field="y")  # neither set: unlabelled records kept with a null label
    assert rej.num_rows == 0 and docs.column("label").to_pylist().count(None) == 3


def test_rejected_labels_go_to_rejected_parquet_and_count_against_max_rejected_fraction(tmp_path):
    from largetrain_core.corpus import rejection_error

    d = labelled_corpus(tmp_path / "c")
    out = tmp_path / "raw"
    out.mkdir()
    config = ReaderConfig(str(d), label_field="y", labels=["pos", "neg"])
    stats = ingest(config, out)
    assert (stats["documents"], stats["rejected"]) == (3, 6)
    stored = pq.read_table(out / "rejected.parquet")
    assert (
        stored.column("reason").to_pylist()[2]
        == "line 5: label 'maybe' is not in the declared label set ['pos', 'neg']"
    )
    error = rejection_error(stats, config, out / "rejected.parquet")
    assert "6 of 9 records rejected" in error and "label 'maybe' is not in the declared label set" in error


def test_label_rules_enter_raw_corpus_versions_only_when_set():
    from largetrain_core.stages.raw_corpus import settings_version

    plain = settings_version(ReaderConfig(path="x", label_field="y"))
    assert "labels" not in plain and "require_label" not in plain  # corpora read before the rules keep their versions
    ruled = settings_version(ReaderConfig(path="x", label_field="y", labels=["a", "b"], require_label=True))
    assert (ruled["labels"], ruled["require_label"]) == (["a", "b"], True)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"labels": ["a", "b"]}, "need label_field"),
        ({"require_label": True}, "need label_field"),
        ({"label_field": "y", "labels": ["a", "a"]}, "distinct non-empty"),
        ({"label_field": "y", "labels": []}, "distinct non-empty"),
        ({"label_field": "y", "labels": ["a", " "]}, "distinct non-empty"),
    ],
)
def test_label_rules_are_checked(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        ReaderConfig(str(tmp_path), **kw)


def test_label_column_survives_clean_and_dedup(tmp_path):
    from largetrain_core.clean import QualityConfig, clean_corpus
    from largetrain_core.dedup import deduplicate

    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {"text": "same words here", "y": "a"},
            {"text": "same words here", "y": "b"},
            {"text": "other words there", "y": "c"},
        ],
    )
    raw, clean, dedup = (tmp_path / n for n in ("raw", "clean", "dedup"))
    for p in (raw, clean, dedup):
        p.mkdir()
    ingest(ReaderConfig(str(src), label_field="y"), raw)
    off = {
        k: None
        for k in (
            "min_words",
            "max_words",
            "min_mean_word_length",
            "max_mean_word_length",
            "max_hash_word_ratio",
            "max_ellipsis_word_ratio",
            "max_bullet_lines_ratio",
            "max_ellipsis_lines_ratio",
            "min_alpha_word_fraction",
            "min_stop_words",
        )
    }
    clean_corpus(raw, clean, QualityConfig(**off, language_id=False, redact_pii=False))  # no columns of their own
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
    for name in ("a.txt", "B.TXT", "c.json", "d.csv.gz", "e.markdown", ".gitignore"):
        (src / name).write_text("some words in a file\n")
    real = tmp_path / "elsewhere"
    real.mkdir()
    (real / "f.md").write_text("a linked directory's file\n")
    (src / "linked").symlink_to(real, target_is_directory=True)
    (real / "loop").symlink_to(src, target_is_directory=True)  # a cycle ends: each real directory once

    listed = scan(src)
    files, skipped = listed.files, listed.skipped
    assert [f.relative_to(src).as_posix() for f in files] == ["B.TXT", "a.txt", "linked/f.md"]
    assert sorted(f.name for f in skipped) == [".gitignore", "c.json", "d.csv.gz", "e.markdown"]
    out = tmp_path / "raw"
    out.mkdir()
    stats = ingest(ReaderConfig(str(src)), out)
    assert (stats["files"], stats["documents"], stats["skipped_files"]) == (3, 3, 4)
    assert sorted((out / "skipped_files.txt").read_text().split()) == [".gitignore", "c.json", "d.csv.gz", "e.markdown"]
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
        docs = pa.concat_tables(
            [
                b.documents
                for i in range(partitions)
                for b in read_corpus(ReaderConfig(str(src), partition=i, partitions=partitions))
            ]
        )
        rej = pa.concat_tables(
            [
                b.rejected
                for i in range(partitions)
                for b in read_corpus(ReaderConfig(str(src), partition=i, partitions=partitions))
            ]
        )
        assert docs.column("doc_id").to_pylist() == ["good.txt"]
        assert rej.column("source").to_pylist() == ["caf\\xe9.txt"]
        assert (
            rej.column("position").to_pylist() == [-1]
            and "file name is not valid UTF-8" in rej.column("reason")[0].as_py()
        )


# ---------------------------------------------------------------------------------------------
# a file's format: decided in one place (largetrain_core.readers) for listing, partitioning, skipping, reading


def test_upper_case_compressed_suffixes_are_read_as_jsonl(cases, tmp_path):
    docs, rej = read_all(cases / "upper_case_suffixes")
    assert rej.num_rows == 0
    assert docs.column("source").to_pylist() == ["A.JSONL.GZ"] * 3 + ["B.JSONL.ZST"] * 3
    stats = ingest(ReaderConfig(str(cases / "upper_case_suffixes")), tmp_path)
    assert (stats["documents"], stats["rejected"], stats["files"], stats["skipped_files"]) == (6, 0, 2, 0)


def _jsonl_bytes(texts):
    return "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()


ZSTD = zstandard.ZstdCompressor().compress
WRITTEN = {  # file name -> (its bytes, the texts read from it)
    "plain.jsonl": (_jsonl_bytes(["p1", "p2"]), ["p1", "p2"]),
    "upper.JSONL.GZ": (gzip.compress(_jsonl_bytes(["u1"])), ["u1"]),
    "mixed.Jsonl.Zst": (ZSTD(_jsonl_bytes(["m1"])), ["m1"]),
    "compound.json.gz": (gzip.compress(_jsonl_bytes(["c1"])), ["c1"]),
    "lines.NDJSON.zst": (ZSTD(_jsonl_bytes(["n1"])), ["n1"]),
    "notes.TXT.GZ": (gzip.compress(b"a gzip text file"), ["a gzip text file"]),
    "page.md.zst": (ZSTD("a zstd markdown file \u00e9".encode()), ["a zstd markdown file \u00e9"]),
    "named.jsonl.gz": (_jsonl_bytes(["not compressed after all"]), ["not compressed after all"]),  # magic decides
    "hidden.jsonl": (gzip.compress(_jsonl_bytes(["gzip under a plain name"])), ["gzip under a plain name"]),
    "table.csv.gz": (gzip.compress(b"a,b\n1,2\n"), None),  # no reader: skipped
    "array.json": (b'[{"text": "a JSON array"}]', None),  # .json is not JSON Lines: skipped
}


@pytest.mark.parametrize("partitions", [1, 3])
def test_every_compressed_and_compound_name_is_listed_partitioned_and_read_alike(tmp_path, partitions):
    from largetrain_core.corpus import scan

    for name, (data, _) in WRITTEN.items():
        (tmp_path / name).write_bytes(data)
    read, skipped = {}, []
    for p in range(partitions):
        listed = scan(tmp_path, p, partitions)
        assert all(s.piece is None for s in listed.sources)  # several files: hash partitions of whole files
        skipped += [f.name for f in listed.skipped]
        docs, rej = read_all(tmp_path, partition=p, partitions=partitions)
        assert rej.num_rows == 0
        for source, text in zip(docs.column("source").to_pylist(), docs.column("text").to_pylist()):
            read.setdefault(source, []).append(text)
    assert read == {n: texts for n, (_, texts) in WRITTEN.items() if texts is not None}
    assert sorted(skipped) == ["array.json", "table.csv.gz"]


def test_a_gzip_stream_under_a_plain_jsonl_name_is_read_by_its_magic_bytes(cases, tmp_path):
    docs, rej = read_all(cases / "misnamed_compressed")
    assert rej.num_rows == 0
    sources = docs.column("source").to_pylist()
    assert (sources.count("archive_part.jsonl"), sources.count("good.jsonl")) == (400, 3)
    assert docs.column("doc_id").to_pylist()[:2] == ["z0", "z1"]
    assert len(set(docs.column("doc_id").to_pylist())) == 403
    # a compressed single file is never split: one partition holds it whole
    per = [
        read_all(cases / "misnamed_compressed" / "archive_part.jsonl", partition=p, partitions=3)[0].num_rows
        for p in range(3)
    ]
    assert sorted(per) == [0, 0, 400]


def test_a_binary_file_under_a_jsonl_name_is_rejected_as_a_whole_counting_its_lines(tmp_path):
    from largetrain_core.readers import UNREADABLE_PREFIX

    rng = random.Random(0)
    noise = bytes(rng.randrange(256) for _ in range(200_000))
    (tmp_path / "noise.jsonl").write_bytes(noise)
    (tmp_path / "three_bad.jsonl").write_text("not json\n[1]\n\n{}\n")
    docs, rej = read_all(tmp_path)
    assert docs.num_rows == 0
    # every non-blank line is one rejected record, with the file's reason (max_rejected_fraction counts lines)
    lines = noise.split(b"\n")
    lines = [n + 1 for n, line in enumerate(lines) if line.strip() and (n + 1 < len(lines) or line)]
    got = rej.to_pylist()
    assert [(r["source"], r["position"]) for r in got] == [("noise.jsonl", n) for n in lines] + [
        ("three_bad.jsonl", n) for n in (1, 2, 4)
    ]
    assert got[0]["reason"].startswith(
        f"line {lines[0]}: the whole file is rejected: no readable JSON line: {UNREADABLE_PREFIX} unreadable lines "
        "(not parsed further)"
    )
    assert len({r["reason"].split(": ", 1)[1] for r in got if r["source"] == "noise.jsonl"}) == 1
    assert got[-1]["reason"].startswith(
        "line 4: the whole file is rejected: no readable JSON line: 3 unreadable lines, the first: line 1: invalid JSON"
    )


def test_unreadable_lines_after_a_readable_one_are_rejected_one_by_one(tmp_path):
    bad = ["{broken"] * 150
    write_jsonl(tmp_path / "a.jsonl", [{"text": "first"}] + bad + [{"text": "last"}])
    write_jsonl(tmp_path / "b.jsonl", ["{broken"] * 2 + [{"text": "third line"}])
    docs, rej = read_all(tmp_path)
    assert docs.column("text").to_pylist() == ["first", "last", "third line"]
    assert [(r["source"], r["position"]) for r in rej.to_pylist()] == (
        [("a.jsonl", i) for i in range(2, 152)] + [("b.jsonl", 1), ("b.jsonl", 2)]
    )


def test_the_failure_message_names_the_files_that_caused_the_rejections(tmp_path):
    from largetrain_core.corpus import rejection_error

    src = tmp_path / "src"
    src.mkdir()
    write_jsonl(src / "good.jsonl", [{"text": f"doc {i}"} for i in range(10)])
    write_jsonl(src / "half.jsonl", [{"text": "ok"}, "{bad", "{bad"])
    (src / "latin1.txt").write_bytes(b"caf\xe9")
    out = tmp_path / "raw"
    out.mkdir()
    cfg = ReaderConfig(str(src))
    stats = ingest(cfg, out)
    assert stats["rejected_by_file"] == {"half.jsonl": 2, "latin1.txt": 1}
    msg = rejection_error(stats, cfg)
    assert msg == (
        "3 of 14 records rejected, more than max_rejected_fraction=0.05; by file: half.jsonl (2), latin1.txt (1)"
    )
    assert rejection_error(stats, cfg, out / "rejected.parquet") == msg + (
        ". Top reasons: 2 x invalid JSON: Expecting property name enclosed in double quotes at column 2 (first: "
        "half.jsonl:2); 1 x invalid UTF-8 at byte 3: unexpected end of data (first: latin1.txt)."
    )
    assert rejection_error(stats, ReaderConfig(str(src), max_rejected_fraction=0.25)) is None


# ---------------------------------------------------------------------------------------------
# bad values inside columnar files: a rejected record per bad row, the rest kept


def test_parquet_invalid_utf8_case_two_documents_one_rejected_row(cases):
    docs, rej = read_all(cases / "parquet_invalid_utf8.parquet")
    assert docs.column("text").to_pylist() == ["first fine document", "third fine document"]
    assert docs.column("doc_id").to_pylist() == ["parquet_invalid_utf8.parquet:0", "parquet_invalid_utf8.parquet:2"]
    assert rej.to_pylist() == [
        {
            "source": "parquet_invalid_utf8.parquet",
            "position": 1,
            "reason": "row 1: text: invalid UTF-8 at byte 3: invalid continuation byte",
        }
    ]


RAW_VALUES = [b"good one", b"caf\xe9 latin-1", None, b"good two"]


def _text_array(layout: str) -> pa.Array:
    """RAW_VALUES as ``layout``; the string layouts hold the invalid bytes unvalidated, as a writer may."""
    binary = pa.array(RAW_VALUES, pa.binary())
    if layout == "binary":
        return binary
    if layout == "large_binary":
        return binary.cast(pa.large_binary())
    string = pa.Array.from_buffers(pa.string(), len(binary), binary.buffers(), null_count=binary.null_count)
    if layout == "string":
        return string
    if layout == "large_string":
        large = binary.cast(pa.large_binary())
        return pa.Array.from_buffers(pa.large_string(), len(large), large.buffers(), null_count=large.null_count)
    if layout == "dictionary":
        values = pa.array([b"good one", b"caf\xe9 latin-1", b"good two"], pa.binary())
        dictionary = pa.Array.from_buffers(pa.string(), 3, values.buffers())
        return pa.DictionaryArray.from_arrays(pa.array([0, 1, None, 2], pa.int32()), dictionary)
    raise ValueError(layout)


LAYOUTS = ["string", "large_string", "dictionary", "binary", "large_binary"]


@pytest.mark.parametrize("dictionary_pages", [False, True], ids=["plain_pages", "dictionary_pages"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_parquet_layout_keeps_good_rows_and_rejects_bad_ones(tmp_path, layout, dictionary_pages):
    ids = pa.Array.from_buffers(pa.string(), 4, pa.array([b"i0", b"i1", b"i2", b"\xff"], pa.binary()).buffers())
    pq.write_table(
        pa.table({"text": _text_array(layout), "id": ids, "other": [1, 2, 3, 4]}),
        tmp_path / "t.parquet",
        use_dictionary=dictionary_pages,
    )
    docs, rej = read_all(tmp_path / "t.parquet")
    assert docs.column("text").to_pylist() == ["good one"] and docs.column("doc_id").to_pylist() == ["i0"]
    assert [(r["position"], r["reason"]) for r in rej.to_pylist()] == [
        (1, "row 1: text: invalid UTF-8 at byte 3: invalid continuation byte"),
        (2, "row 2: text is null"),
        (3, "row 3: id: invalid UTF-8 at byte 0: invalid start byte"),
    ]


def test_a_text_column_that_is_not_text_rejects_each_row(tmp_path):
    pq.write_table(pa.table({"text": [1, 2, 3]}), tmp_path / "numbers.parquet")
    docs, rej = read_all(tmp_path)
    assert docs.num_rows == 0
    why = "the whole file is rejected: column 'text' is int64, not a string or binary column"
    assert rej.to_pylist() == [
        {"source": "numbers.parquet", "position": r, "reason": f"row {r}: {why}"} for r in range(3)
    ]


# ---------------------------------------------------------------------------------------------
# identifiers: one fallback for null, empty and missing ids; unique within a corpus


def test_null_empty_and_missing_ids_get_the_same_fallback(cases, tmp_path):
    docs, rej = read_all(cases / "null_ids.jsonl")  # the records' "id" field is used by default
    assert rej.num_rows == 0
    ids = docs.column("doc_id").to_pylist()
    assert ids == ["null_ids.jsonl:1", "null_ids.jsonl:2", "a1", "null_ids.jsonl:4"]
    assert "None" not in ids and len(set(ids)) == 4
    write_jsonl(
        tmp_path / "e.jsonl",
        [
            {"id": "", "text": "empty id"},
            {"id": 7, "text": "number id"},
            {"id": None, "text": "null id"},
            {"text": "no id"},
        ],
    )
    pq.write_table(pa.table({"text": ["a", "b", "c"], "id": ["", None, "x"]}), tmp_path / "p.parquet")
    docs, _ = read_all(tmp_path)
    assert docs.column("doc_id").to_pylist() == [
        "e.jsonl:1",
        "7",
        "e.jsonl:3",
        "e.jsonl:4",
        "p.parquet:0",
        "p.parquet:1",
        "x",
    ]
    # id_field null: always the file and position, whatever the records hold
    docs, _ = read_all(cases / "null_ids.jsonl", id_field=None)
    assert docs.column("doc_id").to_pylist() == [f"null_ids.jsonl:{i}" for i in (1, 2, 3, 4)]


def test_a_repeated_id_is_renamed_and_counted(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    write_jsonl(
        src / "a.jsonl", [{"id": "x", "text": "one"}, {"id": "x", "text": "two"}, {"id": "a.txt", "text": "three"}]
    )
    pq.write_table(pa.table({"text": ["four"], "id": ["x"]}), src / "b.parquet")
    (src / "a.txt").write_text("five: a text file named like an earlier record's id")
    out = tmp_path / "raw"
    out.mkdir()
    stats = ingest(ReaderConfig(str(src)), out)
    ids = pl.read_parquet(out / "part-00000.parquet")["doc_id"].to_list()
    assert ids == ["x", "x@a.jsonl:2", "a.txt", "a.txt@a.txt", "x@b.parquet:0"]  # files in sorted order
    assert stats["renamed_ids"] == 3
    assert pl.read_parquet(out / "renamed_ids.parquet").rows() == [
        ("x@a.jsonl:2", "x", "a.jsonl", 2),
        ("a.txt@a.txt", "a.txt", "a.txt", 0),
        ("x@b.parquet:0", "x", "b.parquet", 0),
    ]


def test_ids_repeating_across_partitions_are_found(tmp_path):
    from largetrain_core.corpus import duplicate_ids, partition_of

    src = tmp_path / "src"
    src.mkdir()
    names = [f"f{i}.jsonl" for i in range(20)]
    by_part = {}
    for n in names:
        by_part.setdefault(partition_of(n, 2), []).append(n)
    first, second = by_part[0][0], by_part[1][0]
    for n in names:
        write_jsonl(src / n, [{"id": "shared" if n in (first, second) else n, "text": n}])
    dirs = []
    for p in range(2):
        dirs.append(tmp_path / f"p{p}")
        dirs[-1].mkdir()
        ingest(ReaderConfig(str(src), partition=p, partitions=2), dirs[-1])
    repeated, clash = duplicate_ids(dirs, ["000", "001"])
    assert repeated == 1 and clash.rows() == [("shared", [f"000: {first}", f"001: {second}"])]
    assert duplicate_ids(dirs[:1], ["000"])[0] == 0


def test_ids_repeating_across_partitions_are_found_in_any_number_of_hash_ranges(tmp_path):
    from largetrain_core.corpus import duplicate_ids

    dirs = []
    for p, ids in enumerate([[f"a{i}" for i in range(40)] + ["x", "y"], ["y", "b", "x", "a3"], ["a3", "c"]]):
        src = tmp_path / f"src{p}"
        src.mkdir()
        write_jsonl(src / f"f{p}.jsonl", [{"id": i, "text": i} for i in ids])
        dirs.append(tmp_path / f"p{p}")
        dirs[-1].mkdir()
        ingest(ReaderConfig(str(src), batch_size=7), dirs[-1])  # several part files per partition
    expected = [
        ("a3", ["0: f0.jsonl", "1: f1.jsonl", "2: f2.jsonl"]),
        ("x", ["0: f0.jsonl", "1: f1.jsonl"]),
        ("y", ["0: f0.jsonl", "1: f1.jsonl"]),
    ]  # in corpus order of their first occurrence
    for rows_per_pass in (1, 4, 1 << 22):  # 64, 16 and 1 hash ranges
        repeated, clash = duplicate_ids(dirs, ["0", "1", "2"], rows_per_pass=rows_per_pass, spill_dir=tmp_path)
        assert repeated == 3 and clash.rows() == expected
        assert duplicate_ids(dirs, ["0", "1", "2"], examples=2, rows_per_pass=rows_per_pass)[1].rows() == expected[:2]
    assert not list(tmp_path.glob("hash-ranges-*"))


# ---------------------------------------------------------------------------------------------
# a corpus of one large file spreads over the partitions


def test_one_uncompressed_jsonl_file_is_split_at_line_boundaries(tmp_path):
    from largetrain_core.corpus import fingerprint, scan

    rng = random.Random(1)
    lines = []
    for i in range(300):
        if i % 37 == 5:
            lines.append("{broken")
        elif i % 41 == 7:
            lines.append("")
        else:
            lines.append(json.dumps({"text": f"doc {i} " + "\u00e9\u6f22" * rng.randrange(0, 200)}, ensure_ascii=False))
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n")
    whole, whole_rej = read_all(path)
    assert whole.num_rows == 300 - 8 - 8 and whole_rej.num_rows == 8
    for n in (2, 3, 7):
        assert all(s.piece == (p, n) for p in range(n) for s in scan(path, p, n).sources)
        parts = [read_all(path, partition=p, partitions=n) for p in range(n)]
        assert all(d.num_rows for d, _ in parts)
        assert [i for d, _ in parts for i in d.column("doc_id").to_pylist()] == whole.column("doc_id").to_pylist()
        assert [t for d, _ in parts for t in d.column("text").to_pylist()] == whole.column("text").to_pylist()
        assert [r for _, j in parts for r in j.to_pylist()] == whole_rej.to_pylist()
        assert (
            len({fingerprint(path, p, n) for p in range(n)}) == 1
        )  # the file's content; the partition is in the version


def test_one_parquet_file_is_split_by_row_groups(tmp_path):
    path = tmp_path / "one.parquet"
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(95)]}), path, row_group_size=10)
    whole, _ = read_all(path)
    parts = [read_all(path, partition=p, partitions=4)[0] for p in range(4)]
    assert [d.num_rows for d in parts] == [20, 30, 20, 25]  # row groups [0, 2), [2, 5), [5, 7), [7, 10)
    assert [i for d in parts for i in d.column("doc_id").to_pylist()] == whole.column("doc_id").to_pylist()
    assert parts[3].column("doc_id").to_pylist()[0] == "one.parquet:70"


def test_compressed_and_text_single_files_stay_whole(tmp_path):
    (tmp_path / "z").mkdir()
    (tmp_path / "z" / "c.jsonl.gz").write_bytes(gzip.compress(_jsonl_bytes([f"d{i}" for i in range(50)])))
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "one.txt").write_text("a single text file is one document\n" * 100)
    for corpus, rows in (("z", 50), ("t", 1)):
        per = [read_all(tmp_path / corpus, partition=p, partitions=3)[0].num_rows for p in range(3)]
        assert sorted(per) == [0, 0, rows]


# ---------------------------------------------------------------------------------------------
# Arrow IPC files (Hugging Face datasets' .arrow files are the stream format)


@pytest.mark.parametrize("fmt", ["stream", "file"])
def test_arrow_ipc_files_are_read_like_parquet(tmp_path, fmt):
    text = pa.chunked_array([_text_array("large_string").slice(0, 2), pa.array(["three", "four"], pa.large_string())])
    table = pa.table({"text": text, "id": ["a", "b", None, "d"], "y": [1, 2, 3, 4]})
    name = "data-00000-of-00001.arrow" if fmt == "stream" else "TABLE.ARROW"
    with pa.OSFile(str(tmp_path / name), "wb") as sink:
        open_writer = pa.ipc.new_stream if fmt == "stream" else pa.ipc.new_file
        with open_writer(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=2):
                writer.write_batch(batch)
    (tmp_path / "broken.arrow").write_bytes(b"ARROW1 but nothing after")
    docs, rej = read_all(tmp_path, label_field="y")
    assert docs.column("doc_id").to_pylist() == ["a", f"{name}:2", "d"]
    assert docs.column("text").to_pylist() == ["good one", "three", "four"]
    assert docs.column("label").to_pylist() == ["1", "3", "4"]
    got = {(r["source"], r["position"]): r["reason"] for r in rej.to_pylist()}
    assert got.keys() == {("broken.arrow", -1), (name, 1)}
    assert got[(name, 1)] == "row 1: text: invalid UTF-8 at byte 3: invalid continuation byte"
    assert got[("broken.arrow", -1)].startswith("cannot open Arrow IPC file")


def test_holds_records_is_false_only_for_a_corpus_of_nothing(cases, tmp_path):
    """raw_corpus warns at once on a corpus that holds no record (tests/cases/empty_corpus)."""
    from largetrain_core.corpus import holds_records

    assert not holds_records(cases / "empty_corpus")
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "blank.jsonl.gz").write_bytes(gzip.compress(b"\n \r\n\t\n" * 50_000))
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), corpus / "none.parquet")
    assert not holds_records(corpus)
    (corpus / "late.txt").write_bytes(b" " * 200_000 + b"x")  # content past the first block
    assert holds_records(corpus)
