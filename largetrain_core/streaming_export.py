"""Exports of a token_shards split for the streaming loaders of cloud training: litdata (Lightning AI)
and mosaicml-streaming (MDS). Each reads only its own format (a directory with its own ``index.json``),
so the split is rewritten with that library's own writer: litdata's ``BinaryWriter`` (what
``litdata.optimize`` runs), streaming's ``MDSWriter``.

One sample per packed window, in :class:`largetrain_core.shards.TokenShards` order (the manifest's
shard order): ``{"input_ids": ndarray (seq_len + 1,)}`` of the shards' dtype (uint16, or uint32 for a
vocabulary over 65,536 ids); a sequence's input is ``input_ids[:-1]``, its target ``input_ids[1:]``.
No compression (token ids compress poorly and the loaders then decompress every chunk). Beside the
library's ``index.json``, ``largetrain.json`` records the source: split, seq_len, dtype, eos_id,
vocab_size, tokenizer_sha256, sequences.

The libraries are not in the project's virtualenv (with their dependencies they pull a CUDA torch and
older numpy and transformers): ``make install`` puts them, without dependencies, in
``.venv/streaming``; run this module with that folder on PYTHONPATH (docs/guides/data-preparation.md,
litdata and mosaicml-streaming).

CLI: ``python -m largetrain_core.streaming_export {litdata,mds} SHARDS_DIR OUT_DIR [--split S]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import types
from pathlib import Path

import numpy as np

from largetrain_core.shards import SPLITS, ShardError, TokenShards, _exportable

CHUNK_BYTES = 64 << 20  # per chunk / shard file: both libraries' default order of size (litdata 64 MB, MDS 64 MB)
READ_ROWS = 4096  # windows gathered from the shards at a time
INSTALL_HINT = "`make install` (the Makefile's $(VENV)/streaming/.installed) puts it in .venv/streaming; run with PYTHONPATH=.venv/streaming"


def import_litdata_writer():
    """litdata's ``BinaryWriter``. Raises ImportError naming the make target when litdata is missing."""
    try:
        from litdata.streaming.writer import BinaryWriter
    except ModuleNotFoundError as e:
        raise ImportError(f"litdata is not importable ({e}); {INSTALL_HINT}") from e
    return BinaryWriter


def import_streaming():
    """mosaicml-streaming's ``streaming.base`` module (MDSWriter, StreamingDataset, StreamingDataLoader:
    the classes ``from streaming import ...`` gives). The package's ``__init__`` also imports its
    vision datasets, hence torchvision; where torchvision is not installed (``.venv/streaming`` has
    none: PyPI's build needs a CUDA torch), the package is entered without that ``__init__``. Raises
    ImportError naming the make target when streaming is missing."""
    try:
        import streaming.base as base
    except ModuleNotFoundError as e:
        if e.name != "torchvision":
            raise ImportError(f"mosaicml-streaming is not importable ({e}); {INSTALL_HINT}") from e
        sys.modules.pop("streaming", None)
        spec = importlib.util.find_spec("streaming")
        pkg = types.ModuleType("streaming")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__spec__ = spec
        sys.modules["streaming"] = pkg
        import streaming.base as base
    return base


def _windows(data: TokenShards):
    """The split's windows in order, READ_ROWS at a time: (rows, seq_len + 1) arrays."""
    for a in range(0, len(data), READ_ROWS):
        yield data.take(np.arange(a, min(a + READ_ROWS, len(data))))


def _check_empty(out_dir: Path) -> None:
    """Raise ShardError when ``out_dir`` exists and is not empty (a loader would mix the two exports)."""
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ShardError(f"{out_dir}: exists and is not empty; export into a new directory")


def _staging(out_dir: Path) -> Path:
    """A fresh temporary directory beside ``out_dir``, renamed to it when the export completes."""
    _check_empty(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    return tmp


def _finish(data: TokenShards, tmp: Path, out_dir: Path, fmt: str) -> dict:
    m = data.manifest
    info = {
        "format": fmt,
        "split": data.split,
        "sequences": len(data),
        "seq_len": data.seq_len,
        "dtype": data.dtype.name,
        "eos_id": m["eos_id"],
        "vocab_size": m["vocab_size"],
        "tokenizer_sha256": m["tokenizer_sha256"],
    }
    (tmp / "largetrain.json").write_text(json.dumps(info, indent=1) + "\n")
    if out_dir.exists():
        out_dir.rmdir()  # empty: checked by _staging
    tmp.rename(out_dir)
    return {**info, "out": str(out_dir)}


def export_litdata(shards_dir: Path, split: str, out_dir: Path, chunk_bytes: int = CHUNK_BYTES) -> dict:
    """Write one split as a litdata optimized dataset (``index.json`` and ``chunk-*.bin``), read by
    ``litdata.StreamingDataset(out_dir)``: one item ``{"input_ids": ndarray (seq_len + 1,)}`` per
    window, in order. Written under a temporary name and renamed. Returns the ``largetrain.json``
    record plus ``out``. Raises ShardError as :class:`TokenShards`, when the split holds no tokens or
    ``out_dir`` is not empty; ImportError when litdata is missing."""
    data = TokenShards(Path(shards_dir), split)
    _exportable(data)
    _check_empty(Path(out_dir))
    binary_writer = import_litdata_writer()
    tmp = _staging(Path(out_dir))
    writer = binary_writer(str(tmp), chunk_bytes=chunk_bytes)
    i = 0
    for rows in _windows(data):
        for row in rows:
            writer.add_item(i, {"input_ids": row})
            i += 1
    writer.done()
    writer.merge()
    return _finish(data, tmp, Path(out_dir), "litdata")


def export_mds(shards_dir: Path, split: str, out_dir: Path, chunk_bytes: int = CHUNK_BYTES) -> dict:
    """Write one split as a mosaicml-streaming MDS dataset (``index.json`` and ``shard.*.mds``), read
    by ``streaming.StreamingDataset(local=out_dir)`` (or ``remote=`` its object-store copy): one
    sample ``{"input_ids": ndarray (seq_len + 1,)}`` per window (column encoding
    ``ndarray:<dtype>:<seq_len + 1>``), in order. Written under a temporary name and renamed. Returns
    the ``largetrain.json`` record plus ``out``. Raises ShardError as :func:`export_litdata`;
    ImportError when mosaicml-streaming is missing."""
    data = TokenShards(Path(shards_dir), split)
    _exportable(data)
    _check_empty(Path(out_dir))
    base = import_streaming()
    tmp = _staging(Path(out_dir))
    columns = {"input_ids": f"ndarray:{data.dtype.name}:{data.seq_len + 1}"}
    with base.MDSWriter(out=str(tmp), columns=columns, compression=None, size_limit=chunk_bytes) as writer:
        for rows in _windows(data):
            for row in rows:
                writer.write({"input_ids": row})
    return _finish(data, tmp, Path(out_dir), "mds")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m largetrain_core.streaming_export")
    p.add_argument("format", choices=("litdata", "mds"), help="litdata's optimized format or mosaicml-streaming's MDS")
    p.add_argument("path", help="a token_shards directory")
    p.add_argument("out", help="the directory to write (new or empty)")
    p.add_argument("--split", default="train", choices=SPLITS)
    args = p.parse_args(argv)
    export = export_litdata if args.format == "litdata" else export_mds
    try:
        print(json.dumps(export(Path(args.path), args.split, Path(args.out))))
    except (ShardError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
