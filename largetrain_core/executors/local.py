"""The local executor: the core's functions in this process (the default, and what ``make demo`` runs)."""

from __future__ import annotations

from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from largetrain_core.corpus import ingest
from largetrain_core.dedup import DedupConfig, VerifyConfig, deduplicate
from largetrain_core.executors.base import Executor, ExecutorError
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
        """Raises ExecutorError (retryable) when a worker process died, e.g. killed for memory."""
        workers = self.settings.workers
        try:
            return {**map_parts(step, in_dir, out_dir, workers), **self.record(workers=workers)}
        except BrokenProcessPool as e:
            raise ExecutorError(
                f"{step.description}: a worker process of the local executor died ({e}); if it ran out "
                f"of memory (each holds a part), lower the executor's workers (now {workers}, LARGETRAIN_WORKERS)"
            ) from e

    def deduplicate(
        self, in_dirs: list[Path], out_dir: Path, cfg: DedupConfig, verify: VerifyConfig | None = VerifyConfig()
    ) -> dict:
        return {**deduplicate(in_dirs, out_dir, cfg, verify), **self.record()}


EXECUTOR = LocalExecutor
