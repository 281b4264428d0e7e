"""Weighted mixtures of corpora in the token shards (largetrain_core.shards, mixture): the train split sampled
to the weights in tokens, up- and down-sampling counted, the realised share beside the target."""

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from helpers import REPO, TICKETS
from largetrain_core.shards import TokenShards, build_token_shards, mixture_targets, mixture_weights, systematic


@pytest.fixture
def corpora(tmp_path):
    """Two corpora in one part file whose words are disjoint (corpus a: a0..a99, corpus b: b0..b99), so every
    window's corpus can be read from its ids: a has 120 documents of 40 words, b 15 of 40."""
    words = [f"a{i}" for i in range(100)] + [f"b{i}" for i in range(100)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="a0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|endoftext|>"])
    (tmp_path / "tok").mkdir()
    tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    rng = np.random.default_rng(0)
    rows = [(f"a{i}", "a", " ".join(f"a{j}" for j in rng.integers(0, 100, 40))) for i in range(120)]
    rows += [(f"b{i}", "b", " ".join(f"b{j}" for j in rng.integers(0, 100, 40))) for i in range(15)]
    (tmp_path / "docs").mkdir()
    pl.DataFrame(
        {
            "doc_id": [r[0] for r in rows],
            "source": ["s"] * len(rows),
            "corpus": [r[1] for r in rows],
            "text": [r[2] for r in rows],
        }
    ).write_parquet(tmp_path / "docs" / "part-00000.parquet")
    return tmp_path


def build(corpora, name, **kw):
    (corpora / name).mkdir()
    return build_token_shards(corpora / kw.pop("docs", "docs"), corpora / "tok", corpora / name, seq_len=63, **kw)


def windows_of(shards, mixed=True, corpus_b_from=100):
    """(windows holding only corpus a, windows holding corpus b) in the train split (b's ids start at 100; EOS
    is 200); ``mixed``: a mixture's shards, where no window may hold both."""
    data = TokenShards(shards, "train")
    rows = data.take(np.arange(len(data))).astype(np.int64)
    words = np.where(rows == 200, -1, rows)
    is_b = (words >= corpus_b_from).any(axis=1)
    assert not mixed or not ((words >= 0) & (words < corpus_b_from)).any(axis=1)[is_b].any()
    return int((~is_b).sum()), int(is_b.sum())


def test_train_split_sampled_to_the_weights_in_tokens(corpora):
    natural = build(corpora, "natural", validation_fraction=0.1)
    m = build(corpora, "mixed", validation_fraction=0.1, mixture={"a": 1, "b": 1})
    mix = m["mixture"]
    assert mix["weights"] == {"a": 0.5, "b": 0.5}
    a, b = mix["corpora"]["a"], mix["corpora"]["b"]
    total = a["sequences_packed"] + b["sequences_packed"]
    assert m["splits"]["train"]["sequences"] == total  # the split keeps its size
    assert {a["sequences"], b["sequences"]} <= {total // 2, total - total // 2} and a["sequences"] + b[
        "sequences"
    ] == total
    assert b["repeat_sequences"] == b["sequences"] - b["sequences_packed"] > 0 and b["downsampled_sequences"] == 0
    assert a["downsampled_sequences"] == a["sequences_packed"] - a["sequences"] > 0 and a["repeat_sequences"] == 0
    assert a["realised_share"] == pytest.approx(0.5, abs=1 / total) and a["target_share"] == 0.5
    assert m["splits"]["train"]["mixture_repeat_sequences"] == b["repeat_sequences"]
    assert m["splits"]["train"]["mixture_downsampled_sequences"] == a["downsampled_sequences"]
    assert windows_of(corpora / "mixed") == (a["sequences"], b["sequences"])  # counted from the shards themselves
    # natural proportions without weights; the validation split is the same documents either way, unweighted
    assert windows_of(corpora / "natural", mixed=False)[1] < b["sequences"]
    assert m["splits"]["validation"]["documents"] == natural["splits"]["validation"]["documents"]
    assert m["splits"]["train"]["documents"] == natural["splits"]["train"]["documents"]
    assert not (corpora / "mixed" / ".mixture").exists()
    manifest = json.loads((corpora / "mixed" / "manifest.json").read_text())
    assert manifest["mixture"]["corpora"]["b"]["realised_share"] == b["realised_share"]
    TokenShards(corpora / "mixed", "train", verify_checksums=True)


def test_weight_zero_drops_a_corpus_and_bad_mixtures_are_refused(corpora):
    m = build(corpora, "only_a", validation_fraction=0.1, mixture={"a": 0.7, "b": 0})
    assert m["mixture"]["corpora"]["b"]["sequences"] == 0 and windows_of(corpora / "only_a")[1] == 0
    with pytest.raises(
        ValueError, match=r"part-00000.parquet: corpus 'b' has no mixture weight; weights are given for 'a'"
    ):
        build(corpora, "x", mixture={"a": 1})
    with pytest.raises(ValueError, match="corpus 'c' has weight > 0 but no train sequence"):
        build(corpora, "y", mixture={"a": 1, "b": 1, "c": 1})
    with pytest.raises(ValueError, match="finite numbers >= 0"):
        mixture_weights({"a": -1})
    plain = corpora / "plain"
    plain.mkdir()
    pl.read_parquet(corpora / "docs" / "part-00000.parquet").drop("corpus").write_parquet(plain / "part-00000.parquet")
    with pytest.raises(ValueError, match="no 'corpus' column"):
        build(corpora, "z", docs="plain", mixture={"a": 1})


def test_a_weight_that_repeats_a_corpus_too_often_is_warned_and_refused_above_max_repeats(corpora):
    """Issue 42 item 10 (Megatron-LM#547): corpus b (15 of 135 documents) weighted 0.95 needs each of its train
    sequences repeated about 9 times per pass. Built with the default limit, the stage's warning names b and
    its repeat factor; with max_repeats 4 the build is refused, naming b, the factor and the setting."""
    from largetrain_core.stages.token_shards import MAX_REPEATS, repeat_factors, repeat_warning

    m = build(corpora, "heavy_b", validation_fraction=0.1, mixture={"a": 0.05, "b": 0.95}, max_repeats=MAX_REPEATS)
    b = m["mixture"]["corpora"]["b"]
    factor = b["sequences"] / b["sequences_packed"]
    assert 4 < factor < MAX_REPEATS and repeat_factors(m["mixture"]) == {"b": factor}
    warning = repeat_warning("pretrain", m["mixture"])
    assert f"corpus 'b''s train sequences {factor:.1f} times per pass" in warning and "max_repeats" in warning
    assert repeat_warning("pretrain", build(corpora, "mild", mixture={"a": 0.8, "b": 0.2})["mixture"]) is None
    with pytest.raises(
        ValueError,
        match=rf"mixture: corpus 'b' \(weight 0.95\) would repeat each of its {b['sequences_packed']} train sequences "
        rf"{factor:.1f} times per pass .* above max_repeats 4; lower its weight",
    ):
        build(corpora, "refused", validation_fraction=0.1, mixture={"a": 0.05, "b": 0.95}, max_repeats=4)


def test_targets_and_systematic_sampling():
    assert mixture_targets({"a": 10, "b": 5}, {"a": 0.5, "b": 0.5}) == {"a": 8, "b": 7}  # 7.5 each: a first by name
    assert sum(mixture_targets({"a": 7, "b": 3, "c": 1}, mixture_weights({"a": 1, "b": 1, "c": 1})).values()) == 11
    for n, k in ((100, 37), (1000, 1), (50, 49)):
        mask = np.concatenate([systematic(s, 10, k / n, 0.3) for s in range(0, n, 10)])
        assert mask.sum() in (k, k + 1) and int(np.floor(n * k / n + 0.3)) == mask.sum()
        gaps = np.diff(np.flatnonzero(mask))
        assert gaps.max() - gaps.min() <= 1 if len(gaps) else True  # evenly spread


def test_a_mixture_is_the_same_for_any_partition_count_and_copies_no_window(corpora):
    """Per corpus, per part file: the mixture's windows (whole passes and the systematic sample) are the
    same sequences in the same order however many partitions tokenized the parts; the global step lists
    the partitions' shards again or with a selection instead of copying them."""
    from largetrain_core.shards import Packing, assemble_token_shards, tokenize_partition

    df = pl.read_parquet(corpora / "docs" / "part-00000.parquet")
    (corpora / "parts").mkdir()
    for i, (a, b) in enumerate([(0, 40), (40, 41), (41, 100), (100, 135)]):
        df.slice(a, b - a).write_parquet(corpora / "parts" / f"part-{i:05d}.parquet")
    one = build(corpora, "one", docs="parts", validation_fraction=0.1, mixture={"a": 1, "b": 1})

    def rows(d):
        return TokenShards(d, "train", verify_checksums=True).take(range(one["splits"]["train"]["sequences"])).tolist()

    packing = Packing(seq_len=63, validation_fraction=0.1, mixture={"a": 1, "b": 1})
    for n in (2, 3):
        dirs = [corpora / f"p{n}-{i}" for i in range(n)]
        for i, d in enumerate(dirs):
            d.mkdir()
            tokenize_partition(corpora / "parts", corpora / "tok", d, i, n, packing)
        out = corpora / f"g{n}"
        out.mkdir()
        m = assemble_token_shards(dirs, corpora / "parts", corpora / "tok", out, packing)
        assert (
            m["mixture"] == one["mixture"] and m["splits"]["train"]["sequences"] == one["splits"]["train"]["sequences"]
        )
        assert rows(out) == rows(corpora / "one")
        entries = m["splits"]["train"]["shards"]
        assert any("select" in e for e in entries) and len({e["file"] for e in entries}) < len(entries)  # b repeated
        assert not list(out.glob("train-0*.arrow"))  # only tails' windows are written here


def test_a_two_corpus_mixture_through_dagster(tmp_path, monkeypatch):
    """A pretraining role of two named corpora (support tickets, tests/data/support_tickets.jsonl, cut in two
    with one ticket in both): each its own raw_corpus and cleaned_text (its own reader and rules), one
    deduplicated_text across both (the shared ticket is a duplicate; ids prefixed by corpus; a corpus column),
    filtered_text over the mixture, token shards at 30/70 % weights in tokens, the shares in the metadata and
    the summary."""
    from dagster import AssetKey, AssetsDefinition, DagsterInstance, materialize

    from largetrain_dagster import partitions
    from largetrain_dagster.corpus import (
        corpus_assets,
        mixture_chain,
        mixture_dedup_asset,
        no_exact_duplicates_check,
        partition_assets,
    )
    from largetrain_dagster.definitions import build_definitions
    from largetrain_dagster.evaluation import evaluation_sets
    from largetrain_dagster.filtering import filtered_text_asset, relevance_classifier
    from largetrain_dagster.partitions import DATA_PARTITIONS
    from largetrain_dagster.shards import token_shards_asset
    from largetrain_dagster.summary import render
    from largetrain_dagster.tokenizer import tokenizer

    monkeypatch.setitem(
        partitions.CORPORA, "pretrain", ("tickets", "other")
    )  # as LARGETRAIN_PRETRAIN_CORPORA=tickets,other
    tickets = TICKETS.read_text().splitlines()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "tickets.jsonl").write_text("\n".join(tickets[:300]) + "\n")
    shared = json.loads(tickets[7])
    (tmp_path / "b" / "other.jsonl").write_text(
        "\n".join(tickets[300:360]) + "\n" + json.dumps({**shared, "id": "copy-of-7"}) + "\n"
    )
    (tmp_path / "domain.jsonl").write_text("\n".join(tickets[360:460]) + "\n")
    chains = [mixture_chain("pretrain", "tickets"), mixture_chain("pretrain", "other")]
    domain = corpus_assets("domain")  # the relevance classifier's positives, for pretrain/filtered_text
    parted = [a for c in chains for a in partition_assets(c)] + domain[:2]
    rest = [
        mixture_dedup_asset("pretrain", chains),
        no_exact_duplicates_check(["pretrain", "deduplicated_text"]),
        domain[2],
        relevance_classifier,
        evaluation_sets,
        filtered_text_asset("pretrain"),
        tokenizer,
        *token_shards_asset("pretrain"),
    ]
    no_rules = {"gopher_quality": False, "gopher_repetition": False, "c4": False}
    ops = {
        "pretrain__tickets__raw_corpus": {"config": {"path": str(tmp_path / "a")}},
        "pretrain__other__raw_corpus": {"config": {"path": str(tmp_path / "b"), "text_field": "text"}},
        "pretrain__tickets__cleaned_text": {"config": no_rules},
        "pretrain__other__cleaned_text": {
            "config": {**no_rules, "gopher_quality": True, "min_words": 3, "min_stop_words": None}
        },
        "pretrain__deduplicated_text": {"config": {"near": False}},
        "domain__raw_corpus": {"config": {"path": str(tmp_path / "domain.jsonl")}},
        "domain__cleaned_text": {"config": no_rules},
        "domain__deduplicated_text": {"config": {"near": False}},
        "tokenizer": {"config": {"vocab_size": 300}},
        "pretrain__token_shards": {
            "config": {"seq_len": 32, "validation_fraction": 0.1, "mixture": {"tickets": 0.3, "other": 0.7}}
        },
    }
    defs = build_definitions(root=str(tmp_path / "root"), wandb_mode="disabled")
    assets = parted + rest
    with DagsterInstance.ephemeral() as instance:
        for pk in DATA_PARTITIONS.get_partition_keys():
            keys = [k for a in parted for k in a.keys]
            run = materialize(
                assets,
                resources=defs.resources,
                instance=instance,
                partition_key=pk,
                selection=keys,
                run_config={"ops": {k: v for k, v in ops.items() if "raw_corpus" in k or "cleaned" in k}},
            )
            assert run.success
        run = materialize(
            assets,
            resources=defs.resources,
            instance=instance,
            selection=[k for a in rest if isinstance(a, AssetsDefinition) for k in a.keys],
            run_config={"ops": {k: v for k, v in ops.items() if "raw_corpus" not in k and "cleaned" not in k}},
        )
        assert run.success
        assert all(e.passed for e in run.get_asset_check_evaluations())  # accounting, no_exact_duplicates, token ids
        dedup = run.asset_materializations_for_node("pretrain__deduplicated_text")[0].metadata
        assert dedup["documents_duplicate"].value >= 1
        handle = run.output_for_node("pretrain__deduplicated_text")
        kept = pl.concat([pl.read_parquet(p) for p in sorted(Path(handle["path"]).glob("part-*.parquet"))])
        assert set(kept["corpus"]) == {"tickets", "other"}
        assert all(d.startswith(f"{c}:") for d, c in zip(kept["doc_id"], kept["corpus"]))
        assert "other:copy-of-7" not in set(kept["doc_id"])  # the earlier corpus's copy is kept
        assert "| corpus: other | 61 | 1 | 0 | 0 | 1.6 % |" in dedup["dedup_by_source"].value  # per mixture corpus
        assert handle["stats"]["corpora"]["other"]["documents_read"] == 61
        shards = run.asset_materializations_for_node("pretrain__token_shards")[0].metadata
        mix = shards["mixture"].value
        total = sum(r["sequences"] for r in mix["corpora"].values())
        assert abs(mix["corpora"]["other"]["realised_share"] - 0.7) <= 1 / total
        assert (
            mix["corpora"]["other"]["repeat_sequences"] > 0 and mix["corpora"]["tickets"]["downsampled_sequences"] > 0
        )
        assert shards["mixture_other_target_share"].value == 0.7
        assert "| other | 70.0 % |" in shards["mixture_shares"].value
        summary = render(instance)
        assert "mixture, share of the train split's tokens: other 70.0 % (target 70.0 %" in summary, summary
        assert instance.get_latest_materialization_event(AssetKey(["pretrain", "other", "raw_corpus"])) is not None


def test_the_mixture_recipe_commands(tmp_path):
    """docs/guides/your-data.md, "A mixture of corpora": its commands run as written (the Dagster CLI, one run
    per data partition, then the rest, then the summary) on configs/pretrain_mixture.yaml with the corpora cut
    to a slice (a few kernel docs and plays per partition, the domain corpus too, in 2 data partitions:
    LARGETRAIN_DATA_PARTITIONS) and a small vocabulary and sequence length; the mixture is filtered
    (pretrain/filtered_text) before its token shards; the summary reports each corpus's realised share, 70/30
    to within one sequence."""
    import os
    import subprocess
    import sys

    import yaml

    from helpers.docblocks import section_blocks

    corpora = Path(os.environ.get("LARGETRAIN_ROOT", REPO / ".largetrain")) / "corpora"
    if not (corpora / "linux-doc").is_dir() or not (corpora / "shakespeare").is_dir():
        pytest.fail(f"real corpora missing under {corpora}: run `make corpora` (make test does)")
    config = yaml.safe_load((REPO / "configs" / "pretrain_mixture.yaml").read_text())
    ops = config["ops"]
    ops["pretrain__kernel_docs__raw_corpus"]["config"] = {
        "path": str(corpora / "linux-doc" / "admin-guide"),
        "max_documents": 15,
    }
    ops["pretrain__plays__raw_corpus"]["config"] = {"path": str(corpora / "shakespeare"), "max_documents": 2}
    ops["domain__raw_corpus"]["config"] = {"path": str(corpora / "shakespeare" / "comedies"), "max_documents": 2}
    ops["tokenizer"]["config"]["vocab_size"] = 400
    ops["pretrain__token_shards"]["config"]["seq_len"] = 64
    recipe = tmp_path / "pretrain_mixture.yaml"
    recipe.write_text(yaml.safe_dump(config))
    (block,) = section_blocks("docs/guides/your-data.md", "A mixture of corpora", "sh")
    script = (
        block.text.replace("$PWD/.largetrain", str(tmp_path / "lt"))
        .replace(".venv/bin/", f"{Path(sys.executable).parent}/")
        .replace("configs/pretrain_mixture.yaml", str(recipe))
    )
    assert script.count(str(recipe)) == 2 and "LARGETRAIN_PRETRAIN_CORPORA=kernel_docs,plays" in script
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "LARGETRAIN_"))}
    env.update(LARGETRAIN_WANDB_MODE="disabled", OMP_NUM_THREADS="1", LARGETRAIN_DATA_PARTITIONS="2")
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=2400,
        start_new_session=True,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    line = next(x for x in run.stdout.splitlines() if "mixture, share of the train split's tokens" in x)
    assert "kernel_docs 70.0 % (target 70.0 %" in line or "kernel_docs 69." in line or "kernel_docs 70." in line, line
    manifest = json.loads(next((tmp_path / "lt" / "pretrain" / "token_shards").glob("*/manifest.json")).read_text())
    (filtered,) = [d for d in (tmp_path / "lt" / "pretrain" / "filtered_text").iterdir() if d.is_dir()]
    assert manifest["source_data_version"] == filtered.name  # the shards read the filtered mixture
    shares = manifest["mixture"]["corpora"]
    total = sum(r["sequences"] for r in shares.values())
    assert abs(shares["kernel_docs"]["realised_share"] - 0.7) <= 1 / total and shares["plays"]["sequences"] > 0
