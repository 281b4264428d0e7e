"""deduplicated_text: the global step over every partition of one corpus: exact and MinHash-LSH near
duplicates removed (largetrain_core.dedup, on the run's executor; near duplicates verified against a kept
copy), the first copy in corpus order (partition, file, row) kept, then optional class balancing
(largetrain_core.balance), the outcome of every input document (outcomes.parquet), the accounting check,
and per source (largetrain_core.dedup_report) the removals table and the no_source_wiped_out check.

Fails (:class:`StageError`) before any work when a partition was made with another partitioning,
when the partitions come from different corpora or settings (largetrain_core.stages.global_inputs),
when the corpus holds no document at all or none survives raw_corpus and cleaned_text (naming the
corpus and the top reasons), when balancing is asked for without labels, and when document ids
repeat across partitions.

Data version: the code version, the dedup settings (plus the balance settings when set) and every
cleaned_text partition's data version, in partition order. The MinHash signatures are the
partitions' (cleaned_text computes them, with the settings it records): this step clusters them.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import polars as pl

from largetrain_core.accounting import (
    WARN_REMOVED,
    corpus_accounting,
    markdown_table,
    outcome_table,
    reason_setting,
    removal_warning,
)
from largetrain_core.artifacts import CODE_VERSIONS
from largetrain_core.balance import NULL_LABEL, balance_parts, histogram_markdown, label_histogram, repeat_counts
from largetrain_core.clean import pii_redactions
from largetrain_core.corpus import describe_rejections, duplicate_ids
from largetrain_core import dedup_report
from largetrain_core.dedup import SIGNATURE_FIELDS, DedupConfig, VerifyConfig, count_exact_duplicates
from largetrain_core.dedup_report import MAX_SOURCE_REMOVED
from largetrain_core.executors import steps
from largetrain_core.stages.base import (
    Artifact,
    Check,
    Json,
    Markdown,
    StageError,
    StageResult,
    StageRun,
    Text,
    count_table,
    executor_metadata,
    percent,
)
from largetrain_core.stages.global_inputs import check_one_corpus
from largetrain_core.storage import data_version, stored_location

BALANCE_MODES = {"downsample": "down", "upsample": "up"}


def balance_settings(
    target: dict[str, float] | None,
    mode: str = "downsample",
    seed: int = 0,
    max_repeats: int | None = None,
    temperature: float | None = None,
) -> dict | None:
    """The balance settings as they enter the data version (None without a target: no balancing).
    ``target`` {} means uniform; ``mode`` downsample or upsample; ``max_repeats`` and ``temperature``
    (largetrain_core.balance.balance_parts) enter only when set, so the versions balanced before them
    hold. Raises StageError on another mode, a temperature < 1 or beside a non-empty target, or a cap < 1."""
    if target is None:
        return None
    if mode not in BALANCE_MODES:
        raise StageError(f"balance_mode must be downsample or upsample, got {mode!r}")
    if max_repeats is not None and max_repeats < 1:
        raise StageError(f"balance_max_repeats must be >= 1 or null, got {max_repeats}")
    if temperature is not None and (not temperature >= 1 or target):
        raise StageError(
            f"balance_temperature must be >= 1 (1: natural shares, .inf: uniform) with balance_target {{}}, got "
            f"{temperature} with {target}"
        )
    out = {"target": dict(sorted(target.items())) or None, "mode": BALANCE_MODES[mode], "seed": seed}
    out.update({k: v for k, v in (("max_repeats", max_repeats), ("temperature", temperature)) if v is not None})
    return out


def deduplicated_text(
    near: bool,
    raw: dict[str, Artifact],
    cleaned: dict[str, Artifact],
    run: StageRun,
    balance: dict | None = None,
    warn_removed_fraction: float | None = WARN_REMOVED,
    hash_partitioned: bool = True,
    corpora: list[str] | None = None,
    verify: VerifyConfig | None = VerifyConfig(),
    max_source_removed_fraction: float | None = MAX_SOURCE_REMOVED,
) -> StageResult:
    """Deduplicate (and balance) the cleaned_text partitions ``cleaned`` (with their raw_corpus
    partitions ``raw``, keyed alike) into ``<root>/<asset>/<version>/``.

    ``near``: True removes exact and near duplicates, False exact ones only; the MinHash settings are
    the partitions' (cleaned_text computed their signatures with them, so this step only clusters;
    :func:`minhash_settings`).

    ``balance``: :func:`balance_settings`, or None. ``hash_partitioned``: the partitions are the
    hash partitions of one corpus (partition i of n, checked against the keys); else each is a
    corpus read whole (the landed chain: one file per partition). ``corpora``: a mixture's corpus
    names, in order; the keys are then ``<corpus>/<partition>``, every corpus's partitions are checked
    on their own, corpus order is the corpora's order, then partition, file, row (the first copy of a
    duplicate across corpora is the earlier corpus's), and every kept document gets its corpus's name
    in a ``corpus`` column (stats ``corpora``: documents read and kept per corpus).
    ``verify``: near-duplicate candidates are removed only when verified against a kept copy
    (largetrain_core.dedup.verify_assignment; None: the connected components as they are).
    ``max_source_removed_fraction``: check ``no_source_wiped_out`` fails when one source (corpus, top-level
    folder, label; largetrain_core.dedup_report) loses more than this fraction to dedup (None: never).
    Stats: the executor's counts (input, kept, duplicate, clusters, duplicate_exact,
    duplicate_near, near_unverified_kept), ``partitions``, ``balance`` (when balanced), ``documents`` (the accounting) and
    ``corpus`` (:func:`corpus_lineage`). Check ``accounting``: kept + filtered + duplicate + rejected ==
    input, recounted from the files."""
    role = run.asset[0]
    groups = _corpus_groups(cleaned, corpora)
    keys = [k for g in groups.values() for k in g]
    _check_inputs(role, groups, raw, cleaned, hash_partitioned)
    dedup = dataclasses.replace(minhash_settings(role, cleaned), near=near)
    raw_dirs = [raw[k].path for k in keys]
    balance, unlabelled = _labelled_balance(role, balance, raw_dirs)
    version = _version(dedup, verify if near else None, balance, [(k, cleaned[k].data_version) for k in keys])

    def build(out: Path) -> dict:
        return _build(out, role, run, raw, cleaned, groups, dedup, verify, balance)

    built = run.build_or_reuse(version, build, documents=True)
    result = StageResult.built(built, version, metadata=executor_metadata(built.stats))
    _report_inputs(result, role, raw, cleaned, keys, unlabelled)
    _report_outcomes(result, role, raw, cleaned, groups, built, warn_removed_fraction)
    _report_sources(
        result, {name: [cleaned[k].path for k in g] for name, g in groups.items()}, max_source_removed_fraction
    )
    return result


def _corpus_groups(cleaned: dict[str, Artifact], corpora: list[str] | None) -> dict[str | None, list[str]]:
    """The partition keys of each corpus of a mixture, in the corpora's order (one group None without one)."""
    if corpora:
        return {c: sorted(k for k in cleaned if k.split("/", 1)[0] == c) for c in corpora}
    return {None: sorted(cleaned)}


def _check_inputs(
    role: str,
    groups: dict[str | None, list[str]],
    raw: dict[str, Artifact],
    cleaned: dict[str, Artifact],
    hash_partitioned: bool,
) -> None:
    """Check every corpus's partitions: one partitioning, one corpus and settings, not empty."""
    for name, group in groups.items():
        where = f"{role}/{name}" if name else role
        _check_partitioning(where, group, raw, cleaned, hash_partitioned, strip=bool(name))
        check_one_corpus(f"{where}/deduplicated_text", raw, cleaned, group, one_source=hash_partitioned)
        _check_not_empty(where, group, raw, cleaned)


def _labelled_balance(role: str, balance: dict | None, raw_dirs: list[Path]) -> tuple[dict | None, str | None]:
    """The balance settings, or None with a warning when raw_corpus has no labels to balance on."""
    if balance and not _check_labels(role, raw_dirs):  # label_field null: no balancing, said at WARNING
        return None, (
            f"{role}/deduplicated_text: balance_target is set but raw_corpus label_field is null, so there is "
            "nothing to balance on: not balanced. Set label_field (and re-materialize raw_corpus) to balance, or "
            "balance_target: null to silence this."
        )
    return balance, None


def _version(dedup: DedupConfig, verify: VerifyConfig | None, balance: dict | None, inputs: list) -> str:
    """The data version (module doc); ``verify``: None when not verifying (exact dedup only)."""
    # the balance settings enter the version only when set, so unbalanced versions stay as they were
    return data_version(
        CODE_VERSIONS["deduplicated_text"],
        {
            **dedup.to_dict(),
            "verify": verify.to_dict() if verify else None,
            **({"balance": balance} if balance else {}),
        },
        inputs,
    )


def _build(
    out: Path,
    role: str,
    run: StageRun,
    raw: dict[str, Artifact],
    cleaned: dict[str, Artifact],
    groups: dict[str | None, list[str]],
    dedup: DedupConfig,
    verify: VerifyConfig | None,
    balance: dict | None,
) -> dict:
    """Deduplicate (name the corpora, balance) into ``out`` and write outcomes.parquet; the stats."""
    keys = [k for g in groups.values() for k in g]
    raw_dirs, cleaned_dirs = [raw[k].path for k in keys], [cleaned[k].path for k in keys]
    _check_ids(role, raw_dirs, keys, out)
    stats = {
        **run.executor.run_global(steps.deduplicate, out, in_dirs=cleaned_dirs, cfg=dedup, verify=verify),
        "partitions": len(keys),
    }
    if None not in groups:
        stats["corpora"] = name_corpora(
            out,
            {c: [cleaned[k].path for k in g] for c, g in groups.items()},
            {c: sum(raw[k].stats["documents"] for k in g) for c, g in groups.items()},
        )
    if balance:
        stats["balance"] = _balance(out, role, balance)
        stats["kept"] = stats["kept"] - stats["balance"]["balance_dropped"]
    outcome_table(raw_dirs, cleaned_dirs, out).write_parquet(out / "outcomes.parquet")
    return stats


def _balance(out: Path, role: str, balance: dict) -> dict:
    """largetrain_core.balance.balance_parts of ``out``; its stats. StageError when it cannot balance."""
    try:
        return balance_parts(
            out,
            balance["target"],
            balance["mode"],
            balance["seed"],
            balance.get("max_repeats"),
            balance.get("temperature"),
        )
    except ValueError as e:
        raise StageError(f"{role} deduplicated_text: cannot balance: {e}") from e


def _report_inputs(
    result: StageResult,
    role: str,
    raw: dict[str, Artifact],
    cleaned: dict[str, Artifact],
    keys: list[str],
    unlabelled: str | None,
) -> None:
    """The partitions' rejected files, the balance report, the unlabelled warning and the PII redactions."""
    rejected_files = [stored_location(raw[k].path / "rejected.parquet") for k in keys if raw[k].stats.get("rejected")]
    if rejected_files:  # the partitions' rejected records, for the summary (each raw_corpus run logged its reasons)
        result.metadata["rejected_files"] = Json(rejected_files)
    _report_balance(result, role)
    result.warn(unlabelled)
    pii = pii_redactions([cleaned[k].stats for k in keys])
    if pii:  # replacements in the kept text, beside the accounting (they remove no document)
        result.metadata |= {
            "pii_redacted": Json(pii),
            "pii_documents": sum(cleaned[k].stats.get("pii_documents", 0) for k in keys),
        }


def _report_outcomes(
    result: StageResult,
    role: str,
    raw: dict[str, Artifact],
    cleaned: dict[str, Artifact],
    groups: dict[str | None, list[str]],
    built,
    warn_removed_fraction: float | None,
) -> None:
    """The accounting (metadata, stats, check), the removal warning and the corpus lineage."""
    keys = [k for g in groups.values() for k in g]
    acc = corpus_accounting([raw[k].path for k in keys], [cleaned[k].path for k in keys], built.path)
    summary = {k: acc[k] for k in ("input", "kept", "filtered", "duplicate", "rejected")}
    outcomes = pl.read_parquet(built.path / "outcomes.parquet")
    result.warn(
        removal_warning(
            f"{role} corpus (raw_corpus -> cleaned_text -> deduplicated_text)",
            summary["input"],
            [r for r in outcomes.iter_rows() if r[0] != "kept"],
            warn_removed_fraction,
        ),
        key="removal_warning",
    )
    corpus = _mixture_lineage(result, raw, cleaned, groups, built.stats)
    result.stats = {**built.stats, "documents": summary, "corpus": corpus}  # for the model cards
    result.metadata = {
        "corpus": Json(corpus),
        "accounting": count_table(summary, ("outcome", "documents")),
        "outcomes_by_reason": Markdown(markdown_table(outcomes)),
        "outcomes_table": built.path / "outcomes.parquet",
        **{f"documents_{k}": v for k, v in summary.items()},
        **{
            f"{k}_percent": percent(summary[k], summary["input"]) for k in ("kept", "filtered", "duplicate", "rejected")
        },
        **result.metadata,
    }
    result.checks["accounting"] = Check(
        acc["balanced"], {**summary, "intended_repeats": acc["repeats"], "problems": Json(acc["problems"])}
    )


def _mixture_lineage(
    result: StageResult,
    raw: dict[str, Artifact],
    cleaned: dict[str, Artifact],
    groups: dict[str | None, list[str]],
    stats: dict,
) -> dict:
    """:func:`corpus_lineage`, with a mixture's sources and its documents by corpus (metadata)."""
    corpus = corpus_lineage(raw, cleaned)
    if None in groups:
        return corpus
    corpora = list(groups)
    sources = {
        c: next((raw[k].stats.get("source") for k in g if raw[k].stats.get("source")), None) for c, g in groups.items()
    }
    corpus["source"] = "mixture of " + ", ".join(f"{c} ({sources[c]})" for c in corpora)
    corpus["mixture"] = sources
    counts = stats["corpora"]
    result.metadata["documents_by_corpus"] = Markdown(
        "| corpus | documents read | kept after dedup |\n|---|---|---|\n"
        + "\n".join(f"| {c} | {counts[c]['documents_read']:,} | {counts[c]['kept']:,} |" for c in corpora)
    )
    return corpus


def _report_sources(result: StageResult, dirs: dict[str | None, list[Path]], max_fraction: float | None) -> None:
    """Per-source removals (largetrain_core.dedup_report) into the metadata, a sample of near duplicates
    beside their kept copies, and the ``no_source_wiped_out`` check."""
    docs = dedup_report.outcomes(dirs, result.path)
    table = dedup_report.source_table(docs)
    passed, message = dedup_report.wiped_out(docs, table, max_fraction)
    result.metadata["dedup_by_source"] = Markdown(dedup_report.markdown(table))
    result.metadata["near_duplicates_sample"] = Markdown(dedup_report.removed_sample(docs, dirs))
    result.metadata["cluster_sizes"] = Markdown(dedup_report.cluster_sizes_markdown(dedup_report.cluster_sizes(docs)))
    result.metadata["sources_most_removed"] = Json(dedup_report.top_sources(table))
    worst = table.row(0, named=True) if table.height else None
    result.checks["no_source_wiped_out"] = Check(
        passed,
        {
            "message": Text(message),
            dedup_report.SETTING: max_fraction,
            "largest_removed_fraction": worst["removed_fraction"] if worst else 0.0,
            "largest_removed_source": f"{worst['dimension']}: {worst['source']}" if worst else "",
        },
    )
    if not passed:
        result.warn(message, key="no_source_wiped_out")


def name_corpora(out: Path, dirs: dict[str, list[Path]], read: dict[str, int]) -> dict:
    """Add the column ``corpus`` to the kept part files in ``out``: the executor writes one per input part
    file, in input order (executors.base), so the parts of ``dirs``' corpora, in order, are consecutive.
    Returns ``{corpus: {"documents_read", "kept", "parts"}}`` (kept before balancing)."""
    from largetrain_core.storage import part_files
    from largetrain_core.shards import CORPUS

    written = part_files(out)
    counts, i = {}, 0
    for name, in_dirs in dirs.items():
        n = len(part_files(in_dirs))
        kept = 0
        for part in written[i : i + n]:
            df = pl.read_parquet(part)
            df.with_columns(pl.lit(name, dtype=pl.Utf8).alias(CORPUS)).write_parquet(part)
            kept += df.height
        counts[name] = {"documents_read": read[name], "kept": kept, "parts": n}
        i += n
    if i != len(written):
        raise StageError(
            f"{out}: {len(written)} kept part files for {i} input part files: the executor broke the "
            "one-output-per-input layout, so the documents' corpora are unknown"
        )
    return counts


def minhash_settings(role: str, cleaned: dict[str, Artifact]) -> DedupConfig:
    """The MinHash settings every cleaned_text partition made its signatures with (its stats' ``dedup``).
    Raises StageError naming the partitions when some carry no signatures (made by an older cleaned_text)
    or when they were made with different settings (ngram, bands, rows, seed)."""
    made = {k: cleaned[k].stats.get("dedup") for k in sorted(cleaned)}
    missing = [k for k, v in made.items() if v is None]
    if missing:
        raise StageError(
            f"{role}/cleaned_text partitions {', '.join(missing)} carry no MinHash signatures (made by "
            f"an older cleaned_text): re-materialize {role}/cleaned_text for them"
        )
    distinct = {json.dumps({f: v.get(f) for f in SIGNATURE_FIELDS}, sort_keys=True) for v in made.values()}
    if len(distinct) > 1:
        shown = "; ".join(f"{k}: " + ", ".join(f"{f}={v.get(f)}" for f in SIGNATURE_FIELDS) for k, v in made.items())
        raise StageError(
            f"{role}/cleaned_text partitions were made with different MinHash settings ({shown}): "
            f"re-materialize {role}/cleaned_text for every partition with the same settings"
        )
    return DedupConfig(**next(iter(made.values())))


def _check_partitioning(
    role: str, keys: list[str], raw: dict, cleaned: dict, hash_partitioned: bool, strip: bool = False
) -> None:
    """Every partition made as partition i of len(keys) (hash partitions), or as a whole (0 of 1);
    ``strip``: the keys are ``<corpus>/<partition>`` (a mixture), named by their partition."""
    for name, artifacts in (("raw_corpus", raw), ("cleaned_text", cleaned)):
        for i, k in enumerate(keys):
            made = (artifacts[k].stats.get("partition"), artifacts[k].stats.get("partitions"))
            if made != ((i, len(keys)) if hash_partitioned else (0, 1)):
                k = k.split("/", 1)[1] if strip else k
                raise StageError(
                    f"partition {k} of {role}/{name} was made as partition {made[0]} of {made[1]}, but "
                    f"LARGETRAIN_DATA_PARTITIONS is now {len(keys)}: its files belong to other partitions. "
                    f"Re-materialize {role}/raw_corpus and {role}/cleaned_text for every partition."
                )


def _check_not_empty(role: str, keys: list[str], raw: dict, cleaned: dict) -> None:
    """A corpus with no record read, or none left after cleaning, fails here, the first global step,
    naming the corpus and why: an empty partition is fine, an empty corpus is not."""
    stats = [raw[k].stats for k in keys]
    source = next((s["source"] for s in stats if s.get("source")), "?")
    read = sum(s["documents"] + s["not_sampled"] + s["rejected"] for s in stats)
    files, skipped = sum(s.get("files", 0) for s in stats), sum(s.get("skipped_files", 0) for s in stats)
    if not read:
        also = f", and {skipped:,} files with a suffix no reader knows were not read" if skipped else ""
        raise StageError(
            f"{role} corpus at {source} holds no document: its {files:,} corpus files in {len(keys)} partitions "
            f"gave 0 records (empty, or blank lines only){also}. Point raw_corpus `path` at a corpus with text."
        )
    kept = sum(cleaned[k].stats["kept"] for k in keys)
    if kept:
        return
    rejected, sampled_out = sum(s["rejected"] for s in stats), sum(s["not_sampled"] for s in stats)
    by_reason: dict[str, int] = {}
    for k in keys:
        for reason, n in cleaned[k].stats["filtered_by_reason"].items():
            by_reason[reason] = by_reason.get(reason, 0) + n
    top = sorted(by_reason.items(), key=lambda e: (-e[1], e[0]))[:5]
    reasons = "; ".join(f"{n:,} filtered {r} -> {reason_setting('filtered', r)}" for r, n in top)
    rejections = " ".join(
        describe_rejections(raw[k].path / "rejected.parquet") for k in keys if raw[k].stats["rejected"]
    )
    raise StageError(
        f"{role} corpus at {source}: no document is left of its {read:,} records after raw_corpus and cleaned_text "
        f"({sum(by_reason.values()):,} filtered by the quality rules, {rejected:,} rejected, {sampled_out:,} left out "
        f"by sample_fraction/max_documents)."
        + (f" Top reasons: {reasons}." if reasons else "")
        + (f" Rejected: {rejections}" if rejections else "")
        + ' README, "Which rules suit your text".'
    )


def _check_labels(role: str, raw_dirs: list[Path]) -> bool:
    """Whether to balance, given a balance_target: False when raw_corpus read no label column
    (label_field null: nothing to balance on). Fails before any work when a label_field was read but
    no document has it (a misnamed field)."""
    read = label_histogram(raw_dirs)
    if read is None:
        return False
    if set(read) <= {NULL_LABEL}:
        raise StageError(
            f"{role}/deduplicated_text: balance_target is set but no labels were read: none of the "
            f"{read.get(NULL_LABEL, 0):,} documents has the field raw_corpus label_field names. Set label_field to "
            f"the field holding the class and re-materialize {role}/raw_corpus for every partition, or set "
            "label_field: null (no balancing)."
        )
    return True


def _check_ids(role: str, raw_dirs: list[Path], keys: list[str], spill_dir: Path) -> None:
    """Document ids unique across partitions (each partition's reader made them unique within it)."""
    repeated, clash = duplicate_ids(raw_dirs, keys, spill_dir=spill_dir)
    if repeated:
        shown = "; ".join(f"{i!r} in {', '.join(where)}" for i, where in clash.iter_rows())
        raise StageError(
            f"{role}: {repeated} document ids occur in more than one partition (ids repeat across "
            f"files), e.g. {shown}. Make the ids unique, or set raw_corpus id_field: null to name "
            f"documents by file and line, and re-materialize {role}/raw_corpus."
        )


def _report_balance(result: StageResult, role: str) -> None:
    """The balancing's metadata, or, when labels were read but not balanced, a warning with the classes."""
    if "balance" in result.stats:
        b = result.stats["balance"]
        result.metadata |= {
            "class_histogram": Markdown(histogram_markdown(b["before"], b["after"])),
            "balance": Json(b),
            "balance_dropped": b["balance_dropped"],
            "balance_repeats": b["balance_repeats"],
            "repeated_documents": b["repeated_documents"],
        }
    elif (classes := label_histogram([result.path])) is not None:
        shown = ", ".join(f"{c} {n:,}" for c, n in sorted(classes.items(), key=lambda e: (-e[1], e[0])))
        result.warn(
            f"{role} corpus: labels were read (raw_corpus label_field) but not balanced: balance_target is null. "
            f"Documents per class: {shown}. deduplicated_text `balance_target: {{}}` gives every class an equal "
            "share ({a: 2, b: 1}: those shares), with balance_mode downsample or upsample."
            + (" No document has the label field: check label_field." if set(classes) == {NULL_LABEL} else "")
        )
        result.metadata["labels_not_balanced"] = Json(classes)


def corpus_lineage(raw: dict[str, Artifact], cleaned: dict[str, Artifact]) -> dict:
    """What deduplicated_text was made from, from the partitions' artifacts: the corpus source, its
    provenance (the provenance file beside it, or None), the content digest of each partition's files
    and the data versions of raw_corpus and cleaned_text per partition; ``labels``, only when raw_corpus
    declared a label set (its reader's ``labels``, the same in every partition that declares one): the
    label set lora_adapter's classification takes (largetrain_core.training.task_data.label_set)."""
    stats = [raw[k].stats for k in sorted(raw)]
    declared = {tuple(s["reader"]["labels"]) for s in stats if (s.get("reader") or {}).get("labels")}
    labels = {"labels": list(next(iter(declared)))} if len(declared) == 1 else {}
    return {
        **labels,
        "source": next((s["source"] for s in stats if s.get("source")), None),
        "provenance": next((s["provenance"] for s in stats if s.get("provenance")), None),
        "content_digests": {k: raw[k].stats.get("content_digest") for k in sorted(raw)},
        "data_versions": {
            "raw_corpus": {k: raw[k].data_version for k in sorted(raw)},
            "cleaned_text": {k: cleaned[k].data_version for k in sorted(cleaned)},
        },
    }


def exact_duplicates_check(deduplicated: Artifact) -> Check:
    """Recounted from the kept files: no two kept documents share a dedup key; intended repetition
    (balancing's ``copies`` weight) is counted apart."""
    docs, dups, examples = count_exact_duplicates(deduplicated.path)
    repeated, repeats = repeat_counts(deduplicated.path)
    return Check(
        dups == 0,
        {
            "documents": docs,
            "duplicates": dups,
            "examples": Json(examples),
            "intended_repeats": repeats,
            "repeated_documents": repeated,
        },
    )
