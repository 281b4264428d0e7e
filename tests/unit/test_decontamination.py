"""largetrain_core.decontamination: 13-gram matches between training documents and the items of
tests/data/eval_benchmark.jsonl (prompt, answer and the n-grams across both), normalization, the items too
short to check, exact verification of hashed matches, removal or report, and the per-corpus overlaps."""

import json

import numpy as np
import polars as pl
import pytest

from helpers import TESTS
from largetrain_core.decontamination import (
    ANSWER_WINDOW,
    N,
    build_index,
    decontaminate_parts,
    load_index,
    ngram_hashes,
    normalized_words,
    overlaps,
    read_benchmark,
    scan,
)

BENCH = TESTS / "data" / "eval_benchmark.jsonl"
ITEMS = [json.loads(line) for line in BENCH.open()]
FILLER = "The scheduler keeps a run queue per CPU and balances the load between them from time to time. " * 3


@pytest.fixture(scope="module")
def index():
    return build_index(read_benchmark(BENCH))


def _docs(texts):
    return pl.DataFrame({"doc_id": [f"d{i}" for i in range(len(texts))], "source": ["s"] * len(texts), "text": texts})


def test_items_and_the_too_short_ones(index):
    assert index.items["eval_set"].unique().to_list() == ["eval_benchmark"] and index.items.height == 5
    assert index.too_short.to_dicts() == [{"eval_set": "eval_benchmark", "item_id": "q4", "words": 6}]
    assert len(index.hashes) == sum(max(0, len(w) - N + 1) for w in index.items["words"].to_list())
    assert (np.diff(index.hashes.astype(np.float64)) >= 0).all()


def test_a_planted_item_is_found_in_prompt_answer_and_across_with_its_ngram(index):
    q2 = ITEMS[1]
    prompt_only = FILLER + " " + q2["prompt"].upper().replace(",", " ;") + " " + FILLER  # case and punctuation ignored
    across = FILLER + " ... another task on that CPU until the lock is released and preemption is enabled again! "
    answer_only = FILLER + ITEMS[2]["answer"]  # 7 words: below 13, no match on its own
    clean = FILLER + " The lock is released and preemption is enabled again."
    got = scan(_docs([prompt_only, across, answer_only, clean]), index)
    assert got["doc_id"].to_list() == ["d0", "d1"] and set(got["item_id"]) == {"q2"}
    assert got["reason"].to_list() == ["contaminated"] * 2
    first = got.filter(pl.col("doc_id") == "d0")["ngram"][0]
    assert first == "a driver must not sleep while holding a spinlock because the scheduler cannot"
    assert len(got.filter(pl.col("doc_id") == "d1")["ngram"][0].split()) == N


def test_one_word_changed_in_every_13_gram_is_no_match(index):
    words = ITEMS[0]["prompt"].split()
    words[9] = "overwrite"  # the item has 22 words: each of its ten 13-grams holds word 9
    text = " ".join(words) + " " + ITEMS[0]["answer"]
    w = normalized_words(pl.Series([text]))[0].to_list()
    assert all("overwrite" in w[i : i + N] for i in range(len(w) - N + 1))
    assert scan(_docs([text]), index).height == 0


def test_hash_match_is_verified_word_by_word(index):
    """A hash that collides (forced here by editing the index) removes nothing."""
    doc = _docs([FILLER + " " + ITEMS[4]["prompt"]])
    h, _, _ = ngram_hashes(normalized_words(doc["text"]))
    fake = build_index(read_benchmark(BENCH))
    fake.items = fake.items.with_columns(pl.col("words").list.eval(pl.element() + "x"))  # same hashes, other words
    assert scan(doc, index).height == 1 and scan(doc, fake).height == 0
    assert np.isin(h, fake.hashes).any()


def test_remove_or_report_and_the_saved_index(index, tmp_path):
    src, out, rep = tmp_path / "src", tmp_path / "out", tmp_path / "rep"
    for d in (src, out, rep):
        d.mkdir()
    _docs([FILLER, FILLER + ITEMS[0]["prompt"] + " " + ITEMS[0]["answer"], FILLER * 2]).write_parquet(
        src / "part-00000.parquet"
    )
    _docs([ITEMS[2]["prompt"]]).with_columns(doc_id=pl.lit("e0")).write_parquet(src / "part-00001.parquet")
    (tmp_path / "idx").mkdir()
    index.save(tmp_path / "idx")
    again = load_index(tmp_path / "idx")
    stats = decontaminate_parts([src], out, again)
    assert stats == {
        "input": 4,
        "kept": 2,
        "filtered": 2,
        "filtered_by_reason": {"contaminated": 2},
        "contaminated": 2,
        "contaminated_by_set": {"eval_benchmark": 2},
        "too_short_items": 1,
    }
    assert pl.read_parquet(sorted(out.glob("part-*.parquet")))["doc_id"].to_list() == ["d0", "d2"]
    report = pl.read_parquet(out / "contaminated.parquet")
    assert report.select("doc_id", "item_id").rows() == [("d1", "q1"), ("e0", "q3")]
    stats = decontaminate_parts([src], rep, again, remove=False)
    assert stats["kept"] == 4 and stats["contaminated"] == 2 and stats["filtered"] == 0
    found = overlaps({"pretrain": [src], "domain": [out]}, again)
    assert found.select("corpus", "doc_id", "item_id").rows() == [("pretrain", "d1", "q1"), ("pretrain", "e0", "q3")]


def test_bad_benchmark_records_name_file_and_line(tmp_path):
    f = tmp_path / "b.jsonl"
    f.write_text('{"prompt": "ok", "answer": "a"}\n{"question": "no prompt"}\n')
    with pytest.raises(ValueError, match=r"b.jsonl:2: an evaluation item needs"):
        read_benchmark(f)
    f.write_text("not json\n")
    with pytest.raises(ValueError, match=r"b.jsonl:1: not JSON"):
        read_benchmark(f)


FORMS = TESTS / "cases" / "decontamination_forms"


def test_decontamination_forms_case_every_web_form_is_found_and_removed(tmp_path):
    """tests/cases/decontamination_forms: soft hyphens, zero-width spaces, a hyphenated line break (a
    13-word-prompt item), Q:/A: labels, a multiple-choice block and "The answer is" (a 10-word-prompt
    item, matched by prompt + answer); the topical document is kept. The lineage check's overlaps
    (the evaluation asset's blocking check) use the same scan and find the same documents."""
    expected = json.loads((FORMS / "expected.json").read_text())
    docs = pl.read_ndjson(FORMS / "documents.jsonl").select(doc_id="id", source=pl.lit("web"), text="text")
    index = build_index(read_benchmark(FORMS / "quiz.jsonl"))
    assert index.too_short.height == 0  # the short prompt is checkable by prompt + answer
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir(), out.mkdir()
    docs.write_parquet(src / "part-00000.parquet")
    stats = decontaminate_parts([src], out, index)
    kept = pl.read_parquet(out / "part-00000.parquet")["doc_id"].to_list()
    got = {d: ("kept" if d in kept else "contaminated") for d in docs["doc_id"]}
    assert got == expected and stats["contaminated"] == 6
    found = pl.read_parquet(out / "contaminated.parquet")
    assert dict(zip(found["doc_id"], found["item_id"])) == {
        "soft_hyphen": "geo1",
        "zero_width": "geo1",
        "line_break_hyphen": "geo1",
        "qa_labels": "bio2",
        "multiple_choice": "bio2",
        "the_answer_is": "bio2",
    }
    assert found.filter(pl.col("doc_id") == "qa_labels")["ngram"][0] == (
        "which organelle produces most of the energy a cell uses ... the mitochondrion through cellular respiration"
    )
    lineage = overlaps({"pretrain": [src]}, index)
    assert sorted(lineage["doc_id"]) == sorted(d for d, v in expected.items() if v == "contaminated")


def test_format_characters_and_line_break_hyphens_do_not_split_words():
    forms = ["em\u00adpties", "em\u200bpties", "em\u2060pties", "emp\ufeffties", "emp-\nties", "emp-  \r\n  ties"]
    assert [w.to_list() for w in normalized_words(pl.Series(forms))] == [["empties"]] * len(forms)
    # a hyphen inside a line, or before a digit, still separates
    assert normalized_words(pl.Series(["well-known 2-\n3"]))[0].to_list() == ["well", "known", "2", "3"]


def test_short_prompts_match_with_their_answer_within_the_window_or_are_listed(tmp_path):
    items = [
        {"id": "s1", "prompt": "Which planet has the shortest year of all?", "answer": "Mercury"},
        {"id": "tiny", "prompt": "Who wrote Hamlet?", "answer": "Shakespeare"},  # 3 words: uncheckable
        {"id": "no_answer", "prompt": "Name the largest moon of Saturn please", "answer": ""},
    ]
    (tmp_path / "short.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    index = build_index(read_benchmark(tmp_path / "short.jsonl"))
    assert index.too_short.select("item_id", "words").rows() == [("tiny", 4), ("no_answer", 7)]
    assert index.items["prompt_words"].to_list() == [8, 3, 7]
    gap = " ".join(["filler"] * ANSWER_WINDOW)
    texts = [
        "Question: Which planet has the shortest year of all? Options: Venus, Mars. Answer: Mercury.",
        f"Which planet has the shortest year of all? {gap} Mercury",  # ANSWER_WINDOW words between: inside
        f"Which planet has the shortest year of all? {gap} more Mercury",  # one more: outside
        "Mercury. Which planet has the shortest year of all?",  # the answer before the prompt
        "Which planet has the shortest day of all? Mercury",  # another prompt
        "Who wrote Hamlet? Shakespeare.",  # the uncheckable item is not matched
    ]
    got = scan(_docs(texts), index)
    assert got["doc_id"].to_list() == ["d0", "d1"] and set(got["item_id"]) == {"s1"}


def test_the_short_prompt_method_survives_save_and_load(tmp_path):
    index = build_index(read_benchmark(FORMS / "quiz.jsonl"))
    index.save(tmp_path)
    again = load_index(tmp_path)
    assert np.array_equal(again.short_hashes, index.short_hashes) and np.array_equal(again.short_rows, index.short_rows)
    doc = _docs(
        [
            "Q: Which organelle produces most of the energy a cell uses?\nA: The mitochondrion, through cellular respiration."
        ]
    )
    assert scan(doc, again)["item_id"].to_list() == ["bio2"]
