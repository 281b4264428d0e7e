"""The litdata and mosaicml-streaming exports (largetrain_core/streaming_export.py) read back by the real
libraries: every window of both splits, in order, equal to TokenShards' rows; each library's own exact
resume; and docs/guides/data-preparation.md's "litdata and mosaicml-streaming" commands and examples run
as written. The libraries live in ``.venv/streaming`` (the Makefile's ``$(VENV)/streaming/.installed``, a
dependency of ``make install``) and run in a child process with that folder on PYTHONPATH."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import REPO
from helpers.corpora import english_sentences
from helpers.docblocks import commands, section_blocks
from helpers.parts import write_parts
from largetrain_core.shards import SPLITS, ShardError, TokenShards, build_token_shards
from largetrain_core.streaming_export import export_litdata, export_mds

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


def _child(args: list[str], cwd, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` with .venv/streaming and this checkout first on PYTHONPATH."""
    assert os.path.isfile(os.path.join(STREAMING, ".installed")), (
        f"{STREAMING}: missing; `make install` (the Makefile's $(VENV)/streaming/.installed) puts litdata and "
        "mosaicml-streaming there"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([STREAMING, str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


READ_BACK = """
import json, sys
import numpy as np
import litdata
from largetrain_core.streaming_export import export_litdata, export_mds, import_streaming

shards, out = sys.argv[1], sys.argv[2]
base = import_streaming()
res = {}
for split in ("train", "validation"):
    info = {"litdata": export_litdata(shards, split, f"{out}/litdata-{split}"),
            "mds": export_mds(shards, split, f"{out}/mds-{split}")}
    ld = litdata.StreamingDataset(f"{out}/litdata-{split}", shuffle=False)
    md = base.StreamingDataset(local=f"{out}/mds-{split}", shuffle=False, batch_size=1)
    for name, ds in (("litdata", ld), ("mds", md)):
        samples = [s["input_ids"] for s in ds]
        info[name].update(len=len(ds), dtypes=sorted({str(s.dtype) for s in samples}),
                          rows=np.stack(samples).tolist())
    res[split] = info

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

train = f"{out}/litdata-train"
res["litdata_resume"] = resumed(lambda: litdata.StreamingDataLoader(
    litdata.StreamingDataset(train, shuffle=False), batch_size=4, num_workers=0), 3)
res["mds_resume"] = resumed(lambda: base.StreamingDataLoader(
    base.StreamingDataset(local=f"{out}/mds-train", shuffle=False, batch_size=4), batch_size=4, num_workers=0), 3)
print(json.dumps(res))
"""


def test_both_exports_read_back_every_window_in_order_and_resume_exactly(shard_dir, tmp_path):
    """litdata's StreamingDataset and streaming's StreamingDataset (shuffle off) give every window of
    each split in TokenShards' order with its dtype; each library's StreamingDataLoader state_dict,
    taken after 3 batches of 4 and loaded into a new loader, gives exactly the remaining windows."""
    done = _child(["-c", READ_BACK, str(shard_dir), str(tmp_path)], cwd=tmp_path)
    res = json.loads(done.stdout.strip().splitlines()[-1])
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
            written = json.loads((tmp_path / f"{name}-{split}" / "largetrain.json").read_text())
            assert written == {k: v for k, v in got.items() if k not in ("out", "len", "dtypes", "rows")}
            assert (tmp_path / f"{name}-{split}" / "index.json").is_file()
    assert not list(tmp_path.glob(".*.tmp"))  # written under temporary names, then renamed

    train = TokenShards(shard_dir, "train")
    rows = train.take(range(len(train))).tolist()
    assert len(rows) > 12  # the resume point lies inside the epoch
    for name in ("litdata", "mds"):
        head, rest = res[f"{name}_resume"]
        assert [r for b in head for r in b] == rows[:12], name
        assert [r for b in rest for r in b] == rows[12:], name


def test_docs_commands_export_and_the_loaders_read_every_window(shard_dir, tmp_path):
    """The section's bash commands run as written (the shard path and .venv replaced by this test's),
    then its python examples in one child process: the first batch of each loader is the first four
    windows, and each state_dict records them as yielded."""
    (bash,) = section_blocks(DOC, SECTION, "bash")
    cmds = commands(bash)
    assert len(cmds) == 2 and all(DOC_SHARDS in c for c in cmds)
    for cmd in cmds:
        env_part, cmd = cmd.split(" ", 1)
        assert env_part == "PYTHONPATH=.venv/streaming" and cmd.startswith(".venv/bin/python -m ")
        args = cmd.removeprefix(".venv/bin/python ").replace(DOC_SHARDS, str(shard_dir)).split()
        done = _child(args, cwd=tmp_path)
        assert json.loads(done.stdout)["sequences"] == len(TokenShards(shard_dir, "train"))

    blocks = [b.text for b in section_blocks(DOC, SECTION, "python")]
    assert len(blocks) == 2
    script = "\n".join(
        [
            "import json, numpy as np",
            "from largetrain_core.streaming_export import import_streaming",
            "import_streaming()  # streaming.base without torchvision, as the docs say",
            *blocks,
            "print(json.dumps({'ld': ld_batch.tolist(), 'mds': mds_batch.tolist(), 'ld_dtype': str(ld_batch.dtype),",
            "  'mds_dtype': str(mds_batch.dtype), 'ld_yielded': ld_state['num_samples_yielded'],",
            "  'mds_seen': mds_state['sample_in_epoch']}))",
        ]
    )
    res = json.loads(_child(["-c", script], cwd=tmp_path).stdout.strip().splitlines()[-1])
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


def test_the_cli_names_the_make_target_when_the_library_is_missing(shard_dir, tmp_path):
    """Without .venv/streaming on the path the CLI exits 1 with the make target in its message, and
    writes nothing."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for fmt in ("litdata", "mds"):
        done = subprocess.run(
            [sys.executable, "-m", "largetrain_core.streaming_export", fmt, str(shard_dir), str(tmp_path / fmt)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1 and "$(VENV)/streaming/.installed" in done.stderr, done.stderr
        assert not (tmp_path / fmt).exists() and not list(tmp_path.glob(".*.tmp"))
