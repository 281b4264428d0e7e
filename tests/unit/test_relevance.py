"""largetrain_core.relevance: a classifier trained on tests/data/support_tickets.jsonl (billing tickets as the
wanted text against the other categories), its held-out metrics above chance, the informative features,
saving and loading without pickle, the score histogram and the threshold of a top fraction (the filter
itself, the relevance_score column and reason relevance: tests/test_filtered_text.py)."""

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from helpers import TICKETS
from largetrain_core.relevance import (
    BINS,
    SCORE,
    RelevanceConfig,
    histogram_quantiles,
    load,
    read_examples,
    sample_texts,
    score_histogram,
    threshold_for_top,
    train,
)

ROWS = [json.loads(line) for line in TICKETS.open()]
POS = [r["text"] for r in ROWS if r["category"] == "billing"]
NEG = [r["text"] for r in ROWS if r["category"] != "billing"]
POS_IDS = [r["id"] for r in ROWS if r["category"] == "billing"]


@pytest.fixture(scope="module")
def model():
    return train(POS, NEG, RelevanceConfig(seed=0))


def test_held_out_metrics_are_above_chance_and_recorded(model):
    m = model.meta["metrics"]
    assert m["auc"] > 0.9 and m["precision"] > 0.8 and m["recall"] > 0.8, m
    assert m["held_out"] == {"positive": 64, "negative": 96} and m["train"]["positive"] == 255
    assert m["train_seconds"] >= 0


def test_informative_features_are_ngrams_of_the_training_text(model):
    for side in ("relevant", "irrelevant"):
        feats = model.meta["features"][side]
        assert len(feats) == 20 and all(f["ngrams"] for f in feats)
    words = {g for f in model.meta["features"]["relevant"][:5] for g in f["ngrams"]}
    assert words & {"refund", "charged", "invoice", "payment", "eur", "card", "the refund", "charged twice"}, words
    assert all(f["weight"] > 0 for f in model.meta["features"]["relevant"])
    assert all(f["weight"] < 0 for f in model.meta["features"]["irrelevant"])


def test_saved_model_scores_the_same_without_pickle(model, tmp_path):
    model.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json", "weights.npz"]
    again = load(tmp_path)
    texts = POS[:5] + NEG[:5]
    assert np.array_equal(again.score(texts), model.score(texts))
    s = again.score(texts)
    assert s.dtype == np.float32 and (s[:5] > 0.5).all() and (s[5:] < 0.5).all()
    with pytest.raises(FileNotFoundError, match="weights.npz"):
        (tmp_path / "weights.npz").unlink() or load(tmp_path)


def test_the_same_training_saves_byte_identical_files(model, tmp_path):
    """The wall time is in the stage's stats, not in model.json: two trainings of the same inputs save the same bytes."""
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    model.save(tmp_path / "a")
    train(POS, NEG, RelevanceConfig(seed=0)).save(tmp_path / "b")
    for name in ("model.json", "weights.npz"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert "train_seconds" not in json.loads((tmp_path / "a" / "model.json").read_text())["metrics"]
    assert model.meta["metrics"]["train_seconds"] >= 0  # still returned to the stage


def test_too_few_examples_and_bad_settings_fail_clearly():
    with pytest.raises(ValueError, match="1 positive and 3 negative"):
        train(POS[:1], NEG[:3])
    with pytest.raises(ValueError, match="held_out_fraction"):
        RelevanceConfig(held_out_fraction=1.0)


def test_example_files_jsonl_and_text(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"text": "a b"}\n\n{"text": "c"}\n')
    (tmp_path / "p.txt").write_text("one\n\ntwo\n")
    assert read_examples(tmp_path / "p.jsonl") == ["a b", "c"] and read_examples(tmp_path / "p.txt") == ["one", "two"]
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"title": "b"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: no non-empty \"text\""):
        read_examples(tmp_path / "bad.jsonl")


def _corpus(tmp_path: Path) -> Path:
    d = tmp_path / "dedup"
    d.mkdir()
    for i in range(0, len(ROWS), 300):
        chunk = ROWS[i : i + 300]
        pl.DataFrame(
            {
                "doc_id": [r["id"] for r in chunk],
                "source": ["t"] * len(chunk),
                "text": [r["text"] for r in chunk],
                "language": ["en"] * len(chunk),
            }
        ).write_parquet(d / f"part-{i // 300:05d}.parquet")
    return d


def test_score_histogram_and_the_top_fraction_threshold(model, tmp_path):
    """Scores of every document into a histogram, one file at a time, and the threshold of a top
    fraction read from it (the filter itself: tests/test_filtered_text.py)."""
    src = _corpus(tmp_path)
    scored = tmp_path / "scored"
    scored.mkdir()
    for i, part in enumerate(sorted(src.glob("part-*.parquet"))):
        df = pl.read_parquet(part)
        df.with_columns(pl.Series(SCORE, model.score(df["text"].to_list()))).write_parquet(
            scored / f"part-{i:05d}.parquet"
        )
    files = sorted(scored.glob("part-*.parquet"))
    hist = score_histogram(files)
    assert hist.shape == (BINS,) and hist.sum() == 800
    assert score_histogram(files, exclude=frozenset(POS_IDS)).sum() == 800 - len(POS_IDS)
    cut = threshold_for_top(hist, 0.25)
    scores = pl.read_parquet(files)[SCORE]
    assert 200 <= int((scores >= cut).sum()) <= 201  # a quarter, within one histogram bin
    q = histogram_quantiles(hist)
    assert q["count"] == 800 and q["min"] <= q["p10"] <= q["p50"] <= q["p90"] <= q["max"] <= 1.0


def test_threshold_for_top_reads_the_histogram():
    hist = np.zeros(10, np.int64)
    hist[[1, 5, 9]] = [6, 3, 1]  # scores in [0.1, 0.2), [0.5, 0.6), [0.9, 1.0]
    assert threshold_for_top(hist, 0.1) == 0.9 and threshold_for_top(hist, 0.4) == 0.5
    assert threshold_for_top(hist, 0.41) == 0.1 and threshold_for_top(hist, 1.0) == 0.0


def test_sample_texts_is_seeded_and_excludes(tmp_path):
    src = _corpus(tmp_path)
    a, b = sample_texts([src], 50, 3), sample_texts([src], 50, 3)
    assert a == b and len(a) == 50 and sample_texts([src], 50, 4) != a
    assert not set(sample_texts([src], 900, 0, exclude=set(POS))) & set(POS)


def test_relevance_classifier_stage_trains_from_the_corpora_and_is_versioned(tmp_path):
    """The stage of the relevance_classifier asset: positives sampled from the domain corpus, negatives
    from the pretraining corpus, its metrics and features in the stats and metadata, reused when
    nothing changed."""
    import logging

    from largetrain_core.stages.base import Artifact, StageError, StageRun
    from largetrain_core.stages.relevance_classifier import relevance_classifier

    dom, pre = (
        tmp_path / "root" / "domain" / "deduplicated_text" / "d1",
        tmp_path / "copy" / "pretrain" / "deduplicated_text" / "p1",
    )
    for d, rows in (
        (dom, [r for r in ROWS if r["category"] == "billing"]),
        (pre, [r for r in ROWS if r["category"] != "billing"]),
    ):
        d.mkdir(parents=True)
        pl.DataFrame(
            {"doc_id": [r["id"] for r in rows], "source": ["t"] * len(rows), "text": [r["text"] for r in rows]}
        ).write_parquet(d / "part-00000.parquet")
    run = StageRun(
        root=tmp_path / "root",
        asset=("relevance_classifier",),
        partition=None,
        log=logging.getLogger("t"),
        executor=None,
    )
    cfg = RelevanceConfig(negatives_per_positive=1.0)
    res = relevance_classifier(cfg, Artifact(dom, "d1", {}), Artifact(pre, "p1", {}), run)
    assert res.stats["heldout_auc"] > 0.9 and res.stats["metrics"]["train"]["positive"] == 255
    # a corpus is named by its place under a storage root (the same under a root and a local copy of one)
    assert res.stats["positives"] == "corpus domain/deduplicated_text/d1"
    assert res.stats["negatives"] == "corpus pretrain/deduplicated_text/p1"
    assert "informative_features" in res.metadata
    assert (res.path / "model.json").exists() and load(res.path).score(POS[:3]).min() > 0.5
    again = relevance_classifier(cfg, Artifact(dom, "d1", {}), Artifact(pre, "p1", {}), run)
    assert again.reused and again.path == res.path
    other = relevance_classifier(cfg, Artifact(dom, "d2", {}), Artifact(pre, "p1", {}), run)
    assert other.path != res.path  # a new domain corpus version: a new classifier version
    with pytest.raises(StageError, match="does not exist"):
        relevance_classifier(
            RelevanceConfig(positives_file=str(tmp_path / "none.jsonl")),
            Artifact(dom, "d1", {}),
            Artifact(pre, "p1", {}),
            run,
        )


def test_the_domain_corpus_as_the_pretraining_corpus_says_that_negatives_file_fixes_it(tmp_path):
    """Issue 42 item 11: with the domain corpus the pretraining corpus, every negative drawn is also a
    positive: "400 positive and 0 negative examples", and no word of what fixes it. The stage now names
    the cause and negatives_file; with a negatives_file it trains."""
    import logging

    from largetrain_core.stages.base import Artifact, StageError, StageRun
    from largetrain_core.stages.relevance_classifier import relevance_classifier

    same = tmp_path / "root" / "domain" / "deduplicated_text" / "d1"
    same.mkdir(parents=True)
    pl.DataFrame(
        {"doc_id": [r["id"] for r in ROWS], "source": ["t"] * len(ROWS), "text": [r["text"] for r in ROWS]}
    ).write_parquet(same / "part-00000.parquet")
    corpus = {"corpus": {"source": "/data/tickets.jsonl"}}
    run = StageRun(root=tmp_path / "root", asset=("relevance_classifier",), log=logging.getLogger("t"))
    cfg = RelevanceConfig(max_examples=400)
    with pytest.raises(StageError) as e:
        relevance_classifier(cfg, Artifact(same, "d1", corpus), Artifact(same, "d1", corpus), run)
    msg = str(e.value)
    assert msg.startswith(
        "relevance_classifier: 400 positive examples (corpus domain/deduplicated_text/d1) but 0 negative"
    )
    assert "the domain corpus is the pretraining corpus (/data/tickets.jsonl)" in msg
    assert "Set relevance_classifier `negatives_file` to examples of text you do not want" in msg
    negatives = tmp_path / "negatives.txt"
    negatives.write_text("\n".join(f"kernel module {i} loads the driver for device {i}" for i in range(50)))
    cfg = RelevanceConfig(max_examples=400, negatives_file=str(negatives))
    res = relevance_classifier(cfg, Artifact(same, "d1", corpus), Artifact(same, "d1", corpus), run)
    assert res.stats["negatives"] == f"file {negatives}" and res.stats["metrics"]["train"]["negative"] == 40
