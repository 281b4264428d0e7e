"""Model cards: the README.md of an exported Hugging Face model or PEFT adapter directory, generated
from the lineage that made it, and ``lineage.json`` beside it (the same facts, for programs: an
adapter's card embeds its base model's lineage from there).

``from_pretrained`` ignores both files. The card is a Hugging Face model card (YAML metadata block
written by huggingface_hub's ModelCard/ModelCardData, then Markdown). The lineage is a JSON object:

    kind            "base_model" or "lora_adapter"
    data_version    the artifact's data version
    corpora         list of {role, source, provenance (the provenance file's fields, or null),
                    content_digests {partition: digest}, data_versions {asset: version, or {partition: version}},
                    documents {input, kept, filtered, duplicate, rejected}, shards {total_tokens, seq_len,
                    train_sequences, validation_sequences, dtype}}
    tokenizer       {data_version, vocab_size, eos_id, sha256, pretrained_model (or null: a BPE trained here)}
    training        {config: the hyperparameters, results: the trainer's summary (losses, steps, ...),
                    adapter: {r, lora_alpha, target_modules} of a LoRA adapter} or null
    imported        {from, content_digest} for a base model imported instead of pretrained, else absent
    base            the base model's lineage (an adapter's), or null when unknown
    software        {largetrain, commit, python, torch, transformers, peft, deepspeed, tokenizers}

Every field may be null where the producing step did not record it; the card then says "unknown".
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import subprocess
from pathlib import Path

from largetrain_core.storage import write_json_atomic

CARD = "README.md"
LINEAGE = "lineage.json"
TRAINING_KEYS = (
    "preset",
    "mode",
    "task",
    "zero_stage",
    "offload_optimizer",
    "precision",
    "activation_checkpointing",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "max_steps",
    "learning_rate",
    "min_lr_ratio",
    "warmup_steps",
    "weight_decay",
    "max_grad_norm",
    "seed",
    "seq_len",
    "lora",
)
STAGES = ("raw_corpus", "cleaned_text", "deduplicated_text", "filtered_text", "token_shards")
RESULT_KEYS = (
    "steps",
    "first_loss",
    "last_loss",
    "tokens_seen",
    "tokens_per_s",
    "precision",
    "precision_reason",
    "world_size",
    "zero_stage",
    "parameters",
    "trainable_parameters",
    "train_seconds",
)


def software_versions() -> dict:
    """largetrain's version (and git commit, ``+changes`` when the tree differs from it, when it runs
    from a git checkout), Python and the versions of the libraries that shape a model."""
    out = {"python": platform.python_version()}
    for dist in ("largetrain", "torch", "transformers", "peft", "deepspeed", "tokenizers"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    src = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode == 0:
            dirty = subprocess.run(
                ["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            out["commit"] = commit.stdout.strip() + ("+changes" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        pass
    return out


def _fmt(value, spec: str = ",") -> str:
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and spec == ",":
        return format(value, ",.1f") if abs(value) >= 100 else format(value, ".4g")
    if isinstance(value, (int, float)):
        return format(value, spec)
    return str(value)


def _table(header: tuple[str, ...], rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _corpus_source(c: dict) -> str:
    p = c.get("provenance")
    if p:
        version = " ".join(str(x) for x in (p.get("package"), p.get("version")) if x)
        where = f" from {p['registry']}" if p.get("registry") else ""
        archive = f", archive `{p['archive']}` sha256 `{p['archive_sha256']}`" if p.get("archive_sha256") else ""
        note = f" Note: {p['note']}" if p.get("note") else ""
        return (
            f"{version}{where}{archive}; {_fmt(p.get('files'))} files, {_fmt(p.get('bytes'))} bytes, content "
            f"digest `{p.get('content_digest')}`, fetched {p.get('fetched_at')}.{note}"
        )
    return f"`{c.get('source')}` (no provenance file: identified by the content digests of the files read)"


def _versions(v) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k}: `{x}`" for k, x in sorted(v.items()))
    return f"`{v}`" if v else "unknown"


def _corpora_section(corpora: list[dict]) -> list[str]:
    out = []
    for c in corpora:
        d, s = c.get("documents") or {}, c.get("shards") or {}
        out += [f"### {c.get('role')} corpus", "", f"Source: {_corpus_source(c)}", ""]
        if c.get("content_digests"):
            out += [
                f"Content digests of the files read (xxh3-128 per partition): {_versions(c['content_digests'])}",
                "",
            ]
        out += [
            _table(
                ("read", "kept", "filtered", "duplicates", "rejected"),
                [(d.get("input"), d.get("kept"), d.get("filtered"), d.get("duplicate"), d.get("rejected"))],
            ),
            "",
        ]
        if s:
            out += [
                f"Token shards: {_fmt(s.get('total_tokens'))} tokens at sequence length {_fmt(s.get('seq_len'))} "
                f"({_fmt(s.get('train_sequences'))} training and {_fmt(s.get('validation_sequences'))} validation "
                f"sequences, {_fmt(s.get('dtype'))}).",
                "",
            ]
        if c.get("data_versions"):
            order = sorted(c["data_versions"], key=lambda k: (STAGES.index(k) if k in STAGES else len(STAGES), k))
            out += ["Data versions:", ""] + [f"- {k}: {_versions(c['data_versions'][k])}" for k in order] + [""]
    return out


def _task_section(task: dict | None) -> list[str]:
    """What a fine-tuned model does (``lineage["task"]``): for classification the label set in label order
    and the held-out test metrics beside the baselines; for chat the assistant tokens' perplexity, the
    held-out answers' scores and the chat template."""
    if not task or task.get("task") in (None, "causal_lm"):
        return []
    out = ["## Task", "", f"Task: `{task['task']}`.", ""]
    if task["task"] == "classification":
        out += [
            "Labels, in label order (the config's id2label): " + ", ".join(f"`{n}`" for n in task["label_names"]) + ".",
            "",
            "Held-out test split (records never trained on):",
            "",
            _table(
                ("model", "accuracy", "macro-F1"),
                [(name, round(m["accuracy"], 4), round(m["macro_f1"], 4)) for name, m in task["test"].items()],
            ),
            "",
        ]
        if task.get("balancing"):
            out += [f"Class balancing in training: {task['balancing']}.", ""]
    if task["task"] == "chat" and task.get("assistant_perplexity") is not None:
        out += [
            f"Held-out test conversations: perplexity {round(task['assistant_perplexity'], 2)} on the assistant tokens.",
            "",
        ]
    if task["task"] == "chat" and task.get("answers"):
        out += ["Held-out answers, generated greedily through the template:", "", task["answers"], ""]
    if task["task"] == "chat" and task.get("chat_template"):
        out += [
            "Chat template (saved with the tokenizer; `tokenizer.apply_chat_template`):",
            "",
            "```jinja",
            task["chat_template"],
            "```",
            "",
        ]
    return out


def _training_section(lineage: dict) -> list[str]:
    if lineage.get("imported"):
        imp = lineage["imported"]
        return [
            f"Imported, not trained here: copied from `{imp.get('from')}` (content digest "
            f"`{imp.get('content_digest')}`) as fp32 safetensors.",
            "",
        ]
    training = lineage.get("training") or {}
    cfg, res = training.get("config") or {}, training.get("results") or {}
    keys = [k for k in TRAINING_KEYS if k in cfg and not (k == "preset" and cfg.get("mode") == "lora")]
    out = [
        "Configuration:",
        "",
        _table(
            ("setting", "value"),
            [(k, json.dumps(cfg[k], sort_keys=True) if isinstance(cfg[k], (dict, list)) else cfg[k]) for k in keys],
        ),
        "",
    ]
    if training.get("adapter"):
        a = training["adapter"]
        out += [
            f"LoRA: r={_fmt(a.get('r'))}, lora_alpha={_fmt(a.get('lora_alpha'))}, target modules "
            f"{', '.join(f'`{m}`' for m in a.get('target_modules') or []) or 'unknown'} (from adapter_config.json).",
            "",
        ]
    rows = [(k, res[k]) for k in RESULT_KEYS if res.get(k) is not None]
    last = res.get("last_loss")
    if isinstance(last, (int, float)) and math.isfinite(last):
        perplexity = round(math.exp(last), 3) if last < 700 else math.inf  # exp overflows a float past ~709.8
        rows.append(("training perplexity (exp of the last logged training loss)", perplexity))
    rows += [
        (k, v)
        for k, v in sorted(res.items())
        if ("perplexity" in k or k.startswith(("val", "eval"))) and isinstance(v, (int, float)) and k not in RESULT_KEYS
    ]
    out += [
        "Results at the end of training:",
        "",
        _table(("metric", "value"), rows),
        "",
        "Held-out perplexities are computed after training by the `evaluation` asset and recorded in its "
        "materialization, not here.",
        "",
    ]
    return out


def _intro_section(lineage: dict, adapter: bool, sw: dict) -> list[str]:
    """The card's title, data version, how to load it, and the Training data heading."""
    title = "LoRA adapter" if adapter else "Base model"
    load = (
        "`PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE), THIS_DIR, adapter_name=...)` "
        "(the adapter's name is in `adapter_name.txt`)"
        if adapter
        else "`AutoModelForCausalLM.from_pretrained(THIS_DIR)`; the tokenizer files are in the same directory"
    )
    return [
        f"# {title} made by largetrain",
        "",
        f"Data version `{lineage.get('data_version')}`, made by largetrain {_fmt(sw.get('largetrain'))}"
        + (f" (commit `{sw['commit']}`)" if sw.get("commit") else "")
        + ". Load it with "
        + load
        + ".",
        "",
        "This card was generated from the lineage that produced the model; `lineage.json` beside it holds the "
        "same facts as JSON.",
        "",
        "## Training data",
        "",
    ]


def _tokenizer_section(tok: dict) -> list[str]:
    """The Tokenizer section (copied or trained; vocabulary, EOS, sha256, data version) and the Training heading."""
    return [
        "## Tokenizer",
        "",
        (
            f"Copied from `{tok['pretrained_model']}`"
            if tok.get("pretrained_model")
            else "Byte-level BPE trained by largetrain on the deduplicated pretraining corpus"
        )
        + f": vocabulary {_fmt(tok.get('vocab_size'))}, "
        f"EOS id {_fmt(tok.get('eos_id'))}, tokenizer.json sha256 `{tok.get('sha256')}`, data version "
        f"`{tok.get('data_version')}`.",
        "",
        "## Training",
        "",
    ]


def _base_section(base: dict) -> list[str]:
    """An adapter card's Base model section: its data version, import, and its own training data."""
    body = [
        "## Base model",
        "",
        f"Data version `{base.get('data_version')}`"
        + (f", imported from `{base['imported']['from']}`" if base.get("imported") else "")
        + ". Its own training data:",
        "",
    ]
    body += _corpora_section(base.get("corpora") or []) if base else ["unknown", ""]
    return body


def render_model_card(lineage: dict, existing: str | None = None) -> str:
    """The model card (README.md text) for ``lineage`` (see the module doc). ``existing``: a card
    already in the directory (PEFT writes one on save_pretrained); its metadata block is kept
    (library_name, tags, base_model, ...) and its text replaced."""
    from huggingface_hub import ModelCard, ModelCardData

    adapter = lineage.get("kind") == "lora_adapter"
    data = ModelCard(existing, ignore_metadata_errors=True).data.to_dict() if existing else {}
    data.setdefault("library_name", "peft" if adapter else "transformers")
    data.setdefault("pipeline_tag", "text-generation")
    data["tags"] = sorted(set(data.get("tags") or []) | {"largetrain"} | ({"lora"} if adapter else set()))
    meta = ModelCardData(**data)
    sw = lineage.get("software") or {}
    body = _intro_section(lineage, adapter, sw)
    body += _corpora_section(lineage.get("corpora") or [])
    body += _tokenizer_section(lineage.get("tokenizer") or {})
    body += _training_section(lineage) + _task_section(lineage.get("task"))
    if adapter:
        body += _base_section(lineage.get("base") or {})
    body += ["## Software", "", _table(("package", "version"), sorted(sw.items())), ""]
    return ModelCard(f"---\n{meta.to_yaml()}\n---\n\n" + "\n".join(body)).content


def write_model_card(model_dir: str | Path, lineage: dict) -> Path:
    """Write ``README.md`` (:func:`render_model_card`, keeping the metadata of a card already there)
    and ``lineage.json`` into ``model_dir``, each atomically. Returns the card's path."""
    model_dir = Path(model_dir)
    card = model_dir / CARD
    existing = card.read_text(encoding="utf-8") if card.exists() else None
    write_json_atomic(model_dir / LINEAGE, lineage)
    tmp = card.with_name(f".{CARD}.{os.getpid()}.tmp")
    tmp.write_text(render_model_card(lineage, existing), encoding="utf-8")
    os.replace(tmp, card)
    return card


def read_lineage(model_dir: str | Path) -> dict | None:
    """The ``lineage.json`` of a model directory, or None when it has none or it cannot be read."""
    try:
        return json.loads((Path(model_dir) / LINEAGE).read_text())
    except (OSError, ValueError):
        return None
