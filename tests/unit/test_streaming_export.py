"""The litdata and mosaicml-streaming exports (largetrain_core/streaming_export.py) read back by the real
libraries: every window of both splits, in order, equal to TokenShards' rows; each library's own exact
resume; and docs/guides/data-preparation.md's "litdata and mosaicml-streaming" commands and examples run
as written. The libraries live in ``.venv/streaming`` (the Makefile's ``$(VENV)/streaming/.installed``, a
dependency of ``make install``) and run in a child process with that folder on PYTHONPATH."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from helpers import REPO
from helpers.corpora import english_sentences
from helpers.docblocks import commands, section_blocks
from helpers.parts import write_parts
from largetrain_core.shards import SPLITS, ShardError, TokenShards, build_token_shards
from largetrain_core.streaming_export import export_litdata, export_mds, main

STREAMING = os.path.join(sys.prefix, "streaming")
DOC = "docs/guides/data-preparation.md"
SECTION = "litdata and mosaicml-streaming"
DOC_SHARDS = ".largetrain/domain/token_shards/DATA_VERSION"


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory, bpe_dir):
    """Documents of uneven length over three part files; several shards per split."""
    tmp = tmp_path_factory.mktemp("streaming")
    sentences = english_sentences(300)
    docs = [(f"doc-{i:02d}", " ".join(sentences[i * 5 : (i + 1) * 5 - i % 4])) for i in range(40)]
    src = write_parts(tmp / "dedup", [docs[:15], docs[15:16], docs[16:]])
    out = tmp / "shards"
    out.mkdir()
    build_token_shards(src, bpe_dir, out, seq_len=16, validation_fraction=0.25, seed=3, sequences_per_shard=7)
    return out


@pytest.fixture(scope="module")
def shard_dir_uint32(tmp_path_factory):
    """A vocabulary of 70,001 ids (uint32 shards): two windows of 3 tokens."""
    tmp = tmp_path_factory.mktemp("streaming32")
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(70_000)}, unk_token="<unk-not-in-vocab>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|endoftext|>"])
    (tmp / "tok").mkdir()
    tok.save(str(tmp / "tok" / "tokenizer.json"))
    docs = [("d0", "w69999 w1 w2"), ("d1", "w5 w69998")]
    out = tmp / "shards"
    out.mkdir()
    build_token_shards(write_parts(tmp / "in", [docs]), tmp / "tok", out, seq_len=2, validation_fraction=0.0)
    return out


def _child(args: list[str], cwd) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` with .venv/streaming and this checkout first on PYTHONPATH."""
    assert os.path.isfile(os.path.join(STREAMING, ".installed")), (
        f"{STREAMING}: missing; `make install` (the Makefile's $(VENV)/streaming/.installed) puts litdata and "
        "mosaicml-streaming there"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([STREAMING, str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


READ_BACK = """
# validation in chunks of 256 bytes (a few windows each), so reading crosses chunk files
info = {"train": reports, "validation": [export_litdata(sys.argv[1], "validation", "litdata/validation", 256),
                                         export_mds(sys.argv[1], "validation", "mds/validation", 256)]}
base = import_streaming()
res = {"docs": {"codes": codes, "ld": ld_batch.tolist(), "mds": mds_batch.tolist(), "ld_dtype": str(ld_batch.dtype),
                "mds_dtype": str(mds_batch.dtype), "ld_yielded": ld_state["num_samples_yielded"],
                "mds_seen": mds_state["sample_in_epoch"]}}
for split in ("train", "validation"):
    res[split] = {}
    ld = litdata.StreamingDataset(f"litdata/{split}", shuffle=False)
    md = base.StreamingDataset(local=f"mds/{split}", shuffle=False, batch_size=1)
    for name, ds, report in (("litdata", ld, info[split][0]), ("mds", md, info[split][1])):
        samples = [s["input_ids"] for s in ds]
        res[split][name] = {**report, "len": len(ds), "dtypes": sorted({str(s.dtype) for s in samples}),
                            "rows": np.stack(samples).tolist()}


def resumed(make_loader, k):
    first = make_loader()
    it = iter(first)
    head = [next(it)["input_ids"] for _ in range(k)]
    state = first.state_dict()
    del it
    second = make_loader()
    second.load_state_dict(state)
    rest = [b["input_ids"] for b in second]
    return [np.asarray(b).tolist() for b in head], [np.asarray(b).tolist() for b in rest]


res["litdata_resume"] = resumed(lambda: litdata.StreamingDataLoader(
    litdata.StreamingDataset("litdata/train", shuffle=False), batch_size=4, num_workers=0), 3)
res["mds_resume"] = resumed(lambda: base.StreamingDataLoader(
    base.StreamingDataset(local="mds/train", shuffle=False, batch_size=4), batch_size=4, num_workers=0), 3)
for name, export in (("litdata", export_litdata), ("mds", export_mds)):
    export(sys.argv[2], "train", f"{name}32")
res["uint32"] = {
    "litdata": [np.asarray(s["input_ids"]).tolist() + [str(s["input_ids"].dtype)] for s in litdata.StreamingDataset("litdata32")],
    "mds": [np.asarray(s["input_ids"]).tolist() + [str(s["input_ids"].dtype)] for s in base.StreamingDataset(local="mds32", batch_size=1)],
}
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def read_back(shard_dir, shard_dir_uint32, tmp_path_factory):
    """One child process (the libraries' imports are the cost): the docs section's commands, then its
    python examples, then both splits read back and each library's resume. The commands: the shard
    path replaced by this test's, each ``python -m largetrain_core.streaming_export ARGS`` run as its
    ``main(ARGS)``, with .venv/streaming on PYTHONPATH as the command sets it; they export train, the
    test exports validation and a uint32 split with the same functions."""
    (bash,) = section_blocks(DOC, SECTION, "bash")
    cmds = commands(bash)
    assert len(cmds) == 2 and all(DOC_SHARDS in c for c in cmds)
    prefix = "PYTHONPATH=.venv/streaming .venv/bin/python -m largetrain_core.streaming_export "
    assert all(c.startswith(prefix) for c in cmds)
    argvs = [c.removeprefix(prefix).replace(DOC_SHARDS, str(shard_dir)).split() for c in cmds]
    assert [a[:1] + a[2:] for a in argvs] == [
        ["litdata", "litdata/train", "--split", "train"],
        ["mds", "mds/train", "--split", "train"],
    ]

    blocks = [b.text for b in section_blocks(DOC, SECTION, "python")]
    assert len(blocks) == 2
    script = "\n".join(
        [
            "import contextlib, io, json, sys",
            "import numpy as np",
            "from largetrain_core.streaming_export import export_litdata, export_mds, import_streaming, main",
            "reports, codes = [], []",
            f"for argv in {argvs!r}:",
            "    with contextlib.redirect_stdout(io.StringIO()) as out:",
            "        codes.append(main(argv))",
            "    reports.append(json.loads(out.getvalue()))",
            "import_streaming()  # streaming.base without torchvision, as the docs say",
            *blocks,
            READ_BACK,
        ]
    )
    cwd = tmp_path_factory.mktemp("read_back")
    done = _child(["-c", script, str(shard_dir), str(shard_dir_uint32)], cwd=cwd)
    return cwd, json.loads(done.stdout.strip().splitlines()[-1])


def test_both_exports_read_back_every_window_in_order_and_resume_exactly(shard_dir, read_back):
    """litdata's StreamingDataset and streaming's StreamingDataset (shuffle off) give every window of
    each split in TokenShards' order with its dtype; each library's StreamingDataLoader state_dict,
    taken after 3 batches of 4 and loaded into a new loader, gives exactly the remaining windows."""
    out, res = read_back
    manifest = json.loads((shard_dir / "manifest.json").read_text())
    for split in SPLITS:
        shards = TokenShards(shard_dir, split)
        rows = shards.take(range(len(shards)))
        assert len(shards) > 4 and len(manifest["splits"][split]["shards"]) >= 2  # several shard files
        for name in ("litdata", "mds"):
            got = res[split][name]
            assert got["len"] == len(shards) and got["dtypes"] == ["uint16"]
            assert np.array_equal(np.asarray(got["rows"]), rows), (split, name)
            assert (got["sequences"], got["seq_len"], got["dtype"], got["split"]) == (len(shards), 16, "uint16", split)
            assert got["tokenizer_sha256"] == manifest["tokenizer_sha256"] and got["eos_id"] == manifest["eos_id"]
            assert got["format"] == name and got["vocab_size"] == manifest["vocab_size"]
            written = json.loads((out / name / split / "largetrain.json").read_text())
            assert written == {k: v for k, v in got.items() if k not in ("out", "len", "dtypes", "rows")}
            index = json.loads((out / name / split / "index.json").read_text())
            chunks = len(index["chunks"] if name == "litdata" else index["shards"])
            assert chunks >= 3 if split == "validation" else chunks == 1, (name, split, chunks)
            assert not list((out / name).glob(".*.tmp"))  # written under a temporary name, then renamed

    train = TokenShards(shard_dir, "train")
    rows = train.take(range(len(train))).tolist()
    assert len(rows) > 12  # the resume point lies inside the epoch
    for name in ("litdata", "mds"):
        head, rest = res[f"{name}_resume"]
        assert [r for b in head for r in b] == rows[:12], name
        assert [r for b in rest for r in b] == rows[12:], name


def test_a_uint32_vocabulary_exports_as_uint32(read_back):
    """Ids over 65,535 keep their dtype and value in both formats."""
    expected = [[69999, 1, 2, "uint32"], [70_000, 5, 69998, "uint32"]]
    assert read_back[1]["uint32"] == {"litdata": expected, "mds": expected}


def test_docs_commands_export_and_the_loaders_read_every_window(shard_dir, read_back):
    """The section's commands exit 0 and its examples' first batch of each loader is the first four
    windows (as torch.uint16), with each state_dict recording them as yielded."""
    res = read_back[1]["docs"]
    assert res["codes"] == [0, 0]
    first = TokenShards(shard_dir, "train").take(range(4)).tolist()
    assert res["ld"] == first and res["mds"] == first
    assert res["ld_dtype"] == res["mds_dtype"] == "torch.uint16"
    assert res["ld_yielded"] == res["mds_seen"] == 4


def test_exports_refuse_a_directory_that_is_not_empty(shard_dir, tmp_path):
    """An export never writes into a directory that holds files (a loader would mix the two)."""
    for export in (export_litdata, export_mds):
        out = tmp_path / export.__name__
        out.mkdir()
        (out / "index.json").write_text("{}")
        with pytest.raises(ShardError, match="exists and is not empty"):
            export(shard_dir, "train", out)
        assert [p.name for p in out.iterdir()] == ["index.json"]


def test_the_cli_names_the_make_target_when_the_library_is_missing(shard_dir, tmp_path, capsys):
    """Without .venv/streaming on the path (as in this process) the CLI exits 1 with the make target in
    its message, and writes nothing."""
    for fmt, module in (("litdata", "litdata"), ("mds", "streaming")):
        assert importlib.util.find_spec(module) is None  # the case under test: the library is not importable here
        assert main([fmt, str(shard_dir), str(tmp_path / fmt)]) == 1
        assert "$(VENV)/streaming/.installed" in capsys.readouterr().err
        assert not (tmp_path / fmt).exists() and not list(tmp_path.glob(".*.tmp"))
