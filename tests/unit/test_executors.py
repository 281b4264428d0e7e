"""The engine interface of data preparation (largetrain_core.executors): engines found by name, the
contract every engine must meet (tests/helpers/executor_contract.py) on the handed cases, for every
engine that runs in this process, a contract breach caught, the local engine's worker processes, each
engine's metadata from its own record, and the Dagster resource's choice from the environment
(LARGETRAIN_EXECUTOR; its former name LARGETRAIN_ENGINE still works, with a logged deprecation;
LARGETRAIN_WORKERS), its settings nested under the engine's name."""

import logging
import subprocess
import sys

import polars as pl
import pytest

from helpers.executor_contract import QUALITY, check_executor, contract_corpus, in_process_engines
from helpers.parts import DiesOn, write_parts
from largetrain_core.clean import Cleaning
from largetrain_core.corpus import ingest
from largetrain_core.dedup import DedupConfig
from largetrain_core.executors import steps
from largetrain_core.executors.base import Executor, ExecutorError, known, load
from largetrain_core.executors.local import LocalExecutor, LocalSettings
from largetrain_core.executors.settings import ExecutorSettings
from largetrain_core.executors.threads import ThreadExecutor, ThreadSettings
from largetrain_core.parts import WithSignatures, map_parts
from largetrain_core.readers import ReaderConfig
from largetrain_core.shards import partition_parts, tokenize_partition, tokenize_parts
from largetrain_core.stages.base import executor_metadata
from largetrain_core.storage import part_files
from largetrain_dagster.executor import DataExecutor


@pytest.fixture
def corpus(cases, tmp_path):
    return contract_corpus(cases, tmp_path / "corpus")


def test_executors_are_found_by_name_and_implement_the_interface():
    assert {"local", "spark", "threads"} <= set(known())
    for name in known():
        cls = load(name)
        assert issubclass(cls, Executor) and cls.name == name and not cls.__abstractmethods__, name
        assert isinstance(getattr(ExecutorSettings(), name), cls.Settings), f"{name}: settings under its name"
    with pytest.raises(ValueError, match=f"executor must be one of {', '.join(known())}, got 'ray'"):
        load("ray")
    # the submitting process imports no pyspark: only the Spark application does
    code = "import sys; from largetrain_core.executors.base import load; load('spark'); print('pyspark' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )


@pytest.mark.parametrize("engine", in_process_engines(), ids=lambda e: f"{e.name}-{e.settings}")
def test_every_in_process_engine_meets_the_contract(engine, corpus, tmp_path, bpe_dir):
    check_executor(engine, corpus, tmp_path / "out", bpe_dir)
    # the corpus exercises every outcome: kept, filtered, duplicate (exact and near)
    filtered = [
        pl.read_parquet(tmp_path / "out" / "reference" / f"clean{p}" / "filtered.parquet").height for p in (0, 1)
    ]
    dups = pl.read_parquet(tmp_path / "out" / "reference" / "dd" / "duplicates.parquet")
    assert sum(filtered) > 0 and set(dups["kind"]) == {"exact", "near"}
    assert len(part_files(tmp_path / "out" / "reference" / "dd")) > 0


def test_local_workers_write_the_same_files_and_counts_as_one_process(corpus, tmp_path):
    """cleaned_text's step over several part files in 1 process and in 3 spawned workers: the same bytes in
    every part, signature and filtered file, and the same counts."""
    raw = tmp_path / "raw"
    raw.mkdir()
    ingest(ReaderConfig(str(corpus), batch_size=16), raw)
    parts = len(part_files(raw))
    assert parts > 3
    step = WithSignatures(Cleaning(QUALITY), DedupConfig())
    outs, stats = {}, {}
    for workers in (1, 3):
        outs[workers] = tmp_path / f"workers{workers}"
        outs[workers].mkdir()
        stats[workers] = LocalExecutor(LocalSettings(workers=workers)).run_global(
            steps.map_parts, outs[workers], step=step, in_dir=raw
        )
    assert executor_metadata(stats[3]) == {"executor": "local", "executor_workers": 3}
    assert stats[3].pop("executor") == {"executor": "local", "workers": 3}
    assert stats[1].pop("executor") == {"executor": "local", "workers": 1}
    assert stats[3] == stats[1] and stats[1]["filtered"] > 0 and stats[1]["kept"] > 0
    files = sorted(p.relative_to(outs[1]) for p in outs[1].rglob("*") if p.is_file())
    assert len(files) == 2 * parts + 2  # parts, their signatures, the signature settings, filtered.parquet
    assert files == sorted(p.relative_to(outs[3]) for p in outs[3].rglob("*") if p.is_file())
    for f in files:
        assert (outs[3] / f).read_bytes() == (outs[1] / f).read_bytes(), f
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="executor workers must be an integer >= 1"):
            LocalSettings(workers=bad)
    with pytest.raises(ValueError, match="executor threads must be an integer >= 1"):
        ThreadSettings(threads=0)


def test_a_dead_worker_is_an_executor_error_that_says_what_to_lower(tmp_path):
    parts = write_parts(tmp_path / "in", [[(f"d{p}{i}", "some text") for i in range(3)] for p in range(4)])
    (tmp_path / "out").mkdir()
    with pytest.raises(ExecutorError, match=r"test: dies on one part: a worker process .* died .*workers \(now 2"):
        LocalExecutor(LocalSettings(workers=2)).run_global(
            steps.map_parts, tmp_path / "out", step=DiesOn("d21"), in_dir=parts
        )


class _DropsLast(LocalExecutor):
    """An engine that loses the last document of every part: the contract check must catch it."""

    def run_global(self, fn, out_dir, **inputs):
        if fn is not steps.map_parts:
            return super().run_global(fn, out_dir, **inputs)
        step = inputs["step"]

        class Lossy:
            counts, description = step.counts, step.description

            def __call__(self, df: pl.DataFrame):
                kept, removed, counts = step(df)
                return kept.head(max(0, kept.height - 1)), removed, counts

        return {**map_parts(Lossy(), inputs["in_dir"], out_dir), **self.record()}


class _RunsReversed(LocalExecutor):
    """An engine that tokenizes each part file in a run of its own and lists the runs backwards."""

    def run_global(self, fn, out_dir, **inputs):
        if fn is not steps.tokenize:
            return super().run_global(fn, out_dir, **inputs)
        in_dir, tokenizer_path, packing = inputs["in_dir"], inputs["tokenizer_path"], inputs["packing"]
        partition, partitions = inputs["partition"], inputs["partitions"]
        first, mine = partition_parts(part_files(in_dir), partition, partitions)
        runs = [tokenize_parts([p], first + j, tokenizer_path, out_dir, packing) for j, p in enumerate(mine)]
        summary = tokenize_partition(in_dir, tokenizer_path, out_dir, partition, partitions, packing, runs=runs[::-1])
        return {**summary, **self.record()}


class _TasksOutOfOrder(ThreadExecutor):
    """An engine that returns its tasks' results in the order they finished, not the units'."""

    def map_tasks(self, fn, units, description=""):
        return sorted(super().map_tasks(fn, units, description), key=repr)


def test_a_breach_of_the_contract_is_caught(corpus, tmp_path, bpe_dir):
    with pytest.raises(AssertionError):
        check_executor(_TasksOutOfOrder(), corpus, tmp_path / "unordered", bpe_dir)
    with pytest.raises(AssertionError, match="clean[01]"):
        check_executor(_DropsLast(), corpus, tmp_path / "out", bpe_dir)
    with pytest.raises(AssertionError, match="token shards: train"):
        check_executor(_RunsReversed(), corpus, tmp_path / "reversed", bpe_dir)


def test_the_resource_reads_the_environment_and_the_old_name_with_a_warning(monkeypatch, caplog):
    for var in (
        "LARGETRAIN_EXECUTOR",
        "LARGETRAIN_ENGINE",
        "LARGETRAIN_SPARK_MASTER",
        "LARGETRAIN_SPARK_CONF",
        "LARGETRAIN_WORKERS",
    ):
        monkeypatch.delenv(var, raising=False)
    assert DataExecutor.from_env().to_core() == ExecutorSettings()
    monkeypatch.setenv("LARGETRAIN_WORKERS", "4")
    assert DataExecutor.from_env().to_core().local == LocalSettings(workers=4)
    monkeypatch.setenv("LARGETRAIN_WORKERS", "0")
    with pytest.raises(ValueError, match="LARGETRAIN_WORKERS must be an integer >= 1, got '0'"):
        DataExecutor.from_env()
    monkeypatch.delenv("LARGETRAIN_WORKERS")
    monkeypatch.setenv("LARGETRAIN_EXECUTOR", "spark")
    monkeypatch.setenv("LARGETRAIN_SPARK_CONF", '{"spark.executor.cores": 2}')
    with caplog.at_level(logging.WARNING):
        settings = DataExecutor.from_env().to_core()
    assert (settings.name, settings.spark.conf) == (
        "spark",
        {"spark.executor.cores": "2"},
    ) and "deprecated" not in caplog.text
    monkeypatch.delenv("LARGETRAIN_EXECUTOR")
    monkeypatch.setenv("LARGETRAIN_ENGINE", "spark")
    with caplog.at_level(logging.WARNING):
        assert DataExecutor.from_env().name == "spark"
    assert "LARGETRAIN_ENGINE is deprecated: set LARGETRAIN_EXECUTOR=spark instead" in caplog.text
    monkeypatch.setenv("LARGETRAIN_EXECUTOR", "local")
    with pytest.raises(ValueError, match="disagree"):
        DataExecutor.from_env()
    monkeypatch.delenv("LARGETRAIN_ENGINE")
    monkeypatch.setenv("LARGETRAIN_EXECUTOR", "dask")
    with pytest.raises(ValueError, match="LARGETRAIN_EXECUTOR: executor must be one of"):
        DataExecutor.from_env()


def test_each_engine_is_built_with_its_own_settings_and_gives_its_own_metadata():
    settings = ExecutorSettings(name="threads", threads=ThreadSettings(threads=3), local=LocalSettings(workers=2))
    engine = settings.executor()
    assert isinstance(engine, ThreadExecutor) and engine.settings == ThreadSettings(threads=3) and engine.slots == 3
    assert executor_metadata(engine.record()) == {"executor": "threads", "executor_threads": 3}
    spark = {"executor": {"executor": "spark", "spark_master": "local[2]", "spark_application_id": "local-1"}}
    md = executor_metadata(spark)
    assert (md["executor"], md["spark_master"], md["spark_application_id"], md["spark_version"]) == (
        "spark",
        "local[2]",
        "local-1",
        "",
    )
    assert md["spark"].value == spark["executor"]
    assert executor_metadata({}) == {"executor": "local"}
    with pytest.raises(TypeError, match="settings must be LocalSettings, got ThreadSettings"):
        LocalExecutor(ThreadSettings())


def test_raw_corpus_lists_the_corpus_once_for_its_fingerprint_and_its_read(corpus, tmp_path, monkeypatch):
    """The partition's listing (corpus.scan) is made once by the stage and carried into the engine's
    read; the documents are those of a read that lists the corpus itself."""
    import largetrain_core.corpus as corpus_module
    import largetrain_core.stages.raw_corpus as stage_module
    from largetrain_core.stages.base import StageRun
    from largetrain_core.stages.raw_corpus import raw_corpus

    listings = []
    real_scan = corpus_module.scan

    def counted(*args, **kwargs):
        listings.append(args)
        return real_scan(*args, **kwargs)

    monkeypatch.setattr(corpus_module, "scan", counted)
    monkeypatch.setattr(stage_module, "scan", counted)
    reader = ReaderConfig(str(corpus), partition=1, partitions=2)
    result = raw_corpus(
        reader, StageRun(tmp_path / "root", ("c", "raw_corpus"), partition="001", executor=LocalExecutor())
    )
    assert len(listings) == 1 and result.stats["documents"] > 0
    alone = tmp_path / "alone"
    alone.mkdir()
    assert ingest(reader, alone)["documents"] == result.stats["documents"] and len(listings) == 2
    read = lambda d: pl.concat([pl.read_parquet(p) for p in part_files(d)])  # noqa: E731
    assert read(result.path).equals(read(alone))
