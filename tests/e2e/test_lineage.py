"""The whole lineage through Dagster on CPU, materialized once for this module (:func:`tiny_lineage`) and
read by every test that asserts on it:

* it materializes: every asset and partition, the counts, the checks, a loadable model and adapter;
  materialized again, every artifact is reused;
* it is reproducible across places and storage: the same corpus, uploaded to an object store (a real S3
  API server on 127.0.0.1, so with other file times) and materialized with LARGETRAIN_ROOT in a bucket,
  gives the same data versions and byte-identical artifacts, except the files named in VARYING (each with
  why and what is asserted of it instead); the secret key is in nothing the run wrote;
* a copied storage root reads its own files: the original moved away, the copy materializes the steps
  downstream of what it holds, reusing every version (also for data preparation alone).

Needs the real corpora (`make corpora`), as tests/e2e/test_pipeline.py.
"""

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest
import torch
from dagster import AssetKey, DagsterInstance
from safetensors.numpy import load_file

from largetrain_core import fs
from largetrain_core.provenance import write_provenance
from largetrain_dagster.definitions import build_definitions, lineage_assets
from largetrain_dagster.resources import read_handle
from largetrain_dagster.summary import render
from helpers.lineage import PARTITION_KEYS, Runs, materialize_lineage
from helpers.corpora import CORPORA, copy_tiny_slice, corpus, tiny_run_config

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
    "benchmark.json": "lm-evaluation-harness's record names the evaluated model and adapter directories by absolute "
    "path (compared without them: every score, count, task and the cloze's files)",
    "_COMMITTED.json": "the commit marker holds the xxh3-128 of _manifest.json, which differs by its file times "
    "(compared without it)",
    "plan.json": "the training plan made before the launch records this host's free memory and disk at that moment "
    "(the model, the config, the memory formulas and their figures, the tokens compared exactly)",
    "plan.md": "the plan's table, with the same host figures as plan.json (compared through plan.json)",
    "_manifest.json": "every file's modification time, and the sizes and checksums of the files above (the file "
    "list and every other file's size and checksums compared exactly)",
}
DROP = {
    "seconds",
    "fetched_at",
    "tokens_per_s",
    "mfu",
    "mean_mfu",
    "train_seconds",
    "eval_seconds",
    "output",
    "loss_curve",
    "peak_memory_bytes",
    "peak_memory_gib",
    "time",
    "elapsed",
    "step_seconds",
    "resumed_from",
    "output_dir",
    "train_shards",
    "tokenizer",
    "base_model",
    "source",
    "tracking_uri",
}


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
    return {
        p.relative_to(root).as_posix(): p
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.relative_to(root).as_posix().startswith(skip)
    }


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
        keys = (
            "step",
            "loss",
            "lr",
            "grad_norm",
            "loss_scale",
            "skipped_steps",
            "tokens_seen",
            "eval_loss",
            "eval_perplexity",
        )
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
    elif name == "_COMMITTED.json":
        markers = [json.loads(p.read_text()) for p in (a, b)]
        assert all(m.pop("manifest_xxh3_128") for m in markers) and markers[0] == markers[1], a
    elif name == "benchmark.json":
        paths = DROP | {"model", "adapter"}
        assert _without(json.loads(a.read_text()), paths) == _without(json.loads(b.read_text()), paths), a
    elif name == "plan.json":
        keys = (
            "model",
            "config",
            "memory",
            "precision",
            "seq_len",
            "world_size",
            "tokens_per_step",
            "tokens_total",
            "start_step",
            "steps_to_run",
            "settings",
        )
        plans = [json.loads(p.read_text()) for p in (a, b)]
        same = [{k: plan[k] for k in keys} for plan in plans]
        assert same[0] == same[1], a
    elif name == "plan.md":
        pass
    elif name == "_manifest.json":
        m = [json.loads(p.read_text()) for p in (a, b)]
        assert m[0]["paths"] == m[1]["paths"] and m[0]["files"].keys() == m[1]["files"].keys(), a
        for rel, entry in m[0]["files"].items():
            if Path(rel).name not in VARYING:
                same = [{k: v for k, v in e.items() if k != "mtime_ns"} for e in (entry, m[1]["files"][rel])]
                assert same[0] == same[1], f"{a}: {rel}"


@dataclass(frozen=True)
class Lineage:
    """One materialization of the whole lineage: its storage ``root``, the ``corpora`` it read, the
    ``instance`` that recorded it (ephemeral, open for the module) and the ``runs`` (one per data
    partition, then one for the rest)."""

    root: Path
    corpora: Path
    instance: DagsterInstance
    runs: Runs


def _definitions(root: str):
    """The definitions every materialization of this module uses: 1 training rank, MLflow the tracker
    (its store under the root, W&B off)."""
    return build_definitions(root=root, nproc_per_node=1, wandb_mode="disabled", report_to=["mlflow"])


@pytest.fixture(scope="module")
def tiny_lineage(tmp_path_factory) -> Lineage:
    """The whole lineage (lineage_assets: both corpus chains, tokenizer, shards, base model, adapter,
    evaluation) on the tiny slice of the real corpora (helpers.corpora.tiny_run_config), materialized once
    for the module as the CLI does it (helpers.lineage). The slice is copied first (file times not kept)
    and the kernel docs' copy gets a provenance file, as `make corpora` writes one. Tests read it and never
    write into its root (they copy the root for that)."""
    corpus("linux-doc"), corpus("shakespeare")
    base = tmp_path_factory.mktemp("tiny_lineage")
    corpora = copy_tiny_slice(base / "corpora here", keep_times=False)
    write_provenance(corpora / "linux-doc" / "admin-guide", "linux-doc-6.1", registry="debian", version="6.1.192-3")
    root = base / "storage root"
    with DagsterInstance.ephemeral() as instance:
        runs = materialize_lineage(
            lineage_assets(), _definitions(str(root)).resources, instance, tiny_run_config(corpora)
        )
        assert runs.success, [
            e.event_specific_data.error.message for r in runs.results for e in r.all_events if e.is_step_failure
        ]
        yield Lineage(root, corpora, instance, runs)


def test_a_copied_root_reads_its_own_files(tmp_path):
    """Data preparation only: raw_corpus and cleaned_text materialized in a root, the root copied and
    the original removed; the copy runs the global steps from its own partitions."""
    corpus("linux-doc"), corpus("shakespeare")
    original, copy = tmp_path / "original", tmp_path / "elsewhere" / "copy"
    config = {
        "ops": {k: v for k, v in tiny_run_config(CORPORA)["ops"].items() if k.startswith(("pretrain__", "tokenizer"))}
    }
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
        result = materialize_lineage(
            lineage_assets(), defs.resources, instance, config, parted + ["pretrain/deduplicated_text", "tokenizer"]
        )
        assert result.success
        reused = [m.metadata["reused"].value for m in result.asset_materializations_for_node("pretrain__cleaned_text")]
        assert reused == [True] * len(PARTITION_KEYS)  # the copy keeps every version
        tokenizer = result.output_for_node("tokenizer")
        assert Path(tokenizer["path"]).is_relative_to(copy.resolve())
        dedup = result.output_for_node("pretrain__deduplicated_text")
        kept = sum(pl.read_parquet(p).height for p in Path(dedup["path"]).glob("part-*.parquet"))
        assert kept == dedup["stats"]["documents"]["kept"] > 0
    assert not original.exists()


# The whole lineage with both the corpora and LARGETRAIN_ROOT on an object store (a real S3 API server on
# 127.0.0.1, tests/conftest.py: s3_server) gives the same data versions and byte-identical outputs as on local
# disk (VARYING's rules for the files that vary between any two runs), and the secret key appears in
# nothing the run wrote.

# What only one of the two roots holds, and why.
# DeepSpeed's pointer to the newest tag (resume reads COMPLETE.json, not it) and the helper scripts it copies
# beside the checkpoints: only the checkpoints themselves are uploaded
LOCAL_ONLY = ("checkpoints/latest", "checkpoints/zero_to_fp32.py", "checkpoints/zero_to_torch.py")
IN_BOTH_BUT = {
    "_COMMITTED.json": "the commit marker: on the object store it records every object's ETag",
    "train.log": "uploaded after the run (timings, paths: compared nowhere, as on local disk)",
    "trackers.json": "the trackers' run records (MLflow's run ids)",
}
# MLflow's store: its database stays local (in the root's working copy under the cache with an object-store
# root), its artifacts go under the root; run ids differ between any two runs
TRACKER_STORE = ("mlruns.db", "mlartifacts/")


def _everything_written(instance, *dirs: Path) -> list[tuple[str, bytes]]:
    """(where, bytes) of every file under ``dirs`` and of every event of every run in ``instance``."""
    out = [(str(p), p.read_bytes()) for d in dirs for p in d.rglob("*") if p.is_file()]
    for run in instance.get_runs():
        out += [(f"event log of run {run.run_id}", repr(e).encode()) for e in instance.all_logs(run.run_id)]
    return out


def _upload(local: Path, url: str) -> str:
    fsys, root = fs.filesystem(url)
    files = [p for p in sorted(local.rglob("*")) if p.is_file()]
    fsys.put([str(p) for p in files], [f"{root}/{p.relative_to(local).as_posix()}" for p in files])
    return url


def _download(url: str, dest: Path) -> Path:
    fsys, root = fs.filesystem(url)
    fsys.get(root.rstrip("/") + "/", str(dest), recursive=True)
    return dest


def test_whole_lineage_materializes(tiny_lineage, tmp_path):
    """Every asset and partition, the counts, the checks, the model and adapter loadable; materialized
    again, every artifact is reused."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    root, instance, result = tiny_lineage.root, tiny_lineage.instance, tiny_lineage.runs
    assert len(result.results) == len(PARTITION_KEYS) + 1  # one run per data partition, then the rest
    keys = {k.to_user_string() for k in instance.get_asset_keys()}
    for name in ("raw_corpus", "cleaned_text", "deduplicated_text", "token_shards"):
        assert {f"pretrain/{name}", f"domain/{name}"} <= keys
    assert {"tokenizer", "base_checkpoint", "lora_adapter", "evaluation"} <= keys

    def md(*key):
        ev = instance.get_latest_materialization_event(AssetKey(list(key)))
        return {k: getattr(v, "value", v) for k, v in ev.asset_materialization.metadata.items()}

    # every data partition of both chains materialized, and the global step read them all
    for key in ("pretrain/raw_corpus", "pretrain/cleaned_text", "domain/raw_corpus", "domain/cleaned_text"):
        assert instance.get_materialized_partitions(AssetKey.from_user_string(key)) == set(PARTITION_KEYS)
    dedup = md("pretrain", "deduplicated_text")
    assert dedup["partitions"] == len(PARTITION_KEYS)
    read = [m.metadata["documents"].value for m in result.asset_materializations_for_node("pretrain__raw_corpus")]
    assert len(read) == len(PARTITION_KEYS) and sum(read) == dedup["documents_input"] == 40
    assert (
        dedup["documents_kept"]
        + dedup["documents_filtered"]
        + dedup["documents_duplicate"]
        + dedup["documents_rejected"]
        == 40
    )
    plays = sum(m.metadata["documents"].value for m in result.asset_materializations_for_node("domain__raw_corpus"))
    assert 1 <= plays <= len(PARTITION_KEYS) and md("domain", "deduplicated_text")["documents_kept"] == plays
    base = md("base_checkpoint")
    assert base["steps"] == 12 and base["precision"] == "fp32" and base["last_loss"] < base["first_loss"]
    checks = {(e.asset_key.to_user_string(), e.check_name): e.passed for e in result.get_asset_check_evaluations()}
    assert checks[("pretrain/deduplicated_text", "accounting")]
    assert checks[("domain/token_shards", "token_ids_below_vocab")]
    assert checks[("base_checkpoint", "loss_finite_and_decreasing")]
    assert checks[("evaluation", "adapter_beats_base_on_domain")]  # blocking: the run would have failed
    ev = md("evaluation")
    assert all(ev[k] > 1 for k in ("base_pretrain_perplexity", "base_domain_perplexity", "adapter_domain_perplexity"))
    # read by people: a percentage, and the generations as verbatim text blocks, one per prompt and model
    cut = 100 * (1 - ev["adapter_domain_perplexity"] / ev["base_domain_perplexity"])
    assert (
        0 < ev["adapter_domain_perplexity_reduction_percent"] < 100
        and abs(ev["adapter_domain_perplexity_reduction_percent"] - cut) < 0.1
    )
    assert ev["sample_generations"].count("```text\n") == 3 * 3 and "Prompt 3" in ev["sample_generations"]
    # lm-evaluation-harness on the cloze over the held-out plays: a score with its stderr for both models
    for model in ("base", "adapter"):
        assert 0 <= ev[f"lm_eval/{model}/domain_cloze/acc"] <= 1 and ev[f"lm_eval/{model}/domain_cloze/acc_stderr"] > 0
    assert "| domain_cloze | acc |" in ev["benchmark_results"]
    # MLflow recorded both trainings in its store under the root
    assert (root / "mlruns.db").is_file() and any((root / "mlartifacts").rglob("*"))

    model = AutoModelForCausalLM.from_pretrained(Path(base["output"]))
    tuned = PeftModel.from_pretrained(model, read_handle(root, AssetKey("lora_adapter"))["stats"]["output"])
    assert torch.isfinite(tuned(torch.tensor([[1, 2, 3, 4]])).logits).all()

    # Materializing again with the same config and inputs reuses every artifact (same data versions); in a
    # copy of the root, which the module's lineage must keep as it is
    again_root = tmp_path / "root"
    shutil.copytree(root, again_root, symlinks=True)
    with DagsterInstance.ephemeral() as instance:
        again = materialize_lineage(
            lineage_assets(), _definitions(str(again_root)).resources, instance, tiny_run_config(tiny_lineage.corpora)
        )
        assert again.success
        reused = [m.metadata["reused"].value for m in again.asset_materializations_for_node("base_checkpoint")]
        assert reused == [True]


def test_the_lineage_on_an_s3_root_from_a_bucket_matches_local_disk_bit_for_bit(
    tiny_lineage, tmp_path, s3_bucket, monkeypatch, capfd
):
    """Run one is the module's lineage (the slice copied without its file times, a local root); run two
    reads the same slice uploaded to a bucket (other file times, another place) into a root in the bucket."""
    monkeypatch.setenv("LARGETRAIN_CACHE", str(tmp_path / "cache"))
    for name, why in IN_BOTH_BUT.items():
        monkeypatch.setitem(VARYING, name, why)
    bucket_corpora = _upload(tiny_lineage.corpora, fs.join(s3_bucket, "corpora"))
    config = json.loads(
        json.dumps(tiny_run_config(tiny_lineage.corpora)).replace(str(tiny_lineage.corpora), bucket_corpora)
    )
    assert config["ops"]["pretrain__raw_corpus"]["config"]["path"].startswith("s3://")
    s3_root = fs.join(s3_bucket, "largetrain")
    with DagsterInstance.ephemeral() as instance:
        assert materialize_lineage(lineage_assets(), _definitions(s3_root).resources, instance, config).success
        versions = _versions(instance)
        bucket_dir = _download(s3_root, tmp_path / "bucket")
        written = _everything_written(instance, bucket_dir, tmp_path / "cache")

    # the same data versions for every asset and partition
    expected = {
        (key.to_user_string(), p)
        for a in lineage_assets()
        for key in a.keys
        for p in (PARTITION_KEYS if a.partitions_def else [None])
    }
    assert set(versions) == expected
    assert versions == _versions(tiny_lineage.instance)

    # the credentials, from the environment, are in no file, no event and no line printed
    secret = os.environ["AWS_SECRET_ACCESS_KEY"].encode()
    out, err = capfd.readouterr()
    assert len(written) > 100 and [w for w, data in written if secret in data] == []
    assert out + err and secret.decode() not in out + err

    # byte-identical artifacts, but for VARYING (asserted field by field) and what only one side holds
    local, bucket = _files(tiny_lineage.root), _files(bucket_dir)
    only_local = sorted(
        k for k in set(local) - set(bucket) if not k.endswith(LOCAL_ONLY) and not k.startswith(TRACKER_STORE)
    )
    only_bucket = sorted(k for k in set(bucket) - set(local) if not k.startswith(TRACKER_STORE))
    assert only_local == [] and only_bucket == []
    assert any(k.startswith("mlartifacts/") for k in bucket)  # MLflow's artifacts went to the bucket
    kinds = ("cleaned_text/", "token_shards/", "tokenizer/", "base_checkpoint/", "lora_adapter/", "evaluation/")
    for kind in kinds:
        assert any(k.startswith(kind) or f"/{kind}" in k for k in bucket), kind
    for kind in ("cleaned_text/", "token_shards/", "tokenizer/", "base_checkpoint/"):
        assert any(kind in k and k.endswith((".parquet", ".arrow", "tokenizer.json", ".safetensors")) for k in local), (
            kind
        )
    differing = []
    for rel, b in bucket.items():
        a = local.get(rel)
        if a is None or rel.startswith(TRACKER_STORE) or a.name in IN_BOTH_BUT:
            continue
        if a.name in VARYING:
            _same_but_varying(a.name, a, b)
        elif a.read_bytes() != b.read_bytes():
            differing.append(rel)
    assert differing == []
    # every version in the bucket is committed, and its handles name it relative to the root
    handle = json.loads((bucket_dir / "_handles" / "lora_adapter.json").read_text())
    assert not handle["path"].startswith(("/", "s3:")) and "relative_paths" in handle

    # training: the same losses and final weights (safetensors compared bitwise above; here read back)
    roots = {"local": tiny_lineage.root, "s3": bucket_dir}
    for key in ("base_checkpoint", "lora_adapter"):
        runs = [json.loads(next((roots[n] / key).glob("*/summary.json")).read_text()) for n in roots]
        assert runs[0]["last_loss"] == runs[1]["last_loss"] and runs[0]["first_loss"] == runs[1]["first_loss"]
    weights = [load_file(next((roots[n] / "base_checkpoint").glob("*/model/model.safetensors"))) for n in roots]
    assert weights[0].keys() == weights[1].keys() and all((weights[0][k] == weights[1][k]).all() for k in weights[0])
    ppl = [json.loads(next((roots[n] / "evaluation").glob("*/perplexity.json")).read_text()) for n in roots]
    assert ppl[0] == ppl[1]


def test_the_summary_and_model_cards_name_the_corpora_and_a_copied_root_reads_its_own_files(tiny_lineage, tmp_path):
    """The demo summary and the model cards of the module's lineage; then a copy of its root, the original
    moved away: evaluation (removed from the copy) is recomputed from the copy's model files, and every other
    step reuses its version, its handle naming the copy's files."""
    root = tiny_lineage.root
    versions = _versions(tiny_lineage.instance)
    # the demo summary names each corpus's version: its provenance, else the content digests of the files read
    summary = render(tiny_lineage.instance)
    assert "corpus version: linux-doc-6.1 6.1.192-3 (debian);" in summary
    assert "corpus version: no provenance file; content digests 000 " in summary
    # the model cards name the corpora, data versions, counts and the training
    card = next((root / "base_checkpoint").glob("*/model/README.md")).read_text()
    assert "library_name: transformers" in card and "## Training data" in card and "### pretrain corpus" in card
    assert "Source: linux-doc-6.1 6.1.192-3 from debian;" in card
    assert versions[("pretrain/token_shards", None)] in card and "| read | kept |" in card
    adapter_card = next((root / "lora_adapter").glob("*/adapter/README.md")).read_text()
    assert (
        "library_name: peft" in adapter_card and "### domain corpus" in adapter_card and "## Base model" in adapter_card
    )

    copy, away = tmp_path / "copied root", root.with_name(root.name + " (moved away)")
    shutil.copytree(root, copy, symlinks=True)
    shutil.rmtree(copy / "evaluation")
    keys = ["pretrain/token_shards", "domain/token_shards", "base_checkpoint", "lora_adapter", "evaluation"]
    root.rename(away)  # the module's lineage is back in place after this test, whatever it does
    try:
        with DagsterInstance.ephemeral() as instance:
            result = materialize_lineage(
                lineage_assets(),
                _definitions(str(copy)).resources,
                instance,
                tiny_run_config(tiny_lineage.corpora),
                keys,
            )
            assert result.success
            reused = {
                e.asset_key.to_user_string(): e.step_materialization_data.materialization.metadata["reused"].value
                for e in result.get_asset_materialization_events()
            }
            assert reused == {**{k: True for k in keys[:-1]}, "evaluation": False}
            assert _versions(instance) == {k: v for k, v in versions.items() if k[0] in keys}
    finally:
        away.rename(root)
    for key in ("base_checkpoint", "lora_adapter", "evaluation"):
        handle = json.loads((copy / "_handles" / f"{key}.json").read_text())
        assert not handle["path"].startswith("/") and "relative_paths" in handle  # stored relative to the root
    ppl = json.loads(next((root / "evaluation").glob("*/perplexity.json")).read_text())
    assert json.loads(next((copy / "evaluation").glob("*/perplexity.json")).read_text()) == ppl
