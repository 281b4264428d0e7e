"""The local executor: the core's functions in this process (the default, and what ``make demo`` runs)."""

from __future__ import annotations

from pathlib import Path

from largetrain_core.corpus import ingest
from largetrain_core.dedup import DedupConfig, deduplicate
from largetrain_core.executors.base import Executor
from largetrain_core.parts import PartStep, map_parts
from largetrain_core.readers import ReaderConfig


class LocalExecutor(Executor):
    """Every stage in the calling process, one part file at a time (memory bounded by a part); a
    per-part stage (cleaned_text, filtered_text) over ``settings.workers`` part files at once, each in a
    worker process (largetrain_core.parts.map_parts)."""

    name = "local"

    def ingest(self, reader: ReaderConfig, out_dir: Path) -> dict:
        return {**ingest(reader, out_dir), **self.record()}

    def map_parts(self, step: PartStep, in_dir: Path, out_dir: Path) -> dict:
        return {**map_parts(step, in_dir, out_dir, self.settings.workers), **self.record(workers=self.settings.workers)}

    def deduplicate(self, in_dirs: list[Path], out_dir: Path, cfg: DedupConfig) -> dict:
        return {**deduplicate(in_dirs, out_dir, cfg), **self.record()}


EXECUTOR = LocalExecutor
