"""largetrain_core.tokenizer: BPE training, loading, the storage dtype and the EOS/BOS policy."""

import hashlib
import json

import numpy as np
import pytest
from tokenizers import Tokenizer

from largetrain_core.tokenizer import EOS_TOKEN, encode_documents, load_tokenizer_info, storage_dtype, train_bpe


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


@pytest.mark.parametrize("text", ["The cat walks to the river.", "Zebras \u00e9t\u00e9 \U0001F600 \u65e5\u672c\u8a9e",
                                  "tab\tnew\nline\x00nul", ""])
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
    assert [d.tolist() for d in docs] == [tok.encode(t, add_special_tokens=False).ids + [info.eos_id]
                                          for t in ["A dog.", "", "My sister."]]
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
    d = make_word_tokenizer(tmp_path, ["hello", "world"], specials=("<s>", "</s>"),
                            config={"bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": False}})
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
