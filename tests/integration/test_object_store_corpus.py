"""A corpus in a bucket (real S3, GCS and Azure Blob API servers on 127.0.0.1, tests/conftest.py: bucket) is listed,
partitioned, digested and read exactly as the same files on local disk, and a piece of one large file
is read with range requests, not by downloading the object."""

import json
import logging
import os
import re
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from largetrain_core import fs
from largetrain_core.corpus import fingerprint, ingest, scan
from largetrain_core.provenance import read_provenance, tree_size
from largetrain_core.readers import ReaderConfig


def _upload(local, url: str) -> str:
    fsys, root = fs.filesystem(url)
    files = [p for p in sorted(local.rglob("*")) if p.is_file()]
    fsys.put([str(p) for p in files], [f"{root}/{p.relative_to(local).as_posix()}" for p in files])
    return url


def _outputs(d) -> dict:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.mark.parametrize("partitions", [1, 3])
def test_a_corpus_in_a_bucket_reads_as_on_local_disk(tmp_path, bucket, cases, partitions):
    """tests/cases (JSONL with a BOM, compressed and misnamed files, upper-case suffixes, UTF-16, Parquet
    of mixed schemas, invalid UTF-8, nested directories, a file no reader knows) read from the bucket:
    the same files in the same order and partitions, the same content digest, byte-identical parts and
    rejected records."""
    corpus = tmp_path / "corpus"
    shutil.copytree(cases, corpus)
    (corpus / "notes.bin").write_bytes(b"\x00\x01")  # skipped: no reader knows .bin
    url = _upload(corpus, fs.join(bucket, "corpora", "cases"))
    for p in range(partitions):
        here, there = scan(corpus, p, partitions), scan(url, p, partitions)
        assert [s.rel for s in here.sources] == [s.rel for s in there.sources]
        assert [str(f).rsplit("/", 1)[1] for f in there.skipped] == [f.name for f in here.skipped]
        assert fingerprint(corpus, p, partitions) == fingerprint(url, p, partitions)
        a, b = tmp_path / f"local-{p}", tmp_path / f"bucket-{p}"
        a.mkdir(), b.mkdir()
        stats = [
            ingest(ReaderConfig(str(src), partition=p, partitions=partitions), out)
            for src, out in ((corpus, a), (url, b))
        ]
        assert stats[0] == stats[1]
        assert _outputs(a) == _outputs(b)
    assert stats[0]["documents"] > 0 or partitions > 1


def test_a_digest_cache_trusts_an_unchanged_object_and_notices_a_rewrite(tmp_path, bucket):
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text('{"text": "one"}\n')
    url = _upload(corpus, fs.join(bucket, "c"))
    cache = tmp_path / "digests.json"
    first = fingerprint(url, cache_file=cache)
    entries = json.loads(cache.read_text())["files"]
    assert list(entries) == [f"{url}/a.jsonl"] and len(entries[f"{url}/a.jsonl"]) == 3  # size, ETag, digest
    assert fingerprint(url, cache_file=cache) == first == fingerprint(corpus)
    fsys, root = fs.filesystem(url)
    fsys.pipe_file(f"{root}/a.jsonl", b'{"text": "two"}\n')  # same size, new ETag (S3, Azure) or generation (GCS)
    assert fingerprint(url, cache_file=cache) != first


def test_a_provenance_file_beside_a_corpus_in_a_bucket(tmp_path, s3_bucket):
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "a.txt").write_text("hello")
    url = _upload(corpus, fs.join(s3_bucket, "corpora", "c"))
    assert read_provenance(url) is None and tree_size(url) == (1, 5)
    fsys, root = fs.filesystem(url)
    record = {"corpus": "c", "files": 1, "bytes": 5, "content_digest": "x", "fetched_at": "t", "package": "p"}
    fsys.pipe_file(f"{root}.provenance.json", json.dumps(record).encode())
    assert read_provenance(url) == record


def _fetched(caplog, key: str) -> int:
    """Bytes s3fs fetched of ``key`` (its DEBUG lines "Fetch: <bucket>/<key>, <start>-<end>")."""
    total = 0
    for r in caplog.records:
        m = re.match(r"Fetch: (.+), (\d+)-(\d+)$", r.getMessage())
        if m and m.group(1).endswith(key):
            total += int(m.group(3)) - int(m.group(2))
    return total


def test_a_piece_of_one_large_file_is_read_with_range_requests(tmp_path, s3_bucket, caplog):
    """One Parquet file of 8 row groups and one JSONL file, each about 32 MiB (incompressible text), read
    in 4 partitions: every piece gives the documents the local file gives, and the first piece of
    each fetches well under the whole object."""
    corpus = tmp_path / "big"
    corpus.mkdir()
    texts = [os.urandom(2000).hex() for _ in range(8 * 1024)]  # 4,000 characters each: ~32 MiB in all
    pq.write_table(
        pa.table({"id": [f"d{i}" for i in range(len(texts))], "text": texts}),
        corpus / "docs.parquet",
        row_group_size=1024,
        compression="none",
    )
    single = {"docs.parquet": corpus / "docs.parquet"}
    (tmp_path / "lines").mkdir()
    with open(tmp_path / "lines" / "docs.jsonl", "w") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": f"l{i}", "text": t}) + "\n")
    single["docs.jsonl"] = tmp_path / "lines" / "docs.jsonl"
    for name, path in single.items():
        url = fs.join(s3_bucket, name.replace(".", "-"), name)
        fsys, key = fs.filesystem(url)
        fsys.put_file(str(path), key)
        size = path.stat().st_size
        for p in range(4):
            a, b = tmp_path / f"{name}-local-{p}", tmp_path / f"{name}-bucket-{p}"
            a.mkdir(), b.mkdir()
            caplog.clear()
            with caplog.at_level(logging.DEBUG, logger="s3fs"):
                stats = [
                    ingest(ReaderConfig(str(src), partition=p, partitions=4), out) for src, out in ((path, a), (url, b))
                ]
            assert stats[0] == stats[1] and stats[0]["documents"] > 1000, name
            assert _outputs(a) == _outputs(b), name
            if p == 0:  # a quarter of the file plus read-ahead; never the whole object
                assert 0 < _fetched(caplog, name) < 0.6 * size, (name, _fetched(caplog, name), size)


def test_small_objects_are_fetched_whole_in_windows_and_their_scratch_removed(
    tmp_path, s3_bucket, cases, caplog, monkeypatch
):
    """With windows of 3 objects and "small" meaning up to 2 KiB, the cases read from the bucket give the
    local files' parts and rejected records byte for byte: the small objects fetched whole (no range
    request), the larger ones read with range requests, in the corpus's order. Nothing stays in the
    local cache's scratch, after the read or after a read stopped early."""
    import largetrain_core.corpus as corpus_module
    from largetrain_core.corpus import read_corpus

    monkeypatch.setattr(corpus_module, "WHOLE_OBJECT_BYTES", 2048)
    monkeypatch.setattr(corpus_module, "WHOLE_WINDOW_OBJECTS", 3)
    monkeypatch.setenv("LARGETRAIN_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus"
    shutil.copytree(cases, corpus)
    url = _upload(corpus, fs.join(s3_bucket, "corpora", "windows"))
    listed = scan(url)
    small = [s.rel for s in listed.sources if s.size <= 2048]
    large = [s.rel for s in listed.sources if s.size > 2048]
    assert len(small) > 6 and large, (small, large)  # several windows, and objects read by range among them
    a, b = tmp_path / "local", tmp_path / "bucket"
    a.mkdir(), b.mkdir()
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="s3fs"):
        stats = [ingest(ReaderConfig(str(src)), out) for src, out in ((corpus, a), (url, b))]
    assert stats[0] == stats[1] and _outputs(a) == _outputs(b)
    assert all(_fetched(caplog, rel) == 0 for rel in small), [rel for rel in small if _fetched(caplog, rel)]
    assert any(_fetched(caplog, rel) > 0 for rel in large)
    scratch = tmp_path / "cache"
    assert not [p for p in scratch.rglob("*") if p.is_file()]

    batches = read_corpus(ReaderConfig(url, batch_size=1))
    next(batches)  # the first window read, the second being fetched
    batches.close()
    assert not [p for p in scratch.rglob("*") if p.is_file()]
