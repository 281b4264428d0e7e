"""The demo data of the fine-tuning recipes (largetrain_core.recipe_corpora): fortune files to labelled
records and Python FAQ rst pages to chat records, on the samples in tests/data/recipe_corpora/ (the real
packages are fetched by scripts/fetch_corpora.sh, never here)."""

import json
import os

import pytest

from helpers import REPO
from largetrain_core.recipe_corpora import faq_records, fortune_records, main, parse_faq_rst, parse_fortunes

pytestmark = pytest.mark.unit

DATA = REPO / "tests" / "data" / "recipe_corpora"
FORTUNES = DATA / "fortunes"
FAQ = DATA / "faq"

FOOD = [
    "Bread is the staff of life.\n\t\t-- proverb",
    "%% is not a separator; a lone percent sign is.",
    "Eat well, or well, and ring for dessert.",
]
SCIENCE = [
    "E = mc^2",
    'The most exciting phrase in science is not "Eureka!"\nbut "That\'s funny..."\n\t\t-- Isaac Asimov',
    "Entropy isn't what it used to be.",
]


def test_the_samples_hold_the_edge_cases_as_bytes():
    food, science = (FORTUNES / "food").read_bytes(), (FORTUNES / "science").read_bytes()
    assert food.endswith(b"\n%\n") and b"%\n%\n" in food and b"\b" in food and b"\a" in food
    assert science.count(b"\r\n") == 7 and not science.endswith(b"\n")


def test_parse_fortunes_separators_empty_entries_crlf_overstrike():
    assert parse_fortunes((FORTUNES / "food").read_text(), "food") == FOOD
    assert parse_fortunes((FORTUNES / "science").read_bytes().decode(), "science") == SCIENCE
    assert parse_fortunes("", "x") == []
    assert parse_fortunes("%\n%\n", "x") == []
    assert parse_fortunes("one\r%\rtwo\r", "x") == ["one", "two"]  # bare CR line ends
    assert parse_fortunes(" %\n% \nx\n", "x") == [" %\n%\nx"]  # only a line holding just '%' separates


def test_fortune_records_ids_labels_and_order():
    records = fortune_records(FORTUNES, ["science", "food"])
    assert records == [{"id": f"science-{n}", "text": t, "label": "science"} for n, t in enumerate(SCIENCE, 1)] + [
        {"id": f"food-{n}", "text": t, "label": "food"} for n, t in enumerate(FOOD, 1)
    ]


@pytest.mark.parametrize(
    "categories, error, message",
    [
        (["food.dat"], ValueError, "not a plain file name"),
        (["off/food"], ValueError, "off/ set are never read"),
        (["../fortunes/food"], ValueError, "not a plain file name"),
        (["drinks"], FileNotFoundError, "drinks: no such fortune file"),
        (["food", "food"], ValueError, "repeated"),
        ([], ValueError, "no fortune categories"),
    ],
)
def test_fortune_records_refuses_what_is_not_a_category(categories, error, message):
    with pytest.raises(error, match=message):
        fortune_records(FORTUNES, categories)


def test_fortune_records_refuses_links_undecodable_and_empty_files(tmp_path):
    (tmp_path / "good").write_text("a\n%\nb\n")
    os.symlink("good", tmp_path / "good2")
    with pytest.raises(ValueError, match=r"good2: a symlink"):
        fortune_records(tmp_path, ["good2"])
    (tmp_path / "latin").write_bytes(b"ok\n%\ncaf\xe9\n")
    with pytest.raises(ValueError, match=r"latin: line 3 \(byte 8\): not UTF-8"):
        fortune_records(tmp_path, ["latin"])
    (tmp_path / "blank").write_text("%\n \n%\n")
    with pytest.raises(ValueError, match=r"blank: no fortune in the file"):
        fortune_records(tmp_path, ["blank"])


Q1 = "What is a sample?"
A1 = "A small part that shows the whole.  See :ref:`samples`::\n\n   sample = whole[:10]\n\nSamples are cheap."
Q2 = "How are samples nested?"
A2 = "In sections.\n\nDeeper\n^^^^^^\n\nA subsection belongs to its question's answer."
Q3 = "Why three questions?"
A3 = "Because."


def test_parse_faq_rst_questions_answers_directives_and_nesting():
    text = (FAQ / "sample.rst.txt").read_text()
    assert parse_faq_rst(text, "sample") == [(Q1, A1), (Q2, A2), (Q3, A3)]
    assert parse_faq_rst(text.replace("\n", "\r\n"), "sample") == [(Q1, A1), (Q2, A2), (Q3, A3)]


def test_parse_faq_rst_group_with_text_is_a_question_and_same_level_titles_end_it():
    text = "Page\n====\n\nGroup\n-----\n\nIntro.\n\nQ?\n~~~~\n\nA.\n\nNext?\n-----\n\nB.\n"
    assert parse_faq_rst(text, "p") == [("Group", "Intro.\n\nQ?\n~~~~\n\nA."), ("Next?", "B.")]
    # a title right under another title's underline is underlined, not overlined by it
    assert parse_faq_rst("P\n=\n\nA?\n--\nB?\n--\n\nb.\n", "p") == [("B?", "b.")]
    # a footnote, a kept directive and an empty comment stay content; an indented 'title' is not one
    text = "Page\n====\n\nQ?\n--\n\n..\n\n   quoted\n   ------\n\n.. note:: n\n\n.. [1] f\n"
    assert parse_faq_rst(text, "p") == [("Q?", "   quoted\n   ------\n\n.. note:: n\n\n.. [1] f")]


def test_parse_faq_rst_without_titles_names_the_page():
    with pytest.raises(ValueError, match="FAQ page 'loose': no section title"):
        parse_faq_rst("just text\n", "loose")
    assert parse_faq_rst("Page\n====\n\nintro only\n", "p") == []


def test_faq_records_chat_format_pages_sorted_index_adds_nothing(tmp_path):
    def chat(q, a):
        return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]

    assert faq_records(FAQ) == [
        {"id": "sample-1", "messages": chat(Q1, A1)},
        {"id": "sample-2", "messages": chat(Q2, A2)},
        {"id": "sample-3", "messages": chat(Q3, A3)},
    ]
    (tmp_path / "bad.rst.txt").write_bytes(b"T\n=\n\xff\n")
    with pytest.raises(ValueError, match=r"bad.rst.txt: line 3 \(byte 4\): not UTF-8"):
        faq_records(tmp_path)
    (tmp_path / "bad.rst.txt").write_text("no title\n")
    with pytest.raises(ValueError, match=r"bad.rst.txt: FAQ page 'bad': no section title"):
        faq_records(tmp_path)
    with pytest.raises(FileNotFoundError, match="no FAQ page"):
        faq_records(tmp_path / "..")


def test_main_writes_jsonl(tmp_path, capsys):
    out = tmp_path / "fortunes.jsonl"
    assert main(["fortunes", str(FORTUNES), str(out), "--categories", "food,science"]) == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["food-1", "food-2", "food-3"] + [
        "science-1",
        "science-2",
        "science-3",
    ]
    assert "6 fortunes in 2 categories (food 3, science 3)" in capsys.readouterr().out
    out = tmp_path / "python_faq.jsonl"
    assert main(["faq", str(FAQ), str(out)]) == 0
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["sample-1", "sample-2", "sample-3"]
    assert main(["fortunes", str(FORTUNES), str(tmp_path / "x.jsonl"), "--categories", "food.dat"]) == 1
    assert "not a plain file name" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()
