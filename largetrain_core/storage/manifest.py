"""Manifests and commit markers (package doc, Manifests): written, and verified on local disk or an object store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import xxhash

from largetrain_core import fs
from largetrain_core.digest import BLOCK, file_digest
from largetrain_core.storage.files import write_json_atomic


MANIFEST = "_manifest.json"
MANIFEST_FORMAT = "largetrain.manifest/1"
COMMIT = "_COMMITTED.json"
COMMIT_FORMAT = "largetrain.commit/1"
LOCK = "_LOCK.json"
RESERVED = (MANIFEST, COMMIT, LOCK)  # a version's own bookkeeping, at its top level: never data
# verify_manifest hashes a file whole up to this size; a larger one by SAMPLE_BLOCKS blocks of SAMPLE_BLOCK bytes.
FULL_CHECKSUM_MAX_BYTES = 8 << 20
SAMPLE_BLOCK = 64 << 10
SAMPLE_BLOCKS = 16


def _same_version(manifest_bytes: bytes):
    """``keep`` for :func:`_commit_local` of a working copy: the copy there has this manifest and verifies."""

    def keep(final: Path) -> bool:
        mf = final / MANIFEST
        return mf.exists() and mf.read_bytes() == manifest_bytes and not verify_manifest(final)

    return keep


def _marker(manifest_bytes: bytes, objects: dict | None) -> bytes:
    return json.dumps(
        {"format": COMMIT_FORMAT, "manifest_xxh3_128": xxhash.xxh3_128_hexdigest(manifest_bytes), "objects": objects},
        indent=2,
        sort_keys=True,
    ).encode()


_stamp = fs.object_stamp


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


def sampled_digest(directory: str | Path, names: Iterable[str] | None = None) -> str:
    """xxh3-128 (32 hex digits) over every file under the local ``directory`` (or only its files ``names``
    that exist), in sorted order of relative path: the path, then the file's xxh3-128, or for a file over
    FULL_CHECKSUM_MAX_BYTES its sampled xxh3-128 (size and SAMPLE_BLOCKS blocks, as the manifests keep them).
    The identity of a directory's content that costs at most ~1 MiB of reads per large file (a model's
    weights), unchanged when the directory is copied elsewhere."""
    directory = Path(directory)
    files = [directory / n for n in names if (directory / n).is_file()] if names is not None else None
    files = sorted(files if files is not None else (p for p in directory.rglob("*") if p.is_file()))
    h = xxhash.xxh3_128()
    for p in files:
        size = p.stat().st_size
        digest = file_digest(p) if size <= FULL_CHECKSUM_MAX_BYTES else _xxh3_sample(p, size)
        h.update(p.relative_to(directory).as_posix().encode("utf-8", "surrogateescape") + b"\0" + digest.encode())
    return h.hexdigest()


def _within(rel: str, paths: Iterable[str] | None) -> bool:
    """Whether the relative path ``rel`` is a version's data file within the manifest's ``paths``."""
    if rel in RESERVED:
        return False
    return paths is None or any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in paths)


def _files(directory: Path, paths: Iterable[str] | None) -> list[Path]:
    """The regular files under ``directory`` (or under its entries ``paths``), without its bookkeeping
    (manifest, commit marker, lock)."""
    roots = [directory] if paths is None else [directory / p for p in paths]
    out = []
    for root in roots:
        if root.is_file():
            out.append(root)
        elif root.is_dir():
            out.extend(p for p in root.rglob("*") if p.is_file())
    return sorted(p for p in out if p.relative_to(directory).as_posix() not in RESERVED)


def write_manifest(directory: str | Path, paths: Iterable[str] | None = None) -> dict:
    """Record every file under the local ``directory`` (or only under its entries ``paths``, relative
    names: for a directory some of whose files keep changing, such as a training's checkpoints and
    log) in ``directory/_manifest.json``: ``{"format", "paths", "files": {relative path: {"bytes",
    "mtime_ns", "xxh3_128", and for files over FULL_CHECKSUM_MAX_BYTES "sample_xxh3_128"}}}``; then the
    commit marker ``_COMMITTED.json`` (the manifest's checksum), so that the directory, copied to an
    object store as it is, counts as committed there too. Hashing reads every byte once (xxh3 runs
    at memory speed; the files were just written, so mostly from the page cache). Returns the manifest."""
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
    fs.write_atomic(directory / COMMIT, _marker((directory / MANIFEST).read_bytes(), None))
    return manifest


def _read_manifest(manifest_bytes: bytes, shown: str) -> tuple[dict | None, list[str]]:
    try:
        manifest = json.loads(manifest_bytes)
        manifest["files"], manifest["paths"]  # noqa: B018 (both keys must be there)
        return manifest, []
    except (ValueError, KeyError, TypeError) as e:
        return None, [f"{shown}: unreadable ({type(e).__name__}: {e})"]


def _marker_problems(
    marker_bytes: bytes | None, manifest_bytes: bytes, shown: str, required: bool
) -> tuple[dict, list[str]]:
    """(the commit marker, problems): the marker must parse and carry the manifest's checksum."""
    if marker_bytes is None:
        if not required:
            return {}, []
        return {}, [
            f"{shown}: missing: the version was never committed (its writer stopped before the end, or is "
            "still uploading); it is not read, and the next run rebuilds it"
        ]
    try:
        marker = json.loads(marker_bytes)
        digest = marker["manifest_xxh3_128"]
    except (ValueError, KeyError, TypeError) as e:
        return {}, [f"{shown}: unreadable ({type(e).__name__}: {e})"]
    if digest != xxhash.xxh3_128_hexdigest(manifest_bytes):
        return {}, [
            f"{shown}: records another {MANIFEST} than the one there (the manifest was rewritten after the commit)"
        ]
    return marker, []


def verify_manifest(directory: str | Path, full: bool = False) -> list[str]:
    """Check a version (a local directory or a URL prefix) against its ``_manifest.json`` and commit
    marker; returns the problems found, each naming a file (an empty list: the version is committed
    and as it was written).

    Always: the manifest exists and parses, the files present are exactly those listed (within the
    manifest's ``paths``), and every file has its recorded size.

    On local disk the rename was the commit; a ``_COMMITTED.json`` there must name the manifest.
    Content: the full xxh3-128 of every file up to FULL_CHECKSUM_MAX_BYTES (8 MiB: JSON, configs,
    tokenizers, small parts), of every file whose modification time differs from the recorded one
    (rewritten or copied), and of every file when ``full``; a larger file with its recorded
    modification time is checked by SAMPLE_BLOCKS (16) blocks of 64 KiB at evenly spaced offsets,
    so verifying reads at most 8 MiB + 1 MiB per file. What this misses: a same-size change to a
    large file, between the sampled blocks, by a writer that also restored the modification time
    (``full=True`` catches that too, at the cost of reading everything).

    On an object store: the marker ``_COMMITTED.json`` must be there and name the manifest; one
    listing of the prefix gives every object's size and ETag; an object whose ETag is the one the
    marker recorded is unchanged since the commit (S3 gives a rewritten object a new ETag), any other
    (edited, or copied from another store) is read and its xxh3-128 compared; ``full`` reads all.
    """
    if fs.is_url(directory):
        return _verify_remote(str(directory), full)
    directory = fs.local_path(directory)
    mf = directory / MANIFEST
    if not mf.exists():
        return [f"{mf}: missing (the directory was not finished by this version of largetrain, or it was deleted)"]
    manifest_bytes = mf.read_bytes()
    manifest, problems = _read_manifest(manifest_bytes, str(mf))
    if problems:
        return problems
    marker_file = directory / COMMIT
    _, problems = _marker_problems(
        marker_file.read_bytes() if marker_file.exists() else None, manifest_bytes, str(marker_file), required=False
    )
    listed, paths = manifest["files"], manifest["paths"]
    present = {p.relative_to(directory).as_posix() for p in _files(directory, paths)}
    problems += [f"{directory / rel}: listed in {MANIFEST} but missing" for rel in sorted(set(listed) - present)]
    problems += [
        f"{directory / rel}: not in {MANIFEST} (added after the directory was written)"
        for rel in sorted(present - set(listed))
    ]
    for rel in sorted(set(listed) & present):
        entry, path = listed[rel], directory / rel
        st = path.stat()
        if st.st_size != entry["bytes"]:
            problems.append(f"{path}: {st.st_size} bytes, {MANIFEST} says {entry['bytes']} (truncated or rewritten)")
        elif (
            full
            or st.st_size <= FULL_CHECKSUM_MAX_BYTES
            or st.st_mtime_ns != entry["mtime_ns"]
            or "sample_xxh3_128" not in entry
        ):
            if file_digest(path) != entry["xxh3_128"]:
                problems.append(f"{path}: content differs from {MANIFEST} (xxh3-128 checksum)")
        elif _xxh3_sample(path, st.st_size) != entry["sample_xxh3_128"]:
            problems.append(f"{path}: content differs from {MANIFEST} (xxh3-128 of sampled blocks)")
    return problems


def _object_digest(fsys, path: str) -> str:
    """xxh3-128 of an object's bytes, streamed in BLOCK reads."""
    h = xxhash.xxh3_128()
    with fsys.open(path, "rb", block_size=BLOCK) as fh:
        while block := fh.read(BLOCK):
            h.update(block)
    return h.hexdigest()


def _verify_remote(url: str, full: bool = False) -> list[str]:
    """:func:`verify_manifest` of a version at a URL (see there)."""
    fsys, root = fs.filesystem(url)
    root, shown = root.rstrip("/"), fs.redact(url.rstrip("/"))

    def cat(name: str) -> bytes | None:
        try:
            return fsys.cat_file(f"{root}/{name}")
        except FileNotFoundError:
            return None

    marker_bytes, manifest_bytes = cat(COMMIT), cat(MANIFEST)
    if marker_bytes is None:
        _, problems = _marker_problems(None, b"", f"{shown}/{COMMIT}", required=True)
        return problems
    if manifest_bytes is None:
        return [f"{shown}/{MANIFEST}: missing although {COMMIT} is there (deleted after the commit)"]
    manifest, problems = _read_manifest(manifest_bytes, f"{shown}/{MANIFEST}")
    if problems:
        return problems
    marker, problems = _marker_problems(marker_bytes, manifest_bytes, f"{shown}/{COMMIT}", required=True)
    if problems:
        return problems
    recorded = marker.get("objects") or {}
    listed, paths = manifest["files"], manifest["paths"]
    listing = {p[len(root) + 1 :]: info for p, info in fsys.find(root, detail=True).items()}
    present = {rel for rel in listing if _within(rel, paths)}
    problems += [f"{shown}/{rel}: listed in {MANIFEST} but missing" for rel in sorted(set(listed) - present)]
    problems += [
        f"{shown}/{rel}: not in {MANIFEST} (added after the version was committed)"
        for rel in sorted(present - set(listed))
    ]
    for rel in sorted(set(listed) & present):
        entry, info = listed[rel], listing[rel]
        size = int(info["size"])
        if size != entry["bytes"]:
            problems.append(f"{shown}/{rel}: {size} bytes, {MANIFEST} says {entry['bytes']} (truncated or rewritten)")
            continue
        stamp = _stamp(info)
        if full or stamp is None or stamp != (recorded.get(rel) or {}).get("etag"):
            if _object_digest(fsys, f"{root}/{rel}") != entry["xxh3_128"]:
                problems.append(
                    f"{shown}/{rel}: content differs from {MANIFEST} (xxh3-128 checksum; edited after "
                    "the version was committed)"
                )
    return problems
