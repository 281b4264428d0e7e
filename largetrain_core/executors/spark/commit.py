"""The task commit protocol (the atomic-directory rule, largetrain_core.storage): ``out_dir`` is the
stage's temporary directory, committed by the caller when complete (storage.atomic_dir). Outputs are
pure functions of the inputs, so a retried or speculative attempt writes the same bytes.

* Local version (``spec["url"]`` None): a task writes into an attempt directory of its own under
  ``out_dir/_attempts`` and, when done, renames each file to its deterministic name (:func:`publish`);
  a killed attempt leaves only its attempt directory, which the driver removes (with ``_attempts``)
  after checking that every file the tasks reported exists with its row count (:func:`check_outputs`).
* Version at a URL (``spec["url"]``: atomic_dir.direct_url, the version's final prefix, its lock held
  by the submitting process): a task reads its inputs from the object store (:func:`task_input`),
  writes into a scratch directory on its own node (under its LARGETRAIN_CACHE) and puts each finished
  file under the final prefix with one PUT (an object is visible only once complete; no rename).
  The driver then fetches the reported files into ``out_dir`` (storage.fetch_uploaded, every one
  checked as above) and records them, so the commit does not upload them again; it writes the
  manifest and the commit marker last. No executor needs a path that the driver sees.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pyarrow.parquet as pq
from pyspark import TaskContext

from largetrain_core import fs
from largetrain_core.cache import cache_dir
from largetrain_core.storage import fetch_uploaded, stored_location

TASKS = "spark-tasks"  # the tasks' scratch directories, under each node's LARGETRAIN_CACHE


def _attempt_name(item: int) -> str:
    ctx = TaskContext.get()
    return (
        f"{ctx.stageId()}-{ctx.partitionId()}-{ctx.attemptNumber()}-{ctx.taskAttemptId()}" if ctx else "driver"
    ) + f"-{item}"


def attempt_dir(out_dir: str, item: int) -> Path:
    """A fresh directory for ``item`` in this task attempt under ``out_dir/_attempts`` (which must exist:
    a late attempt after the driver removed it fails instead of writing anywhere)."""
    d = Path(out_dir) / "_attempts" / _attempt_name(item)
    d.mkdir()
    return d


@contextlib.contextmanager
def attempt(spec: dict, item: int) -> Iterator[Path]:
    """The directory where this task attempt writes ``item``'s files before :func:`publish`: under
    ``out_dir/_attempts`` for a local version (:func:`attempt_dir`), else a scratch directory in this
    node's cache, removed when the block ends."""
    if not spec.get("url"):
        yield attempt_dir(spec["out"], item)
        return
    base = cache_dir() / TASKS
    base.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix=f"{_attempt_name(item)}-", dir=base))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def publish(spec: dict, src: Path, rel: str) -> None:
    """Make the complete file ``src`` the stage's file ``rel`` (the same bytes whichever attempt wins):
    a rename into ``out_dir`` (atomic), or one PUT under ``spec["url"]``."""
    if spec.get("url"):
        fsys, root = fs.filesystem(spec["url"])
        fsys.put_file(str(src), f"{root.rstrip('/')}/{rel}")
        return
    dst = Path(spec["out"]) / rel
    os.replace(src, dst)


def input_location(path: str | Path) -> str:
    """Where a task reads the driver's input ``path``: for a local working copy of a version at a URL
    (storage.stored_location) that URL, read from the object store; else the local path."""
    return stored_location(Path(path).resolve())


@contextlib.contextmanager
def task_input(location: str, tmp: Path) -> Iterator[Path]:
    """A local file holding the input at ``location`` (:func:`input_location`): the file itself, or the
    object downloaded whole into the attempt's directory ``tmp`` (the tasks read every byte of it),
    deleted when the block ends."""
    if not fs.is_url(location):
        yield Path(location)
        return
    fsys, path = fs.filesystem(location)
    local = Path(tempfile.mkdtemp(prefix="in-", dir=tmp)) / location.rsplit("/", 1)[-1]
    fsys.get_file(path, str(local))
    try:
        yield local
    finally:
        shutil.rmtree(local.parent, ignore_errors=True)


class Uploads:
    """What a stage's tasks put under the version's URL (``url``; None for a local version) and the
    driver fetched: ``objects`` for storage.record_uploaded (the job returns them to the submitting
    process)."""

    def __init__(self, url: str | None = None):
        self.url = url
        self.objects: dict[str, dict] = {}


def check_outputs(out_dir: Path, expected: dict[Path, int], uploads: Uploads | None = None) -> None:
    """Check every reported file (its Parquet row count, or existence for other files, count -1) and
    remove the attempt directories. For a version at a URL the files are first fetched from there
    into ``out_dir`` (and recorded in ``uploads``). Raises RuntimeError naming a missing or short file."""
    if uploads is not None and uploads.url:
        rels = [Path(f).relative_to(out_dir).as_posix() for f in expected]
        try:
            uploads.objects.update(fetch_uploaded(uploads.url, out_dir, rels))
        except FileNotFoundError as e:
            raise RuntimeError(f"Spark task output {e}") from None
    for f, rows in expected.items():
        if not f.exists():
            raise RuntimeError(f"Spark task output {f} is missing")
        if rows >= 0 and pq.ParquetFile(f).metadata.num_rows != rows:
            raise RuntimeError(f"Spark task output {f} has {pq.ParquetFile(f).metadata.num_rows} rows, expected {rows}")
    shutil.rmtree(out_dir / "_attempts", ignore_errors=True)
