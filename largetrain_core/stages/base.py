"""What every stage shares: where it writes and reports (:class:`StageRun`), what it gives back
(:class:`StageResult`, with :class:`Check` results), the error a user can act on (:class:`StageError`),
and the metadata value kinds an orchestrator shows (:class:`Markdown`, :class:`Text`, :class:`Json`,
paths as :class:`pathlib.Path`).
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from largetrain_core import artifacts, dataset_card, fs
from largetrain_core.artifacts import Built
from largetrain_core.executors.base import Executor, metadata as engine_metadata

LOG = logging.getLogger("largetrain_core.stages")


class StageError(ValueError):
    """A stage cannot do its work with these inputs and settings; the message says what is wrong
    (file, position, setting) and what to do. ``retryable``: whether running again could succeed
    (never for a bad input or setting); ``metadata``: what the orchestrator shows beside the message (a
    refused training plan's table)."""

    def __init__(self, message: str, retryable: bool = False, metadata: dict | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.metadata = metadata or {}


class Markdown(str):
    """A metadata value shown as markdown."""


class Text(str):
    """A metadata value shown as plain text (a warning, a reason)."""


class Url(str):
    """A metadata value shown as a link (a tracker's run page)."""


class Json:
    """A metadata value shown as JSON (a dict or list)."""

    def __init__(self, value: Any):
        self.value = value

    def __eq__(self, other) -> bool:
        return isinstance(other, Json) and other.value == self.value

    def __repr__(self) -> str:
        return f"Json({self.value!r})"


@dataclass
class Artifact:
    """A stage's output as the next stage gets it: the directory (local: for a version stored at a URL,
    its verified working copy, largetrain_core.storage.local_copy), its data version and its stats.
    A Dagster handle is ``{"path", "data_version", "stats"}`` (:meth:`of` reads one; its path is where
    the version is stored, a URL under an object-store root)."""

    path: Path
    data_version: str
    stats: dict

    @classmethod
    def of(cls, handle: "Artifact | dict") -> "Artifact":
        if isinstance(handle, Artifact):
            return handle
        from largetrain_core.storage import local_copy

        return cls(local_copy(handle["path"]), handle["data_version"], handle["stats"])

    @property
    def location(self) -> str:
        """Where the version is stored: its URL for a working copy, else the path."""
        from largetrain_core.storage import stored_location

        return stored_location(self.path)

    def handle(self) -> dict:
        return {"path": self.location, "data_version": self.data_version, "stats": self.stats}


@dataclass(frozen=True)
class Check:
    """One check of a stage's output: passed or not, the numbers that show why, and (failed) what is wrong."""

    passed: bool
    metadata: dict = field(default_factory=dict)
    description: str | None = None


@dataclass
class StageResult(Artifact):
    """What a stage gives back: its artifact (path, data version, stats), whether it was ``reused``,
    the ``warnings`` to log, the ``checks`` of its output by name, and ``metadata`` for people (numbers,
    :class:`Markdown`, :class:`Text`, :class:`Json`, paths) beside the numeric stats (shown too unless
    ``show_stats`` is False: the stage chose what to show in ``metadata``)."""

    reused: bool = False
    warnings: list[str] = field(default_factory=list)
    checks: dict[str, Check] = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)
    show_stats: bool = True

    @classmethod
    def built(cls, built: Built, data_version: str, **kw) -> "StageResult":
        return cls(built.path, data_version, built.stats, built.reused, **kw)

    def warn(self, message: str | None, key: str | None = None) -> None:
        """Add ``message`` (when not None) to the warnings, and as metadata ``key`` (Text) when given."""
        if message:
            self.warnings.append(message)
            if key:
                self.metadata[key] = Text(message)


@dataclass(frozen=True)
class StageRun:
    """Where one run of a stage writes and reports: the storage ``root``, the ``asset`` key and the
    ``partition`` key (None for a global step), the ``log`` (``info``/``warning``: a Dagster step's
    log, or a logging.Logger) and the ``executor`` of the data-preparation stages."""

    root: Path | str
    asset: tuple[str, ...]
    partition: str | None = None
    log: Any = LOG
    executor: Executor | None = None

    @property
    def key(self) -> tuple[str, ...]:
        """The artifact key: the asset key, then the partition key's parts."""
        return (*self.asset, *(self.partition.split("/") if self.partition is not None else ()))

    @property
    def name(self) -> str:
        """The asset key and partition in words (``domain/cleaned_text partition 000``)."""
        return "/".join(self.asset) + (f" partition {self.partition}" if self.partition is not None else "")

    def build_or_reuse(self, version: str, build: Callable[[Path], dict], documents: bool = False) -> Built:
        """largetrain_core.artifacts.build_or_reuse of ``<root>/<key>/<version>/``. ``documents``: the
        version holds a text asset's documents as ``part-*.parquet``; a dataset card (README.md:
        largetrain_core.dataset_card) says so to readers of the directory."""
        if documents:
            inner = build

            def build(out: Path) -> dict:
                stats = inner(out)
                dataset_card.write(out, self.name, dataset_card.TEXT_FILES, dataset_card.TEXT_DESCRIPTION)
                return stats

        return artifacts.build_or_reuse(artifacts.location(self.root, self.key, version), build, self.log)

    def cache_file(self, *parts: str) -> Path:
        """A file under ``<root>/_cache/`` (kept between runs, never part of an artifact); for an
        object-store root, in its local working copy (largetrain_core.storage.mirror_path)."""
        if fs.is_url(self.root):
            from largetrain_core.storage import mirror_path

            return mirror_path(fs.join(str(self.root), "_cache", *parts))
        return Path(self.root).resolve().joinpath("_cache", *parts)


def rounded(value: float, digits: int = 4) -> float:
    """``value`` to ``digits`` significant digits (9.04213 -> 9.042, 1234.56 -> 1235.0); NaN and inf as they are."""
    return float(f"{value:.{digits}g}") if math.isfinite(value) else value


def percent(part: float, whole: float) -> float:
    """``100 * part / whole`` to 4 significant digits; 0.0 when ``whole`` is 0."""
    return rounded(100.0 * part / whole) if whole else 0.0


def mib(n_bytes: int) -> float:
    """Bytes in MiB (2**20 bytes), to 4 significant digits."""
    return rounded(n_bytes / 2**20)


def count_table(counts: dict, header=("reason", "documents")) -> Markdown:
    """A two-column markdown table of ``counts`` (sorted by key), or "none"."""
    rows = "\n".join(f"| {k} | {v} |" for k, v in sorted(counts.items()))
    return Markdown(f"| {header[0]} | {header[1]} |\n|---|---|\n{rows}" if counts else "none")


def text_block(text: str) -> str:
    """``text`` as a fenced markdown block shown verbatim (the fence is longer than any backtick run in it)."""
    fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", text)), default=0))
    return f"{fence}text\n{text}\n{fence}"


def executor_metadata(stats: dict) -> dict:
    """Materialization metadata of the engine that built an artifact, from its stats' record (the
    engine's own :meth:`~largetrain_core.executors.base.Executor.metadata`; a dict shown as :class:`Json`)."""
    return {k: Json(v) if isinstance(v, dict) else v for k, v in engine_metadata(stats).items()}
