"""Issue 42 item 5: rows that vanish by the file (tests/cases/parquet_text_shapes, README row).

A file rejected as a whole counts as its rows (Parquet: the footer's; Arrow: its record batches'; JSONL:
its non-blank lines) against max_rejected_fraction; a null-typed text column is null texts rejected per
row; a list of strings is one document, joined by a blank line; a struct's text is reached by a dotted
text_field; a cut stream says how many records were read and at which byte it ended."""

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from helpers.corpora import read_all
from largetrain_core.corpus import ingest, rejection_error
from largetrain_core.readers import LIST_SEPARATOR, ReaderConfig


def _ingest(path: Path, out: Path, **kw) -> tuple[dict, ReaderConfig]:
    out.mkdir(parents=True)
    config = ReaderConfig(str(path), **kw)
    return ingest(config, out), config


def _rows(path: Path) -> int:
    return pq.ParquetFile(path).metadata.num_rows


def test_parquet_text_shapes_every_row_counted_and_the_run_fails_naming_the_files(cases, tmp_path):
    d = cases / "parquet_text_shapes"
    stats, config = _ingest(d, tmp_path / "raw")
    docs = pq.read_table(tmp_path / "raw" / "part-00000.parquet").to_pylist()
    rej = pq.read_table(tmp_path / "raw" / "rejected.parquet").to_pylist()
    # every row of every file is a document or a rejected record (the footers' counts)
    assert stats["documents"] + stats["rejected"] == sum(_rows(f) for f in d.glob("*.parquet")) == 750
    assert stats["rejected_by_file"] == {
        "all_null.parquet": 200,
        "wrapped_struct.parquet": 120,
        "other_column.parquet": 80,
    }
    # the list of paragraphs is one document per row, joined by a blank line
    listed = [r for r in docs if r["source"] == "paragraphs_list.parquet"]
    assert len(listed) == 300 and sum(r["source"] == "good.parquet" for r in docs) == 50
    first = pq.read_table(d / "paragraphs_list.parquet").column("text")[0].as_py()
    assert listed[0]["text"] == LIST_SEPARATOR.join(first) == "paragraph one of record 0.\n\nparagraph two of record 0."
    # the null-typed column: each row rejected as null text
    nulls = [r for r in rej if r["source"] == "all_null.parquet"]
    assert [r["position"] for r in nulls] == list(range(200))
    assert {r["reason"].split(": ", 1)[1] for r in nulls} == {"text is null"}
    struct = [r for r in rej if r["source"] == "wrapped_struct.parquet"]
    assert struct[0]["reason"] == (
        "row 0: the whole file is rejected: column 'text' is struct<body: string, lang: string>, not a string or "
        "binary column; set raw_corpus text_field to one of its string fields: text.body, text.lang"
    )
    message = rejection_error(stats, config, tmp_path / "raw" / "rejected.parquet")
    assert message.startswith(
        "400 of 750 records rejected, more than max_rejected_fraction=0.05; by file: all_null.parquet (200), "
        "wrapped_struct.parquet (120), other_column.parquet (80). "
        "2 files rejected as a whole, counted as 200 records (each row or line of such a file is one). "
    )


def test_a_dotted_text_field_reaches_a_structs_text(cases):
    docs, rej = read_all(
        cases / "parquet_text_shapes" / "wrapped_struct.parquet", text_field="text.body", id_field="id"
    )
    assert rej.num_rows == 0
    assert docs.column("text").to_pylist() == [f"struct body {i}" for i in range(120)]
    assert docs.column("doc_id").to_pylist()[:2] == ["s0", "s1"]


def test_the_same_shapes_in_arrow_and_jsonl(tmp_path):
    """Every reader: a struct through a dotted name, a list joined, a null struct or list a null text,
    a null-typed column rejected per row, a JSON object and array alike."""
    table = pa.table(
        {
            "doc": pa.array([{"body": "b0"}, None, {"body": "b2"}], pa.struct([("body", pa.string())])),
            "paras": pa.array([["p", None, "q"], None, []], pa.list_(pa.string())),
            "nothing": pa.nulls(3),
        }
    )
    with pa.ipc.new_file(tmp_path / "t.arrow", table.schema) as w:
        w.write_table(table)
    (tmp_path / "t.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in table.to_pylist()) + json.dumps({"doc": "flat", "paras": [1]}) + "\n"
    )
    for name, rows in (("t.arrow", 3), ("t.jsonl", 4)):
        docs, rej = read_all(tmp_path / name, text_field="doc.body")
        assert docs.column("text").to_pylist() == ["b0", "b2"], name
        assert [r["position"] for r in rej.to_pylist()] == ([1] if rows == 3 else [2, 4]), name
        docs, rej = read_all(tmp_path / name, text_field="paras")
        assert docs.column("text").to_pylist() == ["p\n\nq", ""], name
        assert docs.num_rows + rej.num_rows == rows
    docs, rej = read_all(tmp_path / "t.arrow", text_field="nothing")
    assert docs.num_rows == 0 and [r["reason"] for r in rej.to_pylist()] == [f"row {i}: text is null" for i in range(3)]


def test_a_whole_file_rejection_weighs_its_lines_against_max_rejected_fraction(tmp_path):
    """100 good records and a file of 10 records without the text field: 10 of 110 rejected fails a
    run at 5 % (as one record of 101 it passed)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "good.jsonl").write_text("".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(100)))
    (corpus / "wrong.jsonl").write_text("".join(json.dumps({"body": f"other {i}"}) + "\n" for i in range(10)))
    stats, config = _ingest(corpus, tmp_path / "raw")
    assert (stats["documents"], stats["rejected"]) == (100, 10)
    message = rejection_error(stats, config, tmp_path / "raw" / "rejected.parquet")
    assert message.startswith(
        "10 of 110 records rejected, more than max_rejected_fraction=0.05; by file: wrong.jsonl (10). "
    )
    assert "1 file rejected as a whole, counted as 10 records" in message


def test_a_cut_gzip_text_file_says_at_which_byte_it_ended(tmp_path):
    blob = gzip.compress(" ".join(f"word{i * 7919 % 10007}" for i in range(20000)).encode())
    (tmp_path / "a.txt.gz").write_bytes(blob[: len(blob) // 2])
    docs, rej = read_all(tmp_path)
    (r,) = rej.to_pylist()
    assert docs.num_rows == 0 and r["position"] > 0
    assert r["reason"].startswith(
        f"cannot read the file past byte {r['position']:,} of its text: the reading ended at byte "
        f"{len(blob) // 2:,} of {len(blob) // 2:,} of the file: EOFError: "
    )
