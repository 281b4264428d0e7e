"""What people read in the UI: metadata rounded with the unit in the label, sample generations as
verbatim text blocks, a description on every asset check."""

import math
import random

from dagster import DagsterInstance
from markdown_it import MarkdownIt

from largetrain_dagster.artifacts import rounded, text_block
from largetrain_dagster.corpus import corpus_assets
from largetrain_dagster.definitions import build_definitions
from largetrain_dagster.evaluation import generations_markdown
from helpers.lineage import PARTITION_KEYS, materialize_lineage


def significant_digits(x: float) -> int:
    digits = f"{abs(x):.15g}".replace(".", "").lstrip("0").split("e")[0]
    return len(digits.rstrip("0")) or 1


def test_every_asset_check_has_a_description():
    graph = build_definitions(root="/nonexistent", wandb_mode="disabled").resolve_asset_graph()
    assert len(graph.asset_check_keys) >= 9
    for key in graph.asset_check_keys:
        assert (graph.get(key).description or "").strip(), f"asset check {key.name} on {key.asset_key.to_user_string()}"


def test_rounded_keeps_four_significant_digits():
    assert rounded(9.04213) == 9.042 and rounded(1234.567) == 1235.0 and rounded(0.000123456) == 0.0001235
    assert rounded(7.0) == 7.0 and math.isnan(rounded(float("nan")))


def test_sample_generations_are_verbatim_text_blocks():
    base = [
        {"prompt": "To be, or not to be,", "completion": " that is the 'question'\n  says he"},
        {"prompt": "Code: ```x```", "completion": "``` and ```` fences\tinside"},
    ]
    adapter = [{"prompt": b["prompt"], "completion": f"adapter {i}: \\n not a newline"} for i, b in enumerate(base)]
    md = generations_markdown(base, adapter)
    blocks = [t.content for t in MarkdownIt().parse(md) if t.type == "fence"]
    expected = [x for b, a in zip(base, adapter) for x in (b["prompt"], b["completion"], a["completion"])]
    assert blocks == [x + "\n" for x in expected]  # every text exactly as generated, no Python repr quoting
    assert "Prompt 1" in md and "Prompt 2" in md and "base + adapter" in md
    assert text_block("a ``` b").startswith("````text\n")


def test_data_metadata_is_rounded_with_units(tmp_path):
    src = tmp_path / "corpus"
    src.mkdir()
    vocab = (
        "the and of to river house field market road station train garden village king queen walks looks "
        "talks waits runs quiet green small old empty morning"
    ).split()
    texts = [" ".join(random.Random(i).choices(vocab, k=60)) for i in range(25)]  # 25 distinct documents
    texts += texts[:3] + ["too short to keep", "also far too short"]  # 3 exact copies; 2 under Gopher's 50 words
    for i, text in enumerate(texts):
        (src / f"doc{i:02d}.txt").write_text(text)
    (src / "bad.txt").write_bytes(b"\xff not utf-8\n")  # a rejected record
    defs = build_definitions(root=str(tmp_path / "root"), wandb_mode="disabled")
    with DagsterInstance.ephemeral() as instance:
        result = materialize_lineage(
            corpus_assets("domain")[:3],
            defs.resources,
            instance,
            {"ops": {"domain__raw_corpus": {"config": {"path": str(src), "max_rejected_fraction": 0.5}}}},
        )
        assert result.success
        mats = {
            (e.asset_key.to_user_string(), e.partition): e.event_specific_data.materialization.metadata
            for e in result.get_asset_materialization_events()
        }
    floats = [(k, v.value) for md in mats.values() for k, v in md.items() if isinstance(v.value, float)]
    assert floats and all(significant_digits(x) <= 4 for _, x in floats), floats

    dedup = {k: v.value for k, v in mats[("domain/deduplicated_text", None)].items()}
    assert (
        dedup["documents_input"],
        dedup["documents_rejected"],
        dedup["documents_filtered"],
        dedup["documents_duplicate"],
    ) == (31, 1, 2, 3)
    for outcome in ("kept", "filtered", "duplicate", "rejected"):
        assert dedup[f"{outcome}_percent"] == rounded(100 * dedup[f"documents_{outcome}"] / 31)
    assert dedup["kept_percent"] == 80.65  # 25 of 31

    raw = [{k: v.value for k, v in mats[("domain/raw_corpus", pk)].items()} for pk in PARTITION_KEYS]
    assert sum(r["documents"] for r in raw) == 30 and sum(r["rejected"] for r in raw) == 1
    for r in raw:
        assert r["size_mib"] == rounded(r["bytes"] / 2**20)
        assert r["rejected_percent"] == (
            rounded(100 * r["rejected"] / (r["documents"] + r["rejected"])) if r["documents"] + r["rejected"] else 0.0
        )
    for pk in PARTITION_KEYS:
        c = {k: v.value for k, v in mats[("domain/cleaned_text", pk)].items()}
        assert c["kept_percent"] == (rounded(100 * c["kept"] / c["input"]) if c["input"] else 0.0)
        assert c["kept_mib"] == rounded(c["bytes_kept"] / 2**20)
