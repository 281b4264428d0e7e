"""The shards read by other tools: the HDF5 export read back with h5py, and the README's examples
(pandas, polars, DuckDB, PyTorch, h5py) run as written against a real shard directory."""

import json
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import xxhash
from tokenizers import Tokenizer

from largetrain_core.shards import TokenShards, build_token_shards, export_hdf5
from parts import write_parts

REPO = Path(__file__).resolve().parents[1]
README_SHARDS = '".largetrain/domain/token_shards/DATA_VERSION"'


@pytest.fixture
def shard_dir(tmp_path, bpe_dir, sentences):
    """Documents of uneven length (many span two windows) over three part files; several shards per split."""
    docs = [(f"doc-{i:02d}", " ".join(sentences[i * 5:(i + 1) * 5 - i % 4])) for i in range(40)]
    src = write_parts(tmp_path / "dedup", [docs[:15], docs[15:16], docs[16:]])
    out = tmp_path / "shards"
    out.mkdir()
    build_token_shards(src, bpe_dir, out, seq_len=16, validation_fraction=0.25, seed=3, sequences_per_shard=7)
    return docs, out


def document_lengths(docs, bpe_dir: Path, validation: bool) -> list[int]:
    """Tokens of each document of a split (its BPE ids + EOS), in corpus order, computed with tokenizers directly."""
    tok = Tokenizer.from_file(str(bpe_dir / "tokenizer.json"))
    in_split = [(xxhash.xxh64_intdigest(d.encode(), 3) < 0.25 * 2**64) == validation for d, _ in docs]
    return [len(tok.encode(t, add_special_tokens=False).ids) + 1 for (d, t), keep in zip(docs, in_split) if keep]


@pytest.mark.parametrize("split", ["train", "validation"])
def test_hdf5_export_reads_back_with_h5py(shard_dir, bpe_dir, tmp_path, split):
    docs, out = shard_dir
    shards = TokenShards(out, split)
    manifest = json.loads((out / "manifest.json").read_text())
    target = tmp_path / "h5" / f"{split}.h5"
    r = subprocess.run([sys.executable, "-m", "largetrain_core.shards", "export-hdf5", str(out), str(target), "--split", split],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert not list(target.parent.glob(".*.tmp"))  # written under a temporary name, then renamed

    with h5py.File(target, "r") as f:
        ids = f["input_ids"][:]
        offsets = f["document_offsets"][:]
        attrs = dict(f.attrs)
        assert f["input_ids"].dtype == np.uint16 and f["document_offsets"].dtype == np.int64
    assert ids.shape == (len(shards), 17) and np.array_equal(ids, shards.take(range(len(shards))))

    # document offsets from the documents' own token counts, cut where the dropped remainder begins
    lengths = document_lengths(docs, bpe_dir, split == "validation")
    total = ids.size
    starts = np.concatenate([[0], np.cumsum(lengths)])
    expected = np.append(starts[starts < total], total)
    assert offsets.tolist() == expected.tolist()
    assert info == {"sequences": len(shards), "tokens": total, "documents": len(expected) - 1, "dtype": "uint16"}
    stream = ids.reshape(-1)
    assert all(stream[e - 1] == manifest["eos_id"] for e in offsets[1:-1])  # each complete document ends with EOS
    assert attrs["last_document_complete"] == (stream[-1] == manifest["eos_id"])

    s = manifest["splits"][split]
    assert (attrs["split"], attrs["seq_len"], attrs["dtype"], attrs["eos_id"], attrs["vocab_size"]) == (split, 16, "uint16", manifest["eos_id"], 300)
    assert attrs["bos_id"] == -1 and attrs["tokenizer_sha256"] == manifest["tokenizer_sha256"]
    assert attrs["format"] == manifest["format"] and attrs["validation_fraction"] == 0.25 and attrs["seed"] == 3
    assert [attrs[k] for k in ("sequences", "tokens", "documents", "document_tokens", "dropped_remainder_tokens")] == \
        [s[k] for k in ("sequences", "tokens", "documents", "document_tokens", "dropped_remainder_tokens")]
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
        assert f["document_offsets"][:].tolist() == [0, 4, 6] and not f.attrs["last_document_complete"]
    assert info["documents"] == 2


def readme_examples() -> list[str]:
    """The python blocks of the README's "Reading the shards from other tools" section, in order."""
    text = (REPO / "README.md").read_text()
    section = text.split("### Reading the shards from other tools", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_readme_examples_read_the_shards(shard_dir, tmp_path, monkeypatch):
    _, out = shard_dir
    blocks = readme_examples()
    assert len(blocks) == 6 and README_SHARDS in blocks[0]
    export_hdf5(out, "train", tmp_path / "train.h5")
    monkeypatch.chdir(tmp_path)  # the h5py example opens train.h5 in the working directory
    ns: dict = {}
    for block in blocks:
        exec(compile(block.replace(README_SHARDS, repr(str(out))), "README.md", "exec"), ns)

    shards = TokenShards(out, "train")
    rows = shards.take(range(len(shards)))
    assert len(ns["files"]) == len(shards.manifest["splits"]["train"]["shards"]) >= 3
    for name in ("windows", "windows_pl", "h5_windows"):  # pandas, polars, h5py
        assert ns[name].dtype == np.uint16 and np.array_equal(ns[name], rows), name
    assert ns["stats"] == (len(shards), int(rows.max()))  # DuckDB
    assert list(ns["first"]) == rows[0].tolist()
    batch = ns["batch"]  # PyTorch
    assert batch["input_ids"].dtype == torch.int64 and batch["input_ids"].shape == (8, 16)
    assert torch.equal(batch["input_ids"], torch.from_numpy(rows[:8, :-1].astype(np.int64)))
    assert torch.equal(batch["labels"], torch.from_numpy(rows[:8, 1:].astype(np.int64)))
    assert ns["first_document"][-1] == shards.manifest["eos_id"] and len(ns["first_document"]) == ns["offsets"][1]
