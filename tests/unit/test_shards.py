"""largetrain_core.shards: packing, shard files + manifest, the zero-copy reader, the sampler and the CLI."""

import hashlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
import xxhash
from tokenizers import Tokenizer

from helpers import REPO
from largetrain_core.corpus import ingest
from largetrain_core.readers import ReaderConfig
from largetrain_core.shards import DistributedSampler, ShardError, TokenShards, build_token_shards
from largetrain_core.tokenizer import EOS_TOKEN
from helpers.parts import write_parts


def is_validation(doc_id: str, fraction: float, seed: int) -> bool:
    """The documented split rule, written out here independently of the module."""
    return xxhash.xxh64_intdigest(doc_id.encode(), seed) / 2**64 < fraction


# ---------------------------------------------------------------------------------------------
# short documents (shared case): no ragged, empty or padded sequence


@pytest.fixture
def short_docs(cases, tmp_path, make_word_tokenizer):
    raw = tmp_path / "raw"
    raw.mkdir()
    ingest(ReaderConfig(str(cases / "short_docs.jsonl"), id_field="id"), raw)
    # s0 "Short one." -> [0, 1, EOS]; s1 "Another short document." -> [2, 3, 4, EOS]; s2 "Third." -> [5, EOS]
    tok = make_word_tokenizer(tmp_path / "tok", ["Short", "one.", "Another", "short", "document.", "Third."])
    return raw, tok


def test_short_docs_pack_into_full_windows_and_count_the_remainder(short_docs, tmp_path):
    raw, tok = short_docs
    out = tmp_path / "shards"
    out.mkdir()
    m = build_token_shards(raw, tok, out, seq_len=5, validation_fraction=0.0)  # every doc has < 5 tokens
    eos = 6
    # stream 0 1 E 2 3 4 E 5 E (9 tokens) -> one window of 6, the last 3 tokens dropped
    train = m["splits"]["train"]
    assert (train["documents"], train["document_tokens"], train["sequences"], train["tokens"]) == (3, 9, 1, 6)
    assert train["dropped_remainder_tokens"] == 3
    assert train["sequences"] * (m["seq_len"] + 1) + train["dropped_remainder_tokens"] == train["document_tokens"]
    assert m["splits"]["validation"]["sequences"] == 0 and m["total_tokens"] == 6
    shards = TokenShards(out, "train")
    assert len(shards) == 1
    assert shards.take([0]).tolist() == [[0, 1, eos, 2, 3, 4]]


def test_short_docs_with_seq_len_beyond_the_whole_stream(short_docs, tmp_path):
    raw, tok = short_docs
    out = tmp_path / "shards"
    out.mkdir()
    m = build_token_shards(raw, tok, out, seq_len=20, validation_fraction=0.0)
    train = m["splits"]["train"]
    assert (train["sequences"], train["shards"], train["dropped_remainder_tokens"], train["document_tokens"]) == (
        0,
        [],
        9,
        9,
    )
    shards = TokenShards(out, "train")
    assert len(shards) == 0
    with pytest.raises(ValueError):
        DistributedSampler(len(shards)).indices(0, 1)


# ---------------------------------------------------------------------------------------------
# round trip with a trained BPE


@pytest.fixture
def built(tmp_path, bpe_dir, sentences):
    docs = [(f"doc-{i:02d}", " ".join(sentences[i * 7 : (i + 1) * 7 - i % 5])) for i in range(30)]
    src = write_parts(tmp_path / "dedup", [docs[:11], docs[11:12], docs[12:]])
    out = tmp_path / "shards"
    out.mkdir()
    m = build_token_shards(
        src,
        bpe_dir,
        out,
        seq_len=16,
        validation_fraction=0.3,
        seed=1,
        sequences_per_shard=3,
        batch_documents=4,
        source_data_version="v123",
    )
    return docs, out, m


PARTS = (slice(0, 11), slice(11, 12), slice(12, 30))  # the part files of ``built``


def expected_stream(docs, tokenizer_json: Path, val: bool) -> list[list[int]]:
    """Per part file, the EOS-joined token stream of the split's documents."""
    tok = Tokenizer.from_file(str(tokenizer_json))
    eos = tok.token_to_id(EOS_TOKEN)
    units = []
    for part in PARTS:
        units.append(
            [
                t
                for doc_id, text in docs[part]
                if is_validation(doc_id, 0.3, 1) == val
                for t in tok.encode(text, add_special_tokens=False).ids + [eos]
            ]
        )
    return units


def packed(units: list[list[int]], window: int) -> tuple[list[list[int]], int]:
    """The documented packing, written out here: each unit's (part's) full windows in order, then the
    units' tails joined and cut the same way; returns the windows and the dropped remainder."""
    windows, tails = [], []
    for u in units:
        n = len(u) // window
        windows += [u[i * window : (i + 1) * window] for i in range(n)]
        tails += u[n * window :]
    n = len(tails) // window
    return windows + [tails[i * window : (i + 1) * window] for i in range(n)], len(tails) - n * window


@pytest.mark.parametrize("split", ["train", "validation"])
def test_round_trip_equals_the_eos_joined_token_stream(built, bpe_dir, split):
    docs, out, m = built
    n_val = sum(is_validation(d, 0.3, 1) for d, _ in docs)
    assert 2 <= n_val <= 28, "the chosen seed should put documents in both splits naturally"
    units = expected_stream(docs, bpe_dir / "tokenizer.json", split == "validation")
    window = 17
    windows, dropped = packed(units, window)
    n = len(windows)
    s = m["splits"][split]
    assert s["documents"] == (n_val if split == "validation" else 30 - n_val)
    assert s["document_tokens"] == sum(len(u) for u in units)
    assert (s["sequences"], s["tokens"], s["dropped_remainder_tokens"]) == (n, n * window, dropped)
    assert n >= 2 and dropped < window
    shards = TokenShards(out, split, verify_checksums=True)
    assert len(shards) == n and shards.dtype == np.uint16 and shards.seq_len == 16
    rows = np.stack([shards[i] for i in range(len(shards))])
    assert rows.shape == (n, window)
    assert rows.tolist() == windows
    assert np.array_equal(shards.take(np.arange(n)[::-1]), rows[::-1])
    with pytest.raises(IndexError):
        shards[n]


def test_take_gathers_the_rows_of_any_index_batch_across_shard_files(built):
    """take() equals row-by-row indexing for index batches inside one shard file, over two, over every
    file (a row each, and many rows each), repeated and unordered, and refuses any index out of range."""
    _, out, _ = built
    shards = TokenShards(out, "train")
    n = len(shards)
    rows = np.stack([shards[i] for i in range(n)])
    assert len(shards.manifest["splits"]["train"]["shards"]) >= 4, "the fixture should span several shard files"
    rng = np.random.default_rng(0)
    batches = [
        [1, 0, 2, 1],  # inside the first file (3 sequences per shard)
        [n - 1, n - 2, n - 1],  # inside the last
        [2, 3, 2],  # over two files
        list(range(0, n, 3)),  # a row from each file
        rng.integers(0, n, 5 * n).tolist(),  # many rows from each file
        list(range(n))[::-1],
    ]
    for idx in batches:
        assert np.array_equal(shards.take(idx), rows[idx]), idx
        assert np.array_equal(shards.take(np.array(idx, dtype=np.int32)), rows[idx]), idx
    assert shards.take([]).shape == (0, 17)
    for bad in ([-1], [0, -1], [n], [0, n], [2, n + 5], [-n]):
        with pytest.raises(IndexError):
            shards.take(bad)


def test_manifest_describes_the_files(built, bpe_dir):
    docs, out, m = built
    assert json.loads((out / "manifest.json").read_text()) == m
    assert (m["seq_len"], m["dtype"], m["vocab_size"], m["source_data_version"]) == (16, "uint16", 300, "v123")
    tok_bytes = (bpe_dir / "tokenizer.json").read_bytes()
    assert (out / "tokenizer.json").read_bytes() == tok_bytes
    assert m["tokenizer_sha256"] == hashlib.sha256(tok_bytes).hexdigest()
    train = m["splits"]["train"]
    assert sum(e["sequences"] for e in train["shards"]) == train["sequences"] and len(train["shards"]) >= 2
    for split in m["splits"].values():
        for entry in split["shards"]:
            f = out / entry["file"]
            assert f.stat().st_size == entry["bytes"]
            h = xxhash.xxh3_128()
            h.update(f.read_bytes())
            assert h.hexdigest() == entry["xxh3_128"]
            assert 1 <= entry["sequences"] <= 3
    assert m["total_tokens"] == sum(s["sequences"] for s in m["splits"].values()) * 17


def test_shards_are_arrow_ipc_readable_by_pyarrow_and_polars(built):
    docs, out, m = built
    entry = m["splits"]["train"]["shards"][0]
    path = out / entry["file"]
    table = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
    assert table.schema.field("input_ids").type == pa.list_(pa.uint16(), 17)
    meta = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    assert meta == {
        "seq_len": "16",
        "dtype": "uint16",
        "eos_id": str(m["eos_id"]),
        "vocab_size": "300",
        "tokenizer_sha256": m["tokenizer_sha256"],
    }
    # polars 1.x: memory_map=True (its default); polars 2 dropped the parameter and always maps local files
    kw = {"memory_map": True} if "memory_map" in inspect.signature(pl.read_ipc).parameters else {}
    df = pl.read_ipc(path, **kw)
    assert pl.scan_ipc(path).select(pl.len()).collect().item() == entry["sequences"]
    assert df.columns == ["input_ids"] and df.height == entry["sequences"]
    assert df.schema["input_ids"] == pl.Array(pl.UInt16, 17)
    shards = TokenShards(out, "train")
    assert np.array_equal(df["input_ids"].to_numpy(), shards.take(range(entry["sequences"])))
    assert np.array_equal(
        np.asarray(table.column(0).combine_chunks().flatten()).reshape(-1, 17), shards.take(range(entry["sequences"]))
    )


def _mapped_ranges(path: Path) -> list[tuple[int, int]]:
    out = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == str(path):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            out.append((start, end))
    return out


def test_token_shards_rows_are_zero_copy_views_of_the_mapped_file(built):
    docs, out, m = built
    shards = TokenShards(out, "train")
    row = shards[0]
    assert row.flags.owndata is False and row.flags.writeable is False
    if not Path("/proc/self/maps").exists():
        pytest.skip("no /proc/self/maps to find the memory mapping on this platform")
    path = (out / m["splits"]["train"]["shards"][0]["file"]).resolve()
    ranges = _mapped_ranges(path)
    assert ranges, f"{path} is not memory-mapped"
    addr = row.ctypes.data
    assert any(start <= addr and addr + row.nbytes <= end for start, end in ranges)
    last = shards[len(shards) - 1]  # a row of the last shard file lies in that file's mapping
    last_path = (out / m["splits"]["train"]["shards"][-1]["file"]).resolve()
    assert any(s <= last.ctypes.data < e for s, e in _mapped_ranges(last_path))


# ---------------------------------------------------------------------------------------------
# broken shard directories


def test_truncated_shard_raises_naming_the_file(built):
    _, out, m = built
    name = m["splits"]["train"]["shards"][1]["file"]
    data = (out / name).read_bytes()
    (out / name).write_bytes(data[: len(data) - 100])
    with pytest.raises(ShardError, match=name):
        TokenShards(out, "train")
    TokenShards(out, "validation")  # the other split is untouched


def test_checksum_mismatch_raises_when_verifying(built):
    _, out, m = built
    name = m["splits"]["train"]["shards"][0]["file"]
    data = bytearray((out / name).read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different content
    (out / name).write_bytes(bytes(data))
    TokenShards(out, "train")  # by design only sizes are checked without verify_checksums
    with pytest.raises(ShardError, match=f"{name}.*checksum"):
        TokenShards(out, "train", verify_checksums=True)


def test_missing_shard_file_and_manifest(built):
    _, out, m = built
    name = m["splits"]["validation"]["shards"][0]["file"]
    (out / name).unlink()
    with pytest.raises(ShardError, match=name):
        TokenShards(out, "validation")
    (out / "manifest.json").unlink()
    with pytest.raises(ShardError, match="manifest.json"):
        TokenShards(out, "train")


def test_unreadable_manifest_raises_shard_error(built):
    _, out, _ = built
    text = (out / "manifest.json").read_text()
    (out / "manifest.json").write_text(text[: len(text) // 2])  # cut short, as after a power cut
    with pytest.raises(ShardError, match="manifest.json"):
        TokenShards(out, "train")


def test_sequence_count_mismatch_raises(built):
    _, out, m = built
    m["splits"]["train"]["shards"][0]["sequences"] += 1
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ShardError, match=m["splits"]["train"]["shards"][0]["file"]):
        TokenShards(out, "train")


# ---------------------------------------------------------------------------------------------
# the split


def test_validation_gets_a_document_when_there_are_two(tmp_path, make_word_tokenizer):
    tok = make_word_tokenizer(tmp_path / "tok", ["alpha", "beta", "gamma"])
    docs = [("first", "alpha beta gamma alpha"), ("second", "gamma gamma beta")]
    fraction = 1e-12
    assert not any(is_validation(d, fraction, 0) for d, _ in docs)  # neither would go there by its hash
    smallest = min((d for d, _ in docs), key=lambda d: xxhash.xxh64_intdigest(d.encode(), 0))
    out = tmp_path / "out"
    out.mkdir()
    m = build_token_shards(write_parts(tmp_path / "in", [docs]), tok, out, seq_len=2, validation_fraction=fraction)
    assert (m["splits"]["train"]["documents"], m["splits"]["validation"]["documents"]) == (1, 1)
    expected_val = {"first": [0, 1, 2, 0, 3], "second": [2, 2, 1, 3]}[smallest]  # EOS id 3
    assert m["splits"]["validation"]["document_tokens"] == len(expected_val)
    assert TokenShards(out, "validation").take([0]).tolist() == [expected_val[:3]]
    # one document: nothing to move, validation stays empty; fraction 0: no validation at all
    for name, d, frac in (("one", docs[:1], fraction), ("zero", docs, 0.0)):
        o = tmp_path / name
        o.mkdir()
        m = build_token_shards(write_parts(tmp_path / f"in-{name}", [d]), tok, o, seq_len=2, validation_fraction=frac)
        assert m["splits"]["validation"]["documents"] == 0
        assert m["splits"]["train"]["documents"] == len(d)


def test_copies_repeat_train_documents_in_later_passes_and_are_counted_apart(tmp_path, make_word_tokenizer):
    """Intended repetition (the ``copies`` weight of up-sampling): a train document with c copies is
    packed c times, its extra copies in passes after every document, never beside the original; a
    validation document once; the manifest counts the copies apart from the documents."""
    tok = make_word_tokenizer(tmp_path / "tok", ["a", "b", "c", "d", "e"])  # EOS id 5
    docs = [("d1", "a"), ("d2", "b b"), ("d3", "c"), ("d4", "d d d"), ("d5", "e")]
    copies = {"d1": 1, "d2": 3, "d3": 1, "d4": 2, "d5": 2}
    frac = 0.3
    # a seed whose split puts a repeated document in validation and keeps d2 (3 copies) in train
    seed = next(s for s in range(1000) if {d for d, _ in docs if is_validation(d, frac, s)} in ({"d4"}, {"d5"}))
    val = {d for d, _ in docs if is_validation(d, frac, seed)}
    src = write_parts(tmp_path / "in", [docs[:3], docs[3:]])
    for p in sorted(src.glob("part-*.parquet")):
        df = pl.read_parquet(p)
        df.with_columns(copies=pl.Series([copies[d] for d in df["doc_id"]], dtype=pl.UInt32)).write_parquet(p)
    out = tmp_path / "out"
    out.mkdir()
    m = build_token_shards(src, tok, out, seq_len=1, validation_fraction=frac, seed=seed)
    ids = {w: i for i, w in enumerate(["a", "b", "c", "d", "e"])}
    enc = {d: [ids[w] for w in t.split()] + [5] for d, t in docs}
    train = [d for d, _ in docs if d not in val]
    parts = [[d for d, _ in docs[:3]], [d for d, _ in docs[3:]]]
    # pass 1, 2, 3, each over the part files
    units = [[t for d in part if d in train and copies[d] > k for t in enc[d]] for k in range(3) for part in parts]
    expected, dropped = packed(units, 2)
    got = TokenShards(out, "train")
    assert got.take(range(len(got))).tolist() == expected and dropped < 2
    t = m["splits"]["train"]
    assert t["documents"] == len(train)
    assert t["repeated_documents"] == sum(copies[d] > 1 for d in train)
    assert t["repeat_copies"] == sum(copies[d] - 1 for d in train)
    assert t["repeat_tokens"] == sum((copies[d] - 1) * len(enc[d]) for d in train)
    v = m["splits"]["validation"]
    assert (v["documents"], v["repeat_copies"], v["document_tokens"]) == (len(val), 0, sum(len(enc[d]) for d in val))

    p = sorted(src.glob("part-*.parquet"))[1]
    pl.read_parquet(p).with_columns(copies=pl.Series([1, 0], dtype=pl.UInt32)).write_parquet(p)
    (tmp_path / "bad").mkdir()
    with pytest.raises(ValueError, match=f"{p.name}.*'copies' must be >= 1"):
        build_token_shards(
            src, tok, tmp_path / "bad", seq_len=1, validation_fraction=frac, seed=seed, sequences_per_shard=1
        )
    assert not list((tmp_path / "bad").rglob("*.arrow*"))  # the failed run's shards and open rows are gone


# ---------------------------------------------------------------------------------------------
# partitions: the same sequences in the same order for any partition count


def _all(d: Path, split: str) -> list:
    shards = TokenShards(d, split, verify_checksums=True)
    return shards.take(range(len(shards))).tolist()


def _partitioned(src: Path, tok: Path, root: Path, n: int, packing) -> tuple[Path, dict, list[dict]]:
    """``n`` partitions tokenized into their own directories, then the global step into ``root/n/global``."""
    from largetrain_core.shards import assemble_token_shards, tokenize_partition

    dirs = []
    for i in range(n):
        dirs.append(root / f"{n}" / f"p{i}")
        dirs[-1].mkdir(parents=True)
        tokenize_partition(src, tok, dirs[-1], i, n, packing)
    out = root / f"{n}" / "global"
    out.mkdir()
    summaries = [json.loads((d / "tokenized.json").read_text()) for d in dirs]
    return out, assemble_token_shards(dirs, src, tok, out, packing, "v1"), summaries


def test_the_same_sequences_in_the_same_order_for_any_partition_count(tmp_path, bpe_dir, sentences):
    from largetrain_core.shards import Packing

    docs = [(f"doc-{i:02d}", " ".join(sentences[(i * 5) % 200 : (i * 5) % 200 + 3 + i % 6])) for i in range(40)]
    cuts = [0, 3, 4, 13, 14, 26, 40]  # 6 part files of 3, 1, 9, 1, 12 and 14 documents
    src = write_parts(tmp_path / "in", [docs[a:b] for a, b in zip(cuts, cuts[1:])])
    for i, f in enumerate(sorted(src.glob("part-*.parquet"))):  # up-sampling weights in some parts
        df = pl.read_parquet(f)
        if i % 2:
            df.with_columns(copies=pl.Series([1 + (k % 3) for k in range(df.height)], dtype=pl.UInt32)).write_parquet(f)
    packing = Packing(seq_len=7, validation_fraction=0.25, seed=2, sequences_per_shard=4, batch_documents=3)
    one = tmp_path / "one"
    one.mkdir()
    whole = build_token_shards(
        src,
        bpe_dir,
        one,
        seq_len=7,
        validation_fraction=0.25,
        seed=2,
        sequences_per_shard=4,
        batch_documents=3,
        source_data_version="v1",
    )
    assert whole["splits"]["train"]["repeat_copies"] > 0 and whole["splits"]["validation"]["sequences"] > 0
    counts = lambda m: {s: {k: v for k, v in d.items() if k != "shards"} for s, d in m["splits"].items()}  # noqa: E731
    for n in (2, 3, 8):  # 8 partitions of 6 part files: some are empty
        out, m, summaries = _partitioned(src, bpe_dir, tmp_path, n, packing)
        assert sum(s["parts"] for s in summaries) == 6 and (n < 8 or min(s["parts"] for s in summaries) == 0)
        assert counts(m) == counts(whole) and m["total_tokens"] == whole["total_tokens"]
        for split in ("train", "validation"):
            assert _all(out, split) == _all(one, split), (n, split)
        # the global step wrote the tails' windows only; the rest are the partitions' files, where they lie
        files = [e["file"] for e in m["splits"]["train"]["shards"]]
        assert {f.split("/")[0] for f in files if "/" in f} == {".."} and all(
            "tail" in f for f in files if "/" not in f
        )
        assert sorted(p.name for p in out.glob("*.arrow")) == sorted(
            f for f in files + [e["file"] for e in m["splits"]["validation"]["shards"]] if "/" not in f
        )


def test_partitions_that_do_not_fit_together_are_refused(tmp_path, bpe_dir, sentences):
    from largetrain_core.shards import Packing, assemble_token_shards, tokenize_partition
    from largetrain_core.storage import ArtifactError

    docs = [(f"d{i}", " ".join(sentences[i * 3 : i * 3 + 5])) for i in range(12)]
    src = write_parts(tmp_path / "in", [docs[:4], docs[4:8], docs[8:]])
    packing = Packing(seq_len=5, validation_fraction=0.2)
    dirs = [tmp_path / f"p{i}" for i in range(3)]
    for i, d in enumerate(dirs):
        d.mkdir()
        tokenize_partition(src, bpe_dir, d, i, 3, Packing(seq_len=6) if i == 2 else packing)
    (tmp_path / "g").mkdir()
    with pytest.raises(ArtifactError, match="partition 2 of 3 does not fit.*seq_len"):
        assemble_token_shards(dirs, src, bpe_dir, tmp_path / "g", packing)
    again = tmp_path / "p2-again"
    again.mkdir()
    tokenize_partition(src, bpe_dir, again, 2, 3, packing)
    with pytest.raises(ArtifactError, match="partition 2 of 3 does not fit.*parts 2.. of 3, expected part 1 of 3"):
        assemble_token_shards([dirs[0], again], src, bpe_dir, tmp_path / "g", packing)
    with pytest.raises(ArtifactError, match="the partitions hold 2 of the 3 part files"):
        assemble_token_shards(dirs[:2], src, bpe_dir, tmp_path / "g", packing)
    assert assemble_token_shards([*dirs[:2], again], src, bpe_dir, tmp_path / "g", packing)["total_tokens"] > 0


def test_the_smallest_hash_goes_to_validation_whatever_the_partitioning(tmp_path, make_word_tokenizer):
    from largetrain_core.shards import Packing

    tok = make_word_tokenizer(tmp_path / "tok", ["alpha", "beta", "gamma"])
    docs = [("first", "alpha beta gamma alpha"), ("second", "gamma gamma beta"), ("third", "beta alpha")]
    fraction = 1e-12
    assert not any(is_validation(d, fraction, 0) for d, _ in docs)
    smallest = min((d for d, _ in docs), key=lambda d: xxhash.xxh64_intdigest(d.encode(), 0))
    src = write_parts(tmp_path / "in", [docs[:1], docs[1:]])
    one = tmp_path / "one"
    one.mkdir()
    whole = build_token_shards(src, tok, one, seq_len=2, validation_fraction=fraction)
    assert (whole["splits"]["train"]["documents"], whole["splits"]["validation"]["documents"]) == (2, 1)
    assert sorted(p.name for p in one.glob("*.arrow") if not p.name.startswith("tails-")) == sorted(
        e["file"] for s in whole["splits"].values() for e in s["shards"]
    )  # the first packing's files are gone
    out, m, _ = _partitioned(src, tok, tmp_path, 2, Packing(seq_len=2, validation_fraction=fraction))
    for split in ("train", "validation"):
        assert _all(out, split) == _all(one, split)
    enc = {"first": [0, 1, 2, 0, 3], "second": [2, 2, 1, 3], "third": [1, 0, 3]}[smallest]  # EOS id 3
    assert m["splits"]["validation"]["document_tokens"] == len(enc) and _all(out, "validation")[0] == enc[:3]


# ---------------------------------------------------------------------------------------------
# the 65,536-token vocabulary (shared case, built here)


@pytest.mark.parametrize("base,dtype,arrow_type", [(65_536, np.uint32, pa.uint32()), (65_535, np.uint16, pa.uint16())])
def test_vocabulary_size_sets_the_dtype_and_every_id_round_trips(
    tmp_path, make_word_tokenizer, base, dtype, arrow_type
):
    tok = make_word_tokenizer(tmp_path / "tok", [f"w{i}" for i in range(base)])
    eos = base  # the added special token takes the next id
    top = [base - 1 - i for i in range(8)]  # the highest base ids
    docs = [("d0", " ".join(f"w{i}" for i in top[:5])), ("d1", " ".join(f"w{i}" for i in top[5:]) + " w0")]
    out = tmp_path / "out"
    out.mkdir()
    m = build_token_shards(write_parts(tmp_path / "in", [docs]), tok, out, seq_len=3, validation_fraction=0.0)
    assert (m["dtype"], m["vocab_size"], m["eos_id"]) == (np.dtype(dtype).name, base + 1, eos)
    stream = top[:5] + [eos] + top[5:] + [0, eos]  # 11 tokens -> 2 windows of 4, 3 dropped
    shards = TokenShards(out, "train", verify_checksums=True)
    assert shards.dtype == dtype and shards.take([0, 1]).dtype == dtype
    assert shards.take([0, 1]).reshape(-1).tolist() == stream[:8]
    assert m["splits"]["train"]["dropped_remainder_tokens"] == 3
    path = out / m["splits"]["train"]["shards"][0]["file"]
    assert pa.ipc.open_file(str(path)).schema.field("input_ids").type == pa.list_(arrow_type, 4)
    rows = shards.take([0, 1])
    assert rows[1, 1] == eos and rows[0, 0] == max(top) == base - 1


# ---------------------------------------------------------------------------------------------
# the distributed sampler


def global_stream(
    num_samples: int, micro_batch: int, world_size: int, steps: int, seed: int = 5, start_step: int = 0
) -> list[list[np.ndarray]]:
    """indices[step][rank] for a run of ``steps`` micro-steps (every rank consumes micro_batch per step)."""
    samplers = [DistributedSampler(num_samples, seed=seed, rank=r, world_size=world_size) for r in range(world_size)]
    per_step = micro_batch * world_size
    return [[s.indices(step * per_step, micro_batch) for s in samplers] for step in range(start_step, steps)]


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("num_samples,micro_batch", [(12, 2), (10, 3), (7, 4), (1, 1)])
def test_ranks_together_read_each_epoch_exactly_once(num_samples, micro_batch, world_size):
    epochs = 3
    per_step = micro_batch * world_size
    steps = -(-epochs * num_samples // per_step)
    stream = []
    for step in global_stream(num_samples, micro_batch, world_size, steps):
        for idx in step:  # rank order = global stream order
            assert idx.dtype == np.int64 and idx.shape == (micro_batch,)
            stream.extend(idx.tolist())
    assert len(stream) >= epochs * num_samples
    perms = [DistributedSampler(num_samples, seed=5).permutation(e) for e in range(epochs)]
    for e in range(epochs):
        chunk = stream[e * num_samples : (e + 1) * num_samples]
        assert sorted(chunk) == list(range(num_samples))
        assert chunk == perms[e].tolist()  # the global stream is the seeded permutation of each epoch


def test_epochs_are_reshuffled():
    s = DistributedSampler(50, seed=3)
    assert s.permutation(0).tolist() != s.permutation(1).tolist()
    assert sorted(s.permutation(1).tolist()) == list(range(50))


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_resuming_anywhere_gives_the_uninterrupted_indices(world_size):
    num_samples, micro_batch, steps = 10, 3, 14  # 14 steps cover 4+ epochs for every world size
    full = global_stream(num_samples, micro_batch, world_size, steps)
    per_step = micro_batch * world_size
    assert steps * per_step >= 2 * num_samples  # resumes land in epoch >= 1 too
    for k in range(steps):
        resumed = global_stream(num_samples, micro_batch, world_size, steps, start_step=k)
        assert [[i.tolist() for i in step] for step in resumed] == [[i.tolist() for i in step] for step in full[k:]]
    # the samplers hold no state: reusing one object in any order changes nothing
    s = DistributedSampler(num_samples, seed=5, rank=world_size - 1, world_size=world_size)
    for k in reversed(range(steps)):
        assert s.indices(k * per_step, micro_batch).tolist() == full[k][world_size - 1].tolist()


def test_different_seeds_give_different_orders():
    a = np.concatenate([DistributedSampler(40, seed=0).indices(c, 8) for c in range(0, 80, 8)])
    b = np.concatenate([DistributedSampler(40, seed=1).indices(c, 8) for c in range(0, 80, 8)])
    assert a.tolist() != b.tolist()
    assert sorted(a[:40].tolist()) == sorted(b[:40].tolist()) == list(range(40))


# ---------------------------------------------------------------------------------------------
# the CLI


def run_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "largetrain_core.shards", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_cli_inspect(built, tmp_path):
    _, out, m = built
    r = run_cli("inspect", str(out))
    assert r.returncode == 0, r.stderr
    assert f"train: {m['splits']['train']['sequences']} sequences" in r.stdout
    assert f"validation: {m['splits']['validation']['sequences']} sequences" in r.stdout
    assert "dtype=uint16" in r.stdout and "seq_len=16" in r.stdout
    r = run_cli("inspect", str(out), "--split", "validation")
    assert r.returncode == 0, r.stderr

    name = m["splits"]["train"]["shards"][0]["file"]
    data = bytearray((out / name).read_bytes())
    data[-40] ^= 0xFF
    (out / name).write_bytes(bytes(data))
    r = run_cli("inspect", str(out))
    assert r.returncode == 1
    assert r.stderr.startswith("error:") and name in r.stderr

    text = (out / "manifest.json").read_text()
    (out / "manifest.json").write_text(text[:100])
    r = run_cli("inspect", str(out))
    assert r.returncode == 1 and r.stderr.startswith("error:") and "manifest.json" in r.stderr

    empty = tmp_path / "not-shards"
    empty.mkdir()
    r = run_cli("inspect", str(empty))
    assert r.returncode == 1 and r.stderr.startswith("error:") and "manifest.json" in r.stderr


@pytest.mark.parametrize("vocab_size", [60_000, 70_000])  # uint16 and uint32 ids
def test_the_shard_writer_streams_rows_to_disk_and_writes_the_bytes_of_one_record_batch(tmp_path, vocab_size):
    """_SplitWriter keeps a shard's rows in a file beside it, not in memory, and writes the same bytes as
    one record batch of those rows written at once (pyarrow), for row sizes that need the IPC body's
    8-byte padding or not and shards cut across calls; no rows file is left."""
    from largetrain_core.shards import _SplitWriter
    from largetrain_core.tokenizer import TokenizerInfo

    info = TokenizerInfo(path=tmp_path / "tokenizer.json", eos_id=0, bos_id=None, vocab_size=vocab_size, sha256="x")
    rng = np.random.default_rng(0)
    for k, (seq_len, per_shard, n) in enumerate([(1024, 8192, 5), (64, 7, 20), (3, 4, 9), (10, 3, 3), (1023, 16, 17)]):
        out = tmp_path / str(k)
        out.mkdir()
        w = _SplitWriter(out, "train-000000", seq_len, info, per_shard)
        rows = rng.integers(0, vocab_size, size=(n, seq_len + 1)).astype(info.dtype)
        w._write(rows[: n // 2])
        w._write(rows[n // 2 :])
        shards = w.finish()["shards"]
        assert [s["sequences"] for s in shards] == [min(per_shard, n - i) for i in range(0, n, per_shard)]
        assert sorted(p.name for p in out.iterdir()) == [s["file"] for s in shards]  # no rows file left
        start = 0
        for s in shards:
            expect = tmp_path / "at_once.arrow"
            flat = pa.array(rows[start : start + s["sequences"]].reshape(-1), type=w.arrow_type)
            with pa.ipc.new_file(str(expect), w.schema) as writer:
                writer.write_batch(
                    pa.record_batch([pa.FixedSizeListArray.from_arrays(flat, w.window)], schema=w.schema)
                )
            assert (out / s["file"]).read_bytes() == expect.read_bytes(), (seq_len, per_shard, n, s["file"])
            start += s["sequences"]
