"""Issue 23 items 1 and 2: a record the parser cannot take is one rejected record, in every reader, and
the counts add up to every record read; UTF-16 is decoded (by byte-order mark or byte pattern) and
counted, never kept as garbage; text that is mostly control characters is rejected.

The handed cases (tests/cases/README.md): deep_nesting.jsonl, huge_integer.jsonl, utf16_text/."""

import gzip
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from helpers.corpora import read_all
from largetrain_core.corpus import ingest, scan
from largetrain_core.readers import Collector, Reader, ReaderConfig, Source, detect_utf16, read_source


def _ingest(path: Path, out: Path, **kw) -> dict:
    out.mkdir(parents=True)
    return ingest(ReaderConfig(str(path), **kw), out)


def _lines(path: Path) -> int:
    return len(path.read_bytes().splitlines())


# ---------------------------------------------------------------------------------------------
# item 1: a line the parser cannot take


def test_deep_nesting_is_one_rejected_record_and_nothing_else_is_lost(cases, tmp_path):
    docs, rej = read_all(cases / "deep_nesting.jsonl")
    assert docs.column("doc_id").to_pylist() == ["a1", "a2", "a4", "a5"]
    assert rej.to_pylist() == [
        {
            "source": "deep_nesting.jsonl",
            "position": 3,
            "reason": "line 3: cannot parse the JSON: nested too deeply for the parser (RecursionError)",
        }
    ]
    stats = _ingest(cases / "deep_nesting.jsonl", tmp_path / "raw")
    assert (stats["documents"], stats["rejected"], stats["blank_lines"]) == (4, 1, 0)
    assert stats["documents"] + stats["rejected"] + stats["blank_lines"] == _lines(cases / "deep_nesting.jsonl")


def test_huge_integer_is_one_rejected_record_and_the_lines_after_it_are_read(cases, tmp_path):
    docs, rej = read_all(cases / "huge_integer.jsonl")
    assert docs.column("doc_id").to_pylist() == ["b1", "b2", "b4", "b5", "b6"]
    (r,) = rej.to_pylist()
    assert (r["source"], r["position"]) == ("huge_integer.jsonl", 3)
    assert r["reason"] == (
        "line 3: cannot parse the JSON: ValueError: Exceeds the limit (4300 digits) for integer "
        "string conversion: value has 10000 digits"
    )  # Python's advice to raise the limit left out
    stats = _ingest(cases / "huge_integer.jsonl", tmp_path / "raw")
    assert stats["documents"] + stats["rejected"] + stats["blank_lines"] == _lines(cases / "huge_integer.jsonl") == 6


def _faulty_lines(n: int = 40) -> list[str]:
    """``n`` JSONL lines, every fifth one a parser fault (deep nesting, a huge integer, alternately),
    every seventh blank."""
    out = []
    for i in range(n):
        if i % 7 == 6:
            out.append("")
        elif i % 5 == 2:
            bad = "[" * 5000 + "]" * 5000 if i % 2 else "1" * 6000
            out.append(f'{{"id": "x{i}", "text": "line {i}", "extra": {bad}}}')
        else:
            out.append(json.dumps({"id": f"x{i}", "text": f"The record of line {i + 1}, kept."}))
    return out


@pytest.mark.parametrize("fmt", ["plain", "gzip", "zstd", "split", "first_line_bad"])
def test_parser_faults_are_rejected_one_by_one_in_every_jsonl_variant(tmp_path, fmt):
    lines = _faulty_lines()
    if fmt == "first_line_bad":  # the file's first line is the fault (the check for a foreign file reads it first)
        lines = [lines[2]] + lines
    data = ("\n".join(lines) + "\n").encode()
    name, blob = {
        "gzip": ("a.jsonl.gz", gzip.compress(data)),
        "zstd": ("a.jsonl.zst", zstandard.ZstdCompressor().compress(data)),
    }.get(fmt, ("a.jsonl", data))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / name).write_bytes(blob)
    bad = [i + 1 for i, line in enumerate(lines) if line and '"extra"' in line]
    blank = sum(1 for line in lines if not line)
    parts = 3 if fmt == "split" else 1
    totals = {"documents": 0, "rejected": 0, "blank_lines": 0}
    rejected = []
    for p in range(parts):
        if parts > 1:
            assert scan(tmp_path / "c", p, parts).sources[0].piece == (p, parts)
        stats = _ingest(tmp_path / "c", tmp_path / f"raw{p}", partition=p, partitions=parts)
        totals = {k: totals[k] + stats[k] for k in totals}
        rejected += pq.read_table(tmp_path / f"raw{p}" / "rejected.parquet").to_pylist()
    assert [r["position"] for r in rejected] == bad
    assert all(r["reason"].startswith(f"line {r['position']}: cannot parse the JSON: ") for r in rejected)
    assert totals == {"documents": len(lines) - blank - len(bad), "rejected": len(bad), "blank_lines": blank}
    assert sum(totals.values()) == len(lines)


def test_a_damaged_parquet_row_group_rejects_its_rows_and_the_next_group_is_read(tmp_path):
    t = pa.table(
        {"text": [f"row number {i} with some words in it" for i in range(12)], "id": [f"r{i}" for i in range(12)]}
    )
    path = tmp_path / "c" / "a.parquet"
    path.parent.mkdir()
    pq.write_table(t, path, row_group_size=4, compression="snappy")
    chunk = pq.ParquetFile(path).metadata.row_group(1).column(0)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[start + 20 : start + chunk.total_compressed_size - 4] = b"\xab" * (chunk.total_compressed_size - 24)
    path.write_bytes(bytes(data))
    docs, rej = read_all(path.parent)
    assert docs.column("doc_id").to_pylist() == [f"r{i}" for i in (0, 1, 2, 3, 8, 9, 10, 11)]
    assert rej.column("position").to_pylist() == [4, 5, 6, 7]
    assert rej.column("reason")[0].as_py().startswith("row 4: cannot decode row group 1 (rows 4 to 7): OSError: ")
    stats = _ingest(path.parent, tmp_path / "raw")
    assert stats["documents"] + stats["rejected"] == pq.ParquetFile(path).metadata.num_rows


def test_a_damaged_arrow_record_batch_ends_the_file_as_one_record_saying_from_which_row(tmp_path):
    t = pa.table({"text": [f"row number {i} with some words in it" for i in range(12)]})
    path = tmp_path / "c" / "a.arrow"
    path.parent.mkdir()
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, t.schema) as w:
        for i in range(3):
            w.write_batch(t.slice(4 * i, 4).to_batches()[0])
    data = bytearray(path.read_bytes())
    marks = [i for i in range(len(data) - 4) if data[i : i + 4] == b"\xff\xff\xff\xff"]  # IPC continuation markers
    data[marks[2] + 8 : marks[2] + 40] = b"\x7f" * 32  # the metadata of the second record batch
    path.write_bytes(bytes(data))
    docs, rej = read_all(path.parent)
    assert docs.column("text").to_pylist() == [f"row number {i} with some words in it" for i in range(4)]
    (r,) = rej.to_pylist()
    assert (r["source"], r["position"]) == ("a.arrow", -1)
    assert r["reason"].startswith("cannot read record batch 1 of 3 (rows from 4 on were not read): OSError: ")


def test_a_truncated_stream_says_how_many_records_were_read_before(tmp_path):
    blob = gzip.compress(b"".join(json.dumps({"text": f"document {i} " * 20}).encode() + b"\n" for i in range(200)))
    (tmp_path / "a.jsonl.gz").write_bytes(blob[: len(blob) // 2])
    docs, rej = read_all(tmp_path)
    (r,) = rej.to_pylist()
    n = docs.num_rows
    assert 0 < n < 200 and r["position"] == n + 1
    assert r["reason"].startswith(f"line {n + 1}: cannot read the file past line {n} ({n} records read before it): ")
    assert r["reason"].endswith("EOFError: Compressed file ended before the end-of-stream marker was reached")


def test_a_reader_that_loses_a_record_is_caught(tmp_path):
    """read_source holds every reader to its own count: one that takes two records and gives one fails."""

    def lossy(src, config, out):
        out.doc(None, f"{src.rel}:1", src.rel, 1, "line 1", "the first record")
        return 2  # the second record was taken and dropped
        yield

    (tmp_path / "a.lossy").write_text("two records\n")
    src = Source(tmp_path / "a.lossy", "a.lossy", Reader("lossy", (".lossy",), lossy))
    with pytest.raises(RuntimeError, match="a.lossy: the lossy reader took 2 records from the file but gave 1"):
        list(read_source(src, ReaderConfig(str(tmp_path)), Collector(16)))


# ---------------------------------------------------------------------------------------------
# item 2: UTF-16 and text that is mostly control characters


def test_utf16_case_both_files_decoded_and_counted_the_utf8_file_kept(cases, tmp_path):
    d = cases / "utf16_text"
    docs, rej = read_all(d)
    assert rej.num_rows == 0
    texts = dict(zip(docs.column("doc_id").to_pylist(), docs.column("text").to_pylist()))
    assert texts == {
        "notes_utf16le_bom.txt": (d / "notes_utf16le_bom.txt").read_bytes()[2:].decode("utf-16-le"),
        "plain_utf8.txt": (d / "plain_utf8.txt").read_text(),
        "ukrainian_utf16be_no_bom.txt": (d / "ukrainian_utf16be_no_bom.txt").read_bytes().decode("utf-16-be"),
    }
    assert texts["ukrainian_utf16be_no_bom.txt"].startswith("Міська бібліотека знову відкрилася")
    assert texts["notes_utf16le_bom.txt"].startswith("The museum reopened its east gallery")
    stats = _ingest(d, tmp_path / "raw")
    assert (stats["documents"], stats["rejected"], stats["utf16_files"]) == (3, 0, 2)
    # the BOM-less file's bytes are valid UTF-8, which is why it needs the byte pattern
    (d / "ukrainian_utf16be_no_bom.txt").read_bytes().decode("utf-8")
    assert detect_utf16((d / "ukrainian_utf16be_no_bom.txt").read_bytes()).evidence == "byte pattern"
    assert detect_utf16((d / "notes_utf16le_bom.txt").read_bytes()).evidence == "byte-order mark"
    assert detect_utf16((d / "plain_utf8.txt").read_bytes()) is None


SENTENCES = [
    "Міська бібліотека знову відкрилася після ремонту.",
    "The ferry leaves the harbour twice a day.",
    "Ο σταθμός άνοιξε ξανά το πρωί.",
    "Le musée a rouvert sa galerie est.",
]


@pytest.mark.parametrize(
    "encoding,bom", [("utf-16-le", b"\xff\xfe"), ("utf-16-be", b"\xfe\xff"), ("utf-16-le", b""), ("utf-16-be", b"")]
)
@pytest.mark.parametrize("compressed", [False, True])
def test_utf16_jsonl_is_decoded_line_by_line(tmp_path, encoding, bom, compressed):
    lines = [json.dumps({"id": f"s{i}", "text": s}, ensure_ascii=False) for i, s in enumerate(SENTENCES)]
    lines.insert(2, "{not json")
    lines.insert(3, "")
    data = bom + ("\r\n".join(lines) + "\r\n").encode(encoding)
    name = "a.jsonl.gz" if compressed else "a.jsonl"
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / name).write_bytes(gzip.compress(data) if compressed else data)
    docs, rej = read_all(tmp_path / "c")
    assert [t.rstrip("\r") for t in docs.column("text").to_pylist()] == SENTENCES
    assert docs.column("doc_id").to_pylist() == ["s0", "s1", "s2", "s3"]
    assert [(r["position"], r["reason"].split(":")[1].strip()) for r in rej.to_pylist()] == [(3, "invalid JSON")]
    stats = _ingest(tmp_path / "c", tmp_path / "raw")
    assert (stats["utf16_files"], stats["blank_lines"], stats["documents"] + stats["rejected"]) == (1, 1, 5)
    if not compressed:  # a single UTF-16 file is not cut into byte ranges: one partition reads it whole
        per = [len(scan(tmp_path / "c", p, 3).sources) for p in range(3)]
        assert sorted(per) == [0, 0, 1] and all(
            s.piece is None for p in range(3) for s in scan(tmp_path / "c", p, 3).sources
        )


def test_invalid_utf16_is_rejected_at_its_byte_offset(tmp_path):
    good = "The first sentence is fine. ".encode("utf-16-le")
    (tmp_path / "a.txt").write_bytes(
        b"\xff\xfe" + good + b"\x00\xdc" + "and more".encode("utf-16-le")
    )  # a lone low surrogate
    (tmp_path / "b.txt").write_bytes(b"\xfe\xff" + "odd".encode("utf-16-be") + b"\x00")  # an odd last byte
    docs, rej = read_all(tmp_path)
    assert docs.num_rows == 0
    assert rej.to_pylist() == [
        {
            "source": "a.txt",
            "position": 2 + len(good),
            "reason": f"invalid UTF-16LE at byte {2 + len(good)}: illegal "
            "encoding (decoded as UTF-16, recognised by its byte-order mark)",
        },
        {
            "source": "b.txt",
            "position": 8,
            "reason": "invalid UTF-16BE at byte 8: truncated data (decoded as UTF-16, "
            "recognised by its byte-order mark)",
        },
    ]


def test_what_is_not_utf16_is_not_re_read(cases):
    rng = random.Random(0)
    samples = {
        "Latin-1 text": "Kernel notes written in a legacy encoding: café, naïve, über. ".encode("latin-1") * 20,
        "random bytes": bytes(rng.randrange(256) for _ in range(4096)),
        "UTF-8 Cyrillic": SENTENCES[0].encode("utf-8") * 20,
        "UTF-8 ASCII": SENTENCES[1].encode("utf-8") * 20,
        "int32 array": b"".join(i.to_bytes(4, "little") for i in range(1000)),
        "the invalid_utf8 case": (cases / "invalid_utf8.txt").read_bytes(),
        "the nul_bytes case": (cases / "nul_bytes.txt").read_bytes(),
        "a short UTF-16 text": "hi there".encode("utf-16-le")[:12],  # too few code units to tell
    }
    assert {k: detect_utf16(v) for k, v in samples.items()} == {k: None for k in samples}


def test_text_that_is_mostly_control_characters_is_rejected_by_every_reader(tmp_path):
    garbage = "\x04\x1c\x04V\x04A\x04L\x04:\x040\x00 \x041"  # UTF-16BE Cyrillic read as UTF-8
    (tmp_path / "a.txt").write_bytes(
        "你好世界，今天天气很好".encode("utf-16-le")
    )  # CJK UTF-16 without a BOM: not recognised
    (tmp_path / "b.jsonl").write_text(
        json.dumps({"id": "j0", "text": garbage})
        + "\n"
        + json.dumps({"id": "j1", "text": "ANSI \x1b[31mred\x1b[0m and a \x00 are fine"})
        + "\n"
    )
    pq.write_table(pa.table({"text": [garbage, "a normal row"]}), tmp_path / "c.parquet")
    docs, rej = read_all(tmp_path)
    assert docs.column("doc_id").to_pylist() == ["j1", "c.parquet:1"]
    assert [(r["source"], r["position"]) for r in rej.to_pylist()] == [("a.txt", 9), ("b.jsonl", 1), ("c.parquet", 0)]
    reasons = rej.column("reason").to_pylist()
    assert (
        reasons[0] == "invalid UTF-8 at byte 9: invalid start byte"
    )  # U+FF0C in UTF-16LE: 0C FF; rejected, never kept
    assert reasons[1] == (
        "line 1: mostly control characters: at least 50% of its characters are control characters "
        "(U+0000-U+001F, U+007F-U+009F other than tab and line breaks), so it is not text: UTF-16 "
        "without a byte-order mark, or binary data?"
    )
    assert reasons[2] == "row 0: " + reasons[1].removeprefix("line 1: ")
