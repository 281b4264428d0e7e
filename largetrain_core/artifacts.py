"""Artifacts: the directory a stage writes, ``<root>/<asset key>/[<partition>/]<data version>/``, built
once and reused while it is intact (docs/ARCHITECTURE.md, Lineage).

The data version hashes the stage's code version (:data:`CODE_VERSIONS`), its settings and its
inputs' data versions (largetrain_core.storage.data_version), so a directory for the same version
holds the same content and can be reused instead of rebuilt. Every stage, the trainings included,
goes through :func:`build_or_reuse`.
"""

from __future__ import annotations

import errno
import logging
import time
from pathlib import Path
from typing import Callable, NamedTuple

from largetrain_core import fs
from largetrain_core.storage import (
    DiskFullError,
    atomic_dir,
    exception_chain,
    free_bytes,
    is_disk_full,
    newest_file,
    local_copy,
    read_json,
    relative_to_root,
    resolve_under,
    verify_manifest,
    write_json_atomic,
)

# Bump a stage's code version when its code changes what it writes: its data version changes, so its
# artifact is rebuilt, and Dagster marks the asset stale.
CODE_VERSIONS = {
    "raw_corpus": "7",
    "cleaned_text": "9",
    "deduplicated_text": "10",
    "tokenizer": "3",
    "token_shards": "4",
    "base_checkpoint": "3",
    "lora_adapter": "3",
    "evaluation": "4",
    "optimization_report": "1",
    "evaluation_sets": "2",
    "relevance_classifier": "2",
    "filtered_text": "2",
}

STATS = "stats.json"
LOG = logging.getLogger(__name__)


class Built(NamedTuple):
    """What :func:`build_or_reuse` gives: the artifact directory (a local directory holding the version:
    itself on local disk, its working copy for an object-store root), its stats (paths in them where
    the version is stored), and whether it was reused. ``storage.stored_location(path)`` is where the
    version is stored."""

    path: Path
    stats: dict
    reused: bool


def location(root: str | Path, key: list[str] | tuple[str, ...], version: str) -> str | Path:
    """Where the artifact of ``key`` (asset key parts, then partition key parts) at ``version`` lies
    under the storage ``root``: ``<root>/<key...>/<version>``; an absolute Path for a local root, a URL
    (string) for an object-store root."""
    if fs.is_url(root):
        return fs.join(str(root), *key, version)
    return Path(root).resolve().joinpath(*key, version)


def build_or_reuse(final: str | Path, build: Callable[[Path], dict], log: logging.Logger | None = None) -> Built:
    """Build the artifact directory ``final`` atomically with ``build(tmp_dir) -> stats``, or reuse it
    if it is complete and intact.

    An existing directory is reused only when it matches its ``_manifest.json``
    (largetrain_core.storage.verify_manifest: file list and sizes, full checksums of files up to 8 MiB,
    sampled checksums of larger ones); otherwise it is rebuilt, with a warning naming the damaged
    files and ``rebuilt_because`` (the problems, "; "-joined) in the returned stats. ``build`` writes
    into a fresh temporary directory renamed to ``final`` when it returns (storage.atomic_dir); what
    it raises propagates and leaves ``final`` as it was. The stats, plus ``seconds`` (the build's wall
    time), are written to ``stats.json`` with paths inside the directory stored relative to it
    (storage.relative_to_root), so a copied or moved directory reads its own files. A version that
    another run commits while this one builds it is kept and this run's result discarded
    (storage.atomic_dir: a committed version is immutable); it counts as reused.
    ``log``: where the reuse and rebuild lines go (``info``/``warning``; a Dagster context's log).
    """
    log = log or LOG
    final = final if fs.is_url(final) else Path(final)
    shown = fs.redact(str(final))
    rebuilt_because = None
    if fs.exists(final):
        intact, rebuilt_because = verified(final, log)
        if intact:
            return _committed(final)
    t0 = time.perf_counter()
    commit = atomic_dir(final)
    with commit as tmp:
        try:
            stats = build(tmp)
        except Exception as e:
            full = disk_full_error(e, tmp, shown)
            if full is None:
                raise
            raise full from e
        stats["seconds"] = round(time.perf_counter() - t0, 3)
        write_json_atomic(tmp / STATS, relative_to_root(relative_to_root(stats, tmp), final))
    if not commit.committed:  # a committed version is immutable: another run's, of the same data version, stays
        log.info(
            f"{shown} was committed by another run while this one built it: reusing that one, this run's "
            "identical result discarded"
        )
        return _committed(final)
    stats = resolve_under(relative_to_root(stats, commit.tmp), final)  # paths into the build dir: where they now are
    return Built(local_copy(final), {**stats, "rebuilt_because": rebuilt_because} if rebuilt_because else stats, False)


def verified(final: str | Path, log: logging.Logger, instead: str = "rebuilding it") -> tuple[bool, str | None]:
    """Whether the existing version ``final`` may be reused: (True, None) when it matches its
    ``_manifest.json`` (storage.verify_manifest), logged as reused; else (False, the problems "; "-joined),
    logged as a warning with ``instead``, what the run does about it. The one reuse check of every
    stage: :func:`build_or_reuse`, and the trainings, which are built in place so that a rerun resumes
    from their checkpoints (largetrain_core.stages.training.train)."""
    shown = fs.redact(str(final))
    t0 = time.perf_counter()
    problems = verify_manifest(final)
    if not problems:
        log.info(
            f"{shown} is already complete and matches its manifest "
            f"(verified in {time.perf_counter() - t0:.3f} s): reusing it"
        )
        return True, None
    rebuilt_because = "; ".join(problems)
    log.warning(f"{shown} does not match its manifest, {instead}: {rebuilt_because}")
    return False, rebuilt_because


def disk_full_error(exc: BaseException, tmp: Path, shown: str) -> DiskFullError | None:
    """When ``exc``, raised by a build into ``tmp`` (the temporary directory of the version ``shown``), is
    the file system filling (storage.is_disk_full): a DiskFullError naming the file it was writing (the
    OSError's, else the newest file under ``tmp``), the version and the free space; else None."""
    if not is_disk_full(exc, tmp):
        return None
    file = next(
        (c.filename for c in exception_chain(exc) if isinstance(c, OSError) and c.filename), None
    ) or newest_file(tmp)
    return DiskFullError(
        errno.ENOSPC,
        f"No space left on device (ENOSPC) writing {file or tmp} while building {shown}: {free_bytes(tmp):,} bytes "
        f"free on its file system ({type(exc).__name__}: {exc}). Free space there, then run the step again; "
        "nothing half-written is kept",
        str(file or tmp),
    )


def _committed(final: str | Path) -> Built:
    """The committed version at ``final``, reused: its working copy and its stats."""
    return Built(
        local_copy(final), resolve_under(read_json(fs.join(final, STATS), f"stage stats ({STATS})"), final), True
    )
