"""largetrain_core.artifacts.build_or_reuse, the one build-or-reuse path of every stage: a complete
directory is reused, a damaged one rebuilt with the reason, a failed build leaves nothing behind."""

import logging

import pytest

from largetrain_core.artifacts import build_or_reuse, location


def _build(calls: list):
    def build(tmp):
        calls.append(tmp)
        (tmp / "part-00000.parquet").write_bytes(b"0123456789")
        (tmp / "notes.txt").write_text(str(tmp / "notes.txt"))
        return {"documents": 3, "file": str(tmp / "notes.txt")}

    return build


def test_built_once_then_reused_with_paths_under_the_directory(tmp_path, caplog):
    final, calls = location(tmp_path / "root", ["domain", "raw_corpus", "000"], "v1"), []
    assert final == (tmp_path / "root" / "domain" / "raw_corpus" / "000" / "v1").resolve()
    first = build_or_reuse(final, _build(calls))
    assert first.path == final and not first.reused and first.stats["documents"] == 3
    assert first.stats["seconds"] >= 0 and len(calls) == 1
    with caplog.at_level(logging.INFO, logger="largetrain_core.artifacts"):
        again = build_or_reuse(final, _build(calls))
    assert again.reused and len(calls) == 1 and "reusing it" in caplog.text
    # the path written inside the temporary directory is read back under the final one
    assert again.stats["file"] == str(final / "notes.txt")
    path, stats, reused = again  # a (path, stats, reused) tuple as well
    assert (path, reused) == (final, True)


def test_a_damaged_directory_is_rebuilt_naming_the_file(tmp_path):
    final, calls = tmp_path / "a" / "v1", []
    build_or_reuse(final, _build(calls))
    (final / "part-00000.parquet").write_bytes(b"0123456780")  # same size, other bytes
    rebuilt = build_or_reuse(final, _build(calls))
    assert not rebuilt.reused and len(calls) == 2
    assert str(final / "part-00000.parquet") in rebuilt.stats["rebuilt_because"]
    assert (final / "part-00000.parquet").read_bytes() == b"0123456789"


def test_a_failed_build_leaves_no_directory(tmp_path):
    final = tmp_path / "a" / "v1"

    def fails(tmp):
        (tmp / "half.parquet").write_bytes(b"x")
        raise ValueError("bad input: file x, line 3")

    with pytest.raises(ValueError, match="line 3"):
        build_or_reuse(final, fails)
    assert not final.exists() and list((tmp_path / "a").iterdir()) == []
