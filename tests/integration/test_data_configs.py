"""Issue 15, fault 2: every supported configuration of the data steps passes every blocking check of
the data steps, through Dagster, and intended repetition (up-sampling's ``copies`` weight) is told
apart from accidental duplication in the checks, the accounting and the shards' metadata.

Configurations: class balancing off / downsample / upsample x near-duplicate removal on / off x the
rule groups (gopher_quality, gopher_repetition, c4) all on / all off, over one labelled JSONL corpus
written here (three classes of prose documents, an exact and a near duplicate, short records).
Checks: ``accounting`` and ``no_exact_duplicates`` on deduplicated_text, ``token_ids_below_vocab``
on token_shards.
"""

import itertools
from pathlib import Path

import polars as pl
from dagster import AssetKey, DagsterInstance

from helpers.corpora import CLASSES, labelled_corpus
from largetrain_core.shards import split_of
from largetrain_dagster.corpus import corpus_assets, no_exact_duplicates_check
from largetrain_dagster.definitions import build_definitions
from largetrain_dagster.shards import token_shards_asset
from largetrain_dagster.tokenizer import tokenizer
from helpers.lineage import materialize_lineage

RULES = {
    "rules_on": {"gopher_quality": True, "gopher_repetition": True, "c4": True},
    "rules_off": {"gopher_quality": False, "gopher_repetition": False, "c4": False},
}
BALANCE = {
    "balance_off": {},
    "downsample": {"balance_target": {}, "balance_mode": "downsample"},
    "upsample": {"balance_target": {}, "balance_mode": "upsample"},
}
NEAR = {"near_on": {"near": True}, "near_off": {"near": False}}


def test_every_data_configuration_passes_every_blocking_check(tmp_path):
    src = labelled_corpus(tmp_path / "corpus" / "tickets.jsonl")
    defs = build_definitions(root=str(tmp_path / "root"), wandb_mode="disabled")
    # the configurations apply to the domain chain (its shards read its deduplicated text); the tokenizer is
    # trained on the pretraining chain, the same in every run (built once, then reused)
    assets = [
        *corpus_assets("pretrain"),
        *corpus_assets("domain"),
        no_exact_duplicates_check(["domain", "deduplicated_text"]),
        tokenizer,
        *token_shards_asset("domain"),
    ]
    seen = {}
    with DagsterInstance.ephemeral() as instance:
        for (rules, r), (bal, b), (near, n) in itertools.product(RULES.items(), BALANCE.items(), NEAR.items()):
            run_config = {
                "ops": {
                    "pretrain__raw_corpus": {"config": {"path": str(src.parent)}},
                    "pretrain__cleaned_text": {"config": RULES["rules_off"]},
                    "domain__raw_corpus": {"config": {"path": str(src.parent), "label_field": "category"}},
                    "domain__cleaned_text": {"config": r},
                    "domain__deduplicated_text": {"config": {**b, **n}},
                    "tokenizer": {"config": {"vocab_size": 300}},
                    "domain__token_shards": {"config": {"seq_len": 16, "validation_fraction": 0.2}},
                }
            }
            result = materialize_lineage(assets, defs.resources, instance, run_config)
            name = f"{rules}/{bal}/{near}"
            assert result.success, name
            checks = {
                c.check_name: c
                for c in result.get_asset_check_evaluations()
                if c.asset_key in (AssetKey(["domain", "deduplicated_text"]), AssetKey(["domain", "token_shards"]))
            }
            assert {k: c.passed for k, c in checks.items()} == {
                "accounting": True,
                "no_source_wiped_out": True,
                "no_exact_duplicates": True,
                "token_ids_below_vocab": True,
            }, name
            md = {
                k: getattr(v, "value", v)
                for k, v in result.asset_materializations_for_node("domain__deduplicated_text")[0].metadata.items()
            }
            shards = {
                k: getattr(v, "value", v)
                for k, v in result.asset_materializations_for_node("domain__token_shards")[0].metadata.items()
            }
            parts = pl.concat([pl.read_parquet(p) for p in sorted(Path(md["path"]).glob("part-*.parquet"))])
            seen[name] = (md, shards, parts, {k: c.metadata for k, c in checks.items()})

    total = sum(CLASSES.values()) + len(CLASSES) + 2
    for name, (md, shards, parts, checks) in seen.items():
        rules, bal, near = name.split("/")
        assert md["documents_input"] == total
        assert parts.height == parts["doc_id"].n_unique() == md["documents_kept"], name  # distinct documents
        # the short records: filtered with the rule groups on, kept with them off (unless balancing dropped them)
        shorts = parts["doc_id"].str.ends_with("-short").sum()
        assert shorts == 0 if rules == "rules_on" else shorts == len(CLASSES) or bal == "downsample", name
        dups = set(pl.read_parquet(Path(md["path"]) / "duplicates.parquet")["doc_id"])
        assert "billing-exact" in dups and ("billing-near" in dups) == (near == "near_on"), name
        assert md["documents_duplicate"] == (2 if near == "near_on" else 1), name
        extra = int(parts["copies"].sum()) - parts.height if "copies" in parts.columns else 0
        assert checks["accounting"]["intended_repeats"].value == extra
        assert checks["no_exact_duplicates"]["intended_repeats"].value == extra
        assert checks["no_exact_duplicates"]["duplicates"].value == 0
        if bal == "upsample":
            hist = md["balance"]["after"]
            assert extra > 0 and md["balance_repeats"] == extra and len(set(hist.values())) == 1, name
            # the train split repeats its documents `copies` times; validation holds each once
            val = split_of(parts["doc_id"].to_list(), 0.2, 0)
            assert not val.all() and val.any()
            train_extra = int((parts["copies"].to_numpy()[~val] - 1).sum())
            assert shards["train_repeat_copies"] == train_extra and shards["validation_repeat_copies"] == 0, name
            assert shards["train_documents"] + shards["validation_documents"] == parts.height
        else:
            assert "copies" not in parts.columns and shards["train_repeat_copies"] == 0, name
        if bal == "downsample":
            assert len(set(md["balance"]["after"].values())) == 1 and md["balance_dropped"] > 0, name
            assert (
                md["documents_kept"] + md["documents_filtered"] + md["documents_duplicate"] + md["documents_rejected"]
                == total
            )


def test_the_tokenizer_trains_on_a_seeded_sample_and_a_whole_corpus_keeps_its_version(tmp_path):
    """max_training_bytes below the corpus: a sample (counted in the metadata), another data version;
    at or above it (the default here) or null: the whole corpus, one version, as before the setting."""
    import xxhash

    src = labelled_corpus(tmp_path / "corpus" / "tickets.jsonl")
    defs = build_definitions(root=str(tmp_path / "root"), wandb_mode="disabled")
    assets = [*corpus_assets("pretrain"), tokenizer]
    ops = {"pretrain__raw_corpus": {"config": {"path": str(src.parent)}}, "tokenizer": {"config": {"vocab_size": 300}}}
    with DagsterInstance.ephemeral() as instance:
        assert materialize_lineage(assets, defs.resources, instance, {"ops": ops}).success
        runs = {}
        for name, bound in (
            ("default", {}),
            ("null", {"max_training_bytes": None}),
            ("sample", {"max_training_bytes": 2000}),
        ):
            cfg = {**ops, "tokenizer": {"config": {"vocab_size": 300, **bound}}}
            result = materialize_lineage(assets, defs.resources, instance, {"ops": cfg}, ["tokenizer"])
            assert result.success, name
            runs[name] = {
                k: getattr(v, "value", v)
                for k, v in result.asset_materializations_for_node("tokenizer")[0].metadata.items()
            }
    assert runs["default"]["data_version"] == runs["null"]["data_version"] != runs["sample"]["data_version"]
    assert (
        runs["default"]["sample_fraction"] == 1.0
        and runs["default"]["sampled_documents"] == runs["default"]["corpus_documents"]
    )
    sample = runs["sample"]
    assert (
        0 < sample["sample_fraction"] < 1 and sample["sampled_documents"] == sample["documents"]
    )  # what the trainer read
    assert 0 < sample["sampled_documents"] < sample["corpus_documents"] == runs["default"]["corpus_documents"]
    docs = pl.concat(
        [
            pl.read_parquet(p)
            for p in sorted((tmp_path / "root" / "pretrain" / "deduplicated_text").glob("*/part-*.parquet"))
        ]
    )
    assert sample["sampled_documents"] == sum(
        xxhash.xxh3_64_intdigest(d.encode(), 0) / 2**64 < sample["sample_fraction"] for d in docs["doc_id"]
    )
