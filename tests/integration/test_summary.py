"""Issue 15: the summary prints the evaluation's sample generations compactly, and a tiny validation
split is warned about in the token_shards run log, its metadata and the summary."""

import json
import logging

from dagster import DagsterInstance

from helpers import TICKETS
from largetrain_dagster.corpus import corpus_assets
from largetrain_dagster.demo import run_tags
from largetrain_dagster.definitions import build_definitions
from largetrain_dagster.shards import MIN_VALIDATION_SEQUENCES, tiny_validation_warning, token_shards_asset
from largetrain_dagster.summary import _samples, corpora_in_order, one_line, render
from largetrain_dagster.tokenizer import tokenizer
from helpers.lineage import materialize_lineage


def test_sample_generations_one_line_each_control_characters_escaped(tmp_path):
    base = [{"prompt": f"Where is my {i}", "completion": f" order?\nIt was\tdue {'x' * (i * 40)}"} for i in range(4)]
    adapter = [{"prompt": b["prompt"], "completion": f" parcel\r\n#{i}\x1b[31m"} for i, b in enumerate(base)]
    (tmp_path / "samples.json").write_text(json.dumps({"base": base, "adapter": adapter}))
    lines = _samples({"path": str(tmp_path), "config": {"max_new_tokens": 24}})
    assert lines[:4] == [
        "sample generations (greedy, at most 24 new tokens):",
        "  prompt 'Where is my 0'",
        "    base:           ' order?\\nIt was\\tdue '",
        "    base + adapter: ' parcel\\r\\n#0\\x1b[31m'",
    ]
    assert len(lines) == 1 + 3 * 3 + 1 and lines[-1] == f"  ... 1 more prompts in {tmp_path / 'samples.json'}"
    assert all("\n" not in line and "\x1b" not in line for line in lines)
    long = lines[8]  # prompt 2's base continuation: 80 x, cut
    assert long.endswith("...") and len(long) == len("    base:           ") + 72
    assert one_line("a" * 100, 10) == "'aaaaaa..." and one_line("ok") == "'ok'"
    assert _samples({"path": str(tmp_path / "none")}) == [] and _samples({}) == []


def test_tiny_validation_split_is_warned_in_the_run_log_metadata_and_summary(tmp_path):
    corpus = tmp_path / "tickets.jsonl"
    corpus.write_text("".join(TICKETS.read_text().splitlines(keepends=True)[:120]))
    defs = build_definitions(root=str(tmp_path / "root"), wandb_mode="disabled")
    assets = [*corpus_assets("pretrain"), *corpus_assets("domain"), tokenizer, *token_shards_asset("domain")]
    raw = {"config": {"path": str(corpus)}}
    quality = {"config": {"gopher_quality": False, "gopher_repetition": False}}
    cfg = {
        "ops": {
            "pretrain__raw_corpus": raw,
            "domain__raw_corpus": raw,
            "pretrain__cleaned_text": quality,
            "domain__cleaned_text": quality,
            "tokenizer": {"config": {"vocab_size": 300}},
            "domain__token_shards": {"config": {"seq_len": 64, "validation_fraction": 0.05}},
        }
    }
    with DagsterInstance.ephemeral() as instance:
        result = materialize_lineage(assets, defs.resources, instance, cfg)
        assert result.success
        warnings = [
            e.user_message
            for r in result.results
            for e in instance.all_logs(r.run_id)
            if e.dagster_event is None and e.level == logging.WARNING and "token_shards" in e.user_message
        ]
        (md,) = [m.metadata for m in result.asset_materializations_for_node("domain__token_shards")]
        summary = render(instance)
        # both corpora prepared by the same runs: the pretraining corpus first; the domain corpus prepared
        # again afterwards (a recipe on it): it leads
        assert summary.index("pretraining corpus (pretrain)") < summary.index("domain corpus (domain)")
        again = materialize_lineage(
            assets,
            defs.resources,
            instance,
            cfg,
            selection=["domain/raw_corpus", "domain/cleaned_text", "domain/deduplicated_text"],
        )
        assert again.success
        assert corpora_in_order(instance) == [("domain", "domain corpus"), ("pretrain", "pretraining corpus")]
        assert render(instance).index("domain corpus (domain)") < render(instance).index(
            "pretraining corpus (pretrain)"
        )
    n = md["validation_sequences"].value
    assert 0 < n < MIN_VALIDATION_SEQUENCES
    (w,) = warnings
    assert w == md["validation_warning"].value
    assert w.startswith(
        f"domain/token_shards: the validation split is tiny: {n} sequences "
        f"({md['validation_tokens'].value:,} tokens, {md['validation_documents'].value} documents), under "
        f"{MIN_VALIDATION_SEQUENCES}; the validation loss and held-out perplexity on it are noisy. "
        "token_shards `validation_fraction` (now 0.05) enlarges it: about "
    )
    assert f"  WARNING: {w}" in summary


def test_enough_validation_sequences_say_nothing():
    assert tiny_validation_warning("domain", {"validation_sequences": MIN_VALIDATION_SEQUENCES}, {}) is None
    assert tiny_validation_warning("domain", {}, {}) is None
    w = tiny_validation_warning("domain", {"validation_sequences": 0}, {"validation_fraction": 0.0})
    assert "0 sequences" in w and "(now 0)" in w and "about" not in w


def test_demo_runs_are_tagged_with_their_config_file_and_corpus_paths():
    run_config = {
        "ops": {
            "pretrain__raw_corpus": {"config": {"path": "/data/kernel-docs"}},
            "domain__raw_corpus": {"config": {"path": "corpora/plays.jsonl"}},
            "pretrain__code__raw_corpus": {"config": {"path": "s3://bucket/code/"}},
            "tokenizer": {"config": {"vocab_size": 300}},
            "domain__cleaned_text": {"config": {"path": "not a corpus"}},
        }
    }
    assert run_tags("configs/demo.yaml", run_config) == {
        "largetrain/config": "configs/demo.yaml",
        "largetrain/corpus/domain": "corpora/plays.jsonl",
        "largetrain/corpus/pretrain": "/data/kernel-docs",
        "largetrain/corpus/pretrain/code": "s3://bucket/code/",
    }
    assert run_tags("c.yaml", {}) == {"largetrain/config": "c.yaml"}
