"""Compression by magic bytes, UTF-16 detection and decoding, control characters (package doc, Encoding policy)."""

from __future__ import annotations

import codecs
import gzip
import io
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

import zstandard

from largetrain_core import fs


@dataclass(frozen=True)
class Compression:
    """A compression of byte streams: detected by ``magic`` (the stream's first bytes); ``suffix`` is
    what file names use for it; ``open`` wraps a binary file into the decompressed stream."""

    name: str
    suffix: str
    magic: bytes
    open: Callable[[BinaryIO], BinaryIO]


def _zstd(f: BinaryIO) -> BinaryIO:  # line iteration needs a buffered reader over the decompressing stream
    return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(f, closefd=True))


COMPRESSIONS: tuple[Compression, ...] = (
    Compression("gzip", ".gz", b"\x1f\x8b", lambda f: gzip.GzipFile(fileobj=f)),  # RFC 1952
    Compression("zstd", ".zst", b"\x28\xb5\x2f\xfd", _zstd),  # RFC 8878 frame magic
)


def compression_of(head: bytes) -> Compression | None:
    """The compression whose magic number ``head`` (a file's first bytes) starts with, else None."""
    return next((c for c in COMPRESSIONS if head.startswith(c.magic)), None)


def _sniff(path: Path | str) -> Compression | None:
    return compression_of(fs.read_head(path, 8))


# Control characters that text does not hold in quantity: C0 but tab, line feed, vertical tab, form
# feed and carriage return; DEL; C1.
_CONTROL = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f]")
CONTROL_FRACTION = 0.5


SNIFF_BYTES = 1 << 16  # UTF-16 is recognised from a stream's first 64 KiB
_UTF16_MIN_UNITS = 8  # fewer code units than this are too few to tell a byte pattern
_UTF16_IMPLAUSIBLE = 0.01
_UTF16_COHERENT = 0.9
_CONTROL_NAMES = "U+0000-U+001F, U+007F-U+009F other than tab and line breaks"


def control_error(text: str) -> str | None:
    """None unless at least :data:`CONTROL_FRACTION` of ``text``'s characters are control characters,
    else the reason to reject it (the same words for every such document, so they group as one reason)."""
    if not _CONTROL.search(text):
        return None
    controls = len(text) - len(_CONTROL.sub("", text))
    if controls < CONTROL_FRACTION * len(text):
        return None
    return (
        f"mostly control characters: at least {CONTROL_FRACTION:.0%} of its characters are control characters "
        f"({_CONTROL_NAMES}), so it is not text: UTF-16 without a byte-order mark, or binary data?"
    )


@dataclass(frozen=True)
class Utf16:
    """A UTF-16 stream: ``name`` (UTF-16LE, UTF-16BE), the Python ``codec``, the ``bom`` bytes to skip
    and the ``evidence`` it was recognised by ("byte-order mark" or "byte pattern")."""

    name: str
    codec: str
    bom: int
    evidence: str


def detect_utf16(head: bytes) -> Utf16 | None:
    """Whether a byte stream whose first bytes are ``head`` (up to :data:`SNIFF_BYTES`) is UTF-16.

    * By its byte-order mark: ``FF FE`` (UTF-16LE) or ``FE FF`` (UTF-16BE).
    * Else by its byte pattern, only when ``head`` does not read as UTF-8 text (invalid UTF-8, or at
      least :data:`CONTROL_FRACTION` control characters), so UTF-8 text is never re-read: exactly one
      byte order must decode ``head`` to text, that is, strictly (no lone surrogate), with at most
      1 % of the characters control, unassigned, private-use or surrogate, and with at least 90 % of
      the code units sharing the two most common high bytes (an alphabetic script's 256-code-point
      block and ASCII's spaces, digits and punctuation; the wrong byte order, Latin-1 and binary data
      spread them: the Ukrainian case of tests/cases/utf16_text reads 100 % as UTF-16BE, 25 % as
      UTF-16LE). Text in scripts spread over many blocks (Chinese, Japanese, Korean) is not
      recognised this way; it is then rejected as invalid UTF-8 or as mostly control characters.
      At least 8 code units are needed.
    """
    if head.startswith(b"\xff\xfe"):
        return Utf16("UTF-16LE", "utf-16-le", 2, "byte-order mark")
    if head.startswith(b"\xfe\xff"):
        return Utf16("UTF-16BE", "utf-16-be", 2, "byte-order mark")
    sample = head[: len(head) // 2 * 2]
    if len(sample) < 2 * _UTF16_MIN_UNITS or head.startswith(b"\xef\xbb\xbf") or not _garbled_as_utf8(head):
        return None
    found = [
        Utf16(name, codec, 0, "byte pattern")
        for name, codec, high in (("UTF-16BE", "utf-16-be", sample[0::2]), ("UTF-16LE", "utf-16-le", sample[1::2]))
        if _reads_as_utf16(sample, codec, high)
    ]
    return found[0] if len(found) == 1 else None


def _garbled_as_utf8(head: bytes) -> bool:
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=False)  # a character may be cut at the end
    except UnicodeDecodeError:
        return True
    return control_error(text) is not None


def _reads_as_utf16(sample: bytes, codec: str, high: bytes) -> bool:
    try:
        text = codecs.getincrementaldecoder(codec)().decode(
            sample, final=False
        )  # a surrogate pair may be cut at the end
    except UnicodeDecodeError:
        return False
    implausible = sum(1 for c in text if unicodedata.category(c) in ("Cc", "Cn", "Co", "Cs") and c not in "\t\n\v\f\r")
    if not text or implausible > _UTF16_IMPLAUSIBLE * len(text):
        return False
    return sum(n for _, n in Counter(high).most_common(2)) >= _UTF16_COHERENT * len(high)


class EncodingError(ValueError):
    """An invalid sequence in a stream decoded from UTF-16: ``position`` is its byte offset in the
    (decompressed) file."""

    def __init__(self, position: int, reason: str):
        super().__init__(reason)
        self.position = position
        self.reason = reason


class _Utf8FromUtf16(io.RawIOBase):
    """A UTF-16 byte stream read as UTF-8 bytes (its byte-order mark dropped). Raises
    :class:`EncodingError` at an invalid UTF-16 sequence (a lone surrogate, an odd last byte)."""

    def __init__(self, raw: BinaryIO, encoding: Utf16):
        self.raw, self.encoding = raw, encoding
        self.decoder = codecs.getincrementaldecoder(encoding.codec)()
        self.fed = len(raw.read(encoding.bom))  # bytes given to the decoder so far
        self.out, self.at, self.eof = b"", 0, False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self.at == len(self.out) and not self.eof:
            chunk = self.raw.read(1 << 16)
            start = self.fed - len(self.decoder.getstate()[0])  # where the decoder's pending bytes begin
            try:
                text = self.decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                raise EncodingError(
                    start + e.start, f"invalid {self.encoding.name} at byte {start + e.start}: {e.reason}"
                ) from None
            self.fed += len(chunk)
            self.eof = not chunk
            self.out, self.at = text.encode("utf-8"), 0  # strict UTF-16 decoding leaves no lone surrogate
        n = min(len(buffer), len(self.out) - self.at)
        buffer[:n] = self.out[self.at : self.at + n]
        self.at += n
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()
