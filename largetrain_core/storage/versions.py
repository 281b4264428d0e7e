"""Data versions, and paths in handles and stats relative to the storage root."""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from pathlib import Path
from typing import Any


from largetrain_core import fs


def data_version(*parts: Any) -> str:
    """A 16-hex-digit version: sha256 over the canonical JSON of ``parts`` (config, input versions, code version)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


RELATIVE_PATHS = "relative_paths"


def _pointer_token(key: str | int) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def _split(location: str) -> tuple[str, str]:
    """(scheme prefix such as ``s3://`` or "" for a local path, the normalized path)."""
    if fs.is_url(location):
        scheme, rest = location.split("://", 1)
        return f"{scheme.lower()}://", posixpath.normpath(rest)
    return "", os.path.normpath(location)


def relative_to_root(obj: dict, root: str | Path) -> dict:
    """A copy of the JSON object ``obj`` in which every string that is an absolute path or URL equal to
    or under ``root`` (a local path or a URL) is relative to it (``"."`` for the root itself), with the
    JSON Pointers (RFC 6901) of those strings listed under ``obj["relative_paths"]``;
    :func:`resolve_under` reverses it under any root, local or URL. So a handle or stats file stays
    true when the root is copied or moved, also between local disk and an object store."""
    scheme, base = _split(str(root))
    found: list[str] = list(obj.get(RELATIVE_PATHS, []))  # paths made relative by an earlier call stay listed

    def walk(value, pointer: str):
        if isinstance(value, dict):
            return {k: walk(v, f"{pointer}/{_pointer_token(k)}") for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, f"{pointer}/{i}") for i, v in enumerate(value)]
        if isinstance(value, str) and (value.startswith("/") or fs.is_url(value)):
            vscheme, norm = _split(value)
            if vscheme == scheme and (norm == base or norm.startswith(base.rstrip("/") + "/")):
                found.append(pointer)
                return (posixpath if scheme else os.path).relpath(norm, base)
        return value

    out = walk({k: v for k, v in obj.items() if k != RELATIVE_PATHS}, "")
    if found:
        out[RELATIVE_PATHS] = found
    return out


def resolve_under(obj: dict, root: str | Path) -> dict:
    """``obj`` (written by :func:`relative_to_root`) with every path listed under ``relative_paths``
    joined to ``root`` (a local path or a URL), and that list removed. An object without the list is
    returned as it is. Raises ValueError when a listed pointer does not name a string in ``obj``."""
    pointers = obj.get(RELATIVE_PATHS)
    if not pointers:
        return obj
    scheme, base = _split(str(root))
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
            if scheme:
                node[key] = scheme + posixpath.normpath(posixpath.join(base, node[key]))
            else:
                node[key] = os.path.normpath(os.path.join(base, node[key]))
        except (KeyError, IndexError, ValueError, TypeError):
            raise ValueError(f"relative path {pointer!r} does not name a string") from None
    return out
