"""Issue 40, the chat / instruction data core (largetrain_core.chat): reading and validating the chat,
prompt/completion and alpaca formats (tests/data/chat), the conversations' dedup text, the ChatML
template, the loss mask of rendered conversations, and packing with attention kept within each example
(checked on a Llama: each example's loss in a packed row equals its loss alone). Also the corpus
reader's verdict on a messages JSONL file read with text_field=messages."""

import json

import numpy as np
import pytest

from helpers import TESTS
from helpers.corpora import read_all
from largetrain_core import chat
from largetrain_core.chat import Conversation, Rejection

pytestmark = pytest.mark.unit

DATA = TESTS / "data" / "chat"


def _m(role, content, weight=1):
    return {"role": role, "content": content, "weight": weight}


@pytest.fixture(scope="module")
def tok(bpe_dir):
    """The session's byte-level BPE (300 ids) as a PreTrainedTokenizerFast with the ChatML template."""
    from transformers import PreTrainedTokenizerFast

    from largetrain_core.tokenizer import EOS_TOKEN, read_tokenizer

    t = PreTrainedTokenizerFast(tokenizer_object=read_tokenizer(bpe_dir / "tokenizer.json"), eos_token=EOS_TOKEN)
    assert chat.add_chat_template(t) == [300, 301]
    return t


# ---------------------------------------------------------------------------------------------
# reading and validation


def test_messages_file_gives_conversations_and_a_rejection_for_each_fault():
    got = list(chat.read_conversations(DATA / "messages.jsonl"))
    f = "messages.jsonl"
    assert got == [
        Conversation(
            f,
            1,
            "c1",
            "chat",
            [_m("system", "Be brief."), _m("user", "What is two plus two?"), _m("assistant", "Four.")],
        ),
        Conversation(
            f,
            2,
            "c2",
            "chat",
            [
                _m("user", "Hi"),
                _m("assistant", "Hello there", 0),
                _m("user", "Two plus two?"),
                _m("assistant", "Four."),
            ],
        ),
        Rejection(f, 3, "line 3: invalid JSON: Expecting ',' delimiter at column 91"),
        Rejection(f, 4, "line 4: message 0 has unknown role 'narrator'; expected one of system, user, assistant"),
        Rejection(f, 5, "line 5: no assistant message: nothing to train on"),
        Rejection(f, 6, "line 6: message 0 (user): content is a JSON array, not a string"),
        Rejection(f, 7, "line 7: message 1 has tool_calls: tool calls are not supported"),
        Rejection(f, 8, "line 8: message 1 has function_call: tool calls are not supported"),
        Rejection(f, 9, "line 9: message 1 has role 'tool': tool calls are not supported"),
        Rejection(f, 10, "line 10: message 1 (assistant) has weight 2; weight must be 0 or 1"),
        Rejection(f, 11, "line 11: message 0 (user) has a weight; weight is only allowed on assistant messages"),
        Rejection(f, 12, "line 12: empty messages list"),
        Rejection(f, 13, "line 13: message 1 is a system message, and a system message may only come first"),
        # line 14 is blank: skipped
        Conversation(f, 15, "c3", "chat", [_m("user", "Say  hi\ttwice"), _m("assistant", "hi hi")]),
        Rejection(f, 16, "line 16: message 0 has no role"),
        Rejection(f, 17, "line 17: messages is a JSON string, not an array"),
        Rejection(f, 18, "line 18: the line is a JSON array, not an object"),
    ]


def test_prompt_completion_and_alpaca_become_user_and_assistant_messages():
    assert list(chat.read_conversations(DATA / "prompt_completion.jsonl")) == [
        Conversation(
            "prompt_completion.jsonl",
            1,
            "p1",
            "prompt_completion",
            [_m("user", "Two plus two?"), _m("assistant", "Four.")],
        ),
        Conversation(
            "prompt_completion.jsonl", 2, "p2", "prompt_completion", [_m("user", "Say hi"), _m("assistant", "hi")]
        ),
        Rejection("prompt_completion.jsonl", 3, "line 3: completion is a JSON number, not a string"),
    ]
    assert list(chat.read_conversations(DATA / "alpaca.jsonl", format="alpaca")) == [
        Conversation("alpaca.jsonl", 1, None, "alpaca", [_m("user", "Add the numbers.\n\n2, 2"), _m("assistant", "4")]),
        Conversation("alpaca.jsonl", 2, None, "alpaca", [_m("user", "Say hello."), _m("assistant", "Hello.")]),
        Rejection("alpaca.jsonl", 3, "line 3: no field 'output': the record has fields instruction, input"),
    ]


def test_auto_detection_rejects_an_unknown_format_and_a_forced_format_needs_its_fields(tmp_path):
    assert list(chat.read_conversations(DATA / "alpaca.jsonl"))[2] == Rejection(
        "alpaca.jsonl",
        3,
        "line 3: unknown format: the record has fields instruction, input; expected messages (chat), prompt and "
        "completion, or instruction and output (alpaca)",
    )
    assert [r.reason for r in chat.read_conversations(DATA / "prompt_completion.jsonl", format="chat")] == [
        f"line {i}: no field 'messages': the record has fields id, prompt, completion" for i in (1, 2, 3)
    ]
    with pytest.raises(ValueError, match="unknown format 'sharegpt'"):
        list(chat.read_conversations(DATA / "alpaca.jsonl", format="sharegpt"))


def test_a_messages_jsonl_file_read_as_a_corpus_is_not_called_not_json_lines(tmp_path):
    """The corpus reader judged a JSON Lines file whose every line is a JSON object, with the text field
    present but not a string, as "no readable JSON line ... is it JSON Lines?"; it is JSON Lines."""
    path = tmp_path / "chat.jsonl"
    lines = [{"messages": [_m("user", f"q{i}"), _m("assistant", "a")]} for i in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    _, rej = read_all(path, text_field="messages")
    why = (
        "the whole file is rejected: no string field 'messages' on any line: its 3 non-empty lines hold another "
        "JSON type; line 1: it is a JSON array; set raw_corpus text_field to the one holding the text"
    )
    assert rej.to_pylist() == [{"source": "chat.jsonl", "position": n, "reason": f"line {n}: {why}"} for n in (1, 2, 3)]
    # the same fault mixed with lines that lack the field
    path.write_text(json.dumps({"messages": "x"})[:0] + json.dumps({"other": 1}) + "\n" + json.dumps(lines[0]) + "\n")
    _, rej = read_all(path, text_field="messages")
    why = (
        "the whole file is rejected: no string field 'messages' on any line: its 2 non-empty lines lack it or hold "
        "another JSON type; line 1: the record has fields other; set raw_corpus text_field to the one holding the text"
    )
    assert rej.column("reason").to_pylist() == [f"line {n}: {why}" for n in (1, 2)]
    # a line that is not JSON still asks whether it is JSON Lines
    path.write_text("[\n" + json.dumps(lines[0]) + "\n")
    _, rej = read_all(path, text_field="messages")
    assert rej.column("reason").to_pylist()[0].endswith("; is it JSON Lines?")


# ---------------------------------------------------------------------------------------------
# dedup text


def test_conversation_text_is_roles_and_contents_with_whitespace_collapsed():
    a = [_m("system", " Be\tbrief. "), _m("user", "Two  plus\n two?"), _m("assistant", "Four.", 0)]
    b = [_m("system", "Be brief."), _m("user", "Two plus two?"), _m("assistant", "Four.")]
    assert chat.conversation_text(a) == "system: Be brief.\nuser: Two plus two?\nassistant: Four."
    assert chat.conversation_text(a) == chat.conversation_text(b)
    assert chat.conversation_text(b) != chat.conversation_text([_m("user", "Be brief."), *b[1:]])


# ---------------------------------------------------------------------------------------------
# template


def test_chatml_is_added_once_and_an_imported_template_is_kept(bpe_dir):
    from transformers import PreTrainedTokenizerFast

    from largetrain_core.tokenizer import EOS_TOKEN, read_tokenizer

    t = PreTrainedTokenizerFast(tokenizer_object=read_tokenizer(bpe_dir / "tokenizer.json"), eos_token=EOS_TOKEN)
    assert chat.add_chat_template(t) == [300, 301]
    assert (t.chat_template, len(t), t.convert_ids_to_tokens([300, 301])) == (
        chat.CHATML_TEMPLATE,
        302,
        ["<|im_start|>", "<|im_end|>"],
    )
    assert chat.add_chat_template(t) == []  # already has one
    assert t.apply_chat_template([_m("user", "Hi")], tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    own = "{% for m in messages %}{{ m['role'] }}: {% generation %}{{ m['content'] }}{% endgeneration %}\n{% endfor %}"
    imported = PreTrainedTokenizerFast(tokenizer_object=read_tokenizer(bpe_dir / "tokenizer.json"), eos_token=EOS_TOKEN)
    imported.chat_template = own
    assert chat.add_chat_template(imported) == []
    assert (imported.chat_template, len(imported)) == (own, 300)


def test_a_project_tokenizer_saved_with_split_special_tokens_renders_the_markers_as_special_ids(bpe_dir, tmp_path):
    """save_hf_tokenizer saves split_special_tokens=true (pretraining: special-token text is plain text);
    add_chat_template turns it off, or the template's markers would encode as bytes."""
    from transformers import AutoTokenizer

    from largetrain_core.tokenizer import load_tokenizer_info, save_hf_tokenizer

    save_hf_tokenizer(load_tokenizer_info(bpe_dir), tmp_path)
    t = AutoTokenizer.from_pretrained(str(tmp_path))
    assert t.split_special_tokens
    assert chat.add_chat_template(t) == [300, 301]
    ids, _ = chat.render(t, CONVERSATIONS[0])
    assert (ids == 300).sum() == (ids == 301).sum() == 2


# ---------------------------------------------------------------------------------------------
# rendering and the loss mask

CONVERSATIONS = [
    [_m("user", "Two plus two?"), _m("assistant", "Four.")],
    [_m("system", "Be brief."), _m("user", "Hi"), _m("assistant", "Hello there")],
    [_m("user", "Hi"), _m("assistant", "Hello there", 0), _m("user", "Two plus two?"), _m("assistant", "Four.")],
    [_m("user", "a"), _m("assistant", "b"), _m("user", "c"), _m("assistant", "d", 0), _m("assistant", "e")],
    [_m("user", ""), _m("assistant", " leading space and trailing\n")],
]


def test_render_ids_are_apply_chat_template_and_labels_cover_the_trained_assistant_turns(tok):
    for messages in CONVERSATIONS + [
        c.messages for c in chat.read_conversations(DATA / "messages.jsonl") if isinstance(c, Conversation)
    ]:
        ids, labels = chat.render(tok, messages)
        assert (ids.dtype, labels.dtype) == (np.int32, np.int64)
        assert ids.tolist() == tok.apply_chat_template(messages, tokenize=True)["input_ids"]
        # the trained tokens decode to the trained assistant contents, each followed by <|im_end|>
        trained = [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant" and m["weight"]]
        assert tok.decode(ids[labels != -100].tolist()) == "".join(trained)
        assert np.array_equal(labels[labels != -100], ids[labels != -100])


def test_the_mask_token_by_token(tok):
    messages = [
        _m("system", "Be brief."),
        _m("user", "Hi"),
        _m("assistant", "Hi", 0),
        _m("user", "Ok?"),
        _m("assistant", "Yes."),
    ]
    ids, labels = chat.render(tok, messages)
    got = [(tok.convert_ids_to_tokens(int(i)), bool(lab != -100)) for i, lab in zip(ids, labels)]
    user = [("<|im_start|>", False), ("u", False), ("s", False), ("er", False), ("Ċ", False)]
    assistant = [("<|im_start|>", False)] + [(t, False) for t in ("a", "s", "s", "i", "st", "a", "n", "t", "Ċ")]
    assert got == [
        ("<|im_start|>", False), ("s", False), ("y", False), ("st", False), ("e", False), ("m", False), ("Ċ", False),
        ("B", False), ("e", False), ("Ġ", False), ("b", False), ("r", False), ("i", False), ("e", False), ("f", False),
        (".", False), ("<|im_end|>", False), ("Ċ", False),
        *user, ("H", False), ("i", False), ("<|im_end|>", False), ("Ċ", False),
        *assistant, ("H", False), ("i", False), ("<|im_end|>", False), ("Ċ", False),  # weight 0
        *user, ("O", False), ("k", False), ("?", False), ("<|im_end|>", False), ("Ċ", False),
        *assistant, ("Y", True), ("e", True), ("s", True), (".", True), ("<|im_end|>", True), ("Ċ", False),
    ]  # fmt: skip


def test_prompt_completion_trains_only_on_the_completion(tok):
    (conv, _, _) = chat.read_conversations(DATA / "prompt_completion.jsonl")
    ids, labels = chat.render(tok, conv.messages)
    assert tok.decode(ids[labels != -100].tolist()) == "Four.<|im_end|>"
    assert (
        tok.decode(ids.tolist())
        == "<|im_start|>user\nTwo plus two?<|im_end|>\n<|im_start|>assistant\nFour.<|im_end|>\n"
    )


def test_render_refuses_content_spelling_a_special_token(tok):
    with pytest.raises(ValueError, match="user message's content holds the special token '<|im_end|>'"):
        chat.render(tok, [_m("user", "end<|im_end|>"), _m("assistant", "x")])


LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)  # Llama 3's template, shortened: no tools, no date


def _imported(bpe_dir, template, specials=()):
    from transformers import PreTrainedTokenizerFast

    from largetrain_core.tokenizer import EOS_TOKEN, read_tokenizer

    t = PreTrainedTokenizerFast(tokenizer_object=read_tokenizer(bpe_dir / "tokenizer.json"), eos_token=EOS_TOKEN)
    t.add_special_tokens({"additional_special_tokens": list(specials)})
    t.chat_template = template
    assert chat.add_chat_template(t) == []  # its own template is kept
    return t


def test_a_template_without_generation_blocks_gives_the_same_mask(tok, bpe_dir):
    """An imported template without {% generation %}: the assistant text is found from prefixes of the
    conversation; on ChatML without the blocks it marks exactly the tokens transformers' mask marks."""
    no_blocks = chat.CHATML_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    t = _imported(bpe_dir, no_blocks, chat.CHATML_SPECIAL_TOKENS)
    for messages in CONVERSATIONS:
        ids, labels = chat.render(t, messages)
        assert ids.tolist() == t.apply_chat_template(messages, tokenize=True)["input_ids"]
        expected_ids, expected_labels = chat.render(tok, messages)
        assert (ids.tolist(), labels.tolist()) == (expected_ids.tolist(), expected_labels.tolist())


def test_an_imported_llama3_template_trains_on_the_content_and_eot(bpe_dir):
    specials = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
    t = _imported(bpe_dir, LLAMA3_TEMPLATE, specials)
    t.bos_token = "<|begin_of_text|>"
    for messages in CONVERSATIONS:
        ids, labels = chat.render(t, messages)
        assert ids.tolist() == t.apply_chat_template(messages, tokenize=True)["input_ids"]
        assert ids[0] == t.convert_tokens_to_ids("<|begin_of_text|>")
        trained = [m["content"].strip() + "<|eot_id|>" for m in messages if m["role"] == "assistant" and m["weight"]]
        assert t.decode(ids[labels != -100].tolist()) == "".join(trained)
    assert t.decode(chat.render(t, CONVERSATIONS[4])[0].tolist()) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nleading space and trailing<|eot_id|>"
    )


def test_the_end_of_turn_is_the_first_special_token_after_an_answer(bpe_dir):
    """A generation through the template stops where the template ends an assistant turn: ChatML's <|im_end|>,
    Llama 3's <|eot_id|>, each before the EOS; a template that writes no special token stops at the EOS only."""
    from transformers import PreTrainedTokenizerFast

    from largetrain_core.tokenizer import EOS_TOKEN, read_tokenizer

    chatml = PreTrainedTokenizerFast(tokenizer_object=read_tokenizer(bpe_dir / "tokenizer.json"), eos_token=EOS_TOKEN)
    chat.add_chat_template(chatml)
    assert chat.end_of_turn(chatml) == ["<|im_end|>", EOS_TOKEN]
    llama3 = _imported(
        bpe_dir, LLAMA3_TEMPLATE, ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
    )
    assert chat.end_of_turn(llama3) == ["<|eot_id|>", llama3.eos_token]
    plain = _imported(bpe_dir, "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    assert chat.end_of_turn(plain) == [plain.eos_token]


def test_a_template_that_renders_a_prefix_differently_is_refused(bpe_dir):
    t = _imported(bpe_dir, "{% for m in messages %}{% if loop.last %}LAST {% endif %}{{ m['content'] }}\n{% endfor %}")
    with pytest.raises(ValueError, match="does not render the conversation before assistant message 1 as a prefix"):
        chat.render(t, CONVERSATIONS[0])


# ---------------------------------------------------------------------------------------------
# packing and padding


def _ex(n, start=0, trained_from=0):
    ids = np.arange(start, start + n, dtype=np.int32)
    return ids, np.where(np.arange(n) >= trained_from, ids.astype(np.int64), -100)


def test_pack_first_fit_restarts_positions_and_truncates():
    p = chat.pack([_ex(3, 10), _ex(4, 20, 2), _ex(2, 30), _ex(7, 40), _ex(1, 50)], seq_len=6, pad_id=0)
    assert p.truncated == 1
    assert p.input_ids.tolist() == [[10, 11, 12, 30, 31, 50], [20, 21, 22, 23, 0, 0], [40, 41, 42, 43, 44, 45]]
    assert p.labels.tolist() == [
        [-100, 11, 12, -100, 31, -100],
        [-100, -100, 22, 23, -100, -100],
        [-100, 41, 42, 43, 44, 45],
    ]
    assert p.position_ids.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 4, 5]]
    assert p.segment_ids.tolist() == [[0, 0, 0, 2, 2, 4], [1, 1, 1, 1, -1, -1], [3, 3, 3, 3, 3, 3]]
    assert (p.input_ids.dtype, p.labels.dtype, p.position_ids.dtype, p.segment_ids.dtype) == (
        np.int32, np.int64, np.int64, np.int32
    )  # fmt: skip
    assert chat.padding_fraction(p) == 2 / 18
    with pytest.raises(ValueError, match="seq_len must be >= 1"):
        chat.pack([_ex(2)], 0)


def test_pad_batch_groups_by_length():
    lengths = [3, 7, 2, 7, 5]
    assert chat.group_by_length(lengths, 2) == [[1, 3], [4, 0], [2]]
    examples = [_ex(n, 10 * i) for i, n in enumerate(lengths)]
    b = chat.pad_batch([examples[i] for i in (4, 0)], pad_id=0)
    assert b["input_ids"].tolist() == [[40, 41, 42, 43, 44], [0, 1, 2, 0, 0]]
    assert b["labels"].tolist() == [[40, 41, 42, 43, 44], [0, 1, 2, -100, -100]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert chat.padding_fraction(b) == 2 / 10


def _summed_losses(model, input_ids, labels, **kw) -> "torch.Tensor":  # noqa: F821
    """Per row and position the next-token cross-entropy (nats, float64: a sum of 100 nats in float32 has a
    rounding step of 1.5e-5) on labels[:, 1:] (-100: 0), shifted as largetrain_core.training.loss does."""
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        logits = model(input_ids=torch.as_tensor(input_ids, dtype=torch.long), **kw).logits.double()
    targets = torch.as_tensor(labels)[:, 1:]
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), targets, ignore_index=-100, reduction="none")


def test_each_example_loses_the_same_packed_padded_or_alone(tok):
    import torch

    from largetrain_core.model import build_model

    examples = [chat.render(tok, m) for m in CONVERSATIONS]
    seq_len = 100
    assert [len(i) for i, _ in examples] == [35, 46, 63, 55, 43]
    for attn in ("sdpa", "eager"):
        model = build_model("llama-tiny", len(tok), seq_len, tok.eos_token_id)
        model.config._attn_implementation = attn
        model.eval()
        alone = [_summed_losses(model, ids[None], lab[None]).sum().item() for ids, lab in examples]
        assert min(alone) > 0

        p = chat.pack(examples, seq_len, pad_id=tok.eos_token_id)
        assert p.truncated == 0
        assert p.segment_ids[:, [0, -1]].tolist() == [[0, -1], [2, -1], [3, -1]]  # rows: 0 1 | 2 | 3 4
        per_pos = _summed_losses(model, p.input_ids, p.labels, position_ids=torch.as_tensor(p.position_ids))
        seg = torch.as_tensor(p.segment_ids)[:, 1:]
        packed = [per_pos[seg == i].sum().item() for i in range(len(examples))]
        assert packed == pytest.approx(alone, abs=1e-5, rel=0)

        # without position_ids restarting, attention crosses examples: the losses differ
        crossed = _summed_losses(model, p.input_ids, p.labels)
        assert not np.allclose([crossed[seg == i].sum().item() for i in range(len(examples))], alone, atol=1e-3)

        for batch in chat.group_by_length([len(i) for i, _ in examples], 2):
            b = chat.pad_batch([examples[i] for i in batch], pad_id=tok.eos_token_id)
            per_pos = _summed_losses(
                model, b["input_ids"], b["labels"], attention_mask=torch.as_tensor(b["attention_mask"])
            )
            assert per_pos.sum(1).tolist() == pytest.approx([alone[i] for i in batch], abs=1e-5, rel=0)


def test_the_corpus_reader_keeps_conversations_and_cleaning_acts_on_each_message(tmp_path):
    """raw_corpus format chat: one document per conversation (its messages kept, its text the canonical
    conversation text), the malformed records rejected by line; cleaned_text normalizes and redacts each
    message's content and makes the text again from them."""
    import polars as pl

    from largetrain_core.clean import QualityConfig, clean_part
    from largetrain_core.corpus import ingest
    from largetrain_core.readers import ReaderConfig
    from largetrain_core.stages.raw_corpus import settings_version

    src = tmp_path / "chats.jsonl"
    src.write_text(
        json.dumps(
            {
                "id": "a",
                "messages": [
                    {"role": "user", "content": "mail bob@acmemail.org\r\nnow"},
                    {"role": "assistant", "content": "Done."},
                ],
            }
        )
        + "\n"
        + json.dumps({"prompt": "2+2?", "completion": "4"})
        + "\n"
        + json.dumps({"messages": [{"role": "user", "content": "hi"}]})
        + "\n"
    )
    out = tmp_path / "raw"
    out.mkdir()
    stats = ingest(ReaderConfig(path=str(src), format="chat"), out)
    assert (stats["documents"], stats["rejected"]) == (2, 1)
    assert pl.read_parquet(out / "rejected.parquet")["reason"].to_list() == [
        "line 3: no assistant message: nothing to train on"
    ]
    raw = pl.read_parquet(out / "part-00000.parquet")
    assert raw.columns == ["doc_id", "source", "text", "messages"]
    assert raw["doc_id"].to_list() == ["a", "chats.jsonl:2"]
    assert raw["text"][1] == chat.conversation_text(json.loads(raw["messages"][1]))
    kept, removed, counts = clean_part(raw, QualityConfig(gopher_quality=False, gopher_repetition=False, c4=False))
    first = json.loads(kept["messages"][0])
    assert first[0]["content"] == "mail <EMAIL>\nnow" and counts["pii_email"] == 1
    assert kept["pii_email"].to_list() == [1, 0] and removed.height == 0
    assert kept["text"][0] == chat.conversation_text(first)
    assert "format" not in settings_version(ReaderConfig(path="x"))  # text corpora keep their versions
    assert settings_version(ReaderConfig(path="x", format="chat"))["format"] == "chat"


def test_a_conversation_file_read_as_text_says_to_set_format_chat(tmp_path):
    import polars as pl

    from largetrain_core.corpus import ingest
    from largetrain_core.readers import ReaderConfig

    src = tmp_path / "chats.jsonl"
    src.write_text("".join(line for line in (DATA / "messages.jsonl").read_text().splitlines(True)[:2]))
    out = tmp_path / "raw"
    out.mkdir()
    ingest(ReaderConfig(path=str(src)), out)
    reasons = pl.read_parquet(out / "rejected.parquet")["reason"].to_list()
    assert len(reasons) == 2 and len({r.split(": ", 1)[1] for r in reasons}) == 1  # each line, the file's reason
    reason = reasons[0]
    assert reason.startswith(
        "line 1: the whole file is rejected: no string field 'text' on any line: its 2 non-empty lines lack it"
    )
    assert reason.endswith("or, for conversations (largetrain_core.chat), set raw_corpus format: chat")


def test_padded_rows_grouped_by_length_lose_what_packed_rows_lose(tok, tmp_path):
    """task_data packing false + group_by_length: tasks.write_chat writes one conversation a row, ordered by
    length in groups that are shards; the trainer's sampler, shuffling by windows of one shard, draws each
    micro-batch from one group, TaskExamples.take cuts it to its longest conversation, and each conversation's
    loss there equals its loss in packed rows."""
    import torch

    from helpers.finetune import conversations
    from largetrain_core.model import build_model
    from largetrain_core.shards import DistributedSampler
    from largetrain_core.training import tasks

    convs = CONVERSATIONS + conversations(7)
    examples = [chat.render(tok, m) for m in convs]
    lengths = [len(i) for i, _ in examples]
    seq_len, pad = 128, tok.eos_token_id
    manifest = tasks.write_chat(tmp_path / "ex", {"train": convs}, tok, seq_len, packing=False, group_size=4)
    assert manifest["packing"] is False and manifest["splits"]["train"]["shard_sizes"] == [4, 4, 4]
    data = tasks.TaskExamples(tmp_path / "ex", "train")
    assert data.shard_sizes == [4, 4, 4] and len(data) == 12
    order = [i for g in chat.group_by_length(lengths, 4) for i in g]
    stored = tasks.row_lengths(data.columns["position_ids"])
    assert stored.tolist() == [lengths[i] for i in order] == sorted(lengths, reverse=True)

    model = build_model("llama-tiny", len(tok), seq_len, pad)
    model.eval()
    p = chat.pack(examples, seq_len, pad_id=pad)
    per_pos = _summed_losses(model, p.input_ids, p.labels, position_ids=torch.as_tensor(p.position_ids))
    seg = torch.as_tensor(p.segment_ids)[:, 1:]
    packed = [per_pos[seg == i].sum().item() for i in range(len(examples))]

    sampler = DistributedSampler(12, seed=3, micro_batch_size=2, shard_sizes=(4, 4, 4), window_shards=1)
    seen, widths = [], []
    for _, idx in zip(range(6), sampler):  # one epoch
        assert len({int(i) // 4 for i in idx}) == 1  # both rows from one length group
        batch = data.take(idx)
        assert batch["input_ids"].shape[1] == max(lengths[order[i]] for i in idx)  # padded to the batch's longest
        rows = _summed_losses(
            model, batch["input_ids"], batch["labels"], position_ids=torch.as_tensor(batch["position_ids"])
        ).sum(1)
        assert rows.tolist() == pytest.approx([packed[order[i]] for i in idx], abs=1e-5, rel=0)
        with torch.no_grad():
            total = tasks.task_loss("chat", model, {k: torch.as_tensor(v) for k, v in batch.items()}, reduction="sum")
        assert total.item() == pytest.approx(rows.sum().item(), abs=1e-4, rel=0)
        seen += idx.tolist()
        widths.append(batch["input_ids"].shape[1])
    assert sorted(seen) == list(range(12)) and min(widths) < seq_len
    with pytest.raises(ValueError, match="group_size must be >= 0, and 0 with packing"):
        tasks.write_chat(tmp_path / "bad", {"train": convs}, tok, seq_len, packing=True, group_size=4)
