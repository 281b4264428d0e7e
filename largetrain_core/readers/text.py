"""The text reader: one document per file."""

from __future__ import annotations

from typing import Generator


from largetrain_core.readers.base import Batch, Collector, ReaderConfig, Source, _stream_end
from largetrain_core.readers.encoding import EncodingError


def _read_text(src: Source, config: ReaderConfig, out: Collector) -> Generator[Batch, None, int]:
    """One document per file: the whole decoded file; doc_id and fallback id = the relative path."""
    raw: list = []
    chunks: list[bytes] = []
    with src.open(raw) as f:
        try:
            read = getattr(f, "read1", f.read)  # what the stream has: a cut stream's text up to the cut is counted
            while block := read(1 << 20):
                chunks.append(block)
        except EncodingError as e:
            out.reject(src.rel, e.position, f"{e.reason} (decoded as UTF-16, recognised by its {src.utf16.evidence})")
            return 1
        except Exception as e:  # noqa: BLE001 -- a cut or damaged compressed stream: the one record, saying where
            done = sum(map(len, chunks))
            out.reject(src.rel, done, f"cannot read the file past byte {done:,} of its text: {_stream_end(raw, e)}")
            return 1
    data = b"".join(chunks)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        out.reject(src.rel, e.start, f"invalid UTF-8 at byte {e.start}: {e.reason}")
        return 1
    out.doc(None, src.rel, src.rel, 0, "", text)
    return 1
    yield  # a generator, as every reader
