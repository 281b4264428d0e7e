"""The shards read by other tools: the HDF5 export read back with h5py, and the examples of
docs/guides/data-preparation.md (pandas, polars, DuckDB, Hugging Face datasets, PyTorch, h5py) run as
written against a real shard directory; and datasets' Dataset.from_file, which that page says cannot
read them, really cannot."""

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import xxhash
from tokenizers import Tokenizer

from helpers import REPO
from helpers.docblocks import section_blocks
from largetrain_core.shards import TokenShards, build_token_shards, export_hdf5
from helpers.parts import write_parts

DOC = "docs/guides/data-preparation.md"
DOC_SHARDS = '".largetrain/domain/token_shards/DATA_VERSION"'


@pytest.fixture
def shard_dir(tmp_path, bpe_dir, sentences):
    """Documents of uneven length (many span two windows) over three part files; several shards per split."""
    docs = [(f"doc-{i:02d}", " ".join(sentences[i * 5 : (i + 1) * 5 - i % 4])) for i in range(40)]
    src = write_parts(tmp_path / "dedup", [docs[:15], docs[15:16], docs[16:]])
    out = tmp_path / "shards"
    out.mkdir()
    build_token_shards(src, bpe_dir, out, seq_len=16, validation_fraction=0.25, seed=3, sequences_per_shard=7)
    return docs, out


PARTS = (slice(0, 15), slice(15, 16), slice(16, 40))  # the part files of ``shard_dir``


def held_documents(docs, bpe_dir: Path, validation: bool, window: int = 17) -> tuple[list[list[int]], int]:
    """The documents of a split that the shards hold tokens of (BPE ids + EOS, computed with tokenizers
    directly), in corpus order, by the documented packing: per part file its full windows, the parts'
    tails joined after them, the last R = (tail tokens mod window) tokens of that dropped. A document
    the drop cut is its held tokens then EOS; one wholly dropped is left out. Returns (the documents,
    how many were cut)."""
    tok = Tokenizer.from_file(str(bpe_dir / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    found = []  # (document, its tokens in its part's tail)
    for part in PARTS:
        mine = [
            tok.encode(t, add_special_tokens=False).ids + [eos]
            for d, t in docs[part]
            if (xxhash.xxh64_intdigest(d.encode(), 3) < 0.25 * 2**64) == validation
        ]
        tail_start, pos = sum(len(d) for d in mine) // window * window, 0
        for d in mine:
            found.append((d, max(0, pos + len(d) - max(pos, tail_start))))
            pos += len(d)
    left, held = sum(t for _, t in found) % window, [d for d, _ in found]
    cut = 0
    for i in reversed(range(len(found))):  # the dropped remainder: the end of the tail stream
        if left <= 0:
            break
        dropped = min(left, found[i][1])
        if dropped:
            keep = len(found[i][0]) - dropped
            held[i] = found[i][0][:keep] + [eos] if keep else None
            cut += bool(keep)
        left -= found[i][1]
    return [d for d in held if d is not None], cut


@pytest.mark.parametrize("split", ["train", "validation"])
def test_hdf5_export_reads_back_with_h5py(shard_dir, bpe_dir, tmp_path, split):
    docs, out = shard_dir
    shards = TokenShards(out, split)
    manifest = json.loads((out / "manifest.json").read_text())
    target = tmp_path / "h5" / f"{split}.h5"
    r = subprocess.run(
        [sys.executable, "-m", "largetrain_core.shards", "export-hdf5", str(out), str(target), "--split", split],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert not list(target.parent.glob(".*.tmp"))  # written under a temporary name, then renamed

    with h5py.File(target, "r") as f:
        ids = f["input_ids"][:]
        tokens = f["document_tokens"][:]
        offsets = f["document_offsets"][:]
        attrs = dict(f.attrs)
        assert f["input_ids"].dtype == np.uint16 and f["document_offsets"].dtype == np.int64
    assert ids.shape == (len(shards), 17) and np.array_equal(ids, shards.take(range(len(shards))))

    # every document the shards hold tokens of, in corpus order: those the dropped remainder cut, their held tokens
    expected, cut = held_documents(docs, bpe_dir, split == "validation")
    assert cut >= 1  # the remainder cut a document: the case the export once left out
    assert [tokens[a:b].tolist() for a, b in zip(offsets, offsets[1:])] == expected
    assert offsets[-1] == len(tokens) == sum(len(d) for d in expected)
    assert info == {"sequences": len(shards), "tokens": ids.size, "documents": len(expected), "dtype": "uint16"}
    s = manifest["splits"][split]
    assert attrs["truncated_documents"] == cut
    assert len(tokens) == s["tokens"] + cut  # the shards' tokens, and one EOS ending each cut document

    assert (attrs["split"], attrs["seq_len"], attrs["dtype"], attrs["eos_id"], attrs["vocab_size"]) == (
        split,
        16,
        "uint16",
        manifest["eos_id"],
        300,
    )
    assert attrs["bos_id"] == -1 and attrs["tokenizer_sha256"] == manifest["tokenizer_sha256"]
    assert attrs["format"] == manifest["format"] and attrs["validation_fraction"] == 0.25 and attrs["seed"] == 3
    assert [attrs[k] for k in ("sequences", "tokens", "documents", "document_tokens", "dropped_remainder_tokens")] == [
        s[k] for k in ("sequences", "tokens", "documents", "document_tokens", "dropped_remainder_tokens")
    ]
    assert json.loads(attrs["manifest_json"]) == manifest


def test_hdf5_export_of_a_uint32_vocabulary(tmp_path, make_word_tokenizer):
    tok = make_word_tokenizer(tmp_path / "tok", [f"w{i}" for i in range(70_000)])
    docs = [("d0", "w69999 w1 w2"), ("d1", "w5 w69998")]  # 4 + 3 tokens with EOS -> 2 windows of 3, 1 dropped
    out = tmp_path / "out"
    out.mkdir()
    build_token_shards(write_parts(tmp_path / "in", [docs]), tok, out, seq_len=2, validation_fraction=0.0)
    info = export_hdf5(out, "train", tmp_path / "t.h5")
    with h5py.File(tmp_path / "t.h5", "r") as f:
        assert f["input_ids"].dtype == np.uint32
        assert f["input_ids"][:].reshape(-1).tolist() == [69999, 1, 2, 70_000, 5, 69998]
        # d1's EOS fell into the dropped remainder: d1 is its held tokens, then EOS
        assert f["document_offsets"][:].tolist() == [0, 4, 7]
        assert f["document_tokens"][:].tolist() == [69999, 1, 2, 70_000, 5, 69998, 70_000]
        assert f.attrs["truncated_documents"] == 1
    assert info["documents"] == 2


def test_datasets_from_file_cannot_read_the_shards_as_the_docs_say(shard_dir):
    """If a datasets release learns to read IPC files here, docs/guides/data-preparation.md's advice
    should say so."""
    import datasets
    import pyarrow as pa

    _, out = shard_dir
    first = out / TokenShards(out, "train").manifest["splits"]["train"]["shards"][0]["file"]
    with pytest.raises(pa.ArrowInvalid, match="Expected to read .* metadata bytes"):
        datasets.Dataset.from_file(str(first))


def docs_examples() -> list[str]:
    """The python blocks of docs/guides/data-preparation.md's "Reading the shards from other tools", in order."""
    return [b.text for b in section_blocks(DOC, "Reading the shards from other tools", "python")]


def test_docs_examples_read_the_shards(shard_dir, tmp_path, monkeypatch):
    _, out = shard_dir
    blocks = docs_examples()
    assert len(blocks) == 7 and DOC_SHARDS in blocks[0]
    export_hdf5(out, "train", tmp_path / "train.h5")
    monkeypatch.chdir(tmp_path)  # the h5py example opens train.h5 in the working directory
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))  # datasets' cache, not the user's
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")  # read at import time
    ns: dict = {}
    for block in blocks:
        exec(compile(block.replace(DOC_SHARDS, repr(str(out))), DOC, "exec"), ns)

    shards = TokenShards(out, "train")
    rows = shards.take(range(len(shards)))
    assert len(ns["files"]) == len(shards.manifest["splits"]["train"]["shards"]) >= 3
    for name in ("windows", "windows_pl", "hf_windows", "h5_windows"):  # pandas, polars, Hugging Face datasets, h5py
        assert ns[name].dtype == np.uint16 and np.array_equal(ns[name], rows), name
    hf_validation = datasets.load_dataset(str(out), split="validation")  # the directory's README.md: both splits
    validation = TokenShards(out, "validation")
    assert hf_validation["input_ids"] == validation.take(range(len(validation))).tolist()
    assert ns["stats"] == (len(shards), int(rows.max()))  # DuckDB
    assert list(ns["first"]) == rows[0].tolist()
    batch = ns["batch"]  # PyTorch
    assert batch["input_ids"].dtype == torch.int64 and batch["input_ids"].shape == (8, 16)
    assert torch.equal(batch["input_ids"], torch.from_numpy(rows[:8, :-1].astype(np.int64)))
    assert torch.equal(batch["labels"], torch.from_numpy(rows[:8, 1:].astype(np.int64)))
    assert ns["first_document"][-1] == shards.manifest["eos_id"] and len(ns["first_document"]) == ns["offsets"][1]


DOC_TEXT = '".largetrain/domain/deduplicated_text/DATA_VERSION"'


@pytest.fixture
def text_assets(tmp_path, sentences):
    """A raw_corpus -> cleaned_text -> deduplicated_text run of the stages on a small corpus with
    duplicates and a filtered document, so the version directories hold bookkeeping beside the parts."""
    from largetrain_core.clean import QualityConfig
    from largetrain_core.executors.local import LocalExecutor
    from largetrain_core.readers import ReaderConfig
    from largetrain_core.stages.base import StageRun
    from largetrain_core.stages.cleaned_text import cleaned_text
    from largetrain_core.stages.deduplicated_text import deduplicated_text
    from largetrain_core.stages.raw_corpus import raw_corpus

    src = tmp_path / "corpus"
    src.mkdir()
    texts = [" ".join(sentences[i * 10 : (i + 1) * 10]) for i in range(30)] + ["a few words"]
    for i, text in enumerate(texts + texts[:5]):  # five exact copies
        (src / f"d{i:02d}.txt").write_text(text)
    root, ex = tmp_path / "root", LocalExecutor()
    raw, cleaned = {}, {}
    for pk in ("0", "1"):
        raw[pk] = raw_corpus(
            ReaderConfig(str(src), partition=int(pk), partitions=2),
            StageRun(root, ("c", "raw_corpus"), pk, executor=ex),
        )
        cleaned[pk] = cleaned_text(QualityConfig(), raw[pk], StageRun(root, ("c", "cleaned_text"), pk, executor=ex))
    dedup = deduplicated_text(True, raw, cleaned, StageRun(root, ("c", "deduplicated_text"), executor=ex))
    return cleaned, dedup


def test_docs_examples_read_the_text_assets(text_assets, tmp_path, monkeypatch):
    """docs/guides/data-preparation.md's "Reading the text assets", run as written on a deduplicated_text
    version and on a cleaned_text partition's version (whose filtered.parquet and signatures/ a
    directory-level read must not take): each reader gives the documents of the part files, in order."""
    import datasets
    import polars as pl

    cleaned, dedup = text_assets
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    blocks = [b.text for b in section_blocks(DOC, "Reading the text assets", "python")]
    assert len(blocks) == 5 and DOC_TEXT in blocks[0]
    assert cleaned["0"].stats["filtered"] >= 1 and dedup.stats["duplicate"] >= 1  # bookkeeping beside the parts
    for version in (dedup.path, cleaned["0"].path):
        assert (version / "README.md").is_file()
        want = pl.concat([pl.read_parquet(p) for p in sorted(version.glob("part-*.parquet"))])
        ns: dict = {}
        for block in blocks:
            exec(compile(block.replace(DOC_TEXT, repr(str(version))), DOC, "exec"), ns)
        assert ns["hf_docs"]["doc_id"] == want["doc_id"].to_list() and ns["hf_docs"]["text"] == want["text"].to_list()
        assert ns["pl_docs"].equals(want.select("doc_id", "text"))
        assert ns["documents"] == len(want) == len(ns["pd_docs"]) > 0
        assert ns["pd_docs"]["doc_id"].tolist() == want["doc_id"].to_list()
