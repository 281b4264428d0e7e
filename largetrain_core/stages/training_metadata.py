"""What the training stages show of a finished training (largetrain_core.stages.training): its numbers
rounded with the unit in the name, the curves, the loss table, the trackers' runs, the plan beside what
was measured, the adapter's and the task's results, and the blocking checks ``loss_finite_and_decreasing``
and ``beats_majority_baseline``. Metadata values are the stage contract's kinds
(largetrain_core.stages.base: Markdown, Text, Json, Url, paths)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from largetrain_core.stages.base import Check, Json, Markdown, StageRun, Text, Url
from largetrain_core.training import calibrate, health
from largetrain_core.training.config import TrainConfig
from largetrain_core.training.plan import PLAN, PLAN_TABLE, plan_numbers, plan_vs_measured
from largetrain_core.training.trackers import METRICS, RECORDS, read_metrics

LOSS_CHECK = (
    "training health (largetrain_core.training.health; thresholds in the run config's health section): every "
    "training loss finite; at most health.max_skipped_fraction of the steps skipped (gradient overflow) or with a "
    "non-finite gradient norm; the mean loss of the last 10% of steps below that of the first 10% by "
    "health.min_loss_decrease and below ln(vocabulary size), a uniform prediction's loss, by "
    "health.min_nats_below_uniform nats (0: not judged); not stopped early as collapsed "
    "(health.stop_after_collapsed_steps) (blocking)"
)
MAJORITY_CHECK = (
    "task classification: the classifier's macro-F1 on the held-out test split is above the majority-class "
    "baseline's (largetrain_core.training.task_evaluation.evaluate_classifier; blocking). Other tasks: passes, with a note."
)


def _inline_png(png: Path, alt: str) -> Markdown:
    return Markdown(f"![{alt}](data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()})")


def trained_metadata(out: Path, summary: dict, cfg: TrainConfig, model_dir: Path) -> dict:
    """Metadata of a finished training in ``out``: its settings (``config``: sectioned, as
    train_config.json, less its paths), the curves (training and validation loss and learning rate
    against step) inline and as a path, the run's numbers (:func:`training_numbers`), the plan beside
    what was measured (:func:`plan_metadata`), the loss table, and each tracker's run record
    (``<tracker>_run_id``, its location, e.g. ``wandb_sync_command`` for offline W&B)."""
    from largetrain_core.stages.training import local_dir

    rows = read_metrics(out / METRICS)
    md = {}
    png = local_dir(summary.get("loss_curve") or out / "loss_curve.png")
    if png.suffix == ".png" and png.exists():
        md["training_curves"] = _inline_png(png, "training and validation loss, learning rate")
        md["training_curves_png"] = png
    if rows:
        md["loss_curve"] = Text(loss_sparkline(rows))
    gguf = sorted((out / "gguf").glob("*.gguf")) if (out / "gguf").is_dir() else []
    if gguf:
        md["gguf_files"] = Json([str(p) for p in gguf])
    md.update(training_numbers(summary, rows))
    md.update(plan_metadata(out, summary, rows))
    md.update(
        {
            "loss_table": loss_table(rows),
            "mfu_formula": Text(summary["mfu_formula"]),
            "precision": summary["precision"],
            "precision_reason": summary["precision_reason"],
            "peak_flops_source": str(summary.get("peak_flops_source")),
            "output": model_dir,
            "resumed_from": (
                local_dir(summary["resumed_from"]) if summary.get("resumed_from") else "none: started from step 0"
            ),
            **tracker_metadata(out / RECORDS),
            "config": Json({k: v for k, v in cfg.to_dict().items() if k not in ("output_dir", "train_shards")}),
        }
    )
    return md


SPARK_LEVELS = "▁▂▃▄▅▆▇█"


def loss_sparkline(rows: list[dict], width: int = 48) -> str:
    """The training loss against the step as one line of text that the asset page shows as it is (a
    Markdown image hides behind a link there): the logged steps cut into ``width`` equal spans of steps,
    each span's mean loss drawn as one of 8 block heights between the lowest and the highest mean, e.g.
    ``loss 9.061 → 5.164, steps 1-500: █▇▆▅▄▄▃▃▂▂▁▁``. Skipped steps (gradient overflow) and non-finite
    losses are left out; "" without a finite loss."""
    import math

    points = [
        (r["step"], r["loss"])
        for r in rows
        if "loss" in r
        and not r.get("step_skipped")
        and isinstance(r["loss"], (int, float))
        and math.isfinite(r["loss"])
    ]
    if not points:
        return ""
    first, last = points[0][0], points[-1][0]
    spans: dict[int, list[float]] = {}
    for step, loss in points:
        spans.setdefault(min(width - 1, (step - first) * width // max(1, last - first + 1)), []).append(loss)
    means = [sum(v) / len(v) for _, v in sorted(spans.items())]
    lo, hi = min(means), max(means)
    levels = len(SPARK_LEVELS) - 1
    line = "".join(SPARK_LEVELS[round((m - lo) / (hi - lo) * levels) if hi > lo else 0] for m in means)
    return f"loss {points[0][1]:.3f} → {points[-1][1]:.3f}, steps {first}-{last}: {line}"


def training_numbers(summary: dict, rows: list[dict]) -> dict:
    """The run's numbers for people and plots: every integer of the summary as it is (steps,
    parameters, resumed_from_step, ...), and its measurements rounded, the unit in the name (losses in
    nats to 3 decimals, percentages to 1, TFLOP/s to 3, seconds to 1, memory in GiB to 3); None left out."""
    last = rows[-1] if rows else {}
    peak_mem = last.get("peak_memory_gib", last.get("peak_rss_gib"))

    def r(value, digits):
        return None if value is None else round(value, digits) if digits else int(round(value))

    def pct(value):
        return None if value is None else round(100 * value, 1)

    numbers = {k: v for k, v in summary.items() if isinstance(v, int) and not isinstance(v, bool)}
    numbers.update(
        {
            "stopped_early": summary.get("stopped_early"),
            "first_loss": r(summary["first_loss"], 3),
            "last_loss": r(summary["last_loss"], 3),
            "eval_loss": r(summary.get("eval_loss"), 3),
            "eval_perplexity": r(summary.get("eval_perplexity"), 2),
            "best_eval_loss": r(summary.get("best_eval_loss"), 3),
            "best_eval_step": summary.get("best_eval_step"),
            "tokens_per_s": r(summary["tokens_per_s"], 0),
            "mfu_percent": pct(summary["mfu"]),
            "mean_mfu_percent": pct(summary.get("mean_mfu")),
            "peak_tflops": r(summary["peak_flops"] / 1e12 if summary["peak_flops"] else None, 3),
            "mflops_per_token": r(summary["flops_per_token"] / 1e6, 2),
            "peak_memory_gib": r(peak_mem, 3),
            "train_seconds": r(summary["train_seconds"], 1),
            "eval_seconds": r(summary.get("eval_seconds"), 1),
            "trainable_percent": round(100 * summary["trainable_parameters"] / summary["parameters"], 2),
        }
    )
    return {k: v for k, v in numbers.items() if v is not None}


def loss_table(rows: list[dict], about: int = 20) -> Markdown:
    """Markdown table of about ``about`` evenly spaced steps plus every evaluated step and the last step:
    step, training loss, validation loss, learning rate, MFU (%)."""
    every = max(1, len(rows) // about)
    keep = {r["step"] for r in rows[::every]} | {r["step"] for r in rows if r.get("eval_loss") is not None}
    keep |= {rows[-1]["step"]} if rows else set()

    def num(value, fmt):
        return "" if value is None else format(value, fmt)

    lines = [
        f"| {r['step']} | {num(r['loss'], '.4f')} | {num(r.get('eval_loss'), '.4f')} | {num(r.get('lr'), '.2e')} | "
        f"{num(100 * r['mfu'] if r.get('mfu') is not None else None, '.1f')} |"
        for r in rows
        if r["step"] in keep
    ]
    return Markdown(
        "| step | training loss (nats) | validation loss (nats) | learning rate | MFU (%) |\n|---|---|---|---|---|\n"
        + "\n".join(lines)
    )


def plan_metadata(out: Path, summary: dict, rows: list[dict]) -> dict:
    """``plan`` (the table shown before the launch), ``plan_vs_measured`` (plan.plan_vs_measured, with the
    calibration's measured peak when one ran) and the planned numbers (plan.plan_numbers); {} for a
    training without plan.json (trained before plans)."""
    f = Path(out) / PLAN
    if not f.exists():
        return {}
    plan = json.loads(f.read_text())
    cal = Path(out) / "calibration" / calibrate.CALIBRATION
    compared = plan_vs_measured(plan, summary, rows, json.loads(cal.read_text()) if cal.exists() else None)
    table = Path(out) / PLAN_TABLE
    return {
        "plan": Markdown(table.read_text() if table.exists() else ""),
        "plan_vs_measured": Markdown(compared["table"]),
        **plan_numbers(plan),
    }


def adapter_metadata(adapter_dir: Path) -> dict:
    """``lora_r``, ``lora_alpha`` and ``lora_target_modules`` (sorted, comma-separated) from PEFT's
    adapter_config.json in ``adapter_dir``; {} when it is missing."""
    f = Path(adapter_dir) / "adapter_config.json"
    if not f.exists():
        return {}
    a = json.loads(f.read_text())
    return {
        "lora_r": a.get("r"),
        "lora_alpha": a.get("lora_alpha"),
        "lora_target_modules": ", ".join(sorted(a.get("target_modules") or [])),
    }


def tracker_metadata(records_file: Path) -> dict:
    """``<tracker>_<key>`` for every entry of every tracker's run record (trackers.json): directories as
    paths, URLs as links, commands as code."""
    records = json.loads(records_file.read_text()) if records_file.exists() else {}
    md = {}
    for name, record in sorted(records.items()):
        for k, v in record.items():
            md[f"{name}_{k}"] = (
                Path(v)
                if k == "dir"
                else Url(v)
                if k == "url"
                else Markdown(f"`{v}`")
                if k.endswith("_command")
                else str(v)
            )
    return md


def task_metadata(cfg: TrainConfig, out: Path, examples: dict | None, evaluated: dict | None) -> dict:
    """The adapter's task; for classification the label set, the split, the documents left out (no label
    in the set), the test metrics beside the baselines (tables) and the confusion matrix; for chat the
    assistant turns' loss and perplexity, the generations, the split and the chat template."""
    from largetrain_core.classification import metrics_markdown

    md = {"task": cfg.task}
    if examples is None or evaluated is None:
        return md
    if cfg.task == "chat":
        rows = "\n".join(
            "| {} | {} | {} |".format(
                *(x.replace("|", "\\|").replace("\n", " ") for x in (g["prompt"], g["reference"], g["generated"]))
            )
            for g in evaluated["generations"]
        )
        md.update(
            {
                "test_assistant_loss": round(evaluated["assistant_loss"], 4),
                "test_assistant_perplexity": evaluated["assistant_perplexity"]
                and round(evaluated["assistant_perplexity"], 2),
                "test_assistant_tokens": evaluated["assistant_tokens"],
                "generations": Markdown("| prompt | reference | generated |\n|---|---|---|\n" + rows),
                "answers": Markdown(answers_markdown(evaluated)),
                "split": Json(examples["split"]["counts"]),
                "documents_left_out": len(examples["left_out"]),
                "chat_template": Text(examples["manifest"].get("chat_template") or ""),
            }
        )
        return md
    names = evaluated["label_names"]
    rows = "\n".join(
        f"| {name} | {evaluated[name]['accuracy']:.4f} | {evaluated[name]['macro_f1']:.4f} |"
        for name in ("lora", "tfidf_logreg", "majority")
    )
    md.update(
        {
            "label_names": Json(names),
            "test_accuracy": round(evaluated["lora"]["accuracy"], 4),
            "test_macro_f1": round(evaluated["lora"]["macro_f1"], 4),
            "baselines": Markdown("| model | accuracy | macro-F1 |\n|---|---|---|\n" + rows),
            "per_class": Markdown(metrics_markdown(evaluated["lora"])),
            "validation_loss_per_class": Json(evaluated.get("validation_loss_per_class")),
            "split": Json(examples["split"]["counts"]),
            "documents_left_out": len(examples["left_out"]),
            "left_out": Json(examples["left_out"][:100]),
        }
    )
    png = out / "confusion_matrix.png"
    if png.exists():
        md["confusion_matrix"] = _inline_png(png, "confusion matrix, test split")
    return md


def answers_markdown(evaluated: dict) -> str:
    """A chat adapter's held-out answers scored by SQuAD's exact match and token F1 (largetrain_core.harness
    .answer_scores): the generations shown, and every test conversation's last answer through
    lm-evaluation-harness (value ± standard error), as a Markdown table."""

    def cell(m):
        if m is None:
            return "-"
        if isinstance(m, dict):
            return f"{m['value']:.4f}" + (f" ± {m['stderr']:.4f}" if m.get("stderr") is not None else "")
        return f"{m:.4f}"

    rows = [("generations shown", evaluated["answers"])]
    if evaluated.get("lm_eval"):
        rows.append((f"lm-evaluation-harness `{evaluated['lm_eval']['task']}`", evaluated["lm_eval"]))
    return "| scored | items | exact match | token F1 |\n|---|---|---|---|\n" + "\n".join(
        f"| {name} | {r['items']} | {cell(r['exact_match'])} | {cell(r['token_f1'])} |" for name, r in rows
    )


def card_task(cfg: TrainConfig, evaluated: dict | None, examples: dict | None) -> dict | None:
    """The model card's Task section (largetrain_core.model_card) of a fine-tuning task, else None: the
    label set, the test metrics beside the baselines, and the balancing of the train split."""
    if cfg.task == "causal_lm":
        return None
    task = {"task": cfg.task}
    balance = (examples or {}).get("balancing")
    if balance:
        per_class = ", ".join(f"{c} {balance['before'][c]} -> {balance['after'].get(c, 0)}" for c in balance["before"])
        task["balancing"] = f"{balance['mode']} (seed {balance['seed']}), documents per class {per_class}"
    if evaluated is not None and cfg.task == "classification":
        task.update(
            label_names=evaluated["label_names"],
            test={k: evaluated[k] for k in ("lora", "tfidf_logreg", "majority")},
        )
    if cfg.task == "chat" and examples:
        task["chat_template"] = examples["manifest"].get("chat_template")
        if evaluated is not None:
            task["assistant_perplexity"] = evaluated["assistant_perplexity"]
            task["answers"] = answers_markdown(evaluated)
    return task


def loss_check(run: StageRun, out: Path, summary: dict, cfg: TrainConfig) -> Check:
    """``loss_finite_and_decreasing`` (:data:`LOSS_CHECK`) of a finished training:
    largetrain_core.training.health.judge_metrics of its metrics.jsonl with ``cfg.health`` (the run
    config's thresholds, read now, so a changed threshold re-judges a reused training); its counts and
    causes in the run log too."""
    verdict = health.judge_metrics(out / METRICS, summary.get("vocab_size"), cfg.health, summary.get("collapsed"))
    n = verdict.numbers
    counts = (
        f"{n.get('skipped_steps', 0)} of {n['steps_logged']} steps skipped (gradient overflow), "
        f"{n.get('nonfinite_grad_norm_steps', 0)} with a non-finite gradient norm, "
        f"{n.get('nonfinite_loss_steps', 0)} with a non-finite loss"
    )
    if verdict.passed:
        run.log.info(f"training health of {run.name}: {counts}; passed")
    else:
        run.log.error(f"training health of {run.name}: {counts}; failed: " + "; ".join(verdict.problems))
    return Check(
        verdict.passed,
        {**{k: v for k, v in n.items() if v is not None}, "problems": Json(verdict.problems)},
        "; ".join(verdict.problems) or None,
    )


def majority_check(run: StageRun, evaluated: dict | None) -> Check:
    """``beats_majority_baseline`` (:data:`MAJORITY_CHECK`) of a classifier's evaluation, or a pass with a note."""
    if evaluated is None or "majority" not in evaluated:
        return Check(True, {"note": "not a classifier: nothing to check"})
    lora, majority = evaluated["lora"]["macro_f1"], evaluated["majority"]["macro_f1"]
    if lora > majority:
        return Check(True, {"macro_f1": round(lora, 4), "majority_macro_f1": round(majority, 4)})
    description = (
        f"the classifier's test macro-F1 {lora:.4f} is not above the majority-class baseline's {majority:.4f}: "
        "it has not learnt the classes (train longer, raise learning_rate, balance the classes, or check the labels)"
    )
    run.log.error(f"{run.name}: {description}")
    return Check(False, {"macro_f1": round(lora, 4), "majority_macro_f1": round(majority, 4)}, description)
