"""The executor interface of data preparation: where raw_corpus, cleaned_text, deduplicated_text,
filtered_text and token_shards' partitions compute (docs/ARCHITECTURE.md, "Adding an executor").
datatrove's ``executor/base.py`` is the model.

An executor runs the core's functions (largetrain_core.corpus.ingest, a
:class:`~largetrain_core.parts.PartStep` over part files, the MinHash signatures and the clustering of
largetrain_core.dedup, the tokenization of largetrain_core.shards) and must write the files the local
executor writes, in the same layout, with the same counts (token shards: the same sequences in the
same order): so the executor is in no data version. It may cut the work into tasks as it likes
(files, part files) and distribute what is global (the dedup clustering); it writes only inside the
``out_dir`` it is given (a temporary directory renamed into place by the caller when complete:
largetrain_core.artifacts).

Executors are found by name: ``largetrain_core.executors.<name>`` holds ``EXECUTOR``, the class
(:func:`load`). Each method returns the stage's counts plus :data:`RECORD`: what ran it
(``{"executor": name, ...}``), shown by :func:`largetrain_core.stages.base.executor_metadata`.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from largetrain_core.dedup import DedupConfig, VerifyConfig
    from largetrain_core.parts import PartStep
    from largetrain_core.readers import ReaderConfig
    from largetrain_core.shards import Packing

RECORD = "executor"  # the stats key of the executor record
LOG = logging.getLogger("largetrain_core.executors")
# (command, environment, log file) -> exit code: how an executor starts a process of its own
Launch = Callable[[list[str], dict, Path], int]


def _describe(text: str) -> dict:
    return {"description": text}


@dataclass(frozen=True)
class ExecutorSettings:
    """Where data preparation computes, for the whole deployment."""

    name: str = field(
        default="local",
        metadata=_describe(
            "local (in the step's process; per-part stages in `workers` processes) or spark (spark-submit through Dagster Pipes); any module "
            "largetrain_core.executors.<name> that defines EXECUTOR. LARGETRAIN_EXECUTOR."
        ),
    )
    master: str = field(
        default="local[*]",
        metadata=_describe(
            "The cluster: a Spark master URL (local[*], local-cluster[2,1,1024], spark://host:7077, "
            "k8s://https://host:443, yarn). LARGETRAIN_SPARK_MASTER."
        ),
    )
    conf: dict[str, str] = field(
        default_factory=dict,
        metadata=_describe(
            "More settings of the cluster's jobs (Spark: spark.executor.memory, ...). LARGETRAIN_SPARK_CONF (a JSON object)."
        ),
    )
    workers: int = field(
        default=1,
        metadata=_describe(
            "local: part files that cleaned_text and filtered_text work on at once, each in a worker process "
            "(memory: about this many parts); the outputs do not depend on it. LARGETRAIN_WORKERS."
        ),
    )
    spark_submit: str = field(
        default="",
        metadata=_describe("Path of spark-submit; empty = $SPARK_HOME/bin/spark-submit, else pyspark's own."),
    )
    kill_grace_seconds: float = field(
        default=10.0,
        metadata=_describe(
            "Seconds between SIGTERM and SIGKILL to a job's process group when the run is cancelled or fails."
        ),
    )

    def __post_init__(self):
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"executor workers must be an integer >= 1, got {self.workers!r}")


class ExecutorError(RuntimeError):
    """An executor's job failed (not the data): the message holds what its log says. Running again can succeed."""


class Executor(ABC):
    """Where the data-preparation stages compute: three abstract methods and two with an in-process
    default (find_contamination, tokenize), each returning counts + :data:`RECORD`.

    ``settings``: the deployment's (:class:`ExecutorSettings`); ``launch``: how to start a process
    of its own (default :func:`launch_in_group`; the Dagster resource passes one that runs it through
    Dagster Pipes); ``log``: where its lines go (``info``/``warning``)."""

    name: str = ""
    process_name: str = "the executor's process"  # how a log names a process it starts ("stopping <process_name>")

    def __init__(self, settings: ExecutorSettings | None = None, launch: Launch | None = None, log=None):
        self.settings = settings or ExecutorSettings(name=self.name)
        self.launch = launch or (
            lambda cmd, env, log_path: launch_in_group(cmd, env, log_path, self.settings.kill_grace_seconds)
        )
        self.log = log or LOG

    def record(self, **extra) -> dict:
        """What ran a stage, as recorded in its stats (:data:`RECORD`)."""
        return {RECORD: {"executor": self.name, **extra}}

    @abstractmethod
    def ingest(self, reader: "ReaderConfig", out_dir: Path) -> dict:
        """largetrain_core.corpus.ingest(reader, out_dir): the partition's documents in part files,
        rejected.parquet, renamed_ids.parquet, skipped_files.txt, and its counts."""

    @abstractmethod
    def map_parts(self, step: "PartStep", in_dir: Path, out_dir: Path) -> dict:
        """largetrain_core.parts.map_parts(step, in_dir, out_dir): ``step`` over every part file of
        ``in_dir`` (a per-document stage such as cleaned_text's rules), kept documents per part and
        the removed ones in filtered.parquet, and its counts."""

    @abstractmethod
    def deduplicate(
        self, in_dirs: list[Path], out_dir: Path, cfg: "DedupConfig", verify: "VerifyConfig | None"
    ) -> dict:
        """largetrain_core.dedup.deduplicate(in_dirs, out_dir, cfg, verify): the global step over every
        partition (kept part files, duplicates.parquet, unverified.parquet; signatures/ only when the
        partitions carry none) and its counts; ``verify`` None: the connected components unverified
        (the implementations default to dedup.VerifyConfig())."""

    def find_contamination(self, in_dirs: list[Path], index_dir: Path, out_file: Path) -> dict:
        """The global part of decontamination, the join of the documents' word n-grams with the
        evaluation sets' index (an evaluation_sets directory, largetrain_core.decontamination.load_index):
        ``out_file`` (Parquet, decontamination.MATCH_SCHEMA: one row per contaminated document of the
        part files of ``in_dirs``, corpus order, its first matching n-gram) and
        decontamination.contamination_counts. Here: decontamination.find_contamination in this process,
        one part file at a time against the index in memory; an executor may distribute the join."""
        from largetrain_core.decontamination import contamination_counts, find_contamination, load_index

        index = load_index(index_dir)
        table = find_contamination(in_dirs, index)
        table.write_parquet(out_file)
        return {**contamination_counts(table, index), **self.record()}

    def tokenize(
        self, in_dir: Path, tokenizer_path: Path, out_dir: Path, partition: int, partitions: int, packing: "Packing"
    ) -> dict:
        """One partition of token_shards (largetrain_core.shards.tokenize_partition): partition
        ``partition`` of ``partitions`` of the part files of ``in_dir`` tokenized and packed into
        ``out_dir`` (shard files, tails, ``tokenized.json``), and its summary. Here: in this process,
        one run over the partition's parts; an executor may cut them into runs of its own, one task
        each (the summary lists the runs, in part order)."""
        from largetrain_core.shards import tokenize_partition

        return {
            **tokenize_partition(in_dir, tokenizer_path, out_dir, partition, partitions, packing),
            **self.record(),
        }


def launch_in_group(cmd: list[str], env: dict, log_path: Path, grace_seconds: float = 10.0) -> int:
    """Run ``cmd`` in a process group of its own to its end (largetrain_core.processes.run_in_group)."""
    from largetrain_core.processes import run_in_group

    return run_in_group(cmd, env, Path(log_path), grace_seconds)


def known() -> list[str]:
    """The executor names: the modules and packages of largetrain_core.executors but base."""
    import largetrain_core.executors as package

    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.name != "base")


def load(name: str) -> type[Executor]:
    """The executor class named ``name`` (``EXECUTOR`` of largetrain_core.executors.<name>).
    Raises ValueError naming the known executors."""
    if name not in known():
        raise ValueError(f"executor must be one of {', '.join(known())}, got {name!r}")
    return importlib.import_module(f"largetrain_core.executors.{name}").EXECUTOR
