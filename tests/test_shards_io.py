"""Shard writes under a killed process, the Megatron export, and the sampler's saved state."""

import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from largetrain_core.shards import DistributedSampler, ShardError, TokenShards, build_token_shards, export_megatron
from largetrain_core.tokenizer import train_bpe

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("io")
    docs = root / "docs"
    docs.mkdir()
    texts = [f"document {i} says the quick brown fox number {i * 7} jumps over the lazy dog" for i in range(200)]
    pl.DataFrame({"doc_id": [f"d{i}" for i in range(200)], "source": ["s"] * 200, "text": texts}).write_parquet(docs / "part-00000.parquet")
    train_bpe([texts], 300, root / "tok")
    out = root / "shards"
    out.mkdir()
    build_token_shards(docs, root / "tok", out, seq_len=16, validation_fraction=0.1, sequences_per_shard=50)
    return root


def read_megatron(prefix: Path):
    """An independent reader of Megatron-Core's IndexedDataset layout (indexed_dataset.py, _IndexReader)."""
    codes = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
    raw = prefix.with_suffix(".idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack("<Q", raw[9:17])
    (code,) = struct.unpack("<B", raw[17:18])
    n_seq, n_doc = struct.unpack("<QQ", raw[18:34])
    off = 34
    lengths = np.frombuffer(raw, np.int32, n_seq, off)
    off += 4 * n_seq
    pointers = np.frombuffer(raw, np.int64, n_seq, off)
    off += 8 * n_seq
    doc_idx = np.frombuffer(raw, np.int64, n_doc, off)
    assert off + 8 * n_doc == len(raw)
    dtype = np.dtype(codes[code])
    data = np.memmap(prefix.with_suffix(".bin"), dtype=np.uint8, mode="r")
    seqs = [np.frombuffer(data, dtype, int(length), int(p)) for length, p in zip(lengths, pointers)]
    return version, dtype, seqs, doc_idx


def test_megatron_export_reads_back_with_the_documented_layout(small, tmp_path):
    shards = TokenShards(small / "shards", "train")
    info = export_megatron(small / "shards", "train", tmp_path / "mega" / "kernel_text_document")
    version, dtype, seqs, doc_idx = read_megatron(tmp_path / "mega" / "kernel_text_document")
    assert version == 1 and dtype == np.uint16 and info["sequences"] == len(shards) == len(seqs)
    assert doc_idx.tolist() == list(range(len(shards) + 1))
    for i in (0, len(shards) // 2, len(shards) - 1):
        assert seqs[i].tolist() == shards[i].tolist()
    assert (tmp_path / "mega" / "kernel_text_document.bin").stat().st_size == info["tokens"] * 2


WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import polars as pl
    from largetrain_core.shards import build_token_shards
    from largetrain_core.storage import atomic_dir
    docs, tok, final = map(Path, sys.argv[1:4])
    with atomic_dir(final) as tmp:
        build_token_shards(docs, tok, tmp, seq_len=16, sequences_per_shard=50)
        print("written", flush=True)
        time.sleep(60)  # killed here: the shards are complete in the temporary directory, not yet renamed
""")


def kill_writer_when(docs: Path, tok: Path, final: Path, ready) -> None:
    """Start WRITER in its own process group; SIGKILL the group once ``ready(proc)`` returns."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(docs), str(tok), str(final)],
                            cwd=REPO, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        ready(proc)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_writer_killed_before_rename_leaves_nothing_a_reader_accepts(small, tmp_path):
    final = tmp_path / "token_shards" / "v1"

    def written(proc):
        assert proc.stdout.readline().strip() == "written"

    kill_writer_when(small / "docs", small / "tok", final, written)
    assert not final.exists()
    leftovers = list(final.parent.iterdir())
    assert leftovers and all(p.name.startswith(".tmp-v1-") for p in leftovers)
    with pytest.raises(ShardError, match="manifest.json: missing"):
        TokenShards(final, "train")


def test_writer_killed_mid_shard_leaves_nothing_a_reader_accepts(tmp_path):
    """Kill while a shard file is being written (many documents, SIGKILL as soon as the first shard file appears)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    texts = ["word " * 400 + str(i) for i in range(4000)]
    pl.DataFrame({"doc_id": [str(i) for i in range(4000)], "source": ["s"] * 4000, "text": texts}).write_parquet(docs / "part-00000.parquet")
    train_bpe([texts[:50]], 300, tmp_path / "tok")
    final = tmp_path / "out" / "v1"

    def first_shard_file_appears(proc):
        deadline = time.time() + 120
        while time.time() < deadline and not list((tmp_path / "out").glob(".tmp-v1-*/train-*.arrow")):
            time.sleep(0.01)

    kill_writer_when(docs, tmp_path / "tok", final, first_shard_file_appears)
    assert not final.exists()
    with pytest.raises(ShardError):
        TokenShards(final, "train")
    # the temporary directory is not a valid shard directory either
    tmp_dirs = list((tmp_path / "out").glob(".tmp-v1-*"))
    assert tmp_dirs
    with pytest.raises(ShardError):
        TokenShards(tmp_dirs[0], "train")


def test_sampler_iterates_and_restores_its_state():
    a = DistributedSampler(37, seed=3, rank=1, world_size=2, micro_batch_size=4)
    it = iter(a)
    first = [next(it) for _ in range(7)]
    state = a.state_dict()
    assert state["consumed_samples"] == 7 * 4 * 2 and state["epoch"] == 56 // 37
    rest = [next(it) for _ in range(5)]
    b = DistributedSampler(37, seed=3, rank=1, world_size=2, micro_batch_size=4)
    b.load_state_dict(state)
    it_b = iter(b)
    assert all(np.array_equal(x, next(it_b)) for x in rest)
    assert not np.array_equal(first[0], rest[0])
    with pytest.raises(ValueError, match="seed"):
        DistributedSampler(37, seed=4, rank=1, world_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match="num_samples"):
        DistributedSampler(38, seed=3, rank=1, world_size=2).load_state_dict(state)


def test_resume_work_does_not_depend_on_the_position():
    """Resuming at any point computes one permutation of the epoch: count the generator draws."""
    from largetrain_core import shards

    s = DistributedSampler(1000, seed=0, rank=0, world_size=2, micro_batch_size=8)
    for consumed in (0, 16, 992 - 16, 5000):
        shards._permutation.cache_clear()
        s.indices(consumed, 8)
        info = shards._permutation.cache_info()
        assert info.misses == 1, (consumed, info)
