"""largetrain_core.dedup_report: per-source removals and the no_source_wiped_out check on a planted case."""

from pathlib import Path

import polars as pl

from largetrain_core.dedup import DedupConfig, deduplicate
from largetrain_core.dedup_report import (
    MIN_SOURCE_DOCUMENTS,
    SETTING,
    TOP_LEVEL,
    cluster_sizes,
    cluster_sizes_markdown,
    outcomes,
    removed_sample,
    source_table,
    top_sources,
    wiped_out,
)


def _write(d: Path, rows: list[tuple[str, str, str]]) -> Path:
    d.mkdir(parents=True)
    pl.DataFrame(
        {"doc_id": [r[0] for r in rows], "source": [r[1] for r in rows], "text": [r[2] for r in rows]}
    ).write_parquet(d / "part-00000.parquet")
    return d


def _ticket(i: int) -> str:
    return " ".join(f"ticket{i} word{k}" for k in range(40))


def _planted(tmp_path: Path):
    """tickets/: 24 documents, 18 of them copies of 3 (exact or one word changed: near); docs/: 30 distinct;
    a top-level file of 2 copies of a doc (too small a source to judge)."""
    rows = [(f"t{i}", f"tickets/t{i}.json", _ticket(i % 6)) for i in range(24)]
    rows = [(d, s, t.replace("word3 ", "wordX ") if i % 12 >= 6 else t) for i, (d, s, t) in enumerate(rows)]
    rows += [(f"d{i}", f"docs/sub/d{i}.txt", _ticket(100 + i)) for i in range(30)]
    rows += [("top0", "a.txt", _ticket(100)), ("top1", "b.txt", _ticket(100))]
    inp = _write(tmp_path / "in", rows)
    out = tmp_path / "out"
    out.mkdir()
    deduplicate(inp, out, DedupConfig())
    return {None: [inp]}, out


def test_a_source_wiped_out_fails_with_its_fraction_clusters_and_setting(tmp_path):
    dirs, out = _planted(tmp_path)
    docs = outcomes(dirs, out)
    table = source_table(docs)
    rows = {(r["dimension"], r["source"]): r for r in table.iter_rows(named=True)}
    t = rows[("folder", "tickets")]
    assert (t["read"], t["removed_exact"] + t["removed_near"], t["kept_unverified"]) == (24, 18, 0)
    assert t["removed_near"] >= 1 and t["removed_exact"] >= 1
    assert rows[("folder", "docs")]["removed_fraction"] == 0.0
    assert rows[("folder", TOP_LEVEL)]["read"] == 2 < MIN_SOURCE_DOCUMENTS  # 2 of 2 removed: shown, not judged
    passed, message = wiped_out(docs, table, 0.5)
    assert not passed
    assert "folder 'tickets' lost 75.0% of its 24 documents" in message
    assert message.count("removed as copies of") == 3 and "'t0'" in message and "'t6'" in message
    assert f"{SETTING}=0.5" in message and "top level" not in message
    assert wiped_out(docs, table, 0.8)[0] and wiped_out(docs, table, None)[0]
    sample = removed_sample(docs, dirs)
    assert "removed as a copy of" in sample and "ticket0 word0" in sample


def test_cluster_sizes_count_the_kept_document_and_its_copies_and_the_worst_sources_lead(tmp_path):
    dirs, out = _planted(tmp_path)
    docs = outcomes(dirs, out)
    sizes = cluster_sizes(docs)
    # every removed document is in exactly one cluster with its kept copy
    removed = docs.filter(pl.col("outcome").is_in(["exact", "near"])).height
    assert (
        sum((size - 1) * n for c in sizes.values() for size, n in c.items()) == removed == 18 + 2
    )  # tickets, and both top-level copies of d0
    per_kept = docs.filter(pl.col("duplicate_of").is_not_null()).group_by("duplicate_of", "outcome").len()
    for r in per_kept.iter_rows(named=True):
        assert sizes[r["outcome"]][r["len"] + 1] >= 1
    md = cluster_sizes_markdown(sizes)
    assert md.startswith("![duplicate clusters by size](data:image/png;base64,iVBOR")  # a PNG
    assert "| kind | cluster size | clusters |" in md
    top = top_sources(source_table(docs))
    assert top == [
        {"source": f"folder: {TOP_LEVEL}", "read": 2, "removed": 2, "removed_fraction": 1.0},
        {"source": "folder: tickets", "read": 24, "removed": 18, "removed_fraction": 0.75},
    ]  # docs/ lost nothing: not listed


def test_normal_data_passes(tmp_path):
    rows = [(f"d{i}", f"docs/d{i}.txt", _ticket(i)) for i in range(30)]
    inp = _write(tmp_path / "in", rows + [("dup", "docs/dup.txt", _ticket(0))])
    out = tmp_path / "out"
    out.mkdir()
    deduplicate(inp, out, DedupConfig())
    docs = outcomes({None: [inp]}, out)
    table = source_table(docs)
    assert table.select("dimension", "source", "read", "removed_exact").row(0) == ("folder", "docs", 31, 1)
    passed, message = wiped_out(docs, table, 0.5)
    assert passed and "folder 'docs', 3.2%" in message
