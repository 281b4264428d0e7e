"""largetrain_core.tokenizer: BPE training (long runs cut, cancellable), loading, the storage dtype and the
EOS/BOS policy on every path."""

import hashlib
import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, normalizers

from largetrain_core.tokenizer import (
    EOS_TOKEN,
    MAX_PRETOKEN_CHARS,
    document_encoder,
    encode_documents,
    load_tokenizer_info,
    read_tokenizer,
    save_hf_tokenizer,
    storage_dtype,
    train_bpe,
)


def test_train_bpe_vocab_eos_and_file(bpe_dir, sentences):
    info = load_tokenizer_info(bpe_dir)
    tok = Tokenizer.from_file(str(bpe_dir / "tokenizer.json"))
    assert info.path == bpe_dir / "tokenizer.json"
    assert info.vocab_size == 300 == tok.get_vocab_size(with_added_tokens=True)
    assert info.eos_id == tok.token_to_id(EOS_TOKEN) is not None
    assert info.bos_id is None
    assert info.dtype == np.uint16
    assert info.sha256 == hashlib.sha256((bpe_dir / "tokenizer.json").read_bytes()).hexdigest()
    assert load_tokenizer_info(bpe_dir / "tokenizer.json") == info  # the file itself works too
    # merges were learned: a frequent sentence needs far fewer ids than bytes
    ids = tok.encode(sentences[0], add_special_tokens=False).ids
    assert len(ids) < len(sentences[0].encode()) / 2
    assert max(ids) < info.vocab_size


@pytest.mark.parametrize(
    "text",
    ["The cat walks to the river.", "Zebras \u00e9t\u00e9 \U0001f600 \u65e5\u672c\u8a9e", "tab\tnew\nline\x00nul", ""],
)
def test_byte_level_bpe_round_trips_any_text(bpe_dir, text):
    tok = Tokenizer.from_file(str(bpe_dir / "tokenizer.json"))
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids) == text  # byte-level: no unknown token, nothing lost


def test_train_bpe_rejects_vocab_below_bytes_plus_eos(tmp_path):
    with pytest.raises(ValueError):
        train_bpe([["some text"]], 256, tmp_path)


def test_encode_documents_appends_eos(bpe_dir):
    info = load_tokenizer_info(bpe_dir)
    tok = Tokenizer.from_file(str(info.path))
    text = "The cat walks to the river."
    (doc,) = encode_documents(tok, info, [text])
    assert doc.dtype == np.uint16
    assert doc[-1] == info.eos_id
    assert doc[:-1].tolist() == tok.encode(text, add_special_tokens=False).ids
    assert (doc == info.eos_id).sum() == 1
    docs = encode_documents(tok, info, ["A dog.", "", "My sister."])
    assert [d.tolist() for d in docs] == [
        tok.encode(t, add_special_tokens=False).ids + [info.eos_id] for t in ["A dog.", "", "My sister."]
    ]
    assert docs[1].tolist() == [info.eos_id]


def test_literal_eos_text_inside_a_document_is_not_a_document_boundary(bpe_dir):
    """A web page that quotes "<|endoftext|>" must not get an EOS id in its middle (nanoGPT's encode_ordinary)."""
    info = load_tokenizer_info(bpe_dir)
    tok = Tokenizer.from_file(str(info.path))
    text = f"GPT-2 separates documents with {EOS_TOKEN} between them."
    (doc,) = encode_documents(tok, info, [text])
    assert (doc == info.eos_id).sum() == 1 and doc[-1] == info.eos_id
    assert tok.decode(doc[:-1].tolist(), skip_special_tokens=False) == text
    # and the caller's tokenizer still treats the special token as special afterwards
    assert tok.encode(EOS_TOKEN, add_special_tokens=False).ids == [info.eos_id]


def test_bos_and_eos_from_tokenizer_config(tmp_path, make_word_tokenizer):
    d = make_word_tokenizer(
        tmp_path,
        ["hello", "world"],
        specials=("<s>", "</s>"),
        config={"bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": False}},
    )
    info = load_tokenizer_info(d)
    assert (info.bos_id, info.eos_id, info.vocab_size) == (2, 3, 4)
    tok = Tokenizer.from_file(str(info.path))
    assert [a.tolist() for a in encode_documents(tok, info, ["hello world", "world"])] == [[2, 0, 1, 3], [2, 1, 3]]


def test_load_tokenizer_info_errors(tmp_path, make_word_tokenizer):
    with pytest.raises(FileNotFoundError):
        load_tokenizer_info(tmp_path / "nothing")
    no_eos = make_word_tokenizer(tmp_path / "no_eos", ["a", "b"], specials=())
    with pytest.raises(ValueError, match="EOS"):
        load_tokenizer_info(no_eos)
    wrong_eos = make_word_tokenizer(tmp_path / "wrong_eos", ["a", "b"], config={"eos_token": "</s>"})
    with pytest.raises(ValueError, match="EOS"):
        load_tokenizer_info(wrong_eos)
    no_bos = make_word_tokenizer(tmp_path / "no_bos", ["a", "b"], config={"bos_token": "<s>"})
    with pytest.raises(ValueError, match="BOS"):
        load_tokenizer_info(no_bos)


def test_storage_dtype_boundaries():
    assert storage_dtype(256) == np.uint16
    assert storage_dtype(65_536) == np.uint16  # ids 0..65535
    assert storage_dtype(65_537) == np.uint32
    with pytest.raises(ValueError):
        storage_dtype(0)


@pytest.mark.parametrize("base,dtype", [(65_536, np.uint32), (65_535, np.uint16)])
def test_vocabulary_at_the_uint16_boundary(tmp_path, make_word_tokenizer, base, dtype):
    d = make_word_tokenizer(tmp_path, [f"w{i}" for i in range(base)])
    info = load_tokenizer_info(d)
    assert (info.eos_id, info.vocab_size, info.dtype) == (base, base + 1, dtype)
    tok = Tokenizer.from_file(str(info.path))
    (doc,) = encode_documents(tok, info, [f"w{base - 1} w0 w{base - 2}"])
    assert doc.dtype == dtype
    assert doc.tolist() == [base - 1, 0, base - 2, base]


def test_sparse_ids_size_the_vocabulary_by_the_largest_id(tmp_path, make_word_tokenizer):
    """ids < vocab_size must hold even when a tokenizer's ids have gaps (3 tokens, largest id 70,000)."""
    d = make_word_tokenizer(tmp_path, {"a": 0, "b": 70_000})
    assert json.loads((d / "tokenizer.json").read_text())["model"]["vocab"]["b"] == 70_000
    info = load_tokenizer_info(d)
    tok = Tokenizer.from_file(str(info.path))
    assert info.vocab_size > 70_000 and info.dtype == np.uint32
    (doc,) = encode_documents(tok, info, ["b a"])
    assert doc.tolist() == [70_000, 0, info.eos_id]


# ---------------------------------------------------------------------------------------------
# long runs (tests/cases/genome_sequence.jsonl): cut before training, counted; training cancellable


def genome_texts(cases) -> list[str]:
    return [json.loads(line)["text"] for line in (cases / "genome_sequence.jsonl").read_text().splitlines()]


def test_genome_sequence_run_is_cut_before_training_and_counted(cases, tmp_path):
    texts = genome_texts(cases)
    assert max(len(t) for t in texts) > 300_000
    info, stats = train_bpe([texts[:2], texts[2:]], 512, tmp_path)
    # one run (the 300,000 letters) longer than MAX_PRETOKEN_CHARS: cut, counted; the rest untouched
    assert stats == {
        "documents": 4,
        "characters": sum(map(len, texts)),
        "long_runs_split": 1,
        "max_pretoken_chars": MAX_PRETOKEN_CHARS,
    }
    tok = Tokenizer.from_file(str(info.path))
    assert max(len(tok.decode([i])) for i in range(info.vocab_size) if i != info.eos_id) <= MAX_PRETOKEN_CHARS
    for text in texts:  # the saved tokenizer encodes the uncut run and gives it back
        assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text


@pytest.mark.parametrize(
    "text,runs",
    [
        ("abcde fghij", 0),  # runs of exactly the bound are not cut
        ("abcdef ghij", 1),  # a run of letters one longer
        ("x" + " " * 6 + "y", 1),  # whitespace
        ("x\u2003\u2003\u2003\n\n\u3000y", 1),  # Unicode White_Space (EM SPACE, ideographic space)
        ("ab-12_cd,ef!", 1),  # non-whitespace of mixed classes
        ("aaaaaaaaaaa bbbbbbbbbbbbbbbbb", 2),
    ],
)
def test_every_run_longer_than_max_pretoken_chars_is_counted(tmp_path, text, runs):
    info, stats = train_bpe([[text] * 3], 260, tmp_path, min_frequency=1, max_pretoken_chars=5)
    assert stats["long_runs_split"] == 3 * runs
    tok = Tokenizer.from_file(str(info.path))
    # no merge crosses a cut: no learned token is longer than the bound (+1: a leading space)
    assert max(len(tok.decode([i])) for i in range(info.vocab_size) if i != info.eos_id) <= 6


def test_bpe_training_failure_names_the_status_and_the_error(tmp_path):
    (tmp_path / "tokenizer.json").mkdir()  # the child cannot save there
    with pytest.raises(RuntimeError, match=r"exited with status 1:(.|\n)*tokenizer\.json"):
        train_bpe([["some text to train on"]], 300, tmp_path)


def _processes_with(marker: str) -> list[int]:
    """Live processes (not zombies) whose command line contains ``marker``."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if d.name.isdigit() and marker in cmd and state != "Z":
            out.append(int(d.name))
    return out


def test_interrupting_bpe_training_ends_the_training_process(cases, tmp_path):
    """SIGINT (what Dagster's run termination and Ctrl-C deliver) while the trainer runs on the genome
    case without the cut (about a minute of uninterruptible Rust): the training process is gone when
    the caller's KeyboardInterrupt has propagated."""
    out = tmp_path / "tok-being-cancelled"
    script = textwrap.dedent(f"""
        import json, sys
        from largetrain_core.tokenizer import train_bpe
        texts = [json.loads(x)["text"] for x in open({str(cases / "genome_sequence.jsonl")!r})]
        def batches():
            yield texts
            print("fed", flush=True)  # every text is in the pipe: the child trains from here on
        train_bpe(batches(), 8192, {str(out)!r}, max_pretoken_chars=10**9)
        print("finished", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "fed"
        trainers = [p for p in _processes_with(str(out)) if p != proc.pid]
        assert len(trainers) == 1  # the training child (its command line names the output directory)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "KeyboardInterrupt" in stderr and "finished" not in stdout
    assert proc.returncode != 0
    assert not _processes_with(str(out)), "the BPE training process outlived the interrupted caller"
    assert not (out / "tokenizer.json").exists()


# ---------------------------------------------------------------------------------------------
# "<|endoftext|>" written inside a document: plain text on every path


def test_literal_eos_text_is_plain_text_in_the_shards_and_the_saved_hf_tokenizer(bpe_dir, tmp_path):
    from transformers import AutoTokenizer

    info = load_tokenizer_info(bpe_dir)
    hf_dir = tmp_path / "hf"
    save_hf_tokenizer(info, hf_dir)
    hf = AutoTokenizer.from_pretrained(str(hf_dir))  # as evaluation and any downstream user loads it
    texts = [f"GPT-2 separates documents with {EOS_TOKEN} between them.", f"{EOS_TOKEN}", f"a{EOS_TOKEN}{EOS_TOKEN}b"]
    docs = encode_documents(Tokenizer.from_file(str(info.path)), info, texts)
    for text, doc in zip(texts, docs):
        ids = hf(text, add_special_tokens=False).input_ids
        assert ids == doc[:-1].tolist()  # the same ids on both paths ...
        assert info.eos_id not in ids  # ... and no EOS id inside the document
        assert hf.decode(ids) == text
    assert hf.eos_token_id == info.eos_id
    assert hf.encode(texts[0], add_special_tokens=False) == docs[0][:-1].tolist()


# ---------------------------------------------------------------------------------------------
# the training sample


def _sample_parts(d: Path, splits: list[int], n: int = 300) -> list[Path]:
    """``n`` documents (ids ``d0``.., texts of 20 to 200 bytes) cut into part files after the indices ``splits``."""
    from helpers.parts import write_parts

    rows = [(f"d{i}", f"text {i} " + "x" * (i * 7 % 180)) for i in range(n)]
    bounds = [0, *splits, n]
    write_parts(d, [rows[a:b] for a, b in zip(bounds, bounds[1:])])
    return sorted(d.glob("part-*.parquet"))


def test_training_sample_is_seeded_bounded_and_the_same_whatever_the_part_files(tmp_path):
    import xxhash

    from largetrain_core.tokenizer import text_bytes, training_sample

    parts = _sample_parts(tmp_path / "a", [100, 250])
    exact = sum(len(f"text {i} ".encode()) + i * 7 % 180 for i in range(300))
    assert exact <= text_bytes(parts) <= exact + 200  # the footers: exact up to page headers and levels
    sample = training_sample(parts, max_bytes=exact // 4, seed=3)
    assert 0.24 < sample.fraction < 0.26
    stats: dict = {}
    drawn = [t for batch in sample.texts(stats, batch=7) for t in batch]
    expected = [
        f"text {i} " + "x" * (i * 7 % 180)
        for i in range(300)
        if xxhash.xxh3_64_intdigest(f"d{i}".encode(), 3) / 2**64 < sample.fraction
    ]
    assert drawn == expected and stats == {"corpus_documents": 300, "sampled_documents": len(expected)}
    assert 0.15 * exact < sum(len(t) for t in drawn) < 0.35 * exact  # about max_bytes
    other = training_sample(_sample_parts(tmp_path / "b", [1, 2, 299]), max_bytes=exact // 4, seed=3)
    assert [t for b in other.texts() for t in b] == drawn  # other part files, the same sample
    assert [t for b in training_sample(parts, max_bytes=exact // 4, seed=4).texts() for t in b] != drawn
    whole = training_sample(parts, max_bytes=10 * exact)  # under the bound: every document, in order
    assert whole.fraction == 1.0 and [t for b in whole.texts() for t in b] == [
        r for i in range(300) for r in [f"text {i} " + "x" * (i * 7 % 180)]
    ]
    assert training_sample(parts, max_bytes=None).fraction == 1.0
    with pytest.raises(ValueError, match="max_training_bytes"):
        training_sample(parts, max_bytes=0)


def test_text_bytes_of_a_dictionary_encoded_part_is_measured(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from largetrain_core.tokenizer import text_bytes

    texts = ["the same text, again"] * 500 + ["one more"]
    pq.write_table(
        pa.table({"doc_id": [str(i) for i in range(len(texts))], "text": texts}),
        tmp_path / "part-00000.parquet",
        use_dictionary=True,
    )
    assert text_bytes([tmp_path / "part-00000.parquet"]) == sum(len(t) for t in texts)


def _engine_texts() -> list[str]:
    """Every text of the handed cases and test data (valid UTF-8, as documents reach the shards), and
    the shapes that part a BPE's engines if any does: special-token text, emoji, CJK, long runs of
    letters, digits and whitespace, Unicode spaces, contractions."""
    root = Path(__file__).resolve().parents[1]
    texts = []
    files = [*sorted((root / "cases").glob("*.jsonl")), *sorted((root / "data").glob("*.jsonl"))]
    for f in files:
        for line in f.read_text(encoding="utf-8-sig").splitlines():
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # the cases' unreadable lines (deep nesting, huge integers)
                continue
            if isinstance(record, dict):
                texts += [v for k, v in record.items() if isinstance(v, str) and k in ("text", "prompt", "answer")]
    for f in sorted((root / "data" / "recipe_corpora").rglob("*")) + [root / "cases" / "utf16_text" / "plain_utf8.txt"]:
        if f.is_file():
            texts.append(f.read_bytes().decode("utf-8", "replace"))
    texts += [
        "Quoting <|endoftext|> inside a page, and <|endoftext|><|endoftext|> twice, and <|endoftext",
        "Emoji 👩‍👩‍👧‍👦 family, 🇫🇷 flag, 👍🏽 tone, ❤️ heart, 🧬🧬🧬 runs",
        "中文分词测试：机器学习和自然语言处理。日本語のテキスト、カタカナ。한국어 문장입니다.",
        "x" * 5000 + " " + "9" * 3000 + " " + "é" * 2000,
        "lines\n\n\n\n    indented\t\t\ttabs   \r\n trailing   \n" + " " * 700 + "end" + "\u3000\u00a0\u2009 spaces",
        "They'll say it's John's, we've I'm you'd THEY'LL IT'S 's 't",
        "",
        " ",
        "\n",
    ]
    return [t for t in texts if t.encode("utf-8", "surrogatepass") == t.encode("utf-8", "ignore")]


@pytest.fixture(scope="module")
def engine_bpe(tmp_path_factory):
    texts = _engine_texts()
    out = tmp_path_factory.mktemp("engine-bpe")
    info, _ = train_bpe([texts], 2000, out)
    return info, texts


def test_tiktoken_gives_the_ids_of_tokenizers_on_every_handed_text(engine_bpe):
    """The trained byte-level BPE is encoded by tiktoken, with the ids tokenizers gives, on every text
    of tests/cases and tests/data and the hard shapes (special-token text as plain text, EOS by id)."""
    info, texts = engine_bpe
    fast = document_encoder(info)
    assert (fast.engine, fast.reason) == ("tiktoken", "")
    slow = document_encoder(info, "tokenizers")
    assert slow.engine == "tokenizers"
    ours, theirs = fast(texts), encode_documents(read_tokenizer(info.path), info, texts)
    assert len(ours) == len(texts) > 100
    for text, a, b in zip(texts, ours, theirs):
        assert a.dtype == b.dtype and a.tolist() == b.tolist(), text[:80]
    assert [a.tolist() for a in fast(texts[:5])] == [a.tolist() for a in slow(texts[:5])]
    special = next(a for t, a in zip(texts, ours) if t.startswith("Quoting <|endoftext|>"))
    assert special.tolist().count(info.eos_id) == 1 and special[-1] == info.eos_id


def test_a_tokenizer_tiktoken_cannot_express_falls_back_to_tokenizers(engine_bpe, tmp_path, make_word_tokenizer):
    """An imported model's tokenizer (another model, a normalizer, an added token that is not special)
    is encoded by tokenizers, the reason said; asking for tiktoken then raises ValueError."""
    info, _ = engine_bpe
    word = load_tokenizer_info(make_word_tokenizer(tmp_path / "word", ["a", "b"]))
    assert document_encoder(word).engine == "tokenizers" and "WordLevel" in document_encoder(word).reason
    with pytest.raises(ValueError, match="tiktoken cannot"):
        document_encoder(word, "tiktoken")
    tok = read_tokenizer(info.path)
    tok.add_tokens(["<plain>"])
    (tmp_path / "added").mkdir()
    tok.save(str(tmp_path / "added" / "tokenizer.json"))
    added = load_tokenizer_info(tmp_path / "added")
    enc = document_encoder(added)
    assert enc.engine == "tokenizers" and "not special" in enc.reason
    text = ["a <plain> b"]
    assert [a.tolist() for a in enc(text)] == [
        a.tolist() for a in encode_documents(read_tokenizer(added.path), added, text)
    ]
    tok = read_tokenizer(info.path)
    tok.normalizer = normalizers.NFKC()
    (tmp_path / "norm").mkdir()
    tok.save(str(tmp_path / "norm" / "tokenizer.json"))
    assert "normalizer" in document_encoder(load_tokenizer_info(tmp_path / "norm")).reason
