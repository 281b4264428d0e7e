"""Where artefacts live, how they are written, and how a stored artefact is checked before it is trusted.

Layout (docs/ARCHITECTURE.md): ``<root>/<asset path>/<data_version>/``. Every artefact directory is
built under a temporary sibling (``.tmp-<name>-<pid>-<random>``) and renamed into place only when
complete, so a killed run never leaves a directory that a later run trusts; a reader only ever
looks at final names. A directory that already exists for the same data version is replaced (the
content is a pure function of the version, so this only matters after a code bug or damage).

Manifests: the last file written into an artefact directory, before the rename, is ``_manifest.json``
(the leading underscore keeps Spark/Hadoop-style readers from taking it for data, as with
``_SUCCESS``): every file's size, modification time and xxh3-128 checksum. :func:`verify_manifest`
checks a directory against it before the directory is reused or read (see its docstring for what
is hashed and what that costs).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

import xxhash

from largetrain_core.digest import file_digest

MANIFEST = "_manifest.json"
MANIFEST_FORMAT = "largetrain.manifest/1"
# verify_manifest hashes a file whole up to this size; a larger one by SAMPLE_BLOCKS blocks of SAMPLE_BLOCK bytes.
FULL_CHECKSUM_MAX_BYTES = 8 << 20
SAMPLE_BLOCK = 64 << 10
SAMPLE_BLOCKS = 16


class ArtefactError(ValueError):
    """A stored artefact that is damaged or not what its reader expects; the message names the file."""


class MissingArtefactError(ArtefactError, FileNotFoundError):
    """A stored artefact that is not there; the message names the path and what was expected."""


@contextlib.contextmanager
def loading(path: str | Path, what: str) -> Iterator[None]:
    """Run a third-party loader of ``path`` so that any failure names the file and what it should be.

    ``with loading(p, "a Hugging Face tokenizer.json"): Tokenizer.from_file(str(p))``: a missing
    ``p`` raises MissingArtefactError, any exception of the loader (a truncated JSON, a safetensors
    header cut short, ...) ArtefactError ``"<path>: not a valid <what> (<type>: <message>)"``, chained
    to the original. KeyboardInterrupt and other BaseExceptions pass through unchanged.
    """
    path = Path(path)
    if not path.exists():
        raise MissingArtefactError(f"{path}: missing; expected {what}")
    try:
        yield
    except ArtefactError:
        raise
    except Exception as e:
        raise ArtefactError(f"{path}: not a valid {what} ({type(e).__name__}: {e}); damaged or incomplete: "
                            "re-materialize the asset that wrote it") from e


def read_json(path: str | Path, what: str) -> Any:
    """Parse the JSON file ``path``; a missing, truncated or non-UTF-8 file raises (Missing)ArtefactError
    naming it and ``what`` it should hold."""
    with loading(path, what):
        return json.loads(Path(path).read_bytes())


def data_version(*parts: Any) -> str:
    """A 16-hex-digit version: sha256 over the canonical JSON of ``parts`` (config, input versions, code version)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a fresh temporary directory that becomes ``final`` when the block exits without error.

    Before the rename, :func:`write_manifest` records every file of the directory in ``_manifest.json``
    and every file is fsynced. On error the temporary directory is removed and ``final`` is left as it was.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-{os.getpid()}-", dir=final.parent))
    try:
        yield tmp
        write_manifest(tmp)
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



def _xxh3_sample(path: Path, size: int) -> str:
    """xxh3-128 of SAMPLE_BLOCKS blocks of SAMPLE_BLOCK bytes at evenly spaced offsets, the first at 0 and
    the last ending at the end of the file (the file's size is hashed too)."""
    h = xxhash.xxh3_128(str(size).encode())
    last = max(0, size - SAMPLE_BLOCK)
    with open(path, "rb") as fh:
        for i in range(SAMPLE_BLOCKS):
            fh.seek(last * i // (SAMPLE_BLOCKS - 1))
            h.update(fh.read(SAMPLE_BLOCK))
    return h.hexdigest()


def _files(directory: Path, paths: Iterable[str] | None) -> list[Path]:
    """The regular files under ``directory`` (or under its entries ``paths``), without the manifest."""
    roots = [directory] if paths is None else [directory / p for p in paths]
    out = []
    for root in roots:
        if root.is_file():
            out.append(root)
        elif root.is_dir():
            out.extend(p for p in root.rglob("*") if p.is_file())
    return sorted(p for p in out if p != directory / MANIFEST)


def write_manifest(directory: str | Path, paths: Iterable[str] | None = None) -> dict:
    """Record every file under ``directory`` (or only under its entries ``paths``, relative names: for a
    directory some of whose files keep changing, such as a training's checkpoints and log) in
    ``directory/_manifest.json``: ``{"format", "paths", "files": {relative path: {"bytes", "mtime_ns",
    "xxh3_128", and for files over FULL_CHECKSUM_MAX_BYTES "sample_xxh3_128"}}}``. Hashing reads every
    byte once (xxh3 runs at memory speed; the files were just written, so mostly from the page cache).
    Returns the manifest."""
    directory = Path(directory)
    paths = None if paths is None else sorted(paths)
    files = {}
    for p in _files(directory, paths):
        st = p.stat()
        entry = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "xxh3_128": file_digest(p)}
        if st.st_size > FULL_CHECKSUM_MAX_BYTES:
            entry["sample_xxh3_128"] = _xxh3_sample(p, st.st_size)
        files[p.relative_to(directory).as_posix()] = entry
    manifest = {"format": MANIFEST_FORMAT, "paths": paths, "files": files}
    write_json_atomic(directory / MANIFEST, manifest)
    return manifest


def verify_manifest(directory: str | Path, full: bool = False) -> list[str]:
    """Check ``directory`` against its ``_manifest.json``; returns the problems found, each naming a file
    (an empty list: the directory is as it was written).

    Always: the manifest exists and parses, the files present are exactly those listed (within the
    manifest's ``paths``), and every file has its recorded size. Content: the full xxh3-128 of every
    file up to FULL_CHECKSUM_MAX_BYTES (8 MiB: JSON, configs, tokenizers, small parts), of every file whose
    modification time differs from the recorded one (rewritten or copied), and of every file when
    ``full``; a larger file with its recorded modification time is checked by SAMPLE_BLOCKS (16) blocks of
    64 KiB at evenly spaced offsets, so verifying reads at most 8 MiB + 1 MiB per file. What this
    misses: a same-size change to a large file, between the sampled blocks, by a writer that also
    restored the modification time (``full=True`` catches that too, at the cost of reading everything).
    """
    directory = Path(directory)
    mf = directory / MANIFEST
    if not mf.exists():
        return [f"{mf}: missing (the directory was not finished by this version of largetrain, or it was deleted)"]
    try:
        manifest = read_json(mf, "artefact manifest")
        listed, paths = manifest["files"], manifest["paths"]
    except (ArtefactError, KeyError, TypeError) as e:
        return [f"{mf}: unreadable ({e})"]
    problems = []
    present = {p.relative_to(directory).as_posix() for p in _files(directory, paths)}
    problems += [f"{directory / rel}: listed in {MANIFEST} but missing" for rel in sorted(set(listed) - present)]
    problems += [f"{directory / rel}: not in {MANIFEST} (added after the directory was written)"
                 for rel in sorted(present - set(listed))]
    for rel in sorted(set(listed) & present):
        entry, path = listed[rel], directory / rel
        st = path.stat()
        if st.st_size != entry["bytes"]:
            problems.append(f"{path}: {st.st_size} bytes, {MANIFEST} says {entry['bytes']} (truncated or rewritten)")
        elif full or st.st_size <= FULL_CHECKSUM_MAX_BYTES or st.st_mtime_ns != entry["mtime_ns"] or "sample_xxh3_128" not in entry:
            if file_digest(path) != entry["xxh3_128"]:
                problems.append(f"{path}: content differs from {MANIFEST} (xxh3-128 checksum)")
        elif _xxh3_sample(path, st.st_size) != entry["sample_xxh3_128"]:
            problems.append(f"{path}: content differs from {MANIFEST} (xxh3-128 of sampled blocks)")
    return problems


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
