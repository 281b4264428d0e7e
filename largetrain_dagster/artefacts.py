"""Shared by every stage: build an artefact directory (or reuse a complete one), and the Output and
metadata an asset returns.

Every asset writes to ``<root>/<asset key>/[<partition>/]<data version>/``, built in a temporary
directory renamed into place when complete; the data version is a hash of the asset's code version
(CODE_VERSIONS), its config and its inputs' data versions (docs/ARCHITECTURE.md, Lineage).
"""

import math
import re
import time
import warnings
from pathlib import Path
from typing import Callable

import polars as pl
from dagster import AssetExecutionContext, BetaWarning, Config, DataVersion, MetadataValue, Output

from largetrain_core.storage import (
    atomic_dir,
    part_files,
    read_json,
    relative_to_root,
    resolve_under,
    verify_manifest,
    write_json_atomic,
)
from largetrain_dagster.resources import Storage

# Bump an asset's code version when its code changes what it writes: Dagster then marks it stale.
CODE_VERSIONS = {"raw_corpus": "5", "cleaned_text": "6", "deduplicated_text": "6", "tokenizer": "2",
                 "token_shards": "3", "base_checkpoint": "3", "lora_adapter": "3", "evaluation": "2",
                 "optimization_report": "1"}



def build_or_reuse(context: AssetExecutionContext, storage: Storage, key: list[str], version: str,
                   build: Callable[[Path], dict]) -> tuple[Path, dict, bool]:
    """Build ``<root>/<key>/<version>/`` atomically with ``build(tmp_dir) -> stats``, or reuse it if it
    is complete and intact.

    An existing directory is reused only when it matches its ``_manifest.json``
    (largetrain_core.storage.verify_manifest: file list and sizes, full checksums of files up to 8 MiB,
    sampled checksums of larger ones); otherwise it is rebuilt, with a warning naming the damaged
    files and ``rebuilt_because`` (the problems, "; "-joined) in the returned stats and so in the
    metadata. Returns (directory, stats, reused). Paths inside the directory are stored in
    ``stats.json`` relative to it (storage.relative_to_root), so a copied or moved directory reads its
    own files."""
    final = storage.path(*key, version)
    rebuilt_because = None
    if final.exists():
        t0 = time.perf_counter()
        problems = verify_manifest(final)
        if not problems:
            context.log.info(f"{'/'.join(key)} {version} is already complete at {final} and matches its manifest "
                             f"(verified in {time.perf_counter() - t0:.3f} s): reusing it")
            return final, resolve_under(read_json(final / "stats.json", "stage stats (stats.json)"), final), True
        rebuilt_because = "; ".join(problems)
        context.log.warning(f"{'/'.join(key)} {version} at {final} does not match its manifest, rebuilding it: "
                            f"{rebuilt_because}")
    t0 = time.perf_counter()
    with atomic_dir(final) as tmp:
        stats = build(tmp)
        stats["seconds"] = round(time.perf_counter() - t0, 3)
        write_json_atomic(tmp / "stats.json", relative_to_root(relative_to_root(stats, tmp), final))
    return final, {**stats, "rebuilt_because": rebuilt_because} if rebuilt_because else stats, False


def asset_output(path: Path, version: str, stats: dict, config: Config | dict, reused: bool, extra: dict | None = None,
                 stats_metadata: bool = True) -> Output:
    """The asset's Output: the JSON handle (path, data version, stats, exact) and metadata (path, data
    version, reused, config, every numeric stat unless ``stats_metadata`` is False, ``extra``), with the data version Dagster records.

    Metadata is for people and plots: floats (in stats and ``extra``) are rounded to 4 significant
    digits (``rounded``); units go in the label (``seconds``, ``size_mib``, ``kept_percent``)."""
    cfg = config if isinstance(config, dict) else config.model_dump()
    handle = {"path": str(path), "data_version": version, "stats": stats}
    md = {"path": MetadataValue.path(str(path)), "data_version": version, "reused": reused,
          "config": MetadataValue.json(cfg)}
    if stats_metadata:  # else the caller shows the stats it chose in ``extra``
        md.update({k: v for k, v in stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
    if stats.get("rebuilt_because"):
        md["rebuilt_because"] = MetadataValue.text(stats["rebuilt_because"])
    md.update(extra or {})
    md = {k: rounded(v) if isinstance(v, float) else v for k, v in md.items()}
    with warnings.catch_warnings():  # Output's data_version is Dagster's documented way to set it (beta-flagged)
        warnings.simplefilter("ignore", BetaWarning)
        return Output(handle, metadata=md, data_version=DataVersion(version))


def rounded(value: float, digits: int = 4) -> float:
    """``value`` to ``digits`` significant digits (9.04213 -> 9.042, 1234.56 -> 1235.0); NaN and inf as they are."""
    return float(f"{value:.{digits}g}") if math.isfinite(value) else value


def percent(part: float, whole: float) -> float:
    """``100 * part / whole`` to 4 significant digits; 0.0 when ``whole`` is 0."""
    return rounded(100.0 * part / whole) if whole else 0.0


def mib(n_bytes: int) -> float:
    """Bytes in MiB (2**20 bytes), to 4 significant digits."""
    return rounded(n_bytes / 2**20)


def text_block(text: str) -> str:
    """``text`` as a fenced markdown block shown verbatim (the fence is longer than any backtick run in it)."""
    fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", text)), default=0))
    return f"{fence}text\n{text}\n{fence}"


def md_table(counts: dict, header=("reason", "documents")) -> MetadataValue:
    """A two-column markdown table of ``counts`` (sorted by key), or "none"."""
    rows = "\n".join(f"| {k} | {v} |" for k, v in sorted(counts.items()))
    return MetadataValue.md(f"| {header[0]} | {header[1]} |\n|---|---|\n{rows}" if counts else "none")


def texts(directory: Path, batch: int = 1000):
    """The ``text`` column of every part file under ``directory``, in lists of up to ``batch`` strings."""
    for part in part_files(directory):
        for df in pl.read_parquet(part, columns=["text"]).iter_slices(batch):
            yield df["text"].to_list()
