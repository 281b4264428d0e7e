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


RELATIVE_PATHS = "relative_paths"


def _pointer_token(key: str | int) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def relative_to_root(obj: dict, root: str | Path) -> dict:
    """A copy of the JSON object ``obj`` in which every string that is an absolute path equal to or
    under ``root`` is relative to it (``"."`` for the root itself), with the JSON Pointers (RFC 6901)
    of those strings listed under ``obj["relative_paths"]``; :func:`resolve_under` reverses it under
    any root. So a handle or stats file stays true when the root is copied or moved."""
    root = os.path.normpath(root)
    found: list[str] = list(obj.get(RELATIVE_PATHS, []))  # paths made relative by an earlier call stay listed

    def walk(value, pointer: str):
        if isinstance(value, dict):
            return {k: walk(v, f"{pointer}/{_pointer_token(k)}") for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, f"{pointer}/{i}") for i, v in enumerate(value)]
        if isinstance(value, str) and value.startswith("/"):
            norm = os.path.normpath(value)
            if norm == root or norm.startswith(root.rstrip("/") + "/"):
                found.append(pointer)
                return os.path.relpath(norm, root)
        return value

    out = walk({k: v for k, v in obj.items() if k != RELATIVE_PATHS}, "")
    if found:
        out[RELATIVE_PATHS] = found
    return out


def resolve_under(obj: dict, root: str | Path) -> dict:
    """``obj`` (written by :func:`relative_to_root`) with every path listed under ``relative_paths``
    joined to ``root``, and that list removed. An object without the list is returned as it is.
    Raises ValueError when a listed pointer does not name a string in ``obj``."""
    pointers = obj.get(RELATIVE_PATHS)
    if not pointers:
        return obj
    out = json.loads(json.dumps({k: v for k, v in obj.items() if k != RELATIVE_PATHS}))
    for pointer in pointers:
        *parents, last = [t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:]]
        node = out
        try:
            for token in parents:
                node = node[int(token)] if isinstance(node, list) else node[token]
            key = int(last) if isinstance(node, list) else last
            if not isinstance(node[key], str):
                raise TypeError
            node[key] = os.path.normpath(os.path.join(str(root), node[key]))
        except (KeyError, IndexError, ValueError, TypeError):
            raise ValueError(f"relative path {pointer!r} does not name a string") from None
    return out
