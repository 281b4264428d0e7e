"""Writing small document part files (the layout of cleaned_text / deduplicated_text) for the core tests."""

from pathlib import Path

import polars as pl


def write_parts(d: Path, parts: list[list[tuple[str, str]]]) -> Path:
    """``d/part-NNNNN.parquet``, one per entry of ``parts``: rows (doc_id, text), source ``"src"``. Returns ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    for i, rows in enumerate(parts):
        pl.DataFrame(
            {"doc_id": [r[0] for r in rows], "source": ["src"] * len(rows), "text": [r[1] for r in rows]},
            schema={"doc_id": pl.Utf8, "source": pl.Utf8, "text": pl.Utf8},
        ).write_parquet(d / f"part-{i:05d}.parquet")
    return d


def sentence_docs(d: Path, sentences: list[str]) -> Path:
    """``d/part-00000.parquet`` of 140 documents of 12 overlapping sentences each (``d0``, ``d1``, ...), enough
    text for a few dozen short token sequences. Returns ``d``."""
    texts = [" ".join(sentences[i : i + 12]) for i in range(0, 280, 2)]
    return write_parts(d, [[(f"d{i}", t) for i, t in enumerate(texts)]])


class DiesOn:
    """A per-part step (largetrain_core.parts.PartStep) that keeps every document, but whose process is
    killed (SIGKILL, as the kernel's OOM killer does) on the part holding ``doc_id``."""

    counts: tuple[str, ...] = ()
    description = "test: dies on one part"

    def __init__(self, doc_id: str):
        self.doc_id = doc_id

    def __call__(self, df: pl.DataFrame):
        import os
        import signal

        if self.doc_id in df["doc_id"].to_list():
            os.kill(os.getpid(), signal.SIGKILL)
        return df, pl.DataFrame(schema={"doc_id": pl.Utf8, "source": pl.Utf8, "reason": pl.Utf8}), {}
