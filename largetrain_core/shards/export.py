"""Exports of a split (its documents, Megatron-Core ``IndexedDataset``, HDF5) and the CLI: ``python -m largetrain_core.shards {inspect,export-megatron,export-hdf5}``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from largetrain_core.tokenizer import read_tokenizer
from largetrain_core.shards.reader import TokenShards
from largetrain_core.shards.writer import SPLITS, ShardError


def _document_pieces(data: TokenShards, chunk_sequences: int = 8192):
    """The split's token stream in packing order (module doc, Packing: per part and pass its windows,
    then its tail, which lies in the tail region at the split's end), as numpy arrays, with None where
    tokens are missing (the dropped remainder: the end of the last parts' tails). A manifest without
    ``units`` (one stream packed whole) is its row-major stream, then the dropped remainder."""
    split = data.manifest["splits"][data.split]
    n, width = len(data), data.seq_len + 1
    units = split.get("units")
    tail_rows = split.get("tail_sequences", 0)
    if units is None:
        units, tail_rows = [[n, split.get("dropped_remainder_tokens", 0)]], 0
    tail_first, tail_tokens = n - tail_rows, tail_rows * width
    row = pos = 0
    for windows, tail in units:
        for lo in range(row, row + windows, chunk_sequences):
            yield data.take(np.arange(lo, min(row + windows, lo + chunk_sequences))).reshape(-1)
        row += windows
        have = max(0, min(tail, tail_tokens - pos))
        if have:
            r0, r1 = tail_first + pos // width, tail_first + (pos + have - 1) // width + 1
            start = pos - (r0 - tail_first) * width
            yield data.take(np.arange(r0, r1)).reshape(-1)[start : start + have]
        if have < tail:
            yield None
        pos += tail


def split_documents(data: TokenShards, chunk_sequences: int = 8192):
    """Every document of a split that the shards hold tokens of, in packing order (corpus order, then
    the train split's repeat passes), each a numpy array of its tokens, EOS last, reassembled from the
    shards (:func:`_document_pieces`). A document the dropped remainder cut (its last tokens fell in
    the tail shorter than a window that packing dropped: at most one per part and pass, the end of the
    last parts' tails) is the tokens of it that the shards hold, then EOS, appended here as
    Megatron's own preprocessing (tools/preprocess_data.py, ``--append-eod``) ends every document, so
    a reader that concatenates documents never joins it to the next one. The documents that fell
    wholly into the remainder are not in the shards and not here. A generator whose return value
    (``StopIteration.value``) is the number of cut documents. Packing appends EOS to every document
    and encodes special-token text inside a document as plain text
    (largetrain_core.tokenizer.encode_documents), so EOS marks exactly the document ends. Raises
    ShardError when the split holds more EOS-delimited documents than it was packed from (EOS inside
    a document: its boundaries cannot be told)."""
    eos = data.manifest["eos_id"]
    split = data.manifest["splits"][data.split]
    packed = split["documents"] + split.get("repeat_copies", 0)
    eos_token = np.asarray([eos], dtype=data.dtype)
    partial: list[np.ndarray] = []  # the document in progress
    cut = found = 0

    def count() -> None:
        nonlocal found
        found += 1
        if found > packed:
            raise ShardError(
                f"{data.directory}: split {data.split!r} holds more EOS-delimited documents than "
                f"the {packed} it was packed from: EOS occurs inside documents, so their "
                "boundaries cannot be told"
            )

    for piece in _document_pieces(data, chunk_sequences):
        if piece is None:  # tokens missing up to the end of a part: the document in progress is cut
            if partial:
                count()
                cut += 1
                yield np.concatenate([*partial, eos_token])
            partial = []
            continue
        start = 0
        for end in np.flatnonzero(piece == eos) + 1:
            count()
            yield np.concatenate([*partial, piece[start:end]]) if partial else piece[start:end]
            partial, start = [], int(end)
        if start < len(piece):
            partial.append(piece[start:])
    if partial:  # tokens after the last EOS with nothing recorded as dropped: cut all the same
        count()
        cut += 1
        yield np.concatenate([*partial, eos_token])
    return cut


def document_offsets(data: TokenShards, chunk_sequences: int = 8192) -> np.ndarray:
    """Where each document of :func:`split_documents` starts in their concatenation, plus its
    length at the end: int64, shape (documents + 1,). Raises ShardError as :func:`split_documents`."""
    lengths = [len(d) for d in split_documents(data, chunk_sequences)]
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)


# Megatron-Core ``IndexedDataset`` layout (megatron/core/datasets/indexed_dataset.py, _IndexWriter):
# .idx = b"MMIDIDX\x00\x00", <Q version 1, <B dtype code, <Q sequence count, <Q document count,
#        int32 sequence lengths, int64 sequence byte offsets into .bin, int64 document indices
#        (the sequence index where each document starts, plus the total at the end);
# .bin = the token ids of every sequence, concatenated.
MEGATRON_INDEX_HEADER = b"MMIDIDX\x00\x00"
MEGATRON_DTYPE_CODES = {
    np.dtype(np.uint8): 1,
    np.dtype(np.int8): 2,
    np.dtype(np.int16): 3,
    np.dtype(np.int32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.float64): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.uint16): 8,
}


def megatron_paths(out_prefix: Path | str) -> tuple[Path, Path]:
    """The ``.bin`` and ``.idx`` files of a Megatron dataset prefix: the suffixes appended to the whole
    prefix, as Megatron does (``wiki.en_text_document`` -> ``wiki.en_text_document.bin``)."""
    return Path(f"{out_prefix}.bin"), Path(f"{out_prefix}.idx")


def _documents_with_cut(data: TokenShards, chunk_sequences: int = 8192):
    """:func:`split_documents` as (a generator of the documents, a list that receives the number of
    cut documents when it ends)."""
    box: list[int] = []

    def gen():
        box.append((yield from split_documents(data, chunk_sequences)))

    return gen(), box


def _exportable(data: TokenShards) -> None:
    """Raise ShardError when the split holds no tokens: an export of it would be empty (Megatron's
    IndexedDataset cannot memory-map an empty ``.bin``)."""
    if len(data):
        return
    s = data.manifest["splits"][data.split]
    raise ShardError(
        f"{data.directory}: split {data.split!r} holds no tokens, so there is nothing to export: its "
        f"{s['documents']} document(s) ({s['document_tokens']} tokens) are fewer than one window of "
        f"seq_len + 1 = {data.seq_len + 1} tokens, and packing dropped them as the remainder "
        f"({s['dropped_remainder_tokens']} tokens); pack with a smaller seq_len or give the split more text"
    )


def export_megatron(shards_dir: Path, split: str, out_prefix: Path) -> dict:
    """Write one split as a Megatron-Core ``IndexedDataset`` pair ``<out_prefix>.bin`` / ``<out_prefix>.idx``.

    The split's documents, as Megatron's own preprocessing (tools/preprocess_data.py) writes them:
    one sequence per document (its tokens, EOS last; BOS first where the tokenizer has one), in the
    order packing put them (corpus order, then the train split's intended repeats, each copy a
    document of its own), reassembled from the shards (:func:`split_documents`): every document the
    shards hold tokens of. A document the dropped remainder cut is the tokens of it the shards hold,
    then EOS (``truncated_documents`` counts them); the documents that fell wholly into the remainder
    are not in the shards. Megatron's GPTDataset then builds its samples from whole documents with its
    own defaults (``sequence_length`` tokens plus one, documents shuffled and concatenated across
    their EOS). Token dtype: uint16 as is; uint32 is written as int32 (Megatron has no uint32 code;
    ids < 2**31 always fit). Both files are written under temporary names and renamed.

    Returns ``{"documents", "tokens", "truncated_documents", "dtype", "bin", "idx"}`` (``tokens``: the
    tokens written, the shards' held tokens plus one EOS per truncated document). Raises ShardError
    as :class:`TokenShards` and :func:`split_documents`, and when the split holds no tokens (nothing
    is written then).
    """
    import struct

    data = TokenShards(Path(shards_dir), split)
    _exportable(data)
    dtype = np.dtype(np.uint16) if data.dtype == np.uint16 else np.dtype(np.int32)
    bin_path, idx_path = megatron_paths(out_prefix)
    bin_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_bin, tmp_idx = bin_path.with_name(f".{bin_path.name}.tmp"), idx_path.with_name(f".{idx_path.name}.tmp")
    lengths = []
    docs, cut = _documents_with_cut(data)
    with open(tmp_bin, "wb") as fh:
        for doc in docs:
            fh.write(doc.astype(dtype, copy=False).tobytes())
            lengths.append(len(doc))
    sizes = np.asarray(lengths, dtype=np.int64)
    n_docs, tokens = len(sizes), int(sizes.sum())
    with open(tmp_idx, "wb") as fh:
        fh.write(MEGATRON_INDEX_HEADER)
        fh.write(struct.pack("<Q", 1))
        fh.write(struct.pack("<B", MEGATRON_DTYPE_CODES[dtype]))
        fh.write(struct.pack("<Q", n_docs))
        fh.write(struct.pack("<Q", n_docs + 1))
        fh.write(sizes.astype(np.int32).tobytes(order="C"))
        fh.write(((np.cumsum(sizes) - sizes) * dtype.itemsize).astype(np.int64).tobytes(order="C"))
        fh.write(np.arange(n_docs + 1, dtype=np.int64).tobytes(order="C"))
    os.replace(tmp_bin, bin_path)
    os.replace(tmp_idx, idx_path)
    return {
        "documents": n_docs,
        "tokens": tokens,
        "truncated_documents": cut[0],
        "dtype": dtype.name,
        "bin": str(bin_path),
        "idx": str(idx_path),
    }


def export_hdf5(shards_dir: Path, split: str, out_path: Path, chunk_sequences: int = 1024) -> dict:
    """Write one split as an HDF5 file (h5py) for loaders that expect HDF5.

    Layout:

    * ``input_ids``: (sequences, seq_len + 1), the shards' dtype (uint16/uint32), chunked by
      ``chunk_sequences`` rows, uncompressed: the packed windows exactly as training reads them.
    * ``document_tokens``: (tokens,), the same dtype: the split's complete documents, each its
      tokens with EOS last, in packing order (corpus order, then the train split's repeat passes):
      every document the shards hold tokens of (:func:`split_documents`; a document the dropped
      remainder cut is its held tokens then EOS, counted in the attribute ``truncated_documents``).
    * ``document_offsets``: int64, (documents + 1,): where each document starts in
      ``document_tokens``, its length last: document ``k`` is ``document_tokens[offsets[k]:offsets[k + 1]]``.
    * attributes of the root: the manifest's scalars (``format``, ``seq_len``, ``dtype``, ``eos_id``,
      ``bos_id`` (-1 without BOS), ``vocab_size``, ``tokenizer_sha256``, ``source_data_version``,
      ``validation_fraction``, ``seed``), ``split``, the split's counts (``sequences``, ``tokens``,
      ``documents``, ``document_tokens``, ``dropped_remainder_tokens``), ``truncated_documents``
      and ``manifest_json`` (the whole manifest.json, with every shard's checksum).

    Written under a temporary name and renamed. Returns ``{"sequences", "tokens", "documents", "dtype"}``.
    Raises ShardError when the shard directory does not match its manifest, as :func:`split_documents`,
    and when the split holds no tokens (nothing is written then).
    """
    import h5py

    data = TokenShards(Path(shards_dir), split)
    _exportable(data)
    n, width = len(data), data.seq_len + 1
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    with h5py.File(tmp, "w") as f:
        _write_windows(f, data, chunk_sequences)
        documents, truncated = _write_documents(f, data, chunk_sequences)
        _write_attributes(f, data.manifest, split, truncated)
    os.replace(tmp, out_path)
    return {"sequences": n, "tokens": n * width, "documents": documents, "dtype": data.dtype.name}


def _write_windows(f, data: TokenShards, chunk_sequences: int) -> None:
    """The ``input_ids`` dataset of :func:`export_hdf5`: every window, ``chunk_sequences`` rows at a time."""
    n, width = len(data), data.seq_len + 1
    ids = f.create_dataset(
        "input_ids",
        shape=(n, width),
        dtype=data.dtype,
        chunks=(max(1, min(chunk_sequences, n)), width) if n else None,
    )
    for lo in range(0, n, chunk_sequences):
        rows = data.take(np.arange(lo, min(n, lo + chunk_sequences)))
        ids[lo : lo + len(rows)] = rows


def _write_documents(f, data: TokenShards, chunk_sequences: int) -> tuple[int, int]:
    """The ``document_tokens`` and ``document_offsets`` datasets of :func:`export_hdf5`; (documents, truncated documents)."""
    width = data.seq_len + 1
    tokens = f.create_dataset(
        "document_tokens", shape=(0,), maxshape=(None,), dtype=data.dtype, chunks=(max(1, chunk_sequences * width),)
    )
    lengths, held = [], []

    def append(pieces: list[np.ndarray]) -> None:  # one resize per chunk_sequences windows of tokens
        block = np.concatenate(pieces)
        tokens.resize((tokens.shape[0] + len(block),))
        tokens[tokens.shape[0] - len(block) :] = block

    docs, cut = _documents_with_cut(data)
    for doc in docs:
        held.append(doc)
        lengths.append(len(doc))
        if sum(len(h) for h in held) >= chunk_sequences * width:
            append(held)
            held = []
    if held:
        append(held)
    f.create_dataset(
        "document_offsets", data=np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)
    )
    return len(lengths), cut[0]


def _write_attributes(f, m: dict, split: str, truncated: int) -> None:
    """The root attributes of :func:`export_hdf5`: the manifest's scalars, the split and its counts."""
    for key in (
        "format",
        "seq_len",
        "dtype",
        "eos_id",
        "vocab_size",
        "tokenizer_sha256",
        "source_data_version",
        "validation_fraction",
        "seed",
    ):
        f.attrs[key] = m[key]
    f.attrs["bos_id"] = -1 if m.get("bos_id") is None else m["bos_id"]
    f.attrs["split"] = split
    for key in ("sequences", "tokens", "documents", "document_tokens", "dropped_remainder_tokens"):
        f.attrs[key] = m["splits"][split][key]
    f.attrs["truncated_documents"] = truncated
    f.attrs["manifest_json"] = json.dumps(m)


def inspect(path: Path, split: str = "train") -> str:
    """Human-readable summary of a shard directory: sequences, tokens, dtype, tokenizer hash, one decoded sample."""
    shards = TokenShards(Path(path), split, verify_checksums=True)
    m = shards.manifest
    lines = [
        f"{path} ({m['format']})",
        f"seq_len={m['seq_len']} dtype={m['dtype']} eos_id={m['eos_id']} "
        f"vocab_size={m['vocab_size']} tokenizer_sha256={m['tokenizer_sha256'][:16]}...",
    ]
    for s, info in m["splits"].items():
        lines.append(
            f"{s}: {info['sequences']} sequences, {info['tokens']} tokens in {len(info['shards'])} shards, "
            f"{info['documents']} documents, {info['dropped_remainder_tokens']} remainder tokens dropped"
        )
    tok_path = Path(path) / "tokenizer.json"
    if len(shards) and tok_path.exists():
        text = read_tokenizer(tok_path).decode(shards[0][:64].tolist(), skip_special_tokens=False)
        lines.append(f"{split}[0][:64] decoded: {text!r}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m largetrain_core.shards")
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("inspect", help="print a shard directory's summary and one decoded sample")
    i.add_argument("path")
    i.add_argument("--split", default="train", choices=SPLITS)
    e = sub.add_parser(
        "export-megatron", help="write a split's documents as a Megatron-Core IndexedDataset PREFIX.bin/PREFIX.idx"
    )
    e.add_argument("path")
    e.add_argument("out_prefix")
    e.add_argument("--split", default="train", choices=SPLITS)
    h = sub.add_parser(
        "export-hdf5", help="write a split as HDF5: input_ids, document_tokens, document_offsets, manifest attributes"
    )
    h.add_argument("path")
    h.add_argument("out", help="the .h5 file to write")
    h.add_argument("--split", default="train", choices=SPLITS)
    args = p.parse_args(argv)
    try:
        if args.cmd == "inspect":
            print(inspect(Path(args.path), args.split))
        elif args.cmd == "export-hdf5":
            print(json.dumps(export_hdf5(Path(args.path), args.split, Path(args.out))))
        else:
            print(json.dumps(export_megatron(Path(args.path), args.split, Path(args.out_prefix))))
    except ShardError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
