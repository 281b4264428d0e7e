"""benchmarks/finetune.py's packing part (issue 40 (b)) at a tiny size: the JSON's structure, the three
paths training on the same tokens, and the merge that keeps other parts' keys. Never on timing."""

import json

import pytest


pytestmark = pytest.mark.unit

PATHS = ("packed", "padded_grouped", "padded_random")
PER_PATH = ("trained_tokens_per_s", "padding_fraction", "steps", "seconds", "trained_tokens", "positions")


@pytest.fixture(scope="module")
def finetune():
    from helpers.finetune import benchmark_module

    return benchmark_module()


@pytest.fixture(scope="module")
def result(finetune, tmp_path_factory):
    """main() with a handful of steps on llama-tiny, into a finetune.json that already holds another part."""
    out = tmp_path_factory.mktemp("finetune") / "finetune.json"
    out.write_text(json.dumps({"classification": {"accuracy": 0.9}}))
    tiny = ["--preset", "llama-tiny", "--examples", "12", "--seq-len", "128", "--micro-batch", "4", "--vocab", "300"]
    assert finetune.main(["--parts", "packing", "--out", str(out), *tiny, "--warmup", "1", "--repeats", "1"]) == 0
    return json.loads(out.read_text())


def test_the_packing_part_is_merged_beside_the_other_parts(result):
    assert set(result) == {"classification", "packing"}
    assert result["classification"] == {"accuracy": 0.9}
    assert result["packing"]["command"].startswith("finetune.py --parts packing")


def test_each_path_has_its_figures_and_the_settings_are_recorded(result):
    p = result["packing"]
    for name in PATHS:
        assert set(PER_PATH) <= set(p[name])
        assert p[name]["steps"] >= 1 and p[name]["seconds"] > 0
        assert 0 <= p[name]["padding_fraction"] < 1
    assert p["trained_tokens_per_s_ratio"] == pytest.approx(
        p["packed"]["trained_tokens_per_s"] / p["padded_grouped"]["trained_tokens_per_s"]
    )
    s = p["settings"]
    assert (s["preset"], s["seq_len"], s["micro_batch"], s["examples"], s["torch_threads"]) == (
        "llama-tiny",
        128,
        4,
        12,
        1,
    )
    assert {"torch", "transformers"} <= set(p["versions"]) and p["machine"]["cpu_model"]
    assert p["data"]["conversations"] == 12
    assert set(p["attention_cost"]["seconds_median"]) == {
        "packed_block_diagonal",
        "same_rows_causal",
        "quarter_rows_causal",
    }


def test_packed_and_padded_train_on_the_same_tokens(result):
    p = result["packing"]
    counts = {p[name]["trained_tokens"] for name in PATHS}
    assert len(counts) == 1 and counts.pop() > 0
    # batches of sorted lengths never pad more than random ones (packed rows may: the last row is padded)
    assert p["padded_grouped"]["positions"] <= p["padded_random"]["positions"]


def test_trained_tokens_equal_on_batches_with_truncation(finetune):
    """Examples longer than seq_len are cut for all paths alike: the counts still agree."""
    import numpy as np

    examples = []
    for n in (5, 30, 9, 17, 3):
        ids = np.arange(1, n + 1, dtype=np.int32)
        examples.append((ids[:16], np.where(np.arange(n) >= 2, ids, -100).astype(np.int64)[:16]))
    paths = finetune.packing_batches(examples, {"micro_batch": 2, "seq_len": 16, "seed": 0}, pad_id=0)
    assert {k: v["trained_tokens"] for k, v in paths.items()} == dict.fromkeys(PATHS, 3 + 14 + 7 + 14 + 1)


def test_an_unknown_part_is_refused(finetune):
    with pytest.raises(SystemExit):
        finetune.main(["--parts", "unknown"])
