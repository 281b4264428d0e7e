"""Print what the last materialization of each asset recorded: `python -m largetrain_dagster.summary`
(`make demo` ends with it; after a recipe of your own, run it with the same DAGSTER_HOME).

Reads the Dagster instance under DAGSTER_HOME (the materialization metadata), so it shows what
Dagster recorded, not what is on disk; only the sample generations are read from the samples.json of
the evaluation directory that Dagster recorded.
"""

from __future__ import annotations

import argparse
import re
import sys

from datetime import datetime, timezone

from dagster import AssetKey, AssetRecordsFilter, DagsterEventType, DagsterInstance, DagsterRunStatus

from largetrain_core import fs
from largetrain_core.provenance import describe
from largetrain_core.storage import read_json
from largetrain_dagster.partitions import DATA_PARTITIONS, PARTITIONED_KEYS, filters_text
from largetrain_dagster.shards import tiny_validation_warning


def _metadata(instance: DagsterInstance, *path: str) -> dict:
    event = instance.get_latest_materialization_event(AssetKey(list(path)))
    if event is None or event.asset_materialization is None:
        return {}
    return {k: getattr(v, "value", v) for k, v in event.asset_materialization.metadata.items()}


def _when(timestamp: float | None) -> str:
    return (
        "n/a" if timestamp is None else datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    )


def _step_failure(instance: DagsterInstance, run_id: str, step: str, width: int = 400) -> str | None:
    """Why step ``step`` (or an op of that graph-backed asset) failed in run ``run_id``, on one line cut to
    ``width`` characters: a dagster.Failure's description, else the innermost cause's message; None when
    it did not fail there."""
    for e in instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE):
        if e.step_key != step and not (e.step_key or "").startswith(step + "."):
            continue
        data = e.dagster_event.event_specific_data
        user = getattr(data, "user_failure_data", None)
        if user is not None and user.description:
            text = user.description
        else:
            error = data.error
            while error is not None and error.cause is not None:
                error = error.cause
            text = error.message if error is not None else "failed"
        text = " ".join(text.split())
        return text if len(text) <= width else text[: width - 3] + "..."
    return None


def failures(instance: DagsterInstance) -> list[str]:
    """A line for each asset (and data partition) whose latest run that planned it failed to materialize it,
    saying when and why and which materialization the summary shows instead; and for each whose latest
    materialization failed a blocking check (largetrain_dagster.resources.failed_blocking_checks)."""
    from largetrain_dagster.resources import failed_blocking_checks

    lines = []
    for key in sorted(instance.get_asset_keys(), key=lambda k: k.to_user_string()):
        name = key.to_user_string()
        if key.path[0] == "landed":  # its dynamic partitions: the landing sensor's runs, not the recipes'
            continue
        parts = DATA_PARTITIONS.get_partition_keys() if key in PARTITIONED_KEYS else [None]
        for pk in parts:
            planned = instance.event_log_storage.get_latest_planned_materialization_info(key, pk)
            if planned is None:
                continue
            made = instance.fetch_materializations(
                AssetRecordsFilter(asset_key=key, asset_partitions=[pk] if pk else None), limit=1
            ).records
            if made and made[0].storage_id > planned.storage_id:
                continue
            run = instance.get_run_by_id(planned.run_id)
            if run is None or run.status not in (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED):
                continue  # a run still going, or one that succeeded (then it materialized it)
            step = "__".join(key.path)
            why = _step_failure(instance, run.run_id, step) or (
                "not run: an earlier step of the run failed" if run.status == DagsterRunStatus.FAILURE else "cancelled"
            )
            what = name + (f" partition {pk}" if pk else "")
            shown = (
                f"what this summary shows of it is from run {made[0].run_id[:8]} ({_when(made[0].timestamp)})"
                if made
                else "it has never been materialized"
            )
            lines.append(
                f"  {what}: the latest run {run.run_id[:8]} ({_when(_run_start(instance, run.run_id))}) failed: {why}; {shown}"
            )
        if key not in PARTITIONED_KEYS:
            for f in failed_blocking_checks(instance, key):
                lines.append(
                    f"  {name}: its latest materialization (run {f['run_id'][:8]}) failed the blocking check "
                    f"{f['check']}: {' '.join(f['description'].split())[:300]}; later runs refuse it as an input"
                )
    return ["FAILED (latest runs):", *lines] if lines else []


def _run_start(instance: DagsterInstance, run_id: str) -> float | None:
    record = instance.get_run_record_by_id(run_id)
    return record.start_time if record is not None else None


def _fmt(value, spec: str = ",") -> str:
    if value is None:
        return "n/a"
    return format(value, spec) if isinstance(value, (int, float)) else str(value)


def corpus_version(corpus: dict | None) -> str:
    """The corpus's provenance in one line, or the content digests of the files read when it has none."""
    if not corpus:
        return "n/a"
    if corpus.get("provenance"):
        line = describe(corpus["provenance"])
        return line + (f" -- {corpus['provenance']['note']}" if corpus["provenance"].get("note") else "")
    digests = corpus.get("content_digests") or {}
    if len(set(digests.values())) == 1 and len(digests) > 1:  # one file split across partitions
        return f"no provenance file; content digest {(next(iter(digests.values())) or 'n/a')[:16]} (every partition)"
    return "no provenance file; content digests " + ", ".join(
        f"{k} {(d or 'n/a')[:16]}" for k, d in sorted(digests.items())
    )


def _balancing(dedup: dict) -> list[str]:
    """Lines on the class balancing of a deduplicated_text materialization (none when it had none)."""
    b = dedup.get("balance")
    if not b and dedup.get("labels_not_balanced"):
        classes = dedup["labels_not_balanced"]
        return [
            "  labels read, not balanced (balance_target null): documents per class "
            + ", ".join(f"{c} {n:,}" for c, n in sorted(classes.items(), key=lambda e: (-e[1], e[0])))
        ]
    if not b:
        return []
    mode = {"down": "down-sampled", "up": "up-sampled"}.get(b.get("mode"), b.get("mode"))
    before, after = b.get("before") or {}, b.get("after") or {}
    classes = ", ".join(f"{c} {before.get(c, 0):,} -> {after.get(c, 0):,}" for c in sorted(set(before) | set(after)))
    line = f"  balancing ({mode}, seed {b.get('seed')}): per class before -> after: {classes}"
    if b.get("mode") == "up":
        line += (
            f"; {b.get('balance_repeats', 0):,} extra copies of {b.get('repeated_documents', 0):,} documents, "
            f"trained on in the train split (intended repeats, not duplicates)"
        )
    else:
        line += f"; {b.get('balance_dropped', 0):,} documents left out (counted as filtered, reason balance_downsample)"
    return [line]


def _corpus(instance: DagsterInstance, role: str, label: str) -> list[str]:
    """The summary lines of one role's corpus chain: source, documents, dedup, balancing, token shards."""
    raw = _metadata(instance, role, "raw_corpus")
    dedup = _metadata(instance, role, "deduplicated_text")
    filt = _metadata(instance, role, "filtered_text") if filters_text(role) else {}
    shards = _metadata(instance, role, "token_shards")
    chain = filt or dedup  # the accounting of the whole chain, to the text the shards are made of
    corpus = dedup.get("corpus") or {}
    lines = [
        f"{label} ({role}): {corpus.get('source') or raw.get('source', 'n/a')}",
        f"  corpus version: {corpus_version(corpus)}",
    ]
    lines.append(_documents_line(dedup, filt, chain))
    lines += _filtering(filt)
    lines += _dedup_notes(dedup, chain)
    lines += _balancing(dedup)
    lines.append(_shards_line(shards))
    lines += _mixture(shards.get("mixture"))
    tiny = tiny_validation_warning(role, shards, shards.get("config") or {}) if shards else None
    if tiny:
        lines.append(f"  WARNING: {tiny}")
    return lines


def _documents_line(dedup: dict, filt: dict, chain: dict) -> str:
    """The summary line of the chain's documents: read, kept, filtered (by what), duplicates, rejected."""
    balanced = (dedup.get("balance") or {}).get("balance_dropped", 0)
    relevance, contaminated = filt.get("removed_relevance", 0), filt.get("removed_contaminated", 0)
    filtered = chain.get("documents_filtered")
    rules = None if filtered is None else filtered - balanced - relevance - contaminated
    exact, near = dedup.get("duplicate_exact"), dedup.get("duplicate_near")
    unverified = dedup.get("near_unverified_kept")  # near candidates kept because verification failed
    return (
        f"  documents read {_fmt(chain.get('documents_input'))} / kept {_fmt(chain.get('documents_kept'))} / "
        f"filtered by the quality rules {_fmt(rules)}"
        + (f" + by balancing {balanced:,}" if balanced else "")
        + (f" + by relevance {relevance:,} + contaminated {contaminated:,}" if filt else "")
        + f" / duplicates {_fmt(chain.get('documents_duplicate'))}"
        + (
            f" (exact {exact:,}, near {near:,}"
            + (f" verified, {unverified:,} candidates kept by verification" if unverified is not None else "")
            + ")"
            if exact is not None and near is not None
            else ""
        )
        + f" / rejected {_fmt(chain.get('documents_rejected'))} ({_fmt(dedup.get('partitions'))} partitions)"
    )


def _dedup_notes(dedup: dict, chain: dict) -> list[str]:
    """The summary lines of the sources that lost most to dedup, PII, rejected files and the removal warning."""
    lines = []
    if dedup.get("sources_most_removed"):
        lines.append(
            "  sources that lost most to dedup: "
            + "; ".join(
                f"{s['source']} {100 * s['removed_fraction']:.1f} % ({s['removed']:,} of {s['read']:,})"
                for s in dedup["sources_most_removed"]
            )
        )
    if dedup.get("pii_redacted") is not None:
        pii = dedup["pii_redacted"]
        lines.append(
            f"  PII replaced by placeholders in {_fmt(dedup.get('pii_documents'))} documents: "
            + (", ".join(f"{k} {v:,}" for k, v in pii.items() if v) or "none found")
        )
    if dedup.get("rejected_files"):
        lines.append(f"  rejected records (file, position, reason): {', '.join(dedup['rejected_files'])}")
    if chain.get("removal_warning"):
        lines.append(f"  WARNING: {chain['removal_warning']}")
    return lines


def _shards_line(shards: dict) -> str:
    """The summary line of the token shards: tokens, sequences, repeats, relevance scores, path."""
    repeats = shards.get("train_repeat_copies")
    return (
        f"  token shards: {_fmt(shards.get('total_tokens'))} tokens; sequences train {_fmt(shards.get('train_sequences'))}, "
        f"validation {_fmt(shards.get('validation_sequences'))}"
        + (
            f"; the train split repeats {shards.get('train_repeated_documents', 0):,} documents "
            f"({repeats:,} extra copies, {shards.get('train_repeat_tokens', 0):,} tokens)"
            if repeats
            else ""
        )
        + (
            f"; relevance_score of its documents p10 {rel['p10']}, median {rel['p50']}, p90 {rel['p90']}"
            if (rel := shards.get("relevance_score")) and rel.get("count")
            else ""
        )
        + f"; {shards.get('path', 'n/a')}"
    )


def _mixture(mix: dict | None) -> list[str]:
    """The realised share of each corpus of a mixture in the train split's tokens, against its target."""
    if not mix:
        return []
    parts = []
    for c, r in mix["corpora"].items():
        how = (
            f"target {100 * r['target_share']:.1f} %" if r.get("target_share") is not None else "no weight"
        ) + f", natural {100 * r['natural_share']:.1f} %"
        if r["repeat_sequences"]:
            how += f", {r['repeat_sequences']:,} sequences repeated"
        if r["downsampled_sequences"]:
            how += f", {r['downsampled_sequences']:,} left out"
        parts.append(f"{c} {100 * r['realised_share']:.1f} % ({how})")
    return ["  mixture, share of the train split's tokens: " + "; ".join(parts)]


def _filtering(filt: dict) -> list[str]:
    """Lines on a filtered_text materialization: the relevance cut with a few kept and removed titles, and
    the contaminated documents with their evaluation items (none when the corpus has no such step)."""
    if not filt:
        return []
    cfg, ex = filt.get("config") or {}, filt.get("examples") or {}
    shown = lambda rows: "; ".join(f"{e['title'] or e['doc_id']!r} {e['relevance_score']:.3f}" for e in rows) or "none"  # noqa: E731
    how = (
        f"top fraction {cfg['relevance_top_fraction']:g}"
        if cfg.get("relevance_top_fraction") is not None
        else f"threshold {cfg['relevance_threshold']:g}"
        if cfg.get("relevance_threshold") is not None
        else "no cut: scored only"
    )
    cut = filt.get("relevance_threshold")
    lines = [
        f"  relevance (relevance_classifier, {how}"
        + (f", score >= {cut:.4f}" if isinstance(cut, float) else "")
        + f"): {filt.get('removed_relevance', 0):,} removed; kept e.g. {shown(ex.get('kept') or [])}; "
        f"removed e.g. {shown(ex.get('removed') or [])}"
    ]
    found, mode = filt.get("contaminated", 0), cfg.get("decontamination", "remove")
    sets = ", ".join(f"{k} {v:,}" for k, v in (filt.get("contaminated_by_set") or {}).items())
    line = f"  decontamination ({mode}): {found:,} documents share a 13-word n-gram with an evaluation item" + (
        f" ({sets}), {'removed (reason contaminated)' if mode == 'remove' else 'KEPT and reported'}" if found else ""
    )
    hits = [
        f"{e['doc_id']} holds {e['eval_set']}/{e['item_id']} ({e['ngram']!r})" for e in ex.get("contaminated") or []
    ]
    return lines + [line + (": " + "; ".join(hits) if hits else "")]


def _training(m: dict) -> str:
    """Loss, steps, speed and precision of a training materialization, as far as it recorded them."""
    parts = [
        f"loss {_fmt(m.get('first_loss'), '.3f')} -> {_fmt(m.get('last_loss'), '.3f')} in {_fmt(m.get('steps'))} steps"
    ]
    if m.get("eval_loss") is not None and m.get("task", "causal_lm") == "classification":
        parts.append(f"validation loss {_fmt(m.get('eval_loss'), '.3f')}")
    elif m.get("eval_loss") is not None:
        parts.append(
            f"validation loss {_fmt(m.get('eval_loss'), '.3f')} (perplexity {_fmt(m.get('eval_perplexity'), '.1f')})"
        )
    parts.append(f"{_fmt(m.get('tokens_per_s'), ',.0f')} tokens/s")
    if m.get("mfu_percent") is not None:
        parts.append(f"MFU {_fmt(m.get('mfu_percent'), '.1f')} %")
    parts.append(f"{m.get('precision', 'n/a')} on {_fmt(m.get('world_size'))} ranks")
    return ", ".join(parts)


def _models(instance: DagsterInstance) -> list[str]:
    base = _metadata(instance, "base_checkpoint")
    lines = []
    if base.get("imported_from"):
        digest = base.get("imported_content_digest")
        lines.append(
            f"base model: imported from {base['imported_from']}"
            + (f" (content {digest[:16]})" if digest else "")
            + f", not trained here; {base.get('output', 'n/a')}"
        )
    elif base:
        preset = ((base.get("config") or {}).get("model") or {}).get("preset", "n/a")
        lines.append(
            f"base model: pretrained here from preset {preset}: {_training(base)}; {base.get('output', 'n/a')}"
        )
    else:
        lines.append("base model: not materialized")
    lora = _metadata(instance, "lora_adapter")
    if lora:
        targets = lora.get("lora_target_modules") or "n/a"
        lines.append(
            f"LoRA adapter: r={_fmt(lora.get('lora_r'))}, lora_alpha={_fmt(lora.get('lora_alpha'), 'g')} on {targets}: "
            f"{_training(lora)}; {lora.get('output', 'n/a')}"
        )
        if lora.get("task") == "classification":
            lines.append(
                f"classifier ({', '.join(lora.get('label_names') or [])}): on the held-out test split accuracy "
                f"{_fmt(lora.get('test_accuracy'), '.3f')}, macro-F1 {_fmt(lora.get('test_macro_f1'), '.3f')}; "
                "beside the majority class and TF-IDF + logistic regression in lora_adapter's baselines"
            )
    else:
        lines.append("LoRA adapter: not materialized")
    return lines


def _filters(instance: DagsterInstance) -> list[str]:
    """The relevance classifier's held-out metrics and strongest n-grams, and the declared evaluation sets."""
    lines = []
    rel = _metadata(instance, "relevance_classifier")
    if rel:
        m = rel.get("metrics") or {}
        lines.append(
            f"relevance classifier: held-out AUC {_fmt(m.get('auc'), '.3f')}, precision {_fmt(m.get('precision'), '.3f')}, "
            f"recall {_fmt(m.get('recall'), '.3f')} ({(m.get('held_out') or {}).get('positive', 'n/a')} positive, "
            f"{(m.get('held_out') or {}).get('negative', 'n/a')} negative held out); trained in "
            f"{_fmt(m.get('train_seconds'), '.1f')} s; {rel.get('path', 'n/a')}"
        )
    sets = _metadata(instance, "evaluation_sets")
    if sets:
        declared = sets.get("sets") or {}
        lines.append(
            "evaluation sets checked against the training corpora: "
            + (
                ", ".join(f"{k} ({v:,} items)" for k, v in declared.items())
                or "none declared (evaluation_sets benchmark_files); the validation splits are held out by construction"
            )
        )
    return lines


def corpora_in_order(instance: DagsterInstance) -> list[tuple[str, str]]:
    """(role, label) of both corpora, the one prepared last first: a role whose latest deduplicated_text
    (raw_corpus when it has none) comes from a later run than the other's leads, so that after a recipe on
    one corpus the summary opens on it. Prepared in the same run (the demo's lineage): pretraining first."""
    order = [("pretrain", "pretraining corpus"), ("domain", "domain corpus")]

    def latest(role: str) -> tuple[str | None, float]:
        for step in ("deduplicated_text", "raw_corpus"):
            event = instance.get_latest_materialization_event(AssetKey([role, step]))
            if event is not None:
                return event.run_id, event.timestamp
        return None, 0.0

    (run_p, when_p), (run_d, when_d) = latest("pretrain"), latest("domain")
    return order[::-1] if run_d != run_p and when_d > when_p else order


def render(instance: DagsterInstance) -> str:
    """What the latest materializations recorded: each corpus (source, version, documents by outcome,
    balancing, shards), the base model's origin (pretrained preset or imported directory) and training,
    the adapter's r, alpha and target modules, the held-out perplexities and a few sample generations.
    The corpus prepared last comes first (:func:`corpora_in_order`).
    Warnings: a corpus's removal warning and a tiny validation split; rejected records: where they are.
    First, when there are any: the assets whose latest run failed, or whose latest materialization failed
    a blocking check (:func:`failures`)."""
    lines = [
        *failures(instance),
        *(line for role, label in corpora_in_order(instance) for line in _corpus(instance, role, label)),
        *_filters(instance),
        *_models(instance),
    ]
    ev = _metadata(instance, "evaluation")
    cut = ev.get("adapter_domain_perplexity_reduction_percent")
    if cut is None and ev.get("adapter_domain_perplexity_reduction") is not None:
        cut = 100 * ev["adapter_domain_perplexity_reduction"]
    lines.append(
        "held-out perplexity: base on the pretraining corpus {}, base on the domain corpus {}, "
        "base + adapter on the domain corpus {} ({} lower)".format(
            _fmt(ev.get("base_pretrain_perplexity"), ".1f"),
            _fmt(ev.get("base_domain_perplexity"), ".1f"),
            _fmt(ev.get("adapter_domain_perplexity"), ".1f"),
            "n/a" if cut is None else f"{cut:.1f} %",
        )
    )
    lines += _benchmarks(ev)
    lines.append(f"evaluation: {ev.get('path', 'n/a')}")
    lines += _samples(ev)
    return "\n".join(lines)


def _benchmarks(ev: dict) -> list[str]:
    """One line per lm-evaluation-harness task and metric of the evaluation (its ``lm_eval/<model>/<task>/<metric>``
    metadata): base and base + adapter, each ± its standard error; none when no benchmark ran."""
    scores = {}
    for key, value in ev.items():
        parts = key.split("/")
        if len(parts) == 4 and parts[0] == "lm_eval" and not parts[3].endswith("_stderr"):
            scores.setdefault((parts[2], parts[3]), {})[parts[1]] = (value, ev.get(f"{key}_stderr"))
    if not scores:
        return []

    def show(v):
        return "n/a" if v is None else f"{v[0]:.3f}" + ("" if v[1] is None else f" ± {v[1]:.3f}")

    lines = ["benchmarks (lm-evaluation-harness, local tasks):"]
    for (task, metric), by in sorted(scores.items()):
        items = ev.get("lm_eval_cloze_items") if task == "domain_cloze" else None
        lines.append(
            f"  {task} {metric}{f' ({items} items)' if items else ''}: base {show(by.get('base'))}, "
            f"base + adapter {show(by.get('adapter'))}"
        )
    return lines


def one_line(text: str, width: int = 72) -> str:
    """``text`` as one line: repr-escaped (newlines, tabs and other control characters as escapes,
    quoted), cut to ``width`` characters with ``...`` when longer."""
    shown = repr(text)
    return shown if len(shown) <= width else shown[: width - 3] + "..."


def _samples(ev: dict, prompts: int = 3) -> list[str]:
    """The evaluation's sample generations (its samples.json): the first ``prompts`` prompts, each with
    the base's and the adapter's continuation on one line; none when there are none."""
    f = fs.join(ev["path"], "samples.json") if ev.get("path") else None  # a local path or, on an object store, a URL
    if f is None or not fs.exists(f):
        return []
    samples = read_json(f, "sample generations (samples.json)")
    pairs = list(zip(samples.get("base") or [], samples.get("adapter") or []))
    config = ev.get("config") or {}
    lines = [f"sample generations (greedy, at most {config.get('max_new_tokens', 'n/a')} new tokens):"]
    for b, a in pairs[:prompts]:
        lines += [
            f"  prompt {one_line(b['prompt'])}",
            f"    base:           {one_line(b['completion'])}",
            f"    base + adapter: {one_line(a['completion'])}",
        ]
    if len(pairs) > prompts:
        lines.append(f"  ... {len(pairs) - prompts} more prompts in {f}")
    return lines if pairs else []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=int, help="wall time of the pipeline, to print")
    p.add_argument("--log", help="the run's log, to find the run id")
    args = p.parse_args(argv)
    with DagsterInstance.get() as instance:
        print("\n== largetrain summary ==")
        print(render(instance))
    if args.log:
        m = re.findall(r"RUN_SUCCESS|RUN_FAILURE", open(args.log).read())
        print(f"runs: {m.count('RUN_SUCCESS')} succeeded, {m.count('RUN_FAILURE')} failed (log: {args.log})")
    if args.seconds is not None:
        print(f"pipeline wall time: {args.seconds // 60} min {args.seconds % 60} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
