"""Local working copies of stored versions: where a URL's copy lies in the cache, a committed version fetched and verified, or some of its files."""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import tempfile
from pathlib import Path
from typing import Iterable


from largetrain_core import fs
from largetrain_core.cache import cache_dir
from largetrain_core.digest import file_digest
from largetrain_core.storage.files import ArtifactError, MissingArtifactError
from largetrain_core.storage.local_store import _commit_local
from largetrain_core.storage.manifest import COMMIT, MANIFEST, _marker, _same_version, _verify_remote


def mirror_path(location: str) -> Path:
    """Where the local working copy of an object-store location lies: ``<cache>/mirror/<scheme>/<path>``
    (largetrain_core.cache), e.g. ``s3://bucket/root/x`` -> ``<cache>/mirror/s3/bucket/root/x``.
    Inverse: :func:`stored_location`."""
    scheme, rest = str(location).split("://", 1)
    rest = posixpath.normpath("/" + rest.split("@", 1)[-1] if "@" in rest.split("/", 1)[0] else "/" + rest)
    return cache_dir() / "mirror" / scheme.lower() / rest.lstrip("/")


def stored_location(path: str | Path) -> str:
    """Where the local path ``path`` is stored: for a working copy (:func:`mirror_path`) its URL, else
    the path itself (a string)."""
    p = Path(path)
    mirror = cache_dir() / "mirror"
    try:
        rel = p.resolve().relative_to(mirror)
    except ValueError:
        return str(path)
    scheme, *parts = rel.parts
    return f"{scheme}://{'/'.join(parts)}"


def committed_root(location: str) -> tuple[str, str]:
    """(the committed version holding ``location``, the path inside it): ``location`` itself when it has
    a commit marker, else its nearest ancestor that has one. Raises MissingArtifactError when none of
    them is committed."""
    url = str(location).rstrip("/")
    fsys, path = fs.filesystem(url)
    inside: list[str] = []
    while "/" in path.strip("/"):
        if fsys.exists(f"{path}/{COMMIT}"):
            return url, "/".join(reversed(inside))
        path, name = path.rsplit("/", 1)
        url = url.rsplit("/", 1)[0]
        inside.append(name)
    raise MissingArtifactError(
        f"{fs.redact(str(location))}: no committed version holds it (no {COMMIT} there or "
        "above): re-materialize the asset that wrote it"
    )


def _open_committed(location: str) -> tuple[str, str, object, str, bytes]:
    """(version URL, the path inside it, its filesystem, its root path, its manifest's bytes) of the
    committed version holding the URL ``location``. Raises ArtifactError naming the problems when the
    version does not verify, MissingArtifactError when no committed version holds it."""
    version, inside = committed_root(str(location))
    problems = _verify_remote(version)
    if problems:
        raise ArtifactError(f"{fs.redact(version)} cannot be read: " + "; ".join(problems))
    fsys, root = fs.filesystem(version)
    root = root.rstrip("/")
    return version, inside, fsys, root, fsys.cat_file(f"{root}/{MANIFEST}")


def local_copy(location: str | Path) -> Path:
    """A local path holding ``location``: the path itself on local disk; for a URL inside a committed
    version, the version's working copy (:func:`mirror_path`), downloaded when missing or when it does
    not match the version's manifest, every file checked against its xxh3-128 before it is used.

    Raises ArtifactError naming the problems when the version does not verify, MissingArtifactError
    when no committed version holds ``location``."""
    if not fs.is_url(location):
        return fs.local_path(location)
    version, inside, fsys, root, manifest_bytes = _open_committed(location)
    local = mirror_path(version)
    current = _same_version(manifest_bytes)
    if not (local.exists() and current(local)):
        manifest = json.loads(manifest_bytes)
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{local.name}-{os.getpid()}-", dir=local.parent))
        try:
            rels = sorted(manifest["files"])
            for rel in rels:
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            if rels:
                fsys.get([f"{root}/{r}" for r in rels], [str(tmp / r) for r in rels])
            for rel in rels:
                entry = manifest["files"][rel]
                if file_digest(tmp / rel) != entry["xxh3_128"]:
                    raise ArtifactError(
                        f"{fs.redact(version)}/{rel}: content differs from {MANIFEST} (xxh3-128 "
                        "checksum) while it was downloaded: re-materialize the asset that wrote it"
                    )
                os.utime(tmp / rel, ns=(entry["mtime_ns"], entry["mtime_ns"]))
            (tmp / MANIFEST).write_bytes(manifest_bytes)
            (tmp / COMMIT).write_bytes(_marker(manifest_bytes, None))
            _commit_local(tmp, local, current)  # a stale copy (of what was here before) is replaced
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return local / inside if inside else local


def local_files(location: str | Path, names: Iterable[str]) -> Path:
    """A local directory holding the files ``names`` (relative to ``location``) of a committed version:
    ``location`` itself on local disk; for a URL a directory in the local cache
    (``<cache>/files/<scheme>/<path>``) into which only those files are downloaded, each checked
    against the version's manifest. For what needs a few small files of a large version (the
    tokenizer beside the token shards, a model's config.json). Names the version does not hold are
    left out (as a local directory would lack them). Raises like :func:`local_copy`."""
    if not fs.is_url(location):
        return fs.local_path(location)
    version, inside, fsys, root, manifest_bytes = _open_committed(location)
    manifest = json.loads(manifest_bytes)
    out = cache_dir() / "files" / mirror_path(str(location)).relative_to(cache_dir() / "mirror")
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        rel = f"{inside}/{name}" if inside else name
        entry = manifest["files"].get(rel)
        target = out / name
        if entry is None or (target.exists() and file_digest(target) == entry["xxh3_128"]):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        fsys.get_file(f"{root}/{rel}", str(tmp))
        if file_digest(tmp) != entry["xxh3_128"]:
            tmp.unlink()
            raise ArtifactError(
                f"{fs.redact(version)}/{rel}: content differs from {MANIFEST} (xxh3-128 checksum) while it "
                "was downloaded: re-materialize the asset that wrote it"
            )
        os.replace(tmp, target)
    return out


def fetch_tree(location: str | Path) -> Path:
    """A local directory holding the files at ``location`` (a local path: itself). At a URL inside a
    committed version: :func:`local_copy`. Any other URL prefix (a model directory someone uploaded):
    downloaded into ``<cache>/downloads/<scheme>/<path>/``, and downloaded again only when one listing
    shows another file set, size or ETag than the copy was made from (recorded in the copy's
    ``.largetrain-listing.json``). For inputs such as ``pretrained_model``. Raises
    MissingArtifactError when nothing is there."""
    if not fs.is_url(location):
        return fs.local_path(location)
    try:
        return local_copy(location)
    except MissingArtifactError:
        pass
    fsys, root = fs.filesystem(str(location))
    root = root.rstrip("/")
    listing = {
        p[len(root) + 1 :]: [int(i["size"]), fs.object_stamp(i)]
        for p, i in fsys.find(root, detail=True).items()
        if not p.endswith("/")
    }
    if not listing:
        raise MissingArtifactError(f"{fs.redact(str(location))}: nothing there (no object under this prefix)")
    out = cache_dir() / "downloads" / mirror_path(str(location)).relative_to(cache_dir() / "mirror")
    stamp = out / ".largetrain-listing.json"
    if (
        stamp.exists()
        and json.loads(stamp.read_text()) == listing
        and all((out / r).is_file() and (out / r).stat().st_size == s for r, (s, _) in listing.items())
    ):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-{os.getpid()}-", dir=out.parent))
    try:
        rels = sorted(listing)
        for r in rels:
            (tmp / r).parent.mkdir(parents=True, exist_ok=True)
        fsys.get([f"{root}/{r}" for r in rels], [str(tmp / r) for r in rels])
        (tmp / stamp.name).write_text(json.dumps(listing))
        _commit_local(
            tmp, out, keep=lambda d: (d / stamp.name).exists() and json.loads((d / stamp.name).read_text()) == listing
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
