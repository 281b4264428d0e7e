"""Where artifacts live, how a version is committed, and how a stored version is checked before it is trusted.

Layout (docs/ARCHITECTURE.md): ``<root>/<asset path>/<data_version>/``, where the root is a local
directory or an object-store URL (``s3://bucket/prefix``, any fsspec URL; largetrain_core.fs).

Commit. :class:`atomic_dir` builds a version in a local temporary directory and then commits it:

* on local disk by ``rename`` into place, so a killed run never leaves a directory at a final name;
* on an object store (no rename there) by uploading every file under the final prefix, then
  ``_manifest.json``, and last the commit marker ``_COMMITTED.json`` (the manifest's checksum and,
  from one listing after the upload, every object's size and ETag). A prefix without a marker that
  matches its manifest is uncommitted: it is never read, and the next writer removes what is there
  before it uploads. Writers of one prefix take turns through a lock object ``_LOCK.json`` created
  with a conditional PUT (``If-None-Match: *``), kept alive by a heartbeat while the upload runs and
  taken over when its holder's process is gone (same host) or its heartbeat stopped for
  :data:`LOCK_STALE_SECONDS`.

A committed version is immutable: the data version is a pure function of its inputs, so a second
writer of the same version (two runs of one partition, a sensor firing twice) discards its own
result and keeps the committed one; only a version that fails verification is replaced.

Manifests: ``_manifest.json`` (the leading underscore keeps Spark/Hadoop-style readers from taking it
for data, as with ``_SUCCESS``) records every file's size, modification time and xxh3-128 checksum.
:func:`verify_manifest` checks a version against it before it is reused or read, on local disk
(sizes, checksums; see its docstring for what is hashed) and on an object store (one listing: sizes,
and ETags against the marker's; an object whose ETag differs, e.g. edited after the commit or
copied from another store, is read and hashed).

Paths in handles and stats are stored relative to the root (:func:`relative_to_root`,
:func:`resolve_under`), so a root copied from local disk to a bucket, or back, reads its own files.
"""

from largetrain_core.storage.files import (
    ArtifactError,
    DiskFullError,
    MissingArtifactError,
    loading,
    log,
    read_json,
    write_json_atomic,
)
from largetrain_core.storage.local_store import (
    NO_SPACE_MARGIN,
    as_dirs,
    exception_chain,
    free_bytes,
    is_disk_full,
    newest_file,
    part_files,
)
from largetrain_core.storage.object_store import LOCK_STALE_SECONDS, fetch_uploaded, publish
from largetrain_core.storage.commit import atomic_dir, direct_url, record_uploaded
from largetrain_core.storage.working_copies import (
    committed_root,
    fetch_tree,
    local_copy,
    local_files,
    mirror_path,
    stored_location,
)
from largetrain_core.storage.manifest import (
    COMMIT,
    COMMIT_FORMAT,
    FULL_CHECKSUM_MAX_BYTES,
    LOCK,
    MANIFEST,
    MANIFEST_FORMAT,
    RESERVED,
    SAMPLE_BLOCK,
    SAMPLE_BLOCKS,
    sampled_digest,
    verify_manifest,
    write_manifest,
)
from largetrain_core.storage.versions import RELATIVE_PATHS, data_version, relative_to_root, resolve_under

__all__ = [
    "ArtifactError",
    "DiskFullError",
    "MissingArtifactError",
    "loading",
    "log",
    "read_json",
    "write_json_atomic",
    "NO_SPACE_MARGIN",
    "as_dirs",
    "exception_chain",
    "free_bytes",
    "is_disk_full",
    "newest_file",
    "part_files",
    "LOCK_STALE_SECONDS",
    "fetch_uploaded",
    "publish",
    "atomic_dir",
    "direct_url",
    "record_uploaded",
    "committed_root",
    "fetch_tree",
    "local_copy",
    "local_files",
    "mirror_path",
    "stored_location",
    "COMMIT",
    "COMMIT_FORMAT",
    "FULL_CHECKSUM_MAX_BYTES",
    "LOCK",
    "MANIFEST",
    "MANIFEST_FORMAT",
    "RESERVED",
    "SAMPLE_BLOCK",
    "SAMPLE_BLOCKS",
    "sampled_digest",
    "verify_manifest",
    "write_manifest",
    "RELATIVE_PATHS",
    "data_version",
    "relative_to_root",
    "resolve_under",
]
