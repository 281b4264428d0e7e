"""The errors of stored artifacts, and reading and writing a stored JSON file (a local path or a URL)."""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any, Iterator


from largetrain_core import fs


log = logging.getLogger("largetrain.storage")


class ArtifactError(ValueError):
    """A stored artifact that is damaged or not what its reader expects; the message names the file."""


class MissingArtifactError(ArtifactError, FileNotFoundError):
    """A stored artifact that is not there; the message names the path and what was expected."""


class DiskFullError(OSError):
    """A write refused for lack of space (errno ENOSPC); the message names the file, where it was going
    and the free space. A retry fails the same way until space is freed."""


@contextlib.contextmanager
def loading(path: str | Path, what: str) -> Iterator[None]:
    """Run a third-party loader of ``path`` so that any failure names the file and what it should be.

    ``with loading(p, "a Hugging Face tokenizer.json"): Tokenizer.from_file(str(p))``: a missing
    ``p`` (a local path or a URL) raises MissingArtifactError, any exception of the loader (a
    truncated JSON, a safetensors header cut short, ...) ArtifactError ``"<path>: not a valid <what>
    (<type>: <message>)"``, chained to the original. KeyboardInterrupt and other BaseExceptions pass
    through unchanged.
    """
    shown = fs.redact(str(path))
    if not fs.exists(path):
        raise MissingArtifactError(f"{shown}: missing; expected {what}")
    try:
        yield
    except ArtifactError:
        raise
    except Exception as e:
        raise ArtifactError(
            f"{shown}: not a valid {what} ({type(e).__name__}: {fs.redact(str(e))}); damaged or "
            "incomplete: re-materialize the asset that wrote it"
        ) from e


def read_json(path: str | Path, what: str) -> Any:
    """Parse the JSON file (or object, at a URL) ``path``; a missing, truncated or non-UTF-8 file raises
    (Missing)ArtifactError naming it and ``what`` it should hold."""
    with loading(path, what):
        return json.loads(fs.read_bytes(path))


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` (a local path: via a temporary file and ``os.replace``;
    a URL: one PUT) so that no reader sees part of it."""
    fs.write_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str).encode())
