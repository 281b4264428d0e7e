"""The Spark executor (largetrain_core.executors.spark) against the local executor, on a real Spark cluster on this
machine: ``local-cluster[2,1,1024]``, a standalone master and two workers, each starting an executor JVM
of 1 core and 1 GiB, everything on 127.0.0.1. One cluster for the module (it takes ~11 s to start).

Input: a slice of the kernel docs (process/, scsi/, i2c/), exact and near copies of some of its files
under another directory (so that clusters span data partitions), and the handed edge cases of
tests/cases (BOM + CRLF, a lone surrogate, invalid UTF-8, NUL bytes, tiny and
empty documents, Unicode variants of one sentence, null ids, mixed Parquet schemas, upper-case
suffixes, a misnamed gzip, Unicode-space lines, a 300,000-letter run, lines the JSON parser cannot take, UTF-16
text), and two JSONL files far apart in
corpus order whose records repeat each other's ids (the reader renames the later ones), read as 2 hash
partitions.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from importlib.util import find_spec
from pathlib import Path

import polars as pl
import pytest

from helpers import CASES, REPO, TESTS
from largetrain_core.accounting import corpus_accounting, outcome_table
from largetrain_core.clean import Cleaning, QualityConfig, clean_corpus
from largetrain_core.corpus import ingest, partition_of
from largetrain_core.readers import ReaderConfig
from largetrain_core.dedup import DedupConfig, deduplicate
from largetrain_core.storage import part_files

# pyspark: the [spark] extra, installed by `make test`
from largetrain_core.executors.spark.dedup import deduplicate as spark_deduplicate
from largetrain_core.executors.spark.ingest import ingest as spark_ingest
from largetrain_core.executors.spark.map_parts import clean as spark_clean
from largetrain_core.executors.spark.progress import progress
from largetrain_core.executors.spark import class_archive
from largetrain_core.executors.spark.session import session
from largetrain_core.executors.spark.submit import local_jvm_conf

KERNEL = REPO / ".largetrain" / "corpora" / "linux-doc"
CASES_DIR = CASES
DATA = TESTS / "data"
CASES = [
    "bom_crlf.jsonl",
    "lone_surrogate.jsonl",
    "invalid_utf8.txt",
    "nul_bytes.txt",
    "tiny_docs.jsonl",
    "unicode_variants.jsonl",
    "null_ids.jsonl",
    "mixed_parquet",
    "upper_case_suffixes",
    "parquet_invalid_utf8.parquet",
    "genome_sequence.jsonl",
    "unicode_space_lines.txt",
    "misnamed_compressed",
    "deep_nesting.jsonl",
    "huge_integer.jsonl",
    "utf16_text",
]
QUALITY = QualityConfig(
    gopher_repetition=True, c4=True, languages=("en",)
)  # language_id and PII on: the same columns and counts
PARTITIONS = 2


@pytest.fixture(scope="module")
def spark():
    s = session("local-cluster[2,1,1024]", "largetrain-tests")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("spark-corpus") / "corpus"
    for d in ("process", "scsi", "i2c"):
        shutil.copytree(KERNEL / d, root / "kernel" / d)
    for c in CASES:
        (root / "cases").mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (CASES_DIR / c).is_dir() else shutil.copy)(CASES_DIR / c, root / "cases" / c)
    # the same record ids in two files of one partition, one early and one late in corpus order
    late = next(
        f"kernel/zz_ids_{i}.jsonl"
        for i in range(100)
        if partition_of(f"kernel/zz_ids_{i}.jsonl", PARTITIONS) == partition_of("cases/ids.jsonl", PARTITIONS)
    )
    for rel, texts in (("cases/ids.jsonl", ("first", "second")), (late, ("third", "fourth"))):
        (root / rel).write_text(
            "".join(
                json.dumps(
                    {
                        "id": f"r{k}",
                        "text": f"The {t} record of the mill and the river, "
                        "with enough words in it to pass the quality rules of the Gopher paper. " * 6,
                    }
                )
                + "\n"
                for k, t in enumerate(texts)
            )
        )
    german = [
        json.loads(line)["text"]
        for line in (DATA / "language_id.jsonl").open(encoding="utf-8")
        if '"language": "de", "kind": "paragraph"' in line
    ]
    (root / "cases" / "german.txt").write_text("\n\n".join(german * 3), encoding="utf-8")  # removed: reason language
    # a chain A ~ B ~ C of near copies whose ends are not (J(A, C) < 0.7): verification keeps C
    a = re.split(r"(\s+)", (KERNEL / "process" / "submitting-patches.rst.txt").read_text())  # words at even places
    b = [f"{w}b" if i % 50 == 0 and i < len(a) // 2 else w for i, w in enumerate(a)]
    c = [f"{w}c" if i % 50 == 0 and i >= len(b) // 2 else w for i, w in enumerate(b)]
    for name, words in (("a", a), ("b", b), ("c", c)):
        (root / "chain").mkdir(exist_ok=True)
        (root / "chain" / f"{name}.txt").write_text("".join(words))
    (root / "cases" / "gone.txt").symlink_to("nowhere.txt")  # a dangling link: one rejected record naming it
    originals = sorted((root / "kernel" / "process").glob("*.txt"))[:12]
    for i, f in enumerate(originals):
        text = f.read_text()
        if i % 2:  # exact copy under the dedup key: only the spacing differs
            (root / "copies" / "exact").mkdir(parents=True, exist_ok=True)
            (root / "copies" / "exact" / f.name).write_text(text.replace(". ", ".  "))
        else:  # near copy: a few words changed
            (root / "copies" / "near").mkdir(parents=True, exist_ok=True)
            (root / "copies" / "near" / f.name).write_text(re.sub(r"\bthe\b", "a", text, count=3))
    return root


def _chain_local(corpus: Path, out: Path) -> dict:
    res = {"raw": [], "clean": []}
    for p in range(PARTITIONS):
        raw, cleaned = out / f"raw{p}", out / f"clean{p}"
        raw.mkdir(parents=True)
        cleaned.mkdir()
        res["raw"].append(
            (raw, ingest(ReaderConfig(str(corpus), id_field="id", partition=p, partitions=PARTITIONS), raw))
        )
        res["clean"].append((cleaned, clean_corpus(raw, cleaned, QUALITY)))
    (out / "dd").mkdir()
    res["dd"] = (out / "dd", deduplicate([d for d, _ in res["clean"]], out / "dd", DedupConfig()))
    return res


def _chain_spark(spark, corpus: Path, out: Path) -> dict:
    res = {"raw": [], "clean": []}
    for p in range(PARTITIONS):
        raw, cleaned = out / f"raw{p}", out / f"clean{p}"
        raw.mkdir(parents=True)
        cleaned.mkdir()
        res["raw"].append(
            (
                raw,
                spark_ingest(spark, ReaderConfig(str(corpus), id_field="id", partition=p, partitions=PARTITIONS), raw),
            )
        )
        res["clean"].append((cleaned, spark_clean(spark, raw, cleaned, QUALITY)))
    (out / "dd").mkdir()
    res["dd"] = (out / "dd", spark_deduplicate(spark, [d for d, _ in res["clean"]], out / "dd", DedupConfig()))
    return res


def _docs(d: Path) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(p) for p in part_files(d)], how="vertical_relaxed")


@pytest.fixture(scope="module")
def local(corpus, tmp_path_factory) -> dict:
    return _chain_local(corpus, tmp_path_factory.mktemp("local"))


def test_spark_engine_equals_local_engine(spark, corpus, local, tmp_path):
    remote = _chain_spark(spark, corpus, tmp_path / "spark")
    for p in range(PARTITIONS):
        (lr, ls), (sr, ss) = local["raw"][p], remote["raw"][p]
        assert _docs(lr).equals(_docs(sr)), f"raw_corpus partition {p}: documents (ids, sources, texts, order)"
        for f in ("rejected.parquet", "renamed_ids.parquet"):
            assert pl.read_parquet(lr / f).equals(pl.read_parquet(sr / f)), f
        assert (lr / "skipped_files.txt").read_text() == (sr / "skipped_files.txt").read_text()
        assert {k: v for k, v in ls.items() if k != "parts"} == {k: v for k, v in ss.items() if k != "parts"}
        (lc, lcs), (sc, scs) = local["clean"][p], remote["clean"][p]
        assert _docs(lc).equals(_docs(sc)), f"cleaned_text partition {p}"
        assert pl.read_parquet(lc / "filtered.parquet").equals(pl.read_parquet(sc / "filtered.parquet"))
        assert lcs == scs
    cleaned = [s for _, s in local["clean"]]
    assert sum(s["filtered_by_reason"].get("language", 0) for s in cleaned) >= 1  # the German file
    assert sum(s["pii_email"] for s in cleaned) >= 10 and sum(s["pii_documents"] for s in cleaned) >= 5
    (ld, lds), (sd, sds) = local["dd"], remote["dd"]
    assert lds == sds
    assert lds["duplicate_exact"] >= 6 and lds["duplicate_near"] >= 1 and lds["clusters"] >= 7
    assert sum(s["renamed_ids"] for _, s in local["raw"]) == 2  # r0, r1 of the late file
    for res in (local, remote):  # the dangling link: the same record from both engines (compared above), named
        rejected = pl.concat([pl.read_parquet(d / "rejected.parquet") for d, _ in res["raw"]])
        assert rejected.filter(pl.col("source") == "cases/gone.txt").rows() == [
            (
                "cases/gone.txt",
                -1,
                "dangling symbolic link: its target nowhere.txt does not exist (or is a loop of links)",
            )
        ], rejected
    assert _docs(ld).equals(_docs(sd)), "deduplicated_text: kept documents"
    dups = pl.read_parquet(ld / "duplicates.parquet")
    assert dups.equals(pl.read_parquet(sd / "duplicates.parquet")), "duplicates: same copies, kept copy, cluster, kind"
    unverified = pl.read_parquet(ld / "unverified.parquet")
    assert unverified.equals(pl.read_parquet(sd / "unverified.parquet")), "candidates kept by verification"
    # a and b fall in partition 0, c in partition 1: a is kept, b removed as its copy, c kept (J(a, c) < 0.7)
    assert unverified["doc_id"].to_list() == ["chain/c.txt"] and lds["near_unverified_kept"] == 1
    assert dups.filter(pl.col("doc_id").str.starts_with("chain/"))["doc_id"].to_list() == ["chain/b.txt"]
    assert dups.filter(pl.col("kind") == "near")["similarity"].min() >= 0.7
    assert _docs(ld / "signatures").equals(_docs(sd / "signatures"))
    dirs = lambda res: ([d for d, _ in res["raw"]], [d for d, _ in res["clean"]], res["dd"][0])  # noqa: E731
    assert corpus_accounting(*dirs(local)) == corpus_accounting(*dirs(remote))
    assert corpus_accounting(*dirs(remote))["balanced"]
    assert outcome_table(*dirs(local)).equals(outcome_table(*dirs(remote)))
    for d in [*dirs(remote)[0], *dirs(remote)[1], dirs(remote)[2]]:  # nothing of the engine's machinery is left
        assert not [f for f in d.rglob("*") if f.name.startswith(("_", ".")) or "tmp" in f.name], d


def test_signatures_computed_with_cleaning_in_the_tasks_equal_the_local_executors(spark, local, tmp_path):
    """cleaned_text's step with its MinHash signatures (parts.WithSignatures): the Spark tasks write the
    local executor's signature files; deduplicated_text then reads them (no signatures/ of its own) and
    removes the same documents as the global signature pass."""
    from largetrain_core.dedup import SIGNATURES
    from largetrain_core.executors.spark.map_parts import map_parts as spark_map_parts
    from largetrain_core.parts import WithSignatures, map_parts

    step = WithSignatures(Cleaning(QUALITY), DedupConfig())
    cleaned = []
    for p in range(PARTITIONS):
        raw = local["raw"][p][0]
        lc, sc = tmp_path / f"local{p}", tmp_path / f"spark{p}"
        lc.mkdir(), sc.mkdir()
        assert map_parts(step, raw, lc) == spark_map_parts(spark, step, raw, sc)
        assert _docs(lc / SIGNATURES).equals(_docs(sc / SIGNATURES)) and _docs(lc).equals(_docs(sc))
        assert (lc / SIGNATURES / "settings.json").read_text() == (sc / SIGNATURES / "settings.json").read_text()
        cleaned.append(sc)
    (tmp_path / "dd").mkdir()
    got = spark_deduplicate(spark, cleaned, tmp_path / "dd", DedupConfig())
    ld, lds = local["dd"]
    assert got == lds and not (tmp_path / "dd" / SIGNATURES).exists()
    assert pl.read_parquet(tmp_path / "dd" / "duplicates.parquet").equals(pl.read_parquet(ld / "duplicates.parquet"))
    assert _docs(tmp_path / "dd").equals(_docs(ld))


def _executor_pids(app_id: str) -> list[int]:
    """The executor JVMs of one Spark application (CoarseGrainedExecutorBackend --app-id APP)."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmd and app_id.encode() in cmd:
                pids.append(int(p.name))
    return sorted(pids)


def test_executor_killed_mid_stage_retried_output_identical(spark, local, tmp_path):
    """SIGKILL one executor JVM while the cleaning stage runs on both: Spark reruns its tasks elsewhere;
    the output equals the local engine's and no attempt file is left."""
    raw, _ = local["raw"][0]
    many = tmp_path / "raw"  # the partition re-cut into parts of 8 documents: 8 tasks of several parts each
    many.mkdir()
    docs = _docs(raw)
    for i in range(0, docs.height, 8):
        docs.slice(i, 8).write_parquet(many / f"part-{i // 8:05d}.parquet")
    expect = tmp_path / "expect"
    expect.mkdir()
    clean_corpus(many, expect, QUALITY)

    sc = spark.sparkContext
    killed, lines = [], []
    tracker, stop = sc.statusTracker(), threading.Event()

    def kill_when_both_executors_busy():
        while not stop.wait(0.05):
            for sid in tracker.getActiveStageIds():
                info = tracker.getStageInfo(sid)
                if info and info.numActiveTasks >= 2 and 1 <= info.numCompletedTasks < info.numTasks - 2:
                    pid = _executor_pids(sc.applicationId)[0]
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return

    out = tmp_path / "out"
    out.mkdir()
    spark.conf.set("spark.largetrain.bytesPerTask", "1")  # as many tasks as allowed: 4 per core
    killer = threading.Thread(target=kill_when_both_executors_busy, daemon=True)
    killer.start()
    try:
        with progress(spark, lines.append, every=0.2) as steps:
            stats = spark_clean(spark, many, out, QUALITY, steps)
    finally:
        stop.set()
        spark.conf.unset("spark.largetrain.bytesPerTask")
    assert killed, "the stage ended before both executors were busy"
    assert any("failed (retried)" in line for line in lines), lines
    assert any(line.startswith("Spark stage ") and f"[{Cleaning.description}]: " in line for line in lines), lines
    assert stats["kept"] == pq_rows(expect)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in expect.iterdir())
    for p in part_files(expect) + [expect / "filtered.parquet"]:
        assert pl.read_parquet(out / p.name).equals(pl.read_parquet(p)), p.name
    for p in part_files(expect):  # the parts are written by the core's code: the same bytes
        assert (out / p.name).read_bytes() == p.read_bytes()


def pq_rows(d: Path) -> int:
    return sum(pl.read_parquet(p).height for p in part_files(d))


def test_progress_logs_every_stage_however_short(spark):
    """A stage that ends between two polls (here: the thread would first poll after a minute) is still
    logged with its step, its task counts and its end: the stages are found through the steps' job
    groups and the tracker is polled once more when the block ends."""
    lines: list[str] = []
    with progress(spark, lines.append, every=60) as steps:
        steps.describe("a short step")
        assert spark.range(100, numPartitions=3).selectExpr("id % 7 AS k").groupBy("k").count().count() == 7
    named = [line for line in lines if line.startswith("Spark stage ") and "[a short step]: " in line]
    assert any(line.endswith("tasks done, 0 running") and "3/3" in line for line in named), lines
    assert any(line.startswith("Spark stage ") and " finished (" in line for line in lines), lines


def test_tokenization_in_spark_tasks_gives_the_sequences_of_one_process(spark, local, bpe_dir, tmp_path):
    """token_shards' partitions on Spark (executors.spark.tokenize): each partition's part files cut
    into runs, one task each, over the two executor JVMs; assembled, the same train and validation
    sequences in the same order as one process, the same counts, and a second pass for the documents
    the train split holds twice (column ``copies``)."""
    from largetrain_core.balance import COPIES
    from largetrain_core.executors.spark.tokenize import tokenize as spark_tokenize
    from largetrain_core.shards import Packing, TokenShards, assemble_token_shards, partition_parts, tokenize_partition

    docs = _docs(local["dd"][0]).select("doc_id", "source", "text")
    docs = docs.with_columns(pl.Series(COPIES, [1 + (i % 3 == 0) for i in range(len(docs))]))
    text = tmp_path / "text"
    text.mkdir()
    bounds = [round(i * len(docs) / 8) for i in range(9)]  # 8 part files of near-equal, non-zero sizes
    for i in range(8):
        docs.slice(bounds[i], bounds[i + 1] - bounds[i]).write_parquet(text / f"part-{i:05d}.parquet")
    packing = Packing(seq_len=32, validation_fraction=0.1, seed=3, sequences_per_shard=64)

    def shards(tokenize_one) -> tuple[Path, list[dict]]:
        out = tmp_path / tokenize_one.__name__
        dirs, summaries = [], []
        for p in range(2):
            d = out / f"p{p}"
            d.mkdir(parents=True)
            summaries.append(tokenize_one(d, p))
            dirs.append(d)
        (out / "all").mkdir()
        assemble_token_shards(dirs, text, bpe_dir, out / "all", packing)
        return out / "all", summaries

    def rows(d: Path, split: str) -> list:
        s = TokenShards(d, split, verify_checksums=True)
        return s.take(range(len(s))).tolist()

    def in_spark(d: Path, p: int) -> dict:
        return spark_tokenize(spark, text, bpe_dir, d, p, 2, packing)

    def in_process(d: Path, p: int) -> dict:
        return tokenize_partition(text, bpe_dir, d, p, 2, packing)

    (remote, remote_runs), (one, one_runs) = shards(in_spark), shards(in_process)
    files = [len(partition_parts(sorted(text.glob("part-*.parquet")), p, 2)[1]) for p in range(2)]
    # 2 executor cores: two runs per core (4), or one per part file where a partition has fewer (plan_runs)
    assert [len(s["runs"]) for s in remote_runs] == [min(4, n) for n in files] and min(files) >= 2
    assert [len(s["runs"]) for s in one_runs] == [1, 1]
    assert sum(r["validation_documents"] for s in remote_runs for r in s["runs"]) > 0  # else assembly re-tokenizes
    for k in ("documents", "sequences", "tail_tokens", "parts"):
        assert [s[k] for s in remote_runs] == [s[k] for s in one_runs], k
    for split in ("train", "validation"):
        assert rows(remote, split) == rows(one, split), split
    m = json.loads((remote / "manifest.json").read_text())
    assert m["splits"]["train"]["repeat_copies"] >= 10 and m["splits"]["validation"]["sequences"] >= 5
    assert not [f for f in (tmp_path / "in_spark").rglob("_attempts")]


def test_local_applications_start_their_jvms_from_the_class_archive(tmp_path):
    """``make test`` built the class-data archive of Spark's classes; a local application's driver, started by
    spark-submit with :func:`local_jvm_conf`'s options and ``-Xshare:on`` (which refuses to start with an
    archive that does not fit this JVM or spark-submit's class path), loads Spark's classes from it."""
    archive = class_archive.path()
    assert archive.is_file()
    conf = local_jvm_conf()
    assert f"-XX:SharedArchiveFile={archive}" in conf["spark.driver.extraJavaOptions"]
    assert conf["spark.driver.extraJavaOptions"] == conf["spark.executor.extraJavaOptions"]
    script, log = tmp_path / "noop.py", tmp_path / "classes.log"
    script.write_text("print('the application ran')\n")
    options = f"{conf['spark.driver.extraJavaOptions']} -Xshare:on -Xlog:class+load=info:file={log}"
    submit = Path(find_spec("pyspark").origin).parent / "bin" / "spark-submit"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_DRIVER_PYTHON": sys.executable}
    cmd = [str(submit), "--master", "local[1]", "--conf", f"spark.driver.extraJavaOptions={options}", str(script)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "the application ran" in out.stdout, out.stderr[-3000:]
    loaded = [line for line in log.read_text().splitlines() if " org.apache.spark.deploy.SparkSubmit " in line]
    assert loaded and loaded[0].endswith("source: shared objects file (top)"), loaded


def test_the_spark_engine_meets_the_shared_contract(spark, cases, tmp_path, bpe_dir):
    """The contract every engine meets (tests/helpers/executor_contract.py, as the in-process engines in
    tests/unit/test_executors.py), on the engine inside a Spark application (driver.SparkDriver, what
    job.py runs after spark-submit) in this module's cluster: the primitives (tasks as Spark tasks, a
    step Spark has no implementation of run on the driver) and Spark's own implementations of the steps."""
    from pyspark import cloudpickle

    from helpers import executor_contract
    from largetrain_core.executors.spark.driver import SparkDriver

    # the contract's task functions travel by value: tests/ is not on the executors' path
    cloudpickle.register_pickle_by_value(executor_contract)
    try:
        executor_contract.check_executor(
            SparkDriver(spark), executor_contract.contract_corpus(cases, tmp_path / "corpus"), tmp_path / "out", bpe_dir
        )
    finally:
        cloudpickle.unregister_pickle_by_value(executor_contract)
