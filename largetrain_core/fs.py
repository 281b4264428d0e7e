"""Locations: a local path or a URL (``s3://``, ``gs://``, ``az://``, ``file://``, ``memory://``), one API.

Every location the project takes (a corpus ``path``, ``LARGETRAIN_ROOT``, ``pretrained_model``,
checkpoints, exports) may be a URL; this module is the only place that turns one into a filesystem.
It uses fsspec (s3fs, gcsfs, adlfs behind it): no HTTP of our own.

Credentials come only from each library's standard chain (environment, profile files, instance
roles); nothing here reads or stores a secret. The S3 endpoint of an S3-compatible store (MinIO,
Ceph, moto) is read from ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, as boto3 reads them; a GCS
emulator's from ``STORAGE_EMULATOR_HOST`` (gcsfs); an Azure account, or Azurite, from
``AZURE_STORAGE_CONNECTION_STRING`` or ``AZURE_STORAGE_ACCOUNT_NAME`` (adlfs).
A URL that carries credentials (``s3://KEY:SECRET@bucket``) is refused; :func:`redact` removes them
from any message that names such a URL.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
from pathlib import Path
from typing import BinaryIO

import fsspec
from fsspec.core import url_to_fs

LOCAL_PROTOCOLS = ("file", "local")
_USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@]*@")


class StorageAccessError(OSError):
    """A location that cannot be reached, a missing bucket or a denied permission; the message names
    the location (credentials redacted) and the operation."""


def is_url(location: str | os.PathLike) -> bool:
    """True for a URL of a remote or in-memory filesystem (``s3://``, ``memory://``, ...); False for a
    local path or a ``file://`` URL."""
    s = str(location)
    m = re.match(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://", s)
    return bool(m) and m.group(1).lower() not in LOCAL_PROTOCOLS


def local_path(location: str | os.PathLike) -> Path:
    """A local path or ``file://`` URL as an absolute Path. Raises ValueError for a remote URL."""
    s = str(location)
    if is_url(s):
        raise ValueError(f"{redact(s)} is not a local path")
    if s.lower().startswith("file://"):
        s = s[len("file://") :]
    return Path(s).resolve()


def redact(location: str) -> str:
    """``location`` without the credentials a URL may carry (``s3://key:secret@bucket/x`` ->
    ``s3://***@bucket/x``): what may appear in a log line, metadata, a handle or a model card."""
    return _USERINFO.sub(r"\1***@", str(location))


def storage_options(protocol: str) -> dict:
    """Keyword arguments for the fsspec filesystem of ``protocol``: for ``s3``, the endpoint of an
    S3-compatible store from AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL (the variables boto3 reads).
    Never a credential."""
    # Listings are not cached: another process (a second writer, a reader on another node) may have
    # changed a prefix since, and a stale listing would hide a commit marker or an edited object.
    options = {"use_listings_cache": False} if protocol in ("s3", "s3a", "gs", "gcs", "az", "abfs") else {}
    if protocol in ("s3", "s3a"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            options["endpoint_url"] = endpoint
    if protocol in ("gs", "gcs") and os.environ.get("STORAGE_EMULATOR_HOST"):
        # a GCS emulator (the variable Google's clients read; gcsfs sends its requests there) takes no
        # credentials: without this gcsfs would first ask the metadata server of a cloud VM for a token
        options["token"] = "anon"
    return options


def filesystem(location: str | os.PathLike) -> tuple[fsspec.AbstractFileSystem, str]:
    """(the fsspec filesystem of ``location``, the path within it). A local path gives fsspec's
    LocalFileSystem and the absolute path. Raises StorageAccessError when no filesystem implements
    the URL's protocol (e.g. ``gs://`` without gcsfs installed), and for a URL that carries
    credentials (``s3://key:secret@bucket``): those come only from the standard chains."""
    s = str(location)
    protocol = s.split("://", 1)[0].lower() if is_url(s) else "file"
    if not is_url(s):
        s = str(local_path(s))
    elif _USERINFO.match(s):
        raise StorageAccessError(
            f"{redact(s)}: credentials in a URL are not taken (they would end up in logs and "
            "metadata): give them through the standard chain (AWS_ACCESS_KEY_ID / "
            "AWS_SECRET_ACCESS_KEY, a profile, an instance role) and the URL without them"
        )
    try:
        fs, path = url_to_fs(s, **storage_options(protocol))
    except (ImportError, ValueError) as e:
        raise StorageAccessError(f"{redact(str(location))}: no filesystem for this location ({e})") from None
    return fs, path


def join(location: str | os.PathLike, *parts: str) -> str:
    """``location`` with ``parts`` appended by ``/`` (a local path stays a local path)."""
    s = str(location)
    if not is_url(s):
        return str(Path(s).joinpath(*parts))
    return "/".join([s.rstrip("/"), *(p.strip("/") for p in parts if p)])


def check_access(location: str | os.PathLike, operation: str, write: bool = False) -> None:
    """Fail before any work when ``location`` cannot be used: a missing bucket or directory, an
    unreachable endpoint, wrong credentials, or (``write=True``) no permission to write.

    ``operation`` names what the location is for ("read the corpus", "write the storage root"); the
    error names it and the redacted location. Writing is probed by putting and deleting one small
    object ``.largetrain-write-probe-<pid>`` under the location. Raises StorageAccessError."""
    shown = redact(str(location))
    try:
        fs, path = filesystem(location)
        if write:
            if not is_url(location):
                fs.makedirs(path, exist_ok=True)
            probe = f"{path.rstrip('/')}/.largetrain-write-probe-{os.getpid()}"
            fs.pipe_file(probe, b"")
            fs.rm_file(probe)
        elif not fs.exists(path):
            raise FileNotFoundError("no such file, directory, bucket or prefix")
    except StorageAccessError:
        raise
    except Exception as e:  # botocore, aiohttp and OSError subclasses differ by backend: all are reported alike
        raise StorageAccessError(f"cannot {operation} at {shown}: {type(e).__name__}: {redact(str(e))}") from None


def protocol(location: str | os.PathLike) -> str:
    """The URL scheme of ``location`` in lower case (``s3``, ``memory``, ...); ``file`` for a local path."""
    s = str(location)
    return s.split("://", 1)[0].lower() if is_url(s) else "file"


def read_bytes(location: str | os.PathLike) -> bytes:
    """The bytes of a local file or of an object at a URL. Raises FileNotFoundError when it is absent."""
    if not is_url(location):
        return local_path(location).read_bytes()
    fsys, path = filesystem(location)
    return fsys.cat_file(path)


READ_BUFFER = 1 << 20  # bytes per read of a buffered stream over an object (line iteration stays in C)
# Bytes per range request when reading an object (fsspec's read-ahead block): large enough that a sequential
# read costs one request per 4 MiB, small enough that reading a Parquet footer or one row group of a large
# file does not fetch the whole object (s3fs's default is 50 MiB). Our choice, no standard's.
RANGE_BYTES = 4 << 20


def open_input(location: str | os.PathLike) -> BinaryIO:
    """A seekable binary stream to read: the local file, or for a URL an fsspec file that fetches the
    byte ranges it is asked for (range requests of RANGE_BYTES with read-ahead, never the whole
    object at once), behind an ``io.BufferedReader`` of READ_BUFFER bytes (so that reading lines is fast)."""
    if not is_url(location):
        return open(local_path(location), "rb")
    fsys, path = filesystem(location)
    return io.BufferedReader(fsys.open(path, "rb", block_size=RANGE_BYTES), buffer_size=READ_BUFFER)


def read_head(location: str | os.PathLike, n: int) -> bytes:
    """The first ``n`` bytes (fewer for a shorter file) of a local file or an object: at most one small
    range request."""
    if not is_url(location):
        with open(local_path(location), "rb") as f:
            return f.read(n)
    fsys, path = filesystem(location)
    with fsys.open(path, "rb", block_size=n) as f:  # an empty object: no range request (S3 refuses one)
        return f.read(n)


def size(location: str | os.PathLike) -> int:
    """The size in bytes of a local file or of an object at a URL."""
    if not is_url(location):
        return local_path(location).stat().st_size
    fsys, path = filesystem(location)
    return int(fsys.info(path)["size"])


def object_stamp(info: dict) -> str | None:
    """What changes whenever an object is rewritten, from its listing entry (``fs.info``/``find``): the
    ETag (S3, Azure, GCS), else the generation (GCS) or the MD5; None where the store gives none."""
    for key in ("ETag", "etag", "generation", "md5Hash"):
        if info.get(key) not in (None, ""):
            return str(info[key])
    return None


def write_atomic(location: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``location`` so that no reader ever sees part of it: a local file via a
    temporary sibling, fsync and ``os.replace``; an object with one PUT (an object store makes an
    object visible only when its upload is complete)."""
    if is_url(location):
        fsys, path = filesystem(location)
        fsys.pipe_file(path, data)
        return
    path = local_path(location)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def exists(location: str | os.PathLike) -> bool:
    """Whether a file, directory or prefix exists at ``location``."""
    if not is_url(location):
        return local_path(location).exists()
    fsys, path = filesystem(location)
    return fsys.exists(path)
