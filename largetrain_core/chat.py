"""Chat and instruction data for fine-tuning: reading and validating conversations, their canonical
text for deduplication, the ChatML chat template, rendering with the loss mask, and packing.

Input formats (JSON Lines, one record a line; the format is found per record from its keys, or forced):

* ``chat``: ``{"messages": [{"role": "system"|"user"|"assistant", "content": "...", "weight": 0|1}, ...]}``,
  the OpenAI fine-tuning format (platform.openai.com/docs/guides/fine-tuning, "Preparing your dataset"
  and "Multi-turn chat examples"): ``weight`` only on assistant messages, 0 (not trained on) or 1
  (trained on, the default). Tool calls (``tool_calls``, ``function_call``, roles ``tool``/``function``)
  are not supported and rejected. A system message may only come first (one system prompt, as ChatML
  and most chat templates place it).
* ``prompt_completion``: ``{"prompt": "...", "completion": "..."}`` (OpenAI's legacy fine-tuning format)
  becomes ``[user: prompt, assistant: completion]``.
* ``alpaca``: ``{"instruction": "...", "input": "...", "output": "..."}`` (Stanford Alpaca's
  alpaca_data.json fields) becomes ``[user: instruction + "\\n\\n" + input (when input is not empty),
  assistant: output]``.

Rejected records are described as the corpus readers describe theirs (largetrain_core.readers): the
file, the 1-based line, and a reason starting ``line N: ``; JSON that does not parse gets the readers'
wording.

Loss mask (:func:`render`): ``labels`` equal ``input_ids`` on the tokens of trained assistant turns (their
content and their end-of-turn token) and -100 elsewhere (system and user turns, role headers, weight-0
assistant turns). Labels are not shifted: like transformers' ``labels``, position t's label is the id at t;
the model predicts position t from positions before it (largetrain_core.training.loss: ids ``[:-1]``
predict ``[1:]``).

Packing (:func:`pack`) and attention isolation: packed rows carry ``position_ids`` that restart at 0 for
each example and no attention mask. transformers 5 (``masking_utils.find_packed_sequence_indices``,
called by ``create_causal_mask`` when ``attention_mask`` is None and there is no cache, i.e. training
with ``use_cache=False``) finds the examples of a row where ``position_ids`` do not step by 1 and builds
a block-diagonal causal mask for the sdpa and eager attention, so no token attends to another example;
the rotary positions restart too. Each example's loss in a packed row therefore equals its loss alone
(tests/unit/test_chat.py checks it to 1e-5 with a Llama, sdpa and eager). An attention_mask must not be
passed with packed rows: transformers then uses it and ignores the packing. FlashAttention 2 finds
packing from ``position_ids`` only in a batch of one row (``modeling_flash_attention_utils.
_is_packed_sequence``), so for it the rows would be concatenated into one; not tested here (no GPU).
The padded path (:func:`pad_batch`, :func:`group_by_length`) passes an ``attention_mask`` instead.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from largetrain_core.readers import READERS, Source, _json_type, exception_text, utf8_error, value_text

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

ROLES = ("system", "user", "assistant")
TOOL_ROLES = ("tool", "function")
TOOL_KEYS = ("tool_calls", "function_call")
FORMATS = ("chat", "prompt_completion", "alpaca")
IGNORE_INDEX = -100  # transformers' and PyTorch's cross_entropy ignore_index: a position not trained on

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CHATML_SPECIAL_TOKENS = (IM_START, IM_END)
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}"
    "{{ message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML (OpenAI's Chat Markup Language, as Qwen and many open models use it): each message is
``<|im_start|>{role}\\n{content}<|im_end|>\\n``; ``add_generation_prompt`` appends
``<|im_start|>assistant\\n``. Hugging Face ``chat_template`` (Jinja) syntax; each assistant message's
content and its ``<|im_end|>`` are inside ``{% generation %}`` so that transformers'
``apply_chat_template(..., return_dict=True, return_assistant_tokens_mask=True)`` marks them."""


# ------------------------------------------------------------------------------------------------ reading


@dataclass(frozen=True)
class Conversation:
    """One normalized record: ``source`` (the file's name), ``line`` (1-based), ``id`` (the record's
    ``id``, as text, when present and not empty), ``format`` (one of :data:`FORMATS`) and ``messages``:
    ``{"role", "content", "weight"}`` dicts, weight 0 or 1 (1 on every system and user message)."""

    source: str
    line: int
    id: str | None
    format: str
    messages: list[dict]


@dataclass(frozen=True)
class Rejection:
    """A record not read: ``source`` (the file's name), ``position`` (1-based line; -1: the whole file)
    and ``reason``, the fields of the readers' rejected records (readers.REJECT_SCHEMA)."""

    source: str
    position: int
    reason: str


def detect_format(record: dict) -> str | None:
    """The format of a JSON object by its keys: ``messages`` -> chat; ``prompt`` and ``completion`` ->
    prompt_completion; ``instruction`` and ``output`` -> alpaca; else None."""
    if "messages" in record:
        return "chat"
    if "prompt" in record and "completion" in record:
        return "prompt_completion"
    if "instruction" in record and "output" in record:
        return "alpaca"
    return None


def _string(record: dict, key: str) -> str:
    if key not in record:
        raise _Bad(f"no field {key!r}: the record has fields {', '.join(record) or '(none)'}")
    value = record[key]
    if not isinstance(value, str):
        raise _Bad(f"{key} is a JSON {_json_type(value)}, not a string")
    bad = utf8_error(value)
    if bad:
        raise _Bad(f"{key}: {bad}")
    return value


class _Bad(ValueError):
    """A record's fault: its message is the rejection's reason."""


def _chat_messages(raw) -> list[dict]:
    """The validated messages of a chat record (module doc; OpenAI fine-tuning format)."""
    if not isinstance(raw, list):
        raise _Bad(f"messages is a JSON {_json_type(raw)}, not an array")
    if not raw:
        raise _Bad("empty messages list")
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise _Bad(f"message {i} is a JSON {_json_type(m)}, not an object")
        role = m.get("role")
        tool = next((k for k in TOOL_KEYS if k in m), None)
        if tool or role in TOOL_ROLES:
            what = f"has {tool}" if tool else f"has role {role!r}"
            raise _Bad(f"message {i} {what}: tool calls are not supported")
        if "role" not in m:
            raise _Bad(f"message {i} has no role")
        if role not in ROLES:
            raise _Bad(f"message {i} has unknown role {value_text(role)!r}; expected one of {', '.join(ROLES)}")
        if role == "system" and i > 0:
            raise _Bad(f"message {i} is a system message, and a system message may only come first")
        content = m.get("content")
        if not isinstance(content, str):
            raise _Bad(f"message {i} ({role}): content is a JSON {_json_type(content)}, not a string")
        bad = utf8_error(content)
        if bad:
            raise _Bad(f"message {i} ({role}): content: {bad}")
        weight = m.get("weight", 1)
        if "weight" in m and role != "assistant":
            raise _Bad(f"message {i} ({role}) has a weight; weight is only allowed on assistant messages")
        if type(weight) is not int or weight not in (0, 1):
            raise _Bad(f"message {i} (assistant) has weight {value_text(weight)}; weight must be 0 or 1")
        messages.append({"role": role, "content": content, "weight": weight})
    if not any(m["role"] == "assistant" for m in messages):
        raise _Bad("no assistant message: nothing to train on")
    return messages


def to_messages(record: dict, format: str = "auto") -> tuple[str, list[dict]]:
    """(format, messages) of one JSON object (module doc for each format). ``format`` "auto": by
    :func:`detect_format`. Raises ValueError with the reason the record cannot be used."""
    fmt = detect_format(record) if format == "auto" else format
    if fmt is None:
        raise _Bad(
            f"unknown format: the record has fields {', '.join(record) or '(none)'}; expected messages (chat), "
            "prompt and completion, or instruction and output (alpaca)"
        )
    if fmt == "chat":
        if "messages" not in record:
            raise _Bad(f"no field 'messages': the record has fields {', '.join(record) or '(none)'}")
        return fmt, _chat_messages(record["messages"])
    if fmt == "prompt_completion":
        user, assistant = _string(record, "prompt"), _string(record, "completion")
    elif fmt == "alpaca":
        user, assistant = _string(record, "instruction"), _string(record, "output")
        extra = "" if record.get("input") is None else _string(record, "input")
        if extra:
            user += "\n\n" + extra
    else:
        raise ValueError(f"unknown format {fmt!r}; expected auto or one of {', '.join(FORMATS)}")
    return fmt, [
        {"role": "user", "content": user, "weight": 1},
        {"role": "assistant", "content": assistant, "weight": 1},
    ]


def read_conversations(path: Path | str, format: str = "auto") -> Iterator[Conversation | Rejection]:
    """The records of the local JSON Lines file ``path`` in file order, each a :class:`Conversation` or a
    :class:`Rejection` (invalid UTF-8 or JSON, not an object, unknown format, and the faults of module
    doc's formats: unknown role, no assistant message, content not a string, a tool call, a weight not
    0/1 or not on an assistant message, an empty messages list, a system message not first). Blank lines
    are skipped. The file is opened as the corpus readers open JSONL (gzip/zstd by magic, UTF-16 by
    byte-order mark or pattern). ``format``: "auto" (per record, :func:`detect_format`) or one of
    :data:`FORMATS`. Raises ValueError for another ``format``, FileNotFoundError for a missing file."""
    if format != "auto" and format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; expected auto or one of {', '.join(FORMATS)}")
    path = Path(path)
    jsonl = next(r for r in READERS if r.name == "jsonl")
    src = Source(path, path.name, jsonl)
    with src.open() as f:
        for line, raw in enumerate(f, start=1):
            if line == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            if not raw.strip():
                continue
            try:
                record = _parse(raw)
                fmt, messages = to_messages(record, format)
                record_id = value_text(record.get("id")) or None
            except _Bad as e:
                yield Rejection(path.name, line, f"line {line}: {e}")
                continue
            yield Conversation(path.name, line, record_id, fmt, messages)


def _parse(raw: bytes) -> dict:
    """One line as a JSON object; the readers' reasons (readers._parse_line) otherwise."""
    try:
        record = json.loads(raw.rstrip(b"\r\n").decode("utf-8"))  # columns of the line, not of a line after it
    except UnicodeDecodeError as e:
        raise _Bad(f"invalid UTF-8 at byte {e.start} of the line: {e.reason}") from None
    except json.JSONDecodeError as e:
        raise _Bad(f"invalid JSON: {e.msg.removesuffix(' at')} at column {e.colno}") from None
    except RecursionError:
        raise _Bad("cannot parse the JSON: nested too deeply for the parser (RecursionError)") from None
    except Exception as e:  # noqa: BLE001 -- whatever the parser raises on one line rejects that line
        raise _Bad(f"cannot parse the JSON: {exception_text(e)}") from None
    if not isinstance(record, dict):
        raise _Bad(f"the line is a JSON {_json_type(record)}, not an object")
    return record


# ------------------------------------------------------------------------------------------------ dedup text


def conversation_text(messages: Sequence[dict]) -> str:
    """The canonical text of a whole conversation, for exact and near deduplication: one line per
    message, ``{role}: {content}``, the content's whitespace runs (str.split) collapsed to one space and
    stripped; weights are left out (they say what is trained on, not what the conversation is)."""
    return "\n".join(f"{m['role']}: {' '.join(m['content'].split())}" for m in messages)


# ------------------------------------------------------------------------------------------------ template


def add_chat_template(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    """Give ``tokenizer`` a chat template: when it already has a ``chat_template`` (an imported model's
    own), it is kept and nothing is added; else :data:`CHATML_TEMPLATE` is set and its special tokens
    (:data:`CHATML_SPECIAL_TOKENS`) are added as additional special tokens. Also sets
    ``split_special_tokens`` False (largetrain_core.tokenizer.save_hf_tokenizer saves it True), so that
    the rendered template's markers encode as their special ids; a tokenizer saved afterwards keeps False,
    and :func:`render` refuses content that spells a special token instead.

    Returns the ids of the tokens added (empty when none was): when not empty, resize the model's
    embedding, ``model.resize_token_embeddings(len(tokenizer))``."""
    tokenizer.split_special_tokens = False
    if tokenizer.chat_template:
        return []
    before = len(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": list(CHATML_SPECIAL_TOKENS)})
    tokenizer.chat_template = CHATML_TEMPLATE
    return [i for i in tokenizer.convert_tokens_to_ids(list(CHATML_SPECIAL_TOKENS)) if i >= before]


def end_of_turn(tokenizer: PreTrainedTokenizerFast) -> list[str]:
    """The strings that end an assistant turn under ``tokenizer.chat_template``, the stop sequences of a
    generation through it: the first special token the template writes after an assistant message's
    content (``<|im_end|>`` for ChatML, ``<|eot_id|>`` for Llama 3), found by rendering a one-exchange
    conversation, then the EOS token if it differs; just the EOS token when the template writes none."""
    marker = "ANSWER_MARKER"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "question"}, {"role": "assistant", "content": marker}], tokenize=False
    )
    rest = text[text.rindex(marker) + len(marker) :]
    specials = {t for t in tokenizer.all_special_tokens + list(tokenizer.added_tokens_encoder) if t}
    found = sorted((rest.index(t), -len(t), t) for t in specials if t in rest)
    stops = [found[0][2]] if found else []
    if tokenizer.eos_token and tokenizer.eos_token not in stops:
        stops.append(tokenizer.eos_token)
    return stops


# ------------------------------------------------------------------------------------------------ render


_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")  # transformers' own test for the tag


def render(tokenizer: PreTrainedTokenizerFast, messages: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, labels) of one conversation under ``tokenizer.chat_template``: input_ids (int32,
    shape (n,)) are ``tokenizer.apply_chat_template(messages, tokenize=True)``; labels (int64, shape (n,))
    equal input_ids on the tokens of trained assistant messages (weight 1) and are -100 elsewhere (module doc).

    Which tokens are an assistant message's:

    * a template with ``{% generation %}`` blocks (:data:`CHATML_TEMPLATE`): transformers'
      ``return_assistant_tokens_mask``, one block per assistant message in order, those of weight-0
      messages cleared;
    * a template without (most imported models' own): the text the model generates for the message,
      found from the template itself: the conversation rendered up to that message
      (``messages[:i + 1]``) less the conversation before it with the generation prompt
      (``messages[:i]``, ``add_generation_prompt=True``), up to and including the first special token
      after the content (the end of turn: ``<|im_end|>``, ``<|eot_id|>``, ``</s>``), the whole rest
      when none follows. A token is marked when its characters overlap that text, the rule of
      transformers' mask.

    Raises ValueError when a message's content spells a special token of the tokenizer (it would encode
    as that token, not as text); with ``{% generation %}``, when the blocks do not match the assistant
    messages one to one; without, when the template does not render the conversation before a message
    as a prefix of the whole (so the message's text cannot be found)."""
    specials = sorted({t for t in tokenizer.all_special_tokens + list(tokenizer.added_tokens_encoder) if t})
    for m in messages:
        hit = next((t for t in specials if t in m["content"]), None)
        if hit:
            raise ValueError(f"a {m['role']} message's content holds the special token {hit!r}")
    plain = [{"role": m["role"], "content": m["content"]} for m in messages]
    weights = [m.get("weight", 1) for m in messages if m["role"] == "assistant"]
    template = tokenizer.get_chat_template()
    if _GENERATION.search(template):
        out = tokenizer.apply_chat_template(plain, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        ids = np.asarray(out["input_ids"], dtype=np.int32)
        mask = np.asarray(out["assistant_masks"], dtype=np.int8)
        edges = np.flatnonzero(np.diff(np.concatenate(([0], mask, [0]))))
        runs = list(zip(edges[0::2], edges[1::2]))  # [start, end) tokens of each generation block
        if len(runs) != len(weights):
            raise ValueError(
                f"the chat_template marks {len(runs)} token runs as assistant output (its {{% generation %}} "
                f"blocks), the conversation has {len(weights)} assistant messages"
            )
    else:
        text = tokenizer.apply_chat_template(plain, tokenize=False)
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)  # as apply_chat_template
        ids = np.asarray(enc["input_ids"], dtype=np.int32)
        offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        runs = []
        for start, end in _assistant_spans(tokenizer, plain, text, specials):
            marked = np.flatnonzero((offsets[:, 1] > start) & (offsets[:, 0] < end))
            runs.append((marked[0], marked[-1] + 1) if len(marked) else (0, 0))
    trained = np.zeros(len(ids), dtype=bool)
    for (start, end), weight in zip(runs, weights):
        trained[start:end] = weight == 1
    return ids, np.where(trained, ids.astype(np.int64), IGNORE_INDEX)


def _assistant_spans(tokenizer, messages: list[dict], text: str, specials: list[str]) -> list[tuple[int, int]]:
    """[start, end) characters of ``text`` (the whole conversation rendered) that each assistant message
    of ``messages`` makes (render's doc)."""
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        head = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
        upto = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        if not (upto.startswith(head) and text.startswith(upto)):
            raise ValueError(
                f"the chat_template does not render the conversation before assistant message {i} as a prefix of "
                "the whole, so its tokens cannot be found; mark assistant content with {% generation %} in the template"
            )
        turn = upto[len(head) :]
        content = m["content"].strip()  # templates may trim it
        at = turn.find(content)
        if at < 0:
            raise ValueError(f"the chat_template's text for assistant message {i} does not hold its content")
        after = [(turn.find(t, at + len(content)), -len(t)) for t in specials]
        after = [(where, -minus) for where, minus in after if where >= 0]
        end = sum(min(after, key=lambda e: (e[0], -e[1]))) if after else len(turn)  # the first, the longest there
        spans.append((len(head), len(head) + end))
    return spans


# ------------------------------------------------------------------------------------------------ packing


@dataclass(frozen=True)
class Packed:
    """Packed rows, each of shape (rows, seq_len): ``input_ids`` int32 (``pad_id`` after the last
    example), ``labels`` int64 (-100 on padding), ``position_ids`` int64 (0, 1, ... within each example
    and within the padding at a row's end), ``segment_ids`` int32 (the index of the example in the
    input list, -1 on padding); ``truncated``: how many examples were longer than seq_len and cut to
    their first seq_len tokens."""

    input_ids: np.ndarray
    labels: np.ndarray
    position_ids: np.ndarray
    segment_ids: np.ndarray
    truncated: int


def pack(examples: Sequence[tuple[np.ndarray, np.ndarray]], seq_len: int, pad_id: int = 0) -> Packed:
    """Pack (input_ids, labels) examples into rows of ``seq_len`` tokens, first fit in input order
    (each example goes into the first row with room for it, else a new row): deterministic. An example
    longer than ``seq_len`` is truncated to its first ``seq_len`` tokens (counted in ``truncated``; what
    was cut is not trained on, and an example whose trained tokens were all cut trains on nothing).
    Attention stays within an example through ``position_ids`` (module doc). Each example's first label
    is set to -100: shifted for the next-token loss, it would be predicted from the previous example's
    last token (alone it is never a target). Raises ValueError when
    seq_len < 1 or an example's input_ids and labels differ in length."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    rows: list[list[int]] = []  # example indices per row
    room: list[int] = []
    truncated = 0
    for i, (ids, labels) in enumerate(examples):
        if len(ids) != len(labels):
            raise ValueError(f"example {i}: {len(ids)} input_ids but {len(labels)} labels")
        n = min(len(ids), seq_len)
        truncated += len(ids) > seq_len
        row = next((r for r, free in enumerate(room) if free >= n), None)
        if row is None:
            rows.append([])
            room.append(seq_len)
            row = len(rows) - 1
        rows[row].append(i)
        room[row] -= n
    return _fill(examples, rows, seq_len, pad_id, truncated)


def pad_rows(examples: Sequence[tuple[np.ndarray, np.ndarray]], seq_len: int, pad_id: int = 0, order=None) -> Packed:
    """One (input_ids, labels) example per row of ``seq_len`` tokens, right-padded, the rows in ``order``
    (indices into ``examples``; default their input order): the unpacked layout of :func:`pack`, with the
    same truncation, first label -100 and position ids (0, 1, ... over the example, restarting over the
    padding), so an example's loss in its row is its loss alone. Raises as :func:`pack`."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    for i, (ids, labels) in enumerate(examples):
        if len(ids) != len(labels):
            raise ValueError(f"example {i}: {len(ids)} input_ids but {len(labels)} labels")
    order = range(len(examples)) if order is None else order
    truncated = sum(len(ids) > seq_len for ids, _ in examples)
    return _fill(examples, [[int(i)] for i in order], seq_len, pad_id, truncated)


def _fill(examples, rows: list[list[int]], seq_len: int, pad_id: int, truncated: int) -> Packed:
    """:class:`Packed` rows holding ``examples[i]`` for the indices of each of ``rows``, in order."""
    shape = (len(rows), seq_len)
    input_ids = np.full(shape, pad_id, dtype=np.int32)
    labels = np.full(shape, IGNORE_INDEX, dtype=np.int64)
    position_ids = np.zeros(shape, dtype=np.int64)
    segment_ids = np.full(shape, -1, dtype=np.int32)
    for r, members in enumerate(rows):
        at = 0
        for i in members:
            ids, lab = examples[i]
            n = min(len(ids), seq_len)
            input_ids[r, at : at + n] = ids[:n]
            labels[r, at + 1 : at + n] = lab[1:n]  # the first: a target of the example before it (doc)
            position_ids[r, at : at + n] = np.arange(n)
            segment_ids[r, at : at + n] = i
            at += n
        position_ids[r, at:] = np.arange(seq_len - at)
    return Packed(input_ids, labels, position_ids, segment_ids, truncated)


def group_by_length(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Batches of example indices of similar lengths, to pad little: the indices sorted by length,
    longest first (ties in input order), cut into batches of ``batch_size``. Raises ValueError when
    batch_size < 1."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def pad_batch(examples: Sequence[tuple[np.ndarray, np.ndarray]], pad_id: int) -> dict[str, np.ndarray]:
    """One padded batch of (input_ids, labels) examples, right-padded to the longest: ``input_ids``
    int64 (batch, longest), ``labels`` int64 (-100 on padding), ``attention_mask`` int64 (1 on tokens,
    0 on padding), as transformers' causal LMs take them. Raises ValueError for no examples."""
    if not examples:
        raise ValueError("pad_batch needs at least one example")
    longest = max(len(ids) for ids, _ in examples)
    shape = (len(examples), longest)
    batch = {
        "input_ids": np.full(shape, pad_id, dtype=np.int64),
        "labels": np.full(shape, IGNORE_INDEX, dtype=np.int64),
        "attention_mask": np.zeros(shape, dtype=np.int64),
    }
    for r, (ids, labels) in enumerate(examples):
        batch["input_ids"][r, : len(ids)] = ids
        batch["labels"][r, : len(ids)] = labels
        batch["attention_mask"][r, : len(ids)] = 1
    return batch


def padding_fraction(batch: Packed | dict[str, np.ndarray]) -> float:
    """The share of positions that are padding (compute spent on no token): for :class:`Packed` rows,
    positions with segment_ids -1; for a :func:`pad_batch` batch, positions with attention_mask 0."""
    pad = batch.segment_ids < 0 if isinstance(batch, Packed) else batch["attention_mask"] == 0
    return float(pad.mean()) if pad.size else 0.0
