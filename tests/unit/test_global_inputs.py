"""Issue 42 item 6: a global step mixed partitions of two corpora and succeeded. A new user ran recipe 1
on one corpus, then on another whose partition 000 failed: the global step read partition 000 of the
previous corpus beside partitions 001-003 of the new one. The real stages build that case here (two
tiny corpora, two partitions each); deduplicated_text refuses it, and inputs read with other settings,
naming the partitions and the settings that differ; filtered_text refuses partitions that are not the
ones its deduplicated_text was made from."""

import pytest

from largetrain_core.clean import QualityConfig
from largetrain_core.executors.local import LocalExecutor
from largetrain_core.readers import ReaderConfig
from largetrain_core.stages.base import StageError, StageRun
from largetrain_core.stages.cleaned_text import cleaned_text
from largetrain_core.stages.deduplicated_text import deduplicated_text
from largetrain_core.stages.global_inputs import check_made_from
from largetrain_core.stages.raw_corpus import raw_corpus

OFF = QualityConfig(gopher_quality=False, gopher_repetition=False, c4=False)
EX = LocalExecutor()


def corpus(tmp_path, name: str, n: int = 8):
    src = tmp_path / name
    src.mkdir()
    for i in range(n):
        (src / f"{name}{i:02d}.txt").write_text(f"Document {i} of corpus {name}: " + "some words here. " * (3 + i))
    return src


def partition(root, src, pk: str, quality=OFF, **reader):
    r = raw_corpus(
        ReaderConfig(str(src), partition=int(pk), partitions=2, **reader),
        StageRun(root, ("domain", "raw_corpus"), pk, executor=EX),
    )
    return r, cleaned_text(quality, r, StageRun(root, ("domain", "cleaned_text"), pk, executor=EX))


def dedup(root, raw, cleaned):
    return deduplicated_text(True, raw, cleaned, StageRun(root, ("domain", "deduplicated_text"), executor=EX))


def test_partitions_of_two_corpora_are_refused_naming_them(tmp_path):
    root = tmp_path / "root"
    old, new = corpus(tmp_path, "old"), corpus(tmp_path, "new")
    raw, cleaned = {}, {}
    raw["0"], cleaned["0"] = partition(root, old, "0")  # left from the previous corpus's runs
    raw["1"], cleaned["1"] = partition(root, new, "1")
    with pytest.raises(StageError) as e:
        dedup(root, raw, cleaned)
    msg = str(e.value)
    assert msg.startswith("domain/deduplicated_text: its input partitions do not come from one corpus and one config")
    assert f"raw_corpus source differs (partition 0: '{old.resolve()}', partition 1: '{new.resolve()}')" in msg
    assert "Re-materialize raw_corpus and cleaned_text for every partition with the same config" in msg
    assert not (root / "domain" / "deduplicated_text").exists()  # refused before any work

    # the same corpus throughout: it runs
    raw["0"], cleaned["0"] = partition(root, new, "0")
    assert dedup(root, raw, cleaned).checks["accounting"].passed


def test_partitions_read_or_cleaned_with_other_settings_are_refused_naming_the_settings(tmp_path):
    root = tmp_path / "root"
    src = corpus(tmp_path, "c")
    raw, cleaned = {}, {}
    raw["0"], cleaned["0"] = partition(root, src, "0", max_documents=3)
    raw["1"], cleaned["1"] = partition(root, src, "1")
    with pytest.raises(StageError, match=r"raw_corpus max_documents differs \(partition 0: 3, partition 1: None\)"):
        dedup(root, raw, cleaned)
    raw["0"], cleaned["0"] = partition(root, src, "0", quality=QualityConfig(gopher_repetition=False, c4=False))
    with pytest.raises(StageError) as e:
        dedup(root, raw, cleaned)
    assert "cleaned_text gopher_quality differs (partition 0: True, partition 1: False)" in str(e.value)
    assert "raw_corpus" not in str(e.value).split(": its input partitions")[1].split(". A global step")[0]


def test_filtered_text_reads_the_partitions_its_deduplicated_text_was_made_from(tmp_path):
    root = tmp_path / "root"
    a, b = corpus(tmp_path, "a"), corpus(tmp_path, "b")
    raw, cleaned = {}, {}
    for pk in ("0", "1"):
        raw[pk], cleaned[pk] = partition(root, a, pk)
    text = dedup(root, raw, cleaned)
    check_made_from("pretrain/filtered_text", text, raw, cleaned)  # the same partitions: fine
    raw["1"], cleaned["1"] = partition(root, b, "1")
    with pytest.raises(StageError) as e:
        check_made_from("pretrain/filtered_text", text, raw, cleaned)
    msg = str(e.value)
    assert (
        f"pretrain/filtered_text: the partitions it reads are not those its deduplicated_text {text.data_version}"
        in msg
    )
    assert (
        f"raw_corpus partition 1: {raw['1'].data_version} now, {text.stats['corpus']['data_versions']['raw_corpus']['1']}"
        in msg
    )
    assert "raw_corpus partition 0" not in msg
