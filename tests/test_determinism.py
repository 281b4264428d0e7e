"""Reproducibility, proven through Dagster on CPU:

* the whole lineage materialized twice, over the same tiny corpus copied into two different
  directories (with other file times) and into two different storage roots, gives the same data
  versions and byte-identical artefacts, except the files named in VARYING (each with why and what
  is asserted of it instead);
* a copied storage root reads its own files: the original removed, the copy materializes the steps
  downstream of what it holds, reusing every version.

Needs the real corpora (`make corpora`), as tests/test_pipeline.py.
"""

import json
import shutil
from pathlib import Path

import polars as pl
from dagster import DagsterInstance
from safetensors.numpy import load_file

from largetrain_core.provenance import write_provenance
from largetrain_dagster.definitions import build_definitions, lineage_assets
from largetrain_dagster.summary import render
from lineage import PARTITION_KEYS, materialize_lineage
from test_pipeline import CORPORA, corpus, tiny_run_config

# Files that differ between two runs of the same lineage, by name, and why. Everything else under
# both roots must be byte-identical.
VARYING = {
    "stats.json": "'seconds' is the step's wall time (compared without it)",
    "summary.json": "tokens/s, MFU, wall times and the output paths (losses, steps, parameters compared exactly)",
    "metrics.jsonl": "per-step tokens/s, MFU, peak memory and time (loss, lr, grad norm compared exactly)",
    "train_config.json": "output_dir, the shard / base model paths and the MLflow tracking URI under the storage root (every other setting compared)",
    "train.log": "timings and paths in the torchrun / DeepSpeed log",
    "loss_curve.png": "the plot's title carries no path, and its curves are of the same losses: compared exactly",
    "adapter_config.json": "PEFT records base_model_name_or_path, the absolute path of the base model directory, and "
                           "writes target_modules from a Python set, in an order that changes with PYTHONHASHSEED "
                           "(compared as a set)",
    "mp_rank_00_model_states.pt": "the DeepSpeed checkpoint's client state holds train.py's config_hash, which covers "
                                  "the shard and base model paths (weights, RNG states, step compared exactly; the "
                                  "ZeRO optimizer shards are byte-identical)",
    "README.md": "the model card names the corpus directory, the provenance's fetch time and (adapter) PEFT's "
                 "base_model path",
    "lineage.json": "the same facts as the model card, as JSON (compared without the corpus location)",
    "_manifest.json": "every file's modification time, and the sizes and checksums of the files above (the file "
                      "list and every other file's size and checksums compared exactly)",
}
DROP = {"seconds", "fetched_at", "tokens_per_s", "mfu", "mean_mfu", "train_seconds", "eval_seconds", "output", "loss_curve", "peak_memory_bytes",
        "peak_memory_gib", "time", "elapsed", "step_seconds", "resumed_from", "output_dir", "train_shards",
        "tokenizer", "base_model", "source", "tracking_uri"}


def _copy_corpora(dest: Path, keep_times: bool) -> Path:
    """The tiny slice of both corpora that tiny_run_config reads, copied under ``dest`` (file times kept
    or not: the data versions must not care)."""
    copy = shutil.copy2 if keep_times else shutil.copy
    for sub in ("linux-doc/admin-guide", "shakespeare/comedies"):
        shutil.copytree(CORPORA / sub, dest / sub, copy_function=copy)
    return dest


def _versions(instance) -> dict:
    out = {}
    for key in instance.get_asset_keys():
        records = instance.fetch_materializations(key, limit=1000).records
        for r in records:
            m = r.asset_materialization
            out[(key.to_user_string(), m.partition)] = m.metadata["data_version"].value
    return out


def _files(root: Path) -> dict[str, Path]:
    skip = ("_handles/", "_cache/", "corpora/")
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*"))
            if p.is_file() and not p.relative_to(root).as_posix().startswith(skip)}


def _without(obj, drop=DROP):
    if isinstance(obj, dict):
        return {k: _without(v, drop) for k, v in obj.items() if k not in drop}
    if isinstance(obj, list):
        return [_without(v, drop) for v in obj]
    return obj


def _assert_equal(x, y, where) -> None:
    """Nested dicts/lists/tensors/arrays equal exactly."""
    import numpy as np
    import torch

    if isinstance(x, dict):
        assert x.keys() == y.keys(), where
        for k in x:
            _assert_equal(x[k], y[k], f"{where}/{k}")
    elif isinstance(x, (list, tuple)):
        assert len(x) == len(y), where
        for i, (u, v) in enumerate(zip(x, y)):
            _assert_equal(u, v, f"{where}[{i}]")
    elif torch.is_tensor(x):
        assert torch.equal(x, y), where
    elif isinstance(x, np.ndarray):
        assert np.array_equal(x, y), where
    else:
        assert x == y, where


def _same_but_varying(name: str, a: Path, b: Path) -> None:
    """Assert what must still agree in a file of VARYING."""
    if name in ("stats.json", "summary.json", "train_config.json"):
        assert _without(json.loads(a.read_text())) == _without(json.loads(b.read_text())), a
    elif name == "metrics.jsonl":
        rows = [[json.loads(line) for line in p.read_text().splitlines() if line.strip()] for p in (a, b)]
        keys = ("step", "loss", "lr", "grad_norm", "loss_scale", "skipped_steps", "tokens_seen", "eval_loss",
                "eval_perplexity")
        assert [{k: r.get(k) for k in keys} for r in rows[0]] == [{k: r.get(k) for k in keys} for r in rows[1]], a
        assert rows[0] and all(isinstance(r["loss"], float) for r in rows[0])
    elif name == "loss_curve.png":
        assert a.read_bytes() == b.read_bytes(), a
    elif name == "adapter_config.json":
        cfgs = [json.loads(p.read_text()) for p in (a, b)]
        for c in cfgs:
            c.pop("base_model_name_or_path")
            c["target_modules"] = sorted(c["target_modules"])
        assert cfgs[0] == cfgs[1], a
    elif name == "mp_rank_00_model_states.pt":
        import torch

        # checkpoints this test wrote (torch pickles: DeepSpeed's format, loaded as DeepSpeed itself does)
        states = [torch.load(p, weights_only=False) for p in (a, b)]
        for st in states:
            st.pop("config_hash")
        _assert_equal(states[0], states[1], a)
    elif name == "lineage.json":
        assert _without(json.loads(a.read_text())) == _without(json.loads(b.read_text())), a
    elif name == "_manifest.json":
        m = [json.loads(p.read_text()) for p in (a, b)]
        assert m[0]["paths"] == m[1]["paths"] and m[0]["files"].keys() == m[1]["files"].keys(), a
        for rel, entry in m[0]["files"].items():
            if Path(rel).name not in VARYING:
                same = [{k: v for k, v in e.items() if k != "mtime_ns"} for e in (entry, m[1]["files"][rel])]
                assert same[0] == same[1], f"{a}: {rel}"


def test_same_corpus_in_two_places_gives_the_same_lineage_bit_for_bit_and_a_copied_root_reads_its_own_files(tmp_path):
    corpus("linux-doc"), corpus("shakespeare")
    roots, versions = {}, {}
    for name, keep_times in (("one", False), ("two", True)):
        corpora = _copy_corpora(tmp_path / name / "corpora here", keep_times)
        write_provenance(corpora / "linux-doc" / "admin-guide", "linux-doc-6.1", registry="debian", version="6.1.192-3")
        roots[name] = tmp_path / name / "storage root"
        defs = build_definitions(root=str(roots[name]), nproc_per_node=2, wandb_mode="disabled")
        with DagsterInstance.ephemeral() as instance:
            result = materialize_lineage(lineage_assets(), defs.resources, instance, tiny_run_config(corpora))
            assert result.success
            versions[name] = _versions(instance)
            summary = render(instance)
    # the demo summary names each corpus's version: its provenance, else the content digests of the files read
    assert "corpus version: linux-doc-6.1 6.1.192-3 (debian);" in summary
    assert "corpus version: no provenance file; content digests 000 " in summary

    # the same data versions for every asset and partition
    assert len(versions["one"]) == 4 * len(PARTITION_KEYS) + 8
    assert versions["one"] == versions["two"]

    # byte-identical artefacts, but for VARYING (asserted field by field)
    one, two = _files(roots["one"]), _files(roots["two"])
    assert one.keys() == two.keys()
    kinds = {"cleaned": "cleaned_text/", "shards": "token_shards/", "tokenizer": "tokenizer/", "model": "base_checkpoint/"}
    for kind, where in kinds.items():
        assert any(where in k and k.endswith((".parquet", ".arrow", "tokenizer.json", ".safetensors")) for k in one), kind
    differing = []
    for rel, a in one.items():
        b = two[rel]
        if a.name in VARYING:
            _same_but_varying(a.name, a, b)
        elif a.read_bytes() != b.read_bytes():
            differing.append(rel)
    assert differing == []

    # training: the same losses and final weights (safetensors compared bitwise above; here read back)
    for key in ("base_checkpoint", "lora_adapter"):
        runs = [json.loads(next((roots[n] / key).glob("*/summary.json")).read_text()) for n in ("one", "two")]
        assert runs[0]["last_loss"] == runs[1]["last_loss"] and runs[0]["first_loss"] == runs[1]["first_loss"]
    weights = [load_file(next((roots[n] / "base_checkpoint").glob("*/model/model.safetensors"))) for n in ("one", "two")]
    assert weights[0].keys() == weights[1].keys() and all((weights[0][k] == weights[1][k]).all() for k in weights[0])
    ppl = [json.loads(next((roots[n] / "evaluation").glob("*/perplexity.json")).read_text()) for n in ("one", "two")]
    assert ppl[0] == ppl[1]

    # the model cards name the corpora, data versions, counts and the training
    card = next((roots["one"] / "base_checkpoint").glob("*/model/README.md")).read_text()
    assert "library_name: transformers" in card and "## Training data" in card and "### pretrain corpus" in card
    assert "Source: linux-doc-6.1 6.1.192-3 from debian;" in card
    assert versions["one"][("pretrain/token_shards", None)] in card and "| read | kept |" in card
    adapter_card = next((roots["one"] / "lora_adapter").glob("*/adapter/README.md")).read_text()
    assert "library_name: peft" in adapter_card and "### domain corpus" in adapter_card and "## Base model" in adapter_card

    # A copy of root one, the original gone: evaluation (removed from the copy) is recomputed from the
    # copy's model files; every other step reuses its version, its handle naming the copy's files.
    copy = tmp_path / "copied root"
    shutil.copytree(roots["one"], copy, symlinks=True)
    shutil.rmtree(roots["one"])
    shutil.rmtree(copy / "evaluation")
    defs = build_definitions(root=str(copy), nproc_per_node=2, wandb_mode="disabled")
    keys = ["pretrain/token_shards", "domain/token_shards", "base_checkpoint", "lora_adapter", "evaluation"]
    with DagsterInstance.ephemeral() as instance:
        result = materialize_lineage(lineage_assets(), defs.resources, instance, tiny_run_config(tmp_path / "one" / "corpora here"),
                                     keys)
        assert result.success
        reused = {e.asset_key.to_user_string(): e.step_materialization_data.materialization.metadata["reused"].value
                  for e in result.get_asset_materialization_events()}
        assert reused == {**{k: True for k in keys[:-1]}, "evaluation": False}
        assert _versions(instance) == {k: v for k, v in versions["one"].items() if k[0] in keys}
    for key in ("base_checkpoint", "lora_adapter", "evaluation"):
        handle = json.loads((copy / "_handles" / f"{key}.json").read_text())
        assert not handle["path"].startswith("/") and "relative_paths" in handle  # stored relative to the root
    assert json.loads(next((copy / "evaluation").glob("*/perplexity.json")).read_text()) == ppl[0]


def test_a_copied_root_reads_its_own_files(tmp_path):
    """Data preparation only: raw_corpus and cleaned_text materialized in a root, the root copied and
    the original removed; the copy runs the global steps from its own partitions."""
    corpus("linux-doc"), corpus("shakespeare")
    original, copy = tmp_path / "original", tmp_path / "elsewhere" / "copy"
    config = {"ops": {k: v for k, v in tiny_run_config(CORPORA)["ops"].items() if k.startswith(("pretrain__", "tokenizer"))}}
    parted = ["pretrain/raw_corpus", "pretrain/cleaned_text"]
    defs = build_definitions(root=str(original), wandb_mode="disabled")
    with DagsterInstance.ephemeral() as instance:
        assert materialize_lineage(lineage_assets(), defs.resources, instance, config, parted).success
    handle = json.loads((original / "_handles" / "pretrain" / "cleaned_text" / f"{PARTITION_KEYS[0]}.json").read_text())
    assert handle["path"].startswith("pretrain/cleaned_text/") and handle["relative_paths"] == ["/path"]

    shutil.copytree(original, copy)
    shutil.rmtree(original)
    defs = build_definitions(root=str(copy), wandb_mode="disabled")
    with DagsterInstance.ephemeral() as instance:
        result = materialize_lineage(lineage_assets(), defs.resources, instance, config,
                                     parted + ["pretrain/deduplicated_text", "tokenizer", "pretrain/token_shards"])
        assert result.success
        reused = [m.metadata["reused"].value for m in result.asset_materializations_for_node("pretrain__cleaned_text")]
        assert reused == [True] * len(PARTITION_KEYS)  # the copy keeps every version
        shards = result.output_for_node("pretrain__token_shards")
        assert Path(shards["path"]).is_relative_to(copy.resolve())
        dedup = result.output_for_node("pretrain__deduplicated_text")
        kept = sum(pl.read_parquet(p).height for p in Path(dedup["path"]).glob("part-*.parquet"))
        assert kept == dedup["stats"]["documents"]["kept"] > 0
    assert not original.exists()
