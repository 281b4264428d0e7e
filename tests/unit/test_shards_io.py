"""Shard writes under a killed process, the Megatron export (read by megatron-core), and the sampler's saved state."""

import json
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
import xxhash
from tokenizers import Tokenizer

from helpers import REPO
from largetrain_core.shards import (
    DistributedSampler,
    ShardError,
    TokenShards,
    build_token_shards,
    export_hdf5,
    export_megatron,
)
from largetrain_core.tokenizer import train_bpe
from helpers.parts import write_parts


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("io")
    docs = root / "docs"
    docs.mkdir()
    texts = [f"document {i} says the quick brown fox number {i * 7} jumps over the lazy dog" for i in range(200)]
    pl.DataFrame({"doc_id": [f"d{i}" for i in range(200)], "source": ["s"] * 200, "text": texts}).write_parquet(
        docs / "part-00000.parquet"
    )
    train_bpe([texts], 300, root / "tok")
    out = root / "shards"
    out.mkdir()
    build_token_shards(docs, root / "tok", out, seq_len=16, validation_fraction=0.1, sequences_per_shard=50)
    return root


def read_megatron(prefix: Path):
    """An independent reader of Megatron-Core's IndexedDataset layout (indexed_dataset.py, _IndexReader)."""
    codes = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
    raw = Path(f"{prefix}.idx").read_bytes()
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
    data = np.memmap(f"{prefix}.bin", dtype=np.uint8, mode="r")
    seqs = [np.frombuffer(data, dtype, int(length), int(p)) for length, p in zip(lengths, pointers)]
    return version, dtype, seqs, doc_idx


def train_documents(root: Path) -> list[list[int]]:
    """The train split's documents of the ``small`` fixture, each its BPE ids + EOS, in corpus order,
    computed with tokenizers and xxhash directly (the split: xxh64(doc_id, 0) / 2**64 >= 0.1)."""
    tok = Tokenizer.from_file(str(root / "tok" / "tokenizer.json"))
    eos = json.loads((root / "shards" / "manifest.json").read_text())["eos_id"]
    df = pl.read_parquet(root / "docs" / "part-00000.parquet")
    return [
        tok.encode(t, add_special_tokens=False).ids + [eos]
        for d, t in zip(df["doc_id"], df["text"])
        if xxhash.xxh64_intdigest(d.encode(), 0) >= 0.1 * 2**64
    ]


def held_documents_in_stream(documents: list[list[int]], total: int, eos: int) -> list[list[int]]:
    """The documents that start within the first ``total`` tokens of their concatenation: whole where
    they end within it, else their tokens up to ``total``, then ``eos``."""
    held, start = [], 0
    for d in documents:
        if start >= total:
            break
        held.append(d if start + len(d) <= total else d[: total - start] + [eos])
        start += len(d)
    return held


@pytest.mark.parametrize("prefix", ["wiki.en_text_document", "kernel_text_document"])
def test_megatron_export_writes_the_documents_under_the_whole_prefix(small, tmp_path, prefix):
    shards = TokenShards(small / "shards", "train")
    stream = shards.take(range(len(shards))).reshape(-1)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "largetrain_core.shards",
            "export-megatron",
            str(small / "shards"),
            str(tmp_path / "mega" / prefix),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    # Megatron appends .bin/.idx to the prefix: wiki.en_text_document.bin, not wiki.bin
    assert sorted(p.name for p in (tmp_path / "mega").iterdir()) == [f"{prefix}.bin", f"{prefix}.idx"]
    version, dtype, seqs, doc_idx = read_megatron(tmp_path / "mega" / prefix)
    eos = shards.manifest["eos_id"]
    documents = train_documents(small)
    expected = held_documents_in_stream(documents, len(stream), eos)
    assert version == 1 and dtype == np.uint16
    # one sequence per document, the last one cut by the dropped remainder: its held tokens, then EOS
    assert [s.tolist() for s in seqs] == expected and expected[-1] != documents[len(expected) - 1]
    assert doc_idx.tolist() == list(range(len(expected) + 1))
    tokens = sum(len(d) for d in expected)
    assert tokens == len(stream) + 1
    assert np.concatenate(seqs)[:-1].tolist() == stream.tolist()  # the tokens training reads, in order
    assert info == {
        "documents": len(expected),
        "tokens": tokens,
        "truncated_documents": 1,
        "dtype": "uint16",
        "bin": str(tmp_path / "mega" / f"{prefix}.bin"),
        "idx": str(tmp_path / "mega" / f"{prefix}.idx"),
    }
    assert (tmp_path / "mega" / f"{prefix}.bin").stat().st_size == tokens * 2


def _megatron_tokenizer(root: Path):
    """Megatron-Core's own Hugging Face tokenizer (``MegatronTokenizer.from_pretrained`` with the
    ``huggingface`` library) pointed at a directory the project wrote: it finds the end-of-text token
    (``eod``) in the tokenizer_config.json beside tokenizer.json."""
    from megatron.core.tokenizers import MegatronTokenizer

    return MegatronTokenizer.from_pretrained(str(root), metadata_path={"library": "huggingface"})


def test_megatron_tokenizer_finds_the_end_of_text_token_in_every_tokenizer_directory(small):
    """The tokenizer stage's directory and the shards' (which carry the tokenizer that made them) both
    give Megatron-Core's tokenizer the EOS id as ``eod``, and it encodes as the shards do."""
    eos = json.loads((small / "shards" / "manifest.json").read_text())["eos_id"]
    tok = Tokenizer.from_file(str(small / "tok" / "tokenizer.json"))
    for directory in (small / "tok", small / "shards"):
        megatron = _megatron_tokenizer(directory)
        assert megatron.eod == eos and megatron.vocab_size == tok.get_vocab_size()
        assert list(megatron.tokenize("the quick brown fox")) == tok.encode("the quick brown fox").ids


@pytest.mark.filterwarnings("ignore:Transformer Engine and Apex are not installed")
def test_megatron_core_reads_the_export_and_its_gpt_dataset_samples_whole_documents(small, tmp_path):
    """megatron-core's own IndexedDataset and GPTDataset (its BlendedMegatronDatasetBuilder, defaults:
    sequence_length = our seq_len, one extra token) over the export: every sample is made of whole
    documents joined after their EOS, except the parts cut at its two ends."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    prefix = str(tmp_path / "mega" / "wiki.en_text_document")
    info = export_megatron(small / "shards", "train", Path(prefix))
    shards = TokenShards(small / "shards", "train")
    eos = shards.manifest["eos_id"]
    documents = held_documents_in_stream(train_documents(small), len(shards) * (shards.seq_len + 1), eos)
    indexed = IndexedDataset(prefix)
    assert len(indexed) == info["documents"] == len(documents) and indexed.document_indices.tolist() == list(
        range(len(documents) + 1)
    )
    assert [indexed[i].tolist() for i in range(len(indexed))] == documents

    train = gpt_dataset(prefix, small / "shards", shards.seq_len, tmp_path / "cache")
    assert len(train) == (info["tokens"] - 1) // shards.seq_len  # one epoch of the documents' tokens
    joined = samples_of_documents(train, documents, eos, shards.seq_len)
    assert joined > len(train) // 2  # most samples span a document boundary: the check above is exercised


def gpt_dataset(prefix: str, shards_dir: Path, seq_len: int, cache: Path, tokenizer=None):
    """megatron-core's GPTDataset over one IndexedDataset prefix, built by its BlendedMegatronDatasetBuilder
    with its defaults (all of it the train split, ``sequence_length`` = our seq_len), with Megatron's
    tokenizer of the shards' directory unless ``tokenizer`` is given."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    config = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=seq_len,
        blend=([prefix], None),
        split="1,0,0",
        tokenizer=tokenizer or _megatron_tokenizer(shards_dir),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        path_to_cache=str(cache),
    )
    train, valid, test = BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], lambda: True, config).build()
    assert valid is None and test is None
    return train


def samples_of_documents(train, documents: list[list[int]], eos: int, seq_len: int) -> int:
    """Assert that every sample of the GPTDataset ``train`` is ``seq_len + 1`` tokens of ``documents``:
    inside one document, or the end of one, whole documents joined after their EOS, and the start of
    another. Returns how many samples span a document boundary."""
    whole = {tuple(d) for d in documents}
    heads = {tuple(d[:k]) for d in documents for k in range(1, len(d) + 1)}
    tails = {tuple(d[-k:]) for d in documents for k in range(1, len(d) + 1)}
    inside = {tuple(d[a:b]) for d in documents for a in range(len(d)) for b in range(a + 1, len(d) + 1)}
    joined = 0
    for i in range(len(train)):
        sample = train[i]
        text = sample["tokens"].tolist() + sample["labels"][-1:].tolist()
        assert sample["labels"].tolist() == text[1:] and len(text) == seq_len + 1
        cuts = [k + 1 for k, t in enumerate(text) if t == eos]
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)]) if a < b]
        if len(pieces) == 1:  # inside one document
            assert tuple(pieces[0]) in inside, (i, pieces)
            continue
        assert tuple(pieces[0]) in tails and tuple(pieces[-1]) in heads, (i, pieces)
        assert all(tuple(p) in whole for p in pieces[1:-1]), (i, pieces)  # documents joined only after their EOS
        joined += 1
    return joined


def _ids_of_split(validation: bool, count: int, prefix: str) -> list[str]:
    """The first ``count`` doc ids ``<prefix>0``, ``<prefix>1``, ... that the split hash (seed 0,
    validation_fraction 0.5: xxh64(doc_id, 0) / 2**64 < 0.5) puts in validation, or in train."""
    ids, i = [], 0
    while len(ids) < count:
        d = f"{prefix}{i}"
        if (xxhash.xxh64_intdigest(d.encode(), 0) < 0.5 * 2**64) == validation:
            ids.append(d)
        i += 1
    return ids


@pytest.mark.filterwarnings("ignore:Transformer Engine and Apex are not installed")
def test_megatron_export_keeps_the_documents_the_dropped_remainder_cut(tmp_path, make_word_tokenizer):
    """The demo's shape: several part files, one validation document in each, and a train split of one
    document. Words are tokens (w0 ... w299, EOS 300), seq_len 16 (windows of 17). Validation: documents
    of 61, 43, 71 and 19 tokens with EOS, one per part: 3, 2, 4 and 1 windows, tails 10, 9, 3 and 2;
    the 24 tail tokens make one window, the last 7 are dropped: the 2nd document loses its last 2
    tokens, the 3rd its last 3, the 4th its last 2. Train: one document of 39 tokens, 2 windows, its
    tail of 5 dropped. megatron-core's IndexedDataset reads every document, each cut one as its held
    tokens then EOS, and its GPTDataset samples them; an export that once left the cut ones out held 1
    of the 4 validation documents and none of train."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.tokenizers import MegatronTokenizer

    tok = make_word_tokenizer(tmp_path / "tok", [f"w{i}" for i in range(300)])
    eos = 300
    lengths = [61, 43, 71, 19]  # validation documents, EOS included
    starts = np.concatenate([[0], np.cumsum(lengths)])
    val_docs = [list(range(a, a + n - 1)) + [eos] for a, n in zip(starts, lengths)]
    train_doc = list(range(starts[-1], starts[-1] + 38)) + [eos]
    val_ids, train_ids = _ids_of_split(True, 4, "play"), _ids_of_split(False, 1, "play")

    def text(doc: list[int]) -> str:
        return " ".join(f"w{t}" for t in doc[:-1])

    parts = [[(val_ids[0], text(val_docs[0])), (train_ids[0], text(train_doc))]]
    parts += [[(d, text(doc))] for d, doc in zip(val_ids[1:], val_docs[1:])]
    out = tmp_path / "shards"
    out.mkdir()
    manifest = build_token_shards(write_parts(tmp_path / "in", parts), tok, out, seq_len=16, validation_fraction=0.5)
    val, train = manifest["splits"]["validation"], manifest["splits"]["train"]
    assert (val["documents"], val["sequences"], val["dropped_remainder_tokens"]) == (4, 11, 7)
    assert (train["documents"], train["sequences"], train["dropped_remainder_tokens"]) == (1, 2, 5)

    expected = {
        "validation": [val_docs[0], val_docs[1][:41] + [eos], val_docs[2][:68] + [eos], val_docs[3][:17] + [eos]],
        "train": [train_doc[:34] + [eos]],
    }
    for split, documents in expected.items():
        prefix = str(tmp_path / "mega" / f"{split}_text_document")
        info = export_megatron(out, split, Path(prefix))
        held = manifest["splits"][split]["tokens"]
        assert (info["documents"], info["tokens"], info["truncated_documents"]) == (
            len(documents),
            held + len(documents) - (split == "validation"),
            len(documents) - (split == "validation"),
        )
        indexed = IndexedDataset(prefix)
        assert [indexed[i].tolist() for i in range(len(indexed))] == documents
        assert indexed.document_indices.tolist() == list(range(len(documents) + 1))
        # Megatron's tokenizer without a vocabulary: EOD is id 300, as here (the word vocabulary has no unknown token)
        null = MegatronTokenizer.from_pretrained(metadata_path={"library": "null"}, vocab_size=300)
        dataset = gpt_dataset(prefix, out, 16, tmp_path / "cache" / split, null)
        assert len(dataset) == (info["tokens"] - 1) // 16
        samples_of_documents(dataset, documents, eos, 16)


def test_megatron_export_of_a_split_without_tokens_fails_and_writes_nothing(tmp_path, make_word_tokenizer):
    """A split whose documents are all shorter than one window holds no tokens: the exports refuse
    (the CLI with exit code 1, the reason on stderr) instead of writing the empty .bin Megatron cannot mmap."""
    tok = make_word_tokenizer(tmp_path / "tok", [f"w{i}" for i in range(10)])
    out = tmp_path / "shards"
    out.mkdir()
    docs = [("a", "w1 w2 w3"), ("b", "w4 w5")]  # 4 + 3 tokens with EOS, under a window of 17
    build_token_shards(write_parts(tmp_path / "in", [docs]), tok, out, seq_len=16, validation_fraction=0.0)
    with pytest.raises(ShardError, match=r"split 'train' holds no tokens.* 2 document\(s\) \(7 tokens\)"):
        export_megatron(out, "train", tmp_path / "mega" / "empty")
    r = subprocess.run(
        [sys.executable, "-m", "largetrain_core.shards", "export-megatron", str(out), str(tmp_path / "mega" / "x")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith(f"error: {out}: split 'train' holds no tokens, so there is nothing to export")
    assert not (tmp_path / "mega").exists() or not list((tmp_path / "mega").iterdir())
    with pytest.raises(ShardError, match=r"split 'train' holds no tokens"):
        export_hdf5(out, "train", tmp_path / "h5" / "empty.h5")
    assert not (tmp_path / "h5").exists() or not list((tmp_path / "h5").iterdir())


@pytest.mark.filterwarnings("ignore:Transformer Engine and Apex are not installed")
def test_megatron_export_of_a_uint32_vocabulary_reads_back_in_megatron_core(tmp_path, make_word_tokenizer):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    tok = make_word_tokenizer(tmp_path / "tok", [f"w{i}" for i in range(70_000)])
    docs = [("d0", "w69999 w1 w2"), ("d1", "w5 w69998"), ("d2", "w7")]  # 4 + 3 + 2 tokens with EOS: 3 windows of 3
    out = tmp_path / "out"
    out.mkdir()
    build_token_shards(write_parts(tmp_path / "in", [docs]), tok, out, seq_len=2, validation_fraction=0.0)
    info = export_megatron(out, "train", tmp_path / "m" / "words")
    indexed = IndexedDataset(str(tmp_path / "m" / "words"))
    assert info["dtype"] == "int32" and indexed.index.dtype == np.int32
    assert [indexed[i].tolist() for i in range(len(indexed))] == [
        [69999, 1, 2, 70_000],
        [5, 69998, 70_000],
        [7, 70_000],
    ]


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
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(docs), str(tok), str(final)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
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
    pl.DataFrame({"doc_id": [str(i) for i in range(4000)], "source": ["s"] * 4000, "text": texts}).write_parquet(
        docs / "part-00000.parquet"
    )
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
