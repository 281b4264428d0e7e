"""largetrain_core.stages.filtered_text on a real chain (raw_corpus -> cleaned_text -> deduplicated_text of 300
support tickets from tests/data plus one document holding an item of tests/data/eval_benchmark.jsonl): the
planted document removed with reason contaminated and reported with its item and 13-gram (or kept and
reported with decontamination: report, with a warning), the relevance_score column, the documents under
the threshold or outside the top fraction removed with reason relevance, the accounting of the whole chain
balanced, the examples, the kept score distribution in the token shards' manifest, bad settings refused."""

import json
import logging
from pathlib import Path

import polars as pl
import pytest

from helpers import TESTS
from largetrain_core.accounting import corpus_accounting
from largetrain_core.clean import QualityConfig
from largetrain_core.executors.local import LocalExecutor
from largetrain_core.readers import ReaderConfig
from largetrain_core.relevance import SCORE, RelevanceConfig
from largetrain_core.stages.base import StageError, StageRun
from largetrain_core.stages.cleaned_text import cleaned_text
from largetrain_core.stages.deduplicated_text import deduplicated_text
from largetrain_core.stages.evaluation_sets import EvaluationSetsSettings, evaluation_sets
from largetrain_core.stages.filtered_text import CONTAMINATED, FilteredTextSettings, filtered_text, title
from largetrain_core.stages.raw_corpus import raw_corpus
from largetrain_core.stages.relevance_classifier import relevance_classifier
from largetrain_core.storage import part_files

DATA = TESTS / "data"
ROWS = [json.loads(line) for line in (DATA / "support_tickets.jsonl").open()][:300]
ITEM = json.loads((DATA / "eval_benchmark.jsonl").read_text().splitlines()[1])  # q2, a 20-word prompt
PLANTED = {
    "id": "planted-1",
    "category": "technical",
    "text": "My driver hangs. I read that " + ITEM["prompt"] + " " + ITEM["answer"] + ", so what now?",
}


def _run(root: Path, *asset: str, partition: str | None = None) -> StageRun:
    return StageRun(
        root=root, asset=asset, partition=partition, log=logging.getLogger("test"), executor=LocalExecutor()
    )


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """The chain to deduplicated_text, the classifier (billing tickets against the others, files written from
    the tickets) and the declared evaluation set."""
    tmp = tmp_path_factory.mktemp("filtered")
    root, corpus = tmp / "root", tmp / "tickets.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in ROWS + [PLANTED]))
    for name, rows in (
        ("pos", [r for r in ROWS if r["category"] == "billing"]),
        ("neg", [r for r in ROWS if r["category"] != "billing"]),
    ):
        (tmp / f"{name}.jsonl").write_text("".join(json.dumps({"text": r["text"]}) + "\n" for r in rows))
    raw = raw_corpus(ReaderConfig(path=str(corpus)), _run(root, "pretrain", "raw_corpus", partition="000"))
    rules_off = QualityConfig(gopher_quality=False, gopher_repetition=False, c4=False)
    cleaned = cleaned_text(rules_off, raw, _run(root, "pretrain", "cleaned_text", partition="000"))
    dedup = deduplicated_text(
        False, {"000": raw}, {"000": cleaned}, _run(root, "pretrain", "deduplicated_text"), hash_partitioned=False
    )
    clf = relevance_classifier(
        RelevanceConfig(positives_file=str(tmp / "pos.jsonl"), negatives_file=str(tmp / "neg.jsonl")),
        dedup,
        dedup,
        _run(root, "relevance_classifier"),
    )
    sets = evaluation_sets(
        EvaluationSetsSettings(benchmark_files=(str(DATA / "eval_benchmark.jsonl"),)), _run(root, "evaluation_sets")
    )
    return root, raw, cleaned, dedup, clf, sets


def _filter(chain, **settings):
    root, raw, cleaned, dedup, clf, sets = chain
    return filtered_text(
        FilteredTextSettings(**settings),
        dedup,
        clf,
        sets,
        {"000": raw},
        {"000": cleaned},
        _run(root, "pretrain", "filtered_text"),
    )


def test_contaminated_removed_and_reported_relevance_by_threshold_accounting_balanced(chain):
    r = _filter(chain, relevance_threshold=0.5)
    dedup = chain[3]
    n, dups = dedup.stats["kept"], dedup.stats["documents"]["duplicate"]
    assert r.stats["input"] == n and n + dups == 301 and dups <= 2  # templated tickets: an exact duplicate or so
    kept = pl.read_parquet(part_files(r.path))
    removed = pl.read_parquet(r.path / "filtered.parquet")
    assert kept.schema[SCORE] == pl.Float32 and (kept[SCORE] >= 0.5).all()
    assert removed.columns == ["doc_id", "source", "reason", SCORE]
    assert removed.filter(pl.col("reason") == "contaminated")["doc_id"].to_list() == ["planted-1"]
    relevance = removed.filter(pl.col("reason") == "relevance")
    assert relevance.height == r.stats["removed_relevance"] > 100 and (relevance[SCORE] < 0.5).all()
    billing = {x["id"] for x in ROWS if x["category"] == "billing"}
    assert len(set(kept["doc_id"]) & billing) > 0.9 * len(billing) and "planted-1" not in set(kept["doc_id"])
    report = pl.read_parquet(r.path / CONTAMINATED)
    (hit,) = report.to_dicts()
    assert (hit["doc_id"], hit["eval_set"], hit["item_id"], hit["reason"]) == (
        "planted-1",
        "eval_benchmark",
        "q2",
        "contaminated",
    )
    assert len(hit["ngram"].split()) == 13 and hit["ngram"] in " ".join(ITEM["prompt"].lower().replace(",", "").split())
    # every input document in exactly one outcome, recounted from the files over the whole chain
    assert r.checks["accounting"].passed
    assert r.stats["documents"] == {
        "input": 301,
        "kept": kept.height,
        "filtered": removed.height,
        "duplicate": dups,
        "rejected": 0,
    }
    acc = corpus_accounting(chain[1].path, chain[2].path, dedup.path, r.path)
    assert acc["balanced"] and acc["kept"] + acc["filtered"] + acc["duplicate"] == 301
    outcomes = {(o, rr): k for o, rr, k in pl.read_parquet(r.path / "outcomes.parquet").iter_rows()}
    assert outcomes == {
        ("kept", None): kept.height,
        ("filtered", "contaminated"): 1,
        ("filtered", "relevance"): relevance.height,
        ("duplicate", "exact"): dups,
    }
    assert r.stats["kept_scores"]["min"] >= 0.5 and r.stats["scored"]["count"] == n and r.stats["threshold"] == 0.5
    ex = r.stats["examples"]
    assert len(ex["kept"]) == 3 and len(ex["removed"]) == 3 and ex["contaminated"][0]["item_id"] == "q2"
    assert ex["kept"][0][SCORE] >= ex["kept"][-1][SCORE] >= 0.5 > ex["removed"][-1][SCORE] >= ex["removed"][0][SCORE]
    assert ex["contaminated"][0]["title"].startswith("My driver hangs.")
    assert "| contaminated (eval_benchmark/q2" in r.metadata["examples_table"]
    again = _filter(chain, relevance_threshold=0.5)
    assert again.reused and again.data_version == r.data_version


def test_report_only_keeps_the_contaminated_and_warns(chain):
    r = _filter(chain, decontamination="report")
    kept = pl.read_parquet(part_files(r.path))
    assert kept.height == chain[3].stats["kept"] and "planted-1" in set(kept["doc_id"]) and r.stats["filtered"] == 0
    assert pl.read_parquet(r.path / CONTAMINATED)["doc_id"].to_list() == ["planted-1"] and r.stats["contaminated"] == 1
    assert r.stats["threshold"] is None and kept[SCORE].is_not_null().all()
    assert any("decontamination: report" in w and "no_evaluation_item_in_training_data" in w for w in r.warnings)
    assert r.checks["accounting"].passed


def test_a_model_trained_on_the_reported_text_fails_the_lineage_check(chain):
    """decontamination: report (the step disabled): a model whose lineage names this filtered_text fails the
    check of evaluation, naming the corpus, the document and the item; with remove it passes."""
    from largetrain_core.model_card import write_model_card
    from largetrain_core.stages.base import Artifact
    from largetrain_core.stages.evaluation_sets import contamination_check

    root, sets = chain[0], chain[5]
    for mode, passed in (("report", False), ("remove", True)):
        r = _filter(chain, decontamination=mode)
        model = root / "base_checkpoint" / mode / "model"
        write_model_card(
            model,
            {
                "kind": "base_model",
                "data_version": mode,
                "corpora": [
                    {
                        "role": "pretrain",
                        "data_versions": {"deduplicated_text": chain[3].data_version, "filtered_text": r.data_version},
                    }
                ],
            },
        )
        check = contamination_check(sets, [Artifact(model.parent, mode, {"output": str(model)})], root)
        assert check.passed is passed and check.metadata["corpora_checked"].value == [
            f"pretrain filtered_text {r.data_version}"
        ]
        if not passed:
            assert (
                f"pretrain filtered_text {r.data_version}: document 'planted-1' holds item eval_benchmark/q2"
                in check.metadata["description"]
            )


def test_top_fraction_keeps_that_share_of_the_uncontaminated(chain):
    r = _filter(chain, relevance_top_fraction=0.25)
    kept = pl.read_parquet(part_files(r.path))
    left = chain[3].stats["kept"] - 1  # after decontamination
    assert 0.25 * left <= kept.height <= 0.25 * left + 5, kept.height  # ties at the threshold are kept
    assert (kept[SCORE] >= r.stats["threshold"]).all() and r.stats["filtered_by_reason"]["contaminated"] == 1
    removed = pl.read_parquet(r.path / "filtered.parquet").filter(pl.col("reason") == "relevance")
    assert (removed[SCORE] < r.stats["threshold"]).all() and removed.height + kept.height == left
    assert not (r.path / "_scored").exists() and r.checks["accounting"].passed


def test_bad_settings_are_refused(chain):
    with pytest.raises(StageError, match="not both"):
        _filter(chain, relevance_threshold=0.5, relevance_top_fraction=0.5)
    with pytest.raises(StageError, match=r"relevance_top_fraction must be in \(0, 1\]"):
        _filter(chain, relevance_top_fraction=0.0)
    with pytest.raises(StageError, match="decontamination must be one of remove, report"):
        _filter(chain, decontamination="drop")


def test_the_token_shards_manifest_records_the_kept_score_distribution(chain, bpe_dir):
    from largetrain_core.stages.base import Artifact
    from largetrain_core.stages.token_shards import TokenShardsSettings, token_shards

    r = _filter(chain, relevance_threshold=0.5)
    tok = Artifact(bpe_dir, "tok", {})
    shards = token_shards(
        TokenShardsSettings(seq_len=32, validation_fraction=0.1), r, tok, _run(chain[0], "pretrain", "token_shards")
    )
    manifest = json.loads((shards.path / "manifest.json").read_text())
    assert manifest[SCORE] == r.stats["kept_scores"] == shards.metadata[SCORE].value and manifest[SCORE]["min"] >= 0.5
    plain = token_shards(
        TokenShardsSettings(seq_len=32, validation_fraction=0.1),
        chain[3],
        tok,
        _run(chain[0], "pretrain", "token_shards"),
    )
    assert SCORE not in json.loads((plain.path / "manifest.json").read_text())


def test_title_is_the_first_line_of_words():
    assert (
        title(".. SPDX-License-Identifier: GPL-2.0\n\n=====\nLinux kernel coding style\n=====\n")
        == "Linux kernel coding style"
    )
    assert title("# Billing\nrefund") == "Billing" and title("") == "" and len(title("x" * 200)) == 72


def test_the_spark_executor_writes_what_the_local_one_writes(chain, tmp_path, caplog):
    """The step on the Spark executor (spark-submit to ``local[2]`` of the n-gram join with the evaluation
    sets, then of each map_parts job, the join, the scoring and the reasons in its tasks) gives the same part
    files, byte for byte, the same filtered.parquet, contaminated.parquet and outcomes, and the same counts as
    on the local executor, with a top fraction (two map_parts jobs: scoring, then the cut)."""
    from largetrain_core.executors.spark import SparkExecutor
    from largetrain_core.executors.spark.submit import SparkSettings

    root, raw, cleaned, dedup, clf, sets = chain
    settings = FilteredTextSettings(relevance_top_fraction=0.5)
    results = {}
    for name, executor in (
        ("local", LocalExecutor()),
        ("spark", SparkExecutor(SparkSettings(master="local[2]"))),
    ):
        run = StageRun(
            root=tmp_path / name,
            asset=("pretrain", "filtered_text"),
            partition=None,
            log=logging.getLogger("test"),
            executor=executor,
        )
        with caplog.at_level(logging.INFO):
            results[name] = filtered_text(settings, dedup, clf, sets, {"000": raw}, {"000": cleaned}, run)
    local, spark = results["local"], results["spark"]
    submitted = [r.getMessage() for r in caplog.records if r.getMessage().startswith("executor spark: ")]
    assert [m.split("--name ", 1)[1].split()[0] for m in submitted] == [
        "largetrain-find_contamination",
        "largetrain-map_parts",
        "largetrain-map_parts",
    ]
    assert spark.stats["executor"]["executor"] == "spark" and local.stats["executor"]["executor"] == "local"
    assert [p.name for p in part_files(spark.path)] == [p.name for p in part_files(local.path)] != []
    for a, b in zip(part_files(local.path), part_files(spark.path)):
        assert a.read_bytes() == b.read_bytes(), a.name
    for name in ("filtered.parquet", CONTAMINATED, "outcomes.parquet"):
        assert pl.read_parquet(local.path / name).equals(pl.read_parquet(spark.path / name)), name
    drop = lambda s: {k: v for k, v in s.items() if k not in ("executor", "seconds")}  # noqa: E731 (what ran it, wall time)
    assert drop(spark.stats) == drop(local.stats) and spark.data_version == local.data_version
    assert (
        spark.checks["accounting"].passed
        and spark.stats["removed_contaminated"] == 1
        and spark.stats["removed_relevance"] > 100
    )
