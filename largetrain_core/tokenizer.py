"""Train or load a Hugging Face ``tokenizers`` tokenizer; the EOS/BOS policy.

Policy: every document is encoded without special tokens and followed by the EOS id; when the
tokenizer defines a BOS token (``bos_token`` in a loaded directory's tokenizer_config.json), BOS is
put in front of every document. Text that spells a special token (a page quoting ``<|endoftext|>``)
is encoded as ordinary text, like tiktoken's ``encode_ordinary``, so EOS/BOS ids only ever mark
document boundaries; this holds for the shards (:func:`encode_documents`) and for the saved
Hugging Face tokenizer (:func:`save_hf_tokenizer` sets ``split_special_tokens``) alike. A trained
tokenizer is a byte-level BPE (GPT-2 style: any byte sequence encodes, no unknown token) with one
special token, ``<|endoftext|>``, used as EOS.

Long runs: the BPE trainer's time on one pre-token grows with the square of its length (measured
on tests/cases/genome_sequence.jsonl, one 300,000-letter run: 61 s at 512 ids, and about 4x that at
twice the length). Before training, every run of more than ``max_pretoken_chars`` (default
MAX_PRETOKEN_CHARS = 1,000) whitespace or non-whitespace characters is cut into pieces of that
length (the same case: 0.26 s), counted as ``long_runs_split``. This is the cut Llama 3's reference
tokenizer makes before tiktoken, for the same reason (``MAX_NO_WHITESPACES_CHARS``, 25,000 there, for
encoding); the byte-level pre-tokens (letters, digits, other symbols, whitespace: GPT-2's pattern)
never span a whitespace/non-whitespace boundary, so no pre-token of more than 1,000 characters (1,001
with its leading space) reaches the trainer. Why the bound is safe: text without such a run is
trained on unchanged; in a longer run the cut forces at most one token boundary per 1,000
characters (natural-language pre-tokens are a few dozen characters at most; runs this long are
sequences, encodings or dumps). Encoding needs no cut: applying learned merges is not quadratic
(the 300,000-letter run encodes in 0.15 s), so the saved tokenizer is a plain byte-level BPE.

Training sample (:func:`training_sample`): the trainer reads at most about ``max_bytes`` of text
(default MAX_TRAINING_BYTES = 10^9 bytes), so its time and memory are bounded whatever the corpus, as
production tokenizers are trained on a sample (nanochat's tok_train.py: the first 2 x 10^9 characters
for a 32,768-token vocabulary). A document is in the sample when xxh3-64(doc_id, seed) / 2**64 <
fraction, fraction = min(1, max_bytes / the corpus's text bytes): seeded, independent of the order,
the part files and the partitioning, and independent of the validation split (which hashes with
xxh64). The text bytes are read from the Parquet footers (the text column's uncompressed size less
the 4-byte length of each value; exact to the page headers for PLAIN-encoded text, which
deduplicated text is; a dictionary-encoded part is measured by reading it). A corpus under the bound
is trained on whole. Why a sample suffices: measured on the paragraph remix of the kernel docs at 8x
(benchmarks/scale.py, held-out paragraphs that never entered the corpus), a vocabulary of 8,192
trained on 16 MB compresses held-out text to 3.381 bytes per token, the same as one trained on all
193 MB (3.381), on 4 MB 3.366 (0.4% worse). Counting pre-tokens per partition and merging the counts
is not possible with Hugging Face tokenizers: its trainer counts the words itself and the
maintainers declined a word-count API (huggingface/tokenizers issues 89 and 760).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import math
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import pyarrow.parquet as pq
import xxhash
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from largetrain_core.storage import MissingArtifactError, loading, read_json

EOS_TOKEN = "<|endoftext|>"
MAX_PRETOKEN_CHARS = 1000  # the module doc says why
MAX_TRAINING_BYTES = 10**9  # the module doc says why


@dataclass(frozen=True)
class TokenizerInfo:
    """What the shards need to know about a tokenizer.

    vocab_size: the full vocabulary including added special tokens: one more than the largest id, so
        ids are < vocab_size even when a tokenizer's ids have gaps.
    sha256: of the tokenizer.json bytes.
    """

    path: Path
    eos_id: int
    bos_id: int | None
    vocab_size: int
    sha256: str

    @property
    def dtype(self) -> np.dtype:
        return storage_dtype(self.vocab_size)


def storage_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id (0..vocab_size-1) fits in 16 bits, else uint32 (docs/ARCHITECTURE.md, Shard format)."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def train_bpe(
    texts: Iterable[list[str]],
    vocab_size: int,
    out_dir: Path,
    min_frequency: int = 2,
    max_pretoken_chars: int = MAX_PRETOKEN_CHARS,
) -> tuple[TokenizerInfo, dict]:
    """Train a byte-level BPE of ``vocab_size`` ids (EOS included) on batches of texts; write
    ``out_dir/tokenizer.json`` and its ``tokenizer_config.json`` (:func:`write_tokenizer_config`).

    Long runs are cut before training (module doc, MAX_PRETOKEN_CHARS): every run of more than
    ``max_pretoken_chars`` whitespace or non-whitespace characters reaches the trainer as pieces of at
    most that many characters. The trainer runs in a child process (``python -m
    largetrain_core.tokenizer``) fed through a pipe; any exception in the caller while it runs
    (KeyboardInterrupt, Dagster's run termination) ends the child with SIGTERM, then SIGKILL, before
    it propagates, so a cancelled training stops within a second.

    Returns ``(info, stats)``, stats ``{"documents", "characters", "long_runs_split", "max_pretoken_chars"}``
    (``long_runs_split``: runs longer than ``max_pretoken_chars`` that were cut). Raises ValueError if
    vocab_size is below the 256 byte symbols + EOS or max_pretoken_chars < 1, RuntimeError naming the
    exit status and the child's last error output if the training process fails.
    """
    if vocab_size < 257:
        raise ValueError(f"vocab_size {vocab_size} < 257: a byte-level BPE needs the 256 bytes plus EOS")
    if max_pretoken_chars < 1:
        raise ValueError(f"max_pretoken_chars must be >= 1, got {max_pretoken_chars}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stats = {"documents": 0, "characters": 0, "long_runs_split": 0, "max_pretoken_chars": max_pretoken_chars}
    cmd = [
        sys.executable,
        "-m",
        "largetrain_core.tokenizer",
        str(out_dir),
        str(vocab_size),
        str(min_frequency),
        str(os.getpid()),
    ]
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err)
        try:
            _feed_and_wait(proc, texts, max_pretoken_chars, stats)
        finally:
            _stop(proc)
        if proc.returncode != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace").strip().splitlines()[-20:]
            raise RuntimeError(
                f"BPE training process {' '.join(cmd)} exited with status {proc.returncode}:\n" + "\n".join(tail)
            )
    info = load_tokenizer_info(out_dir)
    write_tokenizer_config(info)
    return info, stats


def _feed_and_wait(proc: subprocess.Popen, texts: Iterable[list[str]], max_pretoken_chars: int, stats: dict) -> None:
    """Send the batches of ``texts`` (long runs cut, counted in ``stats``) to the training process, then
    wait for it to end in short waits, so that an interrupt is raised between them."""
    try:
        for batch in texts:
            proc.stdin.write(_frame(_pieces(batch, max_pretoken_chars, stats)))
        proc.stdin.write(_END)
        proc.stdin.close()
    except BrokenPipeError:  # the child failed while reading; its error output says why
        pass
    while True:
        try:
            proc.wait(timeout=0.2)  # short waits: an interrupt is raised between them
            break
        except subprocess.TimeoutExpired:
            continue


def text_bytes(parts: list[Path]) -> int:
    """UTF-8 bytes of the ``text`` column of Parquet ``parts``, from their footers: per column chunk its
    uncompressed size less 4 bytes per value (PLAIN byte arrays are a 4-byte length and the bytes; the
    page headers and definition levels are counted too, a few bytes per page). A part whose text is
    dictionary-encoded is read and measured instead."""
    import polars as pl  # reading text parts: not imported by what only reads token shards

    total = 0
    for part in parts:
        with loading(part, "Parquet part file of a text stage (doc_id, text)"):
            md = pq.ParquetFile(part).metadata
            col = md.schema.to_arrow_schema().get_field_index("text")
            chunks = [md.row_group(g).column(col) for g in range(md.num_row_groups)]
            if any("DICTIONARY" in e for c in chunks for e in c.encodings if e != "RLE"):
                total += int(pl.read_parquet(part, columns=["text"])["text"].str.len_bytes().sum() or 0)
            else:
                total += sum(c.total_uncompressed_size - 4 * c.num_values for c in chunks)
    return total


@dataclass(frozen=True)
class TrainingSample:
    """The documents the BPE trainer reads (module doc, Training sample): ``fraction`` of them, drawn by
    xxh3-64(doc_id, ``seed``); ``corpus_bytes`` is :func:`text_bytes` of ``parts``."""

    parts: tuple[Path, ...]
    fraction: float
    seed: int
    max_bytes: int | None
    corpus_bytes: int

    def texts(self, stats: dict | None = None, batch: int = 1000) -> Iterator[list[str]]:
        """The sampled texts in corpus order, in lists of up to ``batch``; ``stats`` (if given) gets
        ``corpus_documents`` (documents looked at) and ``sampled_documents``. Reads a part's text only
        when one of its documents is sampled."""
        import polars as pl

        limit = math.ceil(self.fraction * 2**64)  # h / 2**64 < fraction, exactly, for an integer h
        seen = taken = 0
        for part in self.parts:
            with loading(part, "Parquet part file of a text stage (doc_id, text)"):
                ids = pl.read_parquet(part, columns=["doc_id"])["doc_id"]
                seen += len(ids)
                keep = ids.to_list() if self.fraction >= 1 else None
                mask = (
                    None
                    if keep is not None
                    else pl.Series(
                        [xxhash.xxh3_64_intdigest(d.encode(), self.seed) < limit for d in ids.to_list()],
                        dtype=pl.Boolean,
                    )
                )
                if mask is not None and not mask.any():
                    continue
                text = pl.read_parquet(part, columns=["text"])["text"]
                if mask is not None:
                    text = text.filter(mask)
            taken += len(text)
            for i in range(0, len(text), batch):
                yield text.slice(i, batch).to_list()
        if stats is not None:
            stats.update(corpus_documents=seen, sampled_documents=taken)

    def describe(self) -> dict:
        """What the sample was, for the stats: ``sample_fraction``, ``sample_seed``, ``max_training_bytes``,
        ``corpus_bytes``."""
        return {
            "sample_fraction": self.fraction,
            "sample_seed": self.seed,
            "max_training_bytes": self.max_bytes,
            "corpus_bytes": self.corpus_bytes,
        }


def training_sample(parts: list[Path], max_bytes: int | None = MAX_TRAINING_BYTES, seed: int = 0) -> TrainingSample:
    """The training sample of the documents of Parquet ``parts`` (doc_id, text) in corpus order: fraction
    min(1, ``max_bytes`` / :func:`text_bytes`); ``max_bytes`` None: every document. Raises ValueError when
    ``max_bytes`` < 1, ArtifactError naming a part that cannot be read."""
    if max_bytes is not None and max_bytes < 1:
        raise ValueError(f"max_training_bytes must be >= 1 or null (no sample), got {max_bytes}")
    total = text_bytes(parts)
    fraction = 1.0 if max_bytes is None or total <= max_bytes else max_bytes / total
    return TrainingSample(tuple(parts), fraction, seed, max_bytes, total)


# Unicode White_Space (PropList.txt), the characters the byte-level pre-tokenizer's \s matches.
_WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_END = struct.pack("<Q", 2**64 - 1)


@functools.lru_cache(maxsize=8)
def _long_run(n: int) -> re.Pattern:
    """A maximal run of more than ``n`` non-whitespace, or whitespace, characters (the lookbehinds
    anchor a match at the start of its run, so finding every run is linear in the text)."""
    return re.compile(rf"(?<![^{_WS}])[^{_WS}]{{{n + 1},}}|(?<![{_WS}])[{_WS}]{{{n + 1},}}")


def _pieces(batch: list[str], n: int, stats: dict) -> Iterator[str]:
    """The texts of ``batch``, each cut after every ``n`` characters of a run longer than ``n``."""
    pattern = _long_run(n)
    for text in batch:
        stats["documents"] += 1
        stats["characters"] += len(text)
        start = 0
        for m in pattern.finditer(text):
            stats["long_runs_split"] += 1
            for cut in range(m.start() + n, m.end(), n):
                yield text[start:cut]
                start = cut
        yield text[start:]


def _frame(pieces: Iterable[str]) -> bytes:
    """Length-prefixed UTF-8 (8-byte little-endian length, then the bytes) of each piece."""
    out = []
    for piece in pieces:
        b = piece.encode()
        out += (struct.pack("<Q", len(b)), b)
    return b"".join(out)


def _read_frames(stream) -> Iterator[str]:
    while True:
        head = stream.read(8)
        if len(head) < 8:
            raise EOFError("the training input ended without its end marker: the parent process went away")
        (n,) = struct.unpack("<Q", head)
        if n == 2**64 - 1:
            return
        yield stream.read(n).decode()


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the training process if it still runs (Python's default SIGTERM action ends it even inside
    the Rust trainer), SIGKILL after 5 s; always reap it."""
    if proc.stdin and not proc.stdin.closed:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _train_worker(out_dir: Path, vocab_size: int, min_frequency: int, stream) -> None:
    """The child process: train on the framed texts of ``stream`` and save ``out_dir/tokenizer.json``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_read_frames(stream), trainer=trainer)
    tok.save(str(Path(out_dir) / "tokenizer.json"))


def _exit_with_parent(parent_pid: int) -> None:
    """Linux: have the kernel SIGTERM this process when its parent dies (prctl PR_SET_PDEATHSIG), so a
    SIGKILLed asset process does not leave a training behind; exit if the parent is already gone."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:
        sys.exit("the process that started the BPE training is gone")


def read_tokenizer(path: Path) -> Tokenizer:
    """``Tokenizer.from_file`` whose failures name the file: MissingArtifactError when absent, ArtifactError
    when it is not a valid tokenizer.json (cut short, garbled)."""
    with loading(path, "Hugging Face tokenizers tokenizer.json"):
        return Tokenizer.from_file(str(path))


def load_tokenizer_info(path: Path) -> TokenizerInfo:
    """Read tokenizer.json (a file, or a directory holding it and optionally tokenizer_config.json).

    EOS is ``eos_token`` from tokenizer_config.json if present, else ``<|endoftext|>``, else (a BERT-style
    encoder's tokenizer, which has neither) its ``sep_token``, the token that ends its sequences; BOS is
    ``bos_token`` from tokenizer_config.json if present. Raises MissingArtifactError (a
    FileNotFoundError) when there is no tokenizer.json, ArtifactError (a ValueError) naming the file
    when tokenizer.json or tokenizer_config.json cannot be parsed, and ValueError when the EOS token
    is not in the vocabulary.
    """
    path = Path(path)
    tj = path / "tokenizer.json" if path.is_dir() else path
    if not tj.exists():
        raise MissingArtifactError(f"{tj}: missing; expected a Hugging Face tokenizers tokenizer.json")
    tok = read_tokenizer(tj)
    eos, bos = EOS_TOKEN, None
    cfg_file = tj.parent / "tokenizer_config.json"
    if cfg_file.exists():
        cfg = read_json(cfg_file, "transformers tokenizer_config.json")
        sep = _token_str(cfg.get("sep_token"))
        eos = _token_str(cfg.get("eos_token")) or (sep if sep and tok.token_to_id(eos) is None else eos)
        bos = _token_str(cfg.get("bos_token"))
    eos_id = tok.token_to_id(eos)
    if eos_id is None:
        raise ValueError(f"{tj}: EOS token {eos!r} is not in the vocabulary")
    bos_id = tok.token_to_id(bos) if bos else None
    if bos and bos_id is None:
        raise ValueError(f"{tj}: BOS token {bos!r} is not in the vocabulary")
    vocab_size = max(tok.get_vocab(with_added_tokens=True).values()) + 1  # not the count: ids may have gaps
    return TokenizerInfo(tj, eos_id, bos_id, vocab_size, hashlib.sha256(tj.read_bytes()).hexdigest())


def _token_str(value) -> str | None:
    if isinstance(value, dict):  # {"content": "</s>", ...} in older tokenizer_config.json files
        return value.get("content")
    return value


# GPT-2's pre-tokenizer pattern: tokenizers' ByteLevel(use_regex=True) splits with it, tiktoken's r50k_base too
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character standing for each byte (printable bytes stand for
    themselves, the others for 256 + n) mapped back to the byte (openai/gpt-2 encoder.py, bytes_to_unicode)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def tiktoken_ranks(tokenizer_json: dict) -> tuple[dict[bytes, int] | None, str]:
    """The tiktoken mergeable ranks (token bytes -> id) of a tokenizers ``tokenizer.json`` (parsed) that
    tiktoken encodes with the same ids as tokenizers' ``encode_batch`` (special-token text as plain
    text, no special tokens added), and "" ; or (None, the reason it cannot).

    Expressible: a byte-level BPE (model BPE without dropout, unknown token, subword prefix/suffix or
    byte fallback; pre-tokenizer ByteLevel with GPT-2's pattern and no prefix space; no normalizer),
    whose vocabulary holds the 256 bytes, whose merged tokens are made by exactly one merge each, in
    the order of their ids (tiktoken merges the pair of lowest rank first, tokenizers the merge listed
    first: the same order), and whose added tokens are all special (a non-special added token is
    matched in text by tokenizers, not by tiktoken). The BPE trainer (:func:`train_bpe`) makes such a
    tokenizer; an imported model's may not be."""
    model, pre = tokenizer_json.get("model") or {}, tokenizer_json.get("pre_tokenizer") or {}
    if model.get("type") != "BPE":
        return None, f"model {model.get('type')!r}, not BPE"
    for key in ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            return None, f"BPE {key} {model[key]!r}"
    if model.get("byte_fallback"):
        return None, "BPE byte_fallback"
    if tokenizer_json.get("normalizer") is not None:
        return None, f"normalizer {tokenizer_json['normalizer'].get('type')!r}"
    if pre.get("type") == "Sequence" and len(pre.get("pretokenizers") or []) == 1:
        pre = pre["pretokenizers"][0]
    if pre.get("type") != "ByteLevel" or pre.get("add_prefix_space") or not pre.get("use_regex", True):
        return None, f"pre-tokenizer {pre.get('type')!r} (add_prefix_space, use_regex as set), not GPT-2's ByteLevel"
    added = tokenizer_json.get("added_tokens") or []
    plain = [t["content"] for t in added if not t.get("special")]
    if plain:
        return None, f"added tokens that are not special: {plain[:3]}"
    alphabet = _byte_level_alphabet()
    special = {t["content"] for t in added}
    ranks: dict[bytes, int] = {}
    for token, i in model.get("vocab", {}).items():
        if token in special:
            continue
        try:
            ranks[bytes(alphabet[ch] for ch in token)] = i
        except KeyError:
            return None, f"vocabulary token {token!r} is not byte-level"
    if len(ranks) != len(model.get("vocab", {})) - len(special & set(model.get("vocab", {}))):
        return None, "two vocabulary tokens spell the same bytes"
    if any(bytes([b]) not in ranks for b in range(256)):
        return None, "the vocabulary lacks some of the 256 bytes"
    last, made = -1, set()
    for m in model.get("merges", []):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        try:
            i = model["vocab"][a + b]
        except KeyError:
            return None, f"merge {a!r} {b!r} makes no vocabulary token"
        if i <= last or i <= model["vocab"][a] or i <= model["vocab"][b]:
            return None, f"merge {a!r} {b!r}: the ids of the merged tokens are not in merge order"
        last = i
        made.add(i)
    if len(made) + 256 != len(ranks):
        return None, "vocabulary tokens that no merge makes (or made by more than one)"
    return ranks, ""


@dataclass(frozen=True)
class DocumentEncoder:
    """Encodes documents following the EOS/BOS policy (module doc), with ``engine`` "tiktoken" when the
    tokenizer is one tiktoken expresses (:func:`tiktoken_ranks`; the same ids as tokenizers, several
    times faster per core: benchmarks/results/tokenizer_engines.json) and tiktoken is installed, else "tokenizers";
    ``reason``: why not tiktoken ("" when it is). Make one with :func:`document_encoder`; it may be
    shared by threads (neither engine's state changes while encoding)."""

    info: TokenizerInfo
    tok: Tokenizer
    engine: str
    reason: str
    tiktoken: object | None  # tiktoken.Encoding

    def __call__(self, texts: list[str]) -> list[np.ndarray]:
        """One 1-D array per document of ``texts``, dtype ``info.dtype``: its ids (BOS first when the
        tokenizer has one), ending in ``info.eos_id``. Several threads, as tokenizers' pool
        (RAYON_NUM_THREADS, else every core)."""
        if self.tiktoken is None:  # self.tok is this encoder's own, with encode_special_tokens set
            encoded = [e.ids for e in self.tok.encode_batch_fast(texts, add_special_tokens=False)]
            return _with_eos(self.info, encoded)
        threads = int(os.environ.get("RAYON_NUM_THREADS") or os.cpu_count() or 1)
        if os.environ.get("TOKENIZERS_PARALLELISM", "").lower() in ("0", "false", "off", "no"):
            threads = 1
        if threads == 1 or len(texts) < 2:
            encoded = [self.tiktoken.encode_ordinary(t) for t in texts]
        else:
            encoded = self.tiktoken.encode_ordinary_batch(texts, num_threads=threads)
        return _with_eos(self.info, encoded)


def _with_eos(info: TokenizerInfo, encoded: list[list[int]]) -> list[np.ndarray]:
    """Each document's ids with BOS (when the tokenizer has one) in front and EOS after, dtype ``info.dtype``."""
    head = [info.bos_id] if info.bos_id is not None else []
    return [np.array(head + ids + [info.eos_id], dtype=info.dtype) for ids in encoded]


@functools.lru_cache(maxsize=4)
def document_encoder(info: TokenizerInfo, engine: str = "auto") -> DocumentEncoder:
    """The :class:`DocumentEncoder` of the tokenizer ``info`` describes. ``engine``: "auto" (tiktoken
    when it expresses the tokenizer and is installed), "tokenizers" (always that one) or "tiktoken"
    (raises ValueError saying why it cannot). Converting is checked: every vocabulary token's text
    must encode to the same ids with both engines, else tokenizers is used, the reason saying so."""
    if engine not in ("auto", "tokenizers", "tiktoken"):
        raise ValueError(f"engine must be 'auto', 'tokenizers' or 'tiktoken', got {engine!r}")
    tok = read_tokenizer(info.path)
    tok.encode_special_tokens = True  # special-token text inside a document is plain text (module doc)
    if engine == "tokenizers":
        return DocumentEncoder(info, tok, "tokenizers", "asked for tokenizers", None)
    ranks, reason = tiktoken_ranks(json.loads(info.path.read_bytes()))
    encoding = None
    if ranks is not None:
        try:
            import tiktoken
        except ImportError:
            reason = "tiktoken is not installed"
        else:
            encoding = tiktoken.Encoding(
                name=f"largetrain-{info.sha256[:16]}", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={}
            )
            texts = [t.decode("utf-8", "replace") for t in ranks]
            fast = DocumentEncoder(info, tok, "tiktoken", "", encoding)
            if [a.tolist() for a in fast(texts)] != [a.tolist() for a in encode_documents(tok, info, texts)]:
                encoding, reason = None, "tiktoken's ids differ from tokenizers' on the vocabulary's own tokens"
    if encoding is None:
        if engine == "tiktoken":
            raise ValueError(f"{info.path}: tiktoken cannot encode with this tokenizer: {reason}")
        return DocumentEncoder(info, tok, "tokenizers", reason, None)
    return DocumentEncoder(info, tok, "tiktoken", "", encoding)


def encode_documents(tok: Tokenizer, info: TokenizerInfo, texts: list[str]) -> list[np.ndarray]:
    """Encode a batch of documents with tokenizers (its thread pool) following the EOS/BOS policy.
    The shards use :func:`document_encoder`, which gives the same ids, with tiktoken where it can.

    Returns one 1-D array per document, dtype ``info.dtype``, ending in ``info.eos_id``.
    """
    ordinary = tok.encode_special_tokens
    tok.encode_special_tokens = True  # special-token text inside a document is plain text (module doc)
    try:
        encodings = tok.encode_batch_fast(texts, add_special_tokens=False)
    finally:
        tok.encode_special_tokens = ordinary
    return _with_eos(info, [e.ids for e in encodings])


def save_hf_tokenizer(info: TokenizerInfo, out_dir: Path) -> None:
    """Write the tokenizer as a transformers ``PreTrainedTokenizerFast`` directory (tokenizer.json,
    tokenizer_config.json: :func:`save_tokenizer`), loadable with ``AutoTokenizer.from_pretrained`` in
    transformers 4.x and 5.

    ``split_special_tokens`` is saved as true, so ``AutoTokenizer`` encodes text that spells a special
    token as plain text, the same ids as :func:`encode_documents` (module doc); EOS/BOS are added by id."""
    from transformers import PreTrainedTokenizerFast

    tok = read_tokenizer(info.path)
    kwargs = {"eos_token": tok.id_to_token(info.eos_id), "split_special_tokens": True}
    if info.bos_id is not None:
        kwargs["bos_token"] = tok.id_to_token(info.bos_id)
    save_tokenizer(PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs), out_dir)


# keys transformers 5 writes into tokenizer_config.json that name its own loading, not the tokenizer
_LOADER_KEYS = ("backend", "is_local", "local_files_only")


def save_tokenizer(tokenizer, out_dir: Path) -> None:
    """``tokenizer.save_pretrained(out_dir)``, then make its tokenizer_config.json one that older tools
    load: transformers 5 names its own class (``TokenizersBackend``), which transformers 4.x and the
    tools that pin it (optimum-onnx, llama.cpp's converter) cannot import; the file names
    ``PreTrainedTokenizerFast``, which both majors load from the same tokenizer.json (added special
    tokens as ``additional_special_tokens``: 4.x reads 5.x's ``extra_special_tokens`` list as a
    mapping and fails). A tokenizer
    without a pad token gets EOS as its pad token (GPT-2's convention), so batched padding works; the
    model's config.json keeps ``pad_token_id`` null (largetrain_core.model.build_config), so EOS's
    embedding row still trains. Every transformers tokenizer the project writes goes through here."""
    out_dir = Path(out_dir)
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.save_pretrained(str(out_dir))
    cfg_file = out_dir / "tokenizer_config.json"
    cfg = read_json(cfg_file, "transformers tokenizer_config.json")
    for key in _LOADER_KEYS:
        cfg.pop(key, None)
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    if isinstance(cfg.get("extra_special_tokens"), list):  # 5.x's list is 4.x's additional_special_tokens
        cfg["additional_special_tokens"] = cfg.pop("extra_special_tokens")
    cfg_file.write_text(json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def write_tokenizer_config(info: TokenizerInfo) -> Path:
    """Write ``tokenizer_config.json`` beside ``info.path`` (a trained tokenizer.json), naming its special
    tokens: ``eos_token``, ``bos_token`` when there is one, the class ``PreTrainedTokenizerFast``,
    ``split_special_tokens``. Megatron-Core's Hugging Face tokenizer and ``AutoTokenizer`` pointed at the
    directory then find the end-of-text token. No pad token: Megatron-Core's GPTDataset warns of a pad
    id that collides with EOS (the model exports declare one: :func:`save_tokenizer`). tokenizer.json is
    left byte for byte (its digest, ``info.sha256``, is in the shards' versions). Returns the file's path."""
    tok = read_tokenizer(info.path)
    eos = tok.id_to_token(info.eos_id)
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": eos,
        "split_special_tokens": True,
        "clean_up_tokenization_spaces": False,
    }
    if info.bos_id is not None:
        cfg["bos_token"] = tok.id_to_token(info.bos_id)
    out = info.path.parent / "tokenizer_config.json"
    out.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out


def copy_tokenizer(src: Path, out_dir: Path) -> TokenizerInfo:
    """Take the tokenizer of an existing model instead of training one: copy ``tokenizer.json`` and
    ``tokenizer_config.json`` (when present: it names EOS/BOS) from the local directory ``src`` into
    ``out_dir``. Raises FileNotFoundError / ValueError as :func:`load_tokenizer_info`."""
    src, out_dir = Path(src), Path(out_dir)
    load_tokenizer_info(src)  # validate before copying
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (src / name).exists():
            (out_dir / name).write_bytes((src / name).read_bytes())
    return load_tokenizer_info(out_dir)


if __name__ == "__main__":  # the training child of train_bpe: OUT_DIR VOCAB_SIZE MIN_FREQUENCY PARENT_PID
    _exit_with_parent(int(sys.argv[4]))
    _train_worker(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.stdin.buffer)
