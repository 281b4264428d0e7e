"""Issue 42 item 6, as a new user met it: recipe 1's data steps on one corpus, then on another whose
partition 000 failed (too many rejected records) while its other partitions succeeded. The global step
then read partition 000 of the previous corpus beside the new corpus's others, and succeeded. Through
Dagster now: deduplicated_text refuses, naming the partitions and the corpora; the summary says that
the latest run of partition 000 failed, and which materialization it shows instead."""

from dagster import DagsterInstance

from helpers import TICKETS
from largetrain_core.corpus import partition_of
from largetrain_dagster.corpus import corpus_assets
from largetrain_dagster.definitions import build_definitions
from largetrain_dagster.partitions import DATA_PARTITIONS
from largetrain_dagster.summary import render
from helpers.lineage import materialize_lineage

KEYS = DATA_PARTITIONS.get_partition_keys()
QUALITY = {"config": {"gopher_quality": False, "gopher_repetition": False}}


def _name_in(partition: int, stem: str) -> str:
    """A file name ``<stem>-<i>.jsonl`` that hashes to ``partition`` (largetrain_core.corpus.partition_of)."""
    return next(f"{stem}-{i}.jsonl" for i in range(1000) if partition_of(f"{stem}-{i}.jsonl", len(KEYS)) == partition)


def _corpus(tmp_path, name: str, broken_partition: int | None = None):
    """A corpus directory with one file of 10 tickets in every partition; in ``broken_partition`` the
    file holds only lines that are not JSON (every record rejected)."""
    lines = TICKETS.read_text().splitlines(keepends=True)
    src = tmp_path / name
    src.mkdir()
    for i in range(len(KEYS)):
        text = "not json\n" * 10 if i == broken_partition else "".join(lines[10 * i : 10 * i + 10])
        (src / _name_in(i, f"{name}{i}")).write_text(text)
    return src


def test_a_global_step_refuses_partitions_of_two_corpora_and_the_summary_names_the_failed_run(tmp_path):
    defs = build_definitions(root=str(tmp_path / "root"), wandb_mode="disabled")
    assets = corpus_assets("domain")
    old, new = _corpus(tmp_path, "old"), _corpus(tmp_path, "new", broken_partition=0)

    def cfg(path):
        return {"ops": {"domain__raw_corpus": {"config": {"path": str(path)}}, "domain__cleaned_text": QUALITY}}

    with DagsterInstance.ephemeral() as instance:
        everything = ["domain/raw_corpus", "domain/cleaned_text", "domain/deduplicated_text"]
        assert materialize_lineage(assets, defs.resources, instance, cfg(old), everything).success
        # the new corpus, partition by partition as the README's loop runs them: 000 fails, the others succeed
        results = [
            materialize_lineage(
                assets, defs.resources, instance, cfg(new), everything[:2], partitions=[pk], raise_on_error=False
            )
            for pk in KEYS
        ]
        assert [r.success for r in results] == [False] + [True] * (len(KEYS) - 1)
        dedup = materialize_lineage(assets, defs.resources, instance, cfg(new), everything[2:], raise_on_error=False)
        assert not dedup.success
        (failure,) = [e for e in dedup.last.all_events if e.is_step_failure]
        message = failure.event_specific_data.user_failure_data.description
        others = ", ".join(KEYS[1:])
        assert message.startswith(
            "domain/deduplicated_text: its input partitions do not come from one corpus and one config: "
            f"raw_corpus source differs (partition {KEYS[0]}: '{old.resolve()}', partitions {others}: '{new.resolve()}')"
        ), message
        summary = render(instance)
    lines = summary.splitlines()
    assert lines[0] == "FAILED (latest runs):", summary
    (raw,) = [line for line in lines if line.startswith(f"  domain/raw_corpus partition {KEYS[0]}: the latest run")]
    assert f"the latest run {results[0].run_id[:8]} (" in raw and "records rejected" in raw, raw
    assert "; what this summary shows of it is from run " in raw
    (cleaned,) = [line for line in lines if line.startswith(f"  domain/cleaned_text partition {KEYS[0]}:")]
    assert "failed: not run: an earlier step of the run failed" in cleaned
    (global_step,) = [line for line in lines if line.startswith("  domain/deduplicated_text: the latest run")]
    assert "its input partitions do not come from one corpus" in global_step
    assert not [line for line in lines if line.startswith(f"  domain/raw_corpus partition {KEYS[1]}")]
