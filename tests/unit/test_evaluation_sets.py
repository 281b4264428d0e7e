"""The evaluation sets and the lineage check on evaluation (largetrain_core.stages.evaluation_sets,
largetrain_dagster.evaluation): a benchmark item planted in a pretraining document is found after the
models were trained, through the models' lineage.json (base and adapter, the adapter's holding its
base's), the check failing and naming the corpus, the document and the item; a clean set passes; adding
the set makes a new evaluation_sets version and leaves the models as they are."""

import json
import logging
from pathlib import Path

import polars as pl
import pytest

from helpers import TESTS
from largetrain_core.model_card import write_model_card
from largetrain_core.stages.base import Artifact, StageError, StageRun
from largetrain_core.stages.evaluation_sets import EvaluationSetsSettings, contamination_check, evaluation_sets

BENCH = TESTS / "data" / "eval_benchmark.jsonl"
ROWS = [json.loads(line) for line in (TESTS / "data" / "language_id.jsonl").open(encoding="utf-8")]
PROSE = " ".join(r["text"] for r in ROWS if r["language"] == "en" and r["kind"] == "paragraph")
PLANTED = {
    "id": "p7",
    "prompt": "If the kernel cannot find a valid root device, it stops and prints",
    "answer": "an error message.",
}


def _corpus(root: Path, role: str, dv: str, texts: list[str]) -> None:
    d = root / role / "deduplicated_text" / dv
    d.mkdir(parents=True)
    pl.DataFrame(
        {"doc_id": [f"{role}-{i}" for i in range(len(texts))], "source": ["s"] * len(texts), "text": texts}
    ).write_parquet(d / "part-00000.parquet")


def _models(root: Path) -> tuple[Artifact, Artifact]:
    """A base model trained on pretrain/deduplicated_text v1 and an adapter on domain/deduplicated_text v2,
    as their model cards record it (only the lineage matters here, not the weights)."""
    base_dir, adapter_dir = root / "base_checkpoint" / "b1" / "model", root / "lora_adapter" / "a1" / "adapter"
    base = {
        "kind": "base_model",
        "data_version": "b1",
        "corpora": [{"role": "pretrain", "data_versions": {"deduplicated_text": "v1"}}],
    }
    write_model_card(base_dir, base)
    write_model_card(
        adapter_dir,
        {
            "kind": "lora_adapter",
            "data_version": "a1",
            "base": base,
            "corpora": [{"role": "domain", "data_versions": {"deduplicated_text": "v2"}}],
        },
    )
    return (
        Artifact(base_dir.parent, "b1", {"output": str(base_dir)}),
        Artifact(adapter_dir.parent, "a1", {"output": str(adapter_dir)}),
    )


def _run(root: Path) -> StageRun:
    return StageRun(root=root, asset=("evaluation_sets",), partition=None, log=logging.getLogger("test"), executor=None)


@pytest.fixture
def trained(tmp_path):
    root = tmp_path / "root"
    _corpus(
        root, "pretrain", "v1", [PROSE, PROSE + " Boot notes: " + PLANTED["prompt"] + " " + PLANTED["answer"], "short"]
    )
    _corpus(
        root, "domain", "v2", ["To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer."]
    )
    return root, _models(root)


def test_a_planted_item_is_found_through_the_lineage_after_training(trained, tmp_path):
    root, models = trained
    clean = evaluation_sets(EvaluationSetsSettings(benchmark_files=(str(BENCH),)), _run(root))
    assert clean.stats["sets"] == {"eval_benchmark": 5} and clean.stats["too_short_items"] == 1 and clean.warnings
    ok = contamination_check(Artifact(clean.path, clean.data_version, clean.stats), list(models), root)
    assert ok.passed and ok.metadata["corpora_checked"].value == [
        "domain deduplicated_text v2",
        "pretrain deduplicated_text v1",
    ]
    # the user adds a benchmark file after the models were trained: a new version, the same models
    added = tmp_path / "boot_quiz.jsonl"
    added.write_text(json.dumps(PLANTED) + "\n")
    both = evaluation_sets(EvaluationSetsSettings(benchmark_files=(str(BENCH), str(added))), _run(root))
    assert both.data_version != clean.data_version and both.stats["sets"] == {"boot_quiz": 1, "eval_benchmark": 5}
    bad = contamination_check(Artifact(both.path, both.data_version, both.stats), list(models), root)
    assert not bad.passed and bad.metadata["overlapping_documents"] == 1
    (hit,) = bad.metadata["overlaps"].value
    assert (hit["corpus"], hit["doc_id"], hit["eval_set"], hit["item_id"]) == (
        "pretrain deduplicated_text v1",
        "pretrain-1",
        "boot_quiz",
        "p7",
    )
    assert "pretrain deduplicated_text v1: document 'pretrain-1' holds item boot_quiz/p7" in bad.metadata["description"]
    assert (root / "base_checkpoint" / "b1" / "model" / "lineage.json").exists()  # nothing retrained or rewritten


def test_the_dagster_check_fails_naming_corpus_document_and_item(trained, tmp_path):
    from largetrain_dagster.evaluation import no_evaluation_item_in_training_data
    from largetrain_dagster.resources import Storage

    root, (base, adapter) = trained
    added = tmp_path / "boot_quiz.jsonl"
    added.write_text(json.dumps(PLANTED) + "\n")
    sets = evaluation_sets(EvaluationSetsSettings(benchmark_files=(str(added),)), _run(root))
    result = no_evaluation_item_in_training_data(
        storage=Storage(root=str(root)),
        sets=Artifact(sets.path, sets.data_version, sets.stats).handle(),
        base=base.handle(),
        adapter=adapter.handle(),
    )
    assert not result.passed and "document 'pretrain-1' holds item boot_quiz/p7" in result.description
    assert (
        no_evaluation_item_in_training_data.check_specs
        and next(iter(no_evaluation_item_in_training_data.check_specs)).blocking
    )


def test_a_corpus_gone_from_the_store_fails_the_check_and_bad_files_fail_the_step(trained, tmp_path):
    import shutil

    root, models = trained
    sets = evaluation_sets(EvaluationSetsSettings(benchmark_files=(str(BENCH),)), _run(root))
    shutil.rmtree(root / "domain" / "deduplicated_text" / "v2")
    check = contamination_check(Artifact(sets.path, sets.data_version, sets.stats), list(models), root)
    assert not check.passed and "domain/deduplicated_text v2" in check.metadata["problem"]
    with pytest.raises(StageError, match="does not exist"):
        evaluation_sets(EvaluationSetsSettings(benchmark_files=(str(tmp_path / "nope.jsonl"),)), _run(root))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"answer": "no prompt"}\n')
    with pytest.raises(StageError, match=r"bad.jsonl:2"):
        evaluation_sets(EvaluationSetsSettings(benchmark_files=(str(bad),)), _run(root))
