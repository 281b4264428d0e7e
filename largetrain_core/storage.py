"""Where artefacts live and how they are written.

Layout (docs/ARCHITECTURE.md, Lineage): ``<root>/<asset path>/<data_version>/``. Every artefact directory is
built under a temporary sibling (``.tmp-<name>-<pid>-<random>``) and renamed into place only when
complete, so a killed run never leaves a directory that a later run trusts; a reader only ever
looks at final names. A directory that already exists for the same data version is replaced (the
content is a pure function of the version, so this only matters after a code bug).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator


def data_version(*parts: Any) -> str:
    """A 16-hex-digit version: sha256 over the canonical JSON of ``parts`` (config, input versions, code version)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a fresh temporary directory that becomes ``final`` when the block exits without error.

    On error the temporary directory is removed and ``final`` is left as it was.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-{os.getpid()}-", dir=final.parent))
    try:
        yield tmp
        for p in tmp.rglob("*"):
            if p.is_file():
                with open(p, "rb+") as fh:
                    os.fsync(fh.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def as_dirs(dirs: str | Path | list) -> list[Path]:
    """One stage directory, or several (one per partition, in the order given), as a list of Paths."""
    return [Path(dirs)] if isinstance(dirs, (str, Path)) else [Path(d) for d in dirs]


def part_files(dirs: str | Path | list) -> list[Path]:
    """The ``part-*.parquet`` files of a stage directory (or of several, in the order given), sorted
    within each: the document order of a stage's output."""
    return [p for d in as_dirs(dirs) for p in sorted(d.glob("part-*.parquet"))]


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` via a temporary file and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=2, sort_keys=True, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
