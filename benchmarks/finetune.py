"""Fine-tuning on chat data (issue 40), measured by hand on this machine; each part writes its own key of
the JSON and keeps the others' keys (results merged into an existing file, written atomically).

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/finetune.py --parts packing [--quick]
        [--out benchmarks/results/finetune.json]

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

PARTS = ("packing",)  # to come: "classification" (issue 40 (a)), "chat_ppl" (issue 40 (c))

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
    merge_write(Path(args.out), results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
