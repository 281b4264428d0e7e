"""The shard writer: one split's (or stream's) windows into Arrow IPC shard files (package doc, Format)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa

from largetrain_core.digest import file_digest
from largetrain_core.storage import ArtifactError
from largetrain_core.tokenizer import TokenizerInfo


FORMAT = "largetrain.token_shards/1"
SPLITS = ("train", "validation")


LOG = logging.getLogger("largetrain.shards")


class ShardError(ArtifactError):
    """A shard directory that does not match its manifest (the message names the file)."""


class _SplitWriter:
    """Packs token streams into windows and writes them into shard files ``<name>-NNNNN.arrow``."""

    def __init__(self, out_dir: Path, name: str, seq_len: int, info: TokenizerInfo, sequences_per_shard: int):
        self.out_dir, self.name, self.window = out_dir, name, seq_len + 1
        self.arrow_type = pa.uint16() if info.dtype == np.uint16 else pa.uint32()
        self.schema = pa.schema(
            [pa.field("input_ids", pa.list_(self.arrow_type, self.window))],
            metadata={
                "seq_len": str(seq_len),
                "dtype": info.dtype.name,
                "eos_id": str(info.eos_id),
                "vocab_size": str(info.vocab_size),
                "tokenizer_sha256": info.sha256,
            },
        )
        self.sequences_per_shard = sequences_per_shard
        self.pending: list[np.ndarray] = []
        self.pending_tokens = 0
        self.dtype = info.dtype
        self.rows = None  # the open shard's rows so far, a file: ``.<shard>.rows``
        self.filled = 0
        self.windows = 0  # full windows since the last end_unit
        self.shards: list[dict] = []
        self.documents = 0
        self.document_tokens = 0
        self.repeated_documents = 0
        self.repeat_copies = 0
        self.repeat_tokens = 0

    def add(self, docs: list[np.ndarray], repeat: bool = False) -> None:
        """Pack ``docs`` (token arrays); ``repeat``: they are extra copies of documents already added."""
        if repeat:
            self.repeat_copies += len(docs)
            self.repeat_tokens += sum(len(d) for d in docs)
        else:
            self.documents += len(docs)
        for d in docs:
            self.pending.append(d)
            self.pending_tokens += len(d)
            self.document_tokens += len(d)
        if self.pending_tokens >= self.window:
            stream = np.concatenate(self.pending)
            n = len(stream) // self.window
            self._write(stream[: n * self.window].reshape(n, self.window))
            rest = stream[n * self.window :]
            self.pending, self.pending_tokens = [rest], len(rest)

    def end_unit(self) -> tuple[int, np.ndarray]:
        """(full windows since the last call, the tokens left after them: fewer than a window), taken out
        of the stream: the next :meth:`add` starts a new unit."""
        tail = np.concatenate(self.pending) if self.pending else np.zeros(0, self.dtype)
        windows, self.windows = self.windows, 0
        self.pending, self.pending_tokens = [], 0
        return windows, tail.astype(self.dtype, copy=False)

    def _write(self, rows: np.ndarray) -> None:
        """Append full windows to the open shard; each shard is written as ONE record batch, so a reader
        sees one contiguous (sequences, seq_len + 1) array per shard. The rows wait in a file beside it
        (``.<shard>.rows``), not in memory: the writer's memory does not depend on ``sequences_per_shard``."""
        self.windows += len(rows)
        while len(rows):
            if self.rows is None:
                self.rows = open(self.out_dir / f".{self._shard_name()}.rows", "wb")  # noqa: SIM115 (closed in _flush)
                self.filled = 0
            take = min(len(rows), self.sequences_per_shard - self.filled)
            np.ascontiguousarray(rows[:take], dtype=self.dtype).tofile(self.rows)
            self.filled += take
            rows = rows[take:]
            if self.filled == self.sequences_per_shard:
                self._flush()

    def _shard_name(self) -> str:
        return f"{self.name}-{len(self.shards):05d}.arrow"

    def _flush(self) -> None:
        """Write the open shard: the Arrow IPC file of one record batch of ``filled`` rows, its values
        first zeros (an untouched calloc'd array: no resident memory), then overwritten in place by the
        rows' file, which is the last buffer of the batch's body (8-byte aligned, as Arrow's IPC writer
        pads each buffer); the same bytes as writing the rows' array at once."""
        if self.rows is None:
            return
        self.rows.close()
        raw, self.rows = Path(self.rows.name), None
        name = self._shard_name()
        path = self.out_dir / name
        values = self.filled * self.window
        zeros = np.zeros(values, dtype=self.dtype)
        flat = pa.Array.from_buffers(self.arrow_type, values, [None, pa.py_buffer(zeros)])
        col = pa.FixedSizeListArray.from_arrays(flat, self.window)
        with pa.OSFile(str(path), "wb") as sink:
            with pa.ipc.new_file(sink, self.schema) as writer:
                writer.write_batch(pa.record_batch([col], schema=self.schema))
                body_end = sink.tell()
        nbytes = values * zeros.itemsize
        if raw.stat().st_size != nbytes:
            raise ArtifactError(f"{raw}: {raw.stat().st_size} bytes of rows, expected {nbytes}")
        with open(raw, "rb") as src, open(path, "r+b") as dst:
            dst.seek(body_end - (nbytes + 7) // 8 * 8)
            shutil.copyfileobj(src, dst, 1 << 20)
        raw.unlink()
        self.shards.append(
            {"file": name, "sequences": self.filled, "bytes": path.stat().st_size, "xxh3_128": file_digest(path)}
        )
        self.filled = 0

    def discard(self) -> None:
        """Remove what this writer wrote (its shard files and the open shard's rows): its run failed."""
        if self.rows is not None:
            self.rows.close()
            Path(self.rows.name).unlink(missing_ok=True)
            self.rows = None
        for shard in self.shards:
            (self.out_dir / shard["file"]).unlink(missing_ok=True)
        self.shards = []

    def finish(self) -> dict:
        self._flush()
        sequences = sum(s["sequences"] for s in self.shards)
        return {
            "shards": self.shards,
            "sequences": sequences,
            "tokens": sequences * self.window,
            "documents": self.documents,
            "document_tokens": self.document_tokens,
            "repeated_documents": self.repeated_documents,
            "repeat_copies": self.repeat_copies,
            "repeat_tokens": self.repeat_tokens,
            "dropped_remainder_tokens": self.pending_tokens,
        }
