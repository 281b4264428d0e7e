"""Locations: a local path or a URL (``s3://``, ``gs://``, ``az://``, ``file://``, ``memory://``), one API.

Every location the project takes (a corpus ``path``, ``LARGETRAIN_ROOT``, ``pretrained_model``,
checkpoints, exports) may be a URL; this module is the only place that turns one into a filesystem.
It uses fsspec (s3fs, gcsfs, adlfs behind it): no HTTP of our own.

Credentials come only from each library's standard chain (environment, profile files, instance
roles); nothing here reads or stores a secret. The S3 endpoint of an S3-compatible store (MinIO,
Ceph, moto) is read from ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, as boto3 reads them.
:func:`redact` removes credentials that a user wrote into a URL (``s3://KEY:SECRET@bucket``) before a
location is logged or recorded.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

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
        s = s[len("file://"):]
    return Path(s).resolve()


def redact(location: str) -> str:
    """``location`` without the credentials a URL may carry (``s3://key:secret@bucket/x`` ->
    ``s3://***@bucket/x``): what may appear in a log line, metadata, a handle or a model card."""
    return _USERINFO.sub(r"\1***@", str(location))


def storage_options(protocol: str) -> dict:
    """Keyword arguments for the fsspec filesystem of ``protocol``: for ``s3``, the endpoint of an
    S3-compatible store from AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL (the variables boto3 reads).
    Never a credential."""
    if protocol in ("s3", "s3a"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return {"endpoint_url": endpoint} if endpoint else {}
    return {}


def filesystem(location: str | os.PathLike) -> tuple[fsspec.AbstractFileSystem, str]:
    """(the fsspec filesystem of ``location``, the path within it). A local path gives fsspec's
    LocalFileSystem and the absolute path. Raises StorageAccessError when no filesystem implements
    the URL's protocol (e.g. ``gs://`` without gcsfs installed)."""
    s = str(location)
    protocol = s.split("://", 1)[0].lower() if is_url(s) else "file"
    if not is_url(s):
        s = str(local_path(s))
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
