"""filtered_text: the deduplicated pretraining text filtered for what it is trained on, between
deduplicated_text and token_shards (docs/guides/filtering.md):

* decontamination: every document sharing a word 13-gram with an item of the declared evaluation
  sets (evaluation_sets; largetrain_core.decontamination) is removed with reason ``contaminated``
  (``decontamination: report`` keeps it), each listed in ``contaminated.parquet`` with the item and
  the n-gram. The join of the documents' n-grams with the index is the executor's
  (``Executor.find_contamination``: in this process, or distributed on Spark);
* relevance: every document scored by the relevance_classifier (a ``relevance_score`` column, Float32,
  P(relevant)), and those under ``relevance_threshold``, or outside the ``relevance_top_fraction``
  with the highest scores, removed with reason ``relevance``.

Both are one per-document step (:class:`Filtering`, a largetrain_core.parts.PartStep on the run's
executor): removed documents in ``filtered.parquet`` (doc_id, source, reason, relevance_score), which
the accounting counts as filtered (check ``accounting``, recounted from the files over the whole
chain raw_corpus -> cleaned_text -> deduplicated_text -> filtered_text). A top fraction needs every
score first: the documents are scored into ``_scored/`` (removed when done), the threshold read from
a histogram of the scores, then filtered without scoring again.

Data version: the code version, the settings, and the data versions of deduplicated_text, the
relevance classifier and the evaluation sets.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from largetrain_core.accounting import WARN_REMOVED, corpus_accounting, markdown_table, outcome_table, removal_warning
from largetrain_core.artifacts import CODE_VERSIONS
from largetrain_core.relevance import SCORE, Model, histogram_quantiles, load, score_histogram, threshold_for_top
from largetrain_core.executors import steps
from largetrain_core.stages.base import (
    Artifact,
    Check,
    Json,
    Markdown,
    StageError,
    StageResult,
    StageRun,
    count_table,
    executor_metadata,
    percent,
)
from largetrain_core.stages.global_inputs import check_made_from
from largetrain_core.storage import data_version, part_files

CONTAMINATED = "contaminated.parquet"
MODES = ("remove", "report")
REMOVED_SCHEMA = {"doc_id": pl.Utf8, "source": pl.Utf8, "reason": pl.Utf8, SCORE: pl.Float32}
EXAMPLES = 3  # kept and removed documents shown in the metadata and the demo summary


@dataclass(frozen=True)
class FilteredTextSettings:
    """What the training text keeps: a relevance threshold or top fraction, and what decontamination does."""

    relevance_threshold: float | None = field(
        default=None,
        metadata={
            "description": (
                "Keep the documents whose relevance_score (the relevance_classifier's P(relevant), 0 to 1) is at least this; "
                "the others are removed with reason relevance. null (and relevance_top_fraction null): keep every document, "
                "scored."
            )
        },
    )
    relevance_top_fraction: float | None = field(
        default=None,
        metadata={
            "description": (
                "Instead of a threshold: keep this share of the documents (0 to 1) with the highest relevance_score (the "
                "threshold read from a histogram of every score, 65,536 bins; ties at the threshold are kept)."
            )
        },
    )
    decontamination: str = field(
        default="remove",
        metadata={
            "description": (
                "remove: a document sharing a 13-word n-gram with an item of evaluation_sets is removed (reason "
                "contaminated); report: kept and listed only (the check no_evaluation_item_in_training_data on evaluation "
                "then fails). Either way contaminated.parquet lists each with the item and the n-gram."
            )
        },
    )

    def problems(self) -> list[str]:
        """What is wrong with these settings, in words (empty when nothing)."""
        out = []
        if self.relevance_threshold is not None and self.relevance_top_fraction is not None:
            out.append("set relevance_threshold or relevance_top_fraction, not both")
        if self.relevance_threshold is not None and not 0.0 <= self.relevance_threshold <= 1.0:
            out.append(f"relevance_threshold must be in [0, 1], got {self.relevance_threshold}")
        if self.relevance_top_fraction is not None and not 0.0 < self.relevance_top_fraction <= 1.0:
            out.append(f"relevance_top_fraction must be in (0, 1], got {self.relevance_top_fraction}")
        if self.decontamination not in MODES:
            out.append(f"decontamination must be one of {', '.join(MODES)}, got {self.decontamination!r}")
        return out


@dataclass(frozen=True)
class Filtering:
    """filtered_text's step over one part (largetrain_core.parts.PartStep): every document scored by
    ``model`` (None: the part holds ``relevance_score`` already) into a ``relevance_score`` column;
    the documents in ``contaminated`` removed with reason ``contaminated``, then those scoring under
    ``threshold`` (None: none) with reason ``relevance``. Removed rows: :data:`REMOVED_SCHEMA`."""

    model: Model | None
    threshold: float | None = None
    contaminated: frozenset = frozenset()
    batch: int = 2048

    counts = ()
    description = "filtered_text: relevance score, decontamination, relevance threshold"

    def __call__(self, df: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, int]]:
        if self.model is not None:
            texts = df["text"]
            scores = (
                np.concatenate(
                    [self.model.score(texts.slice(i, self.batch).to_list()) for i in range(0, df.height, self.batch)]
                )
                if df.height
                else np.zeros(0, np.float32)
            )
            df = df.with_columns(pl.Series(SCORE, scores, dtype=pl.Float32))
        reason = pl.when(pl.col("doc_id").is_in(pl.Series(sorted(self.contaminated), dtype=pl.Utf8).implode())).then(
            pl.lit("contaminated")
        )
        if self.threshold is not None:
            reason = reason.when(pl.col(SCORE) < self.threshold).then(pl.lit("relevance"))
        df = df.with_columns(reason.otherwise(pl.lit(None, pl.Utf8)).alias("_reason"))
        kept = df.filter(pl.col("_reason").is_null()).drop("_reason")
        removed = df.filter(pl.col("_reason").is_not_null()).select(
            "doc_id",
            pl.col("source") if "source" in df.columns else pl.lit(None, pl.Utf8).alias("source"),
            reason="_reason",
            **{SCORE: pl.col(SCORE)},
        )
        return kept, removed.cast(REMOVED_SCHEMA), {}


def _version(settings: FilteredTextSettings, text: Artifact, classifier: Artifact, sets: Artifact) -> str:
    return data_version(
        CODE_VERSIONS["filtered_text"], asdict(settings), text.data_version, classifier.data_version, sets.data_version
    )


def filtered_text(
    settings: FilteredTextSettings,
    text: Artifact,
    classifier: Artifact,
    sets: Artifact,
    raw: dict[str, Artifact],
    cleaned: dict[str, Artifact],
    run: StageRun,
    warn_removed_fraction: float | None = WARN_REMOVED,
) -> StageResult:
    """Filter the deduplicated text ``text`` with the relevance classifier ``classifier`` and the
    evaluation sets ``sets`` into ``<root>/<asset>/<version>/`` (part files with ``relevance_score``,
    filtered.parquet, contaminated.parquet); ``raw`` and ``cleaned``: the corpus's partitions, for
    the accounting.

    Stats: ``input``, ``kept``, ``filtered``, ``filtered_by_reason`` (also as ``removed_relevance``
    and ``removed_contaminated``), ``threshold`` (the score cut
    applied; null: none), ``scored`` and ``kept_scores`` (largetrain_core.relevance.histogram_quantiles
    of every score and of the kept ones), ``contaminated`` (documents sharing an n-gram, removed or
    not), ``contaminated_by_set``, ``too_short_items``, ``examples`` (the most relevant kept and least
    relevant removed documents, with their titles, and the contaminated ones with their items),
    ``documents`` (the chain's accounting), ``corpus`` (deduplicated_text's, for the model cards),
    ``deduplicated_text`` (its data version) and, for a mixture, ``corpora`` (deduplicated_text's
    counts per corpus, ``kept`` recounted here and ``kept_after_dedup``). Check ``accounting``. Raises StageError for bad
    settings, and when ``raw`` and ``cleaned`` are not the partitions ``text`` was made from
    (largetrain_core.stages.global_inputs.check_made_from). Warns (metadata ``removal_warning``) when more than ``warn_removed_fraction`` of the
    chain's input is gone."""
    problems = settings.problems()
    if problems:
        raise StageError(f"{run.name}: " + "; ".join(problems))
    check_made_from(run.name, text, raw, cleaned)
    version = _version(settings, text, classifier, sets)
    keys = sorted(cleaned)
    raw_dirs, cleaned_dirs = [raw[k].path for k in keys], [cleaned[k].path for k in keys]

    def build(out: Path) -> dict:
        stats = _filter_documents(out, settings, run, text, classifier, sets)
        outcome_table(raw_dirs, cleaned_dirs, text.path, out).write_parquet(out / "outcomes.parquet")
        return stats

    built = run.build_or_reuse(version, build, documents=True)
    result = StageResult.built(built, version, metadata=executor_metadata(built.stats))
    acc = corpus_accounting(raw_dirs, cleaned_dirs, text.path, built.path)
    summary = {k: acc[k] for k in ("input", "kept", "filtered", "duplicate", "rejected")}
    outcomes = pl.read_parquet(built.path / "outcomes.parquet")
    _warn(result, run, settings.decontamination, summary, outcomes, built, warn_removed_fraction)
    _report(result, text, built, acc, summary, outcomes)
    return result


def _filter_documents(
    out: Path, settings: FilteredTextSettings, run: StageRun, text: Artifact, classifier: Artifact, sets: Artifact
) -> dict:
    """Find the contaminated documents, score and filter ``text`` into ``out``; the stats (but the accounting)."""
    found = run.executor.run_global(
        steps.find_contamination, out, in_dirs=[text.path], index_dir=sets.path, out_file=out / CONTAMINATED
    )
    remove = (
        frozenset(pl.read_parquet(out / CONTAMINATED, columns=["doc_id"])["doc_id"].to_list())
        if settings.decontamination == "remove"
        else frozenset()
    )
    stats, cut = _score_and_filter(out, settings, run, text, load(classifier.path), remove)
    removed = pl.read_parquet(out / "filtered.parquet")
    kept_hist = score_histogram(part_files(out))
    stats |= {
        "threshold": cut,
        "scored": histogram_quantiles(kept_hist + score_histogram([out / "filtered.parquet"])),
        "kept_scores": histogram_quantiles(kept_hist),
        **{f"removed_{r}": stats["filtered_by_reason"].get(r, 0) for r in ("relevance", "contaminated")},
        "contaminated": found["contaminated"],
        "contaminated_by_set": found["contaminated_by_set"],
        "too_short_items": found["too_short_items"],
        "decontamination": settings.decontamination,
        "examples": examples(text.path, out, removed),
    }
    stats["kept_percent"] = percent(stats["kept"], stats["input"])
    if text.stats.get("corpora"):  # a mixture's corpora, for the token shards' weights, with what each kept here
        stats["corpora"] = _kept_by_corpus(out, text.stats["corpora"], stats["kept"])
    return stats


def _score_and_filter(
    out: Path, settings: FilteredTextSettings, run: StageRun, text: Artifact, model, remove: frozenset
) -> tuple[dict, float | None]:
    """Score ``text`` and keep what passes the relevance cut and is not in ``remove``; the stats and the cut."""
    cut = settings.relevance_threshold
    if settings.relevance_top_fraction is None:
        stats = run.executor.run_global(steps.map_parts, out, step=Filtering(model, cut, remove), in_dir=text.path)
        return stats, cut
    # every score first, for the threshold of the top fraction
    scored = out / "_scored"
    scored.mkdir()
    run.executor.run_global(steps.map_parts, scored, step=Filtering(model), in_dir=text.path)
    hist = score_histogram(part_files(scored), exclude=remove)
    cut = threshold_for_top(hist, settings.relevance_top_fraction)
    stats = run.executor.run_global(steps.map_parts, out, step=Filtering(None, cut, remove), in_dir=scored)
    shutil.rmtree(scored)
    return stats, cut


def _kept_by_corpus(out: Path, corpora: dict[str, dict], kept: int) -> dict[str, dict]:
    """deduplicated_text's counts per corpus, with ``kept`` recounted in ``out`` and ``kept_after_dedup``."""
    counts = pl.scan_parquet(part_files(out)).group_by("corpus").len().collect() if kept else None
    by_corpus = dict(counts.iter_rows()) if counts is not None else {}
    return {c: {**n, "kept_after_dedup": n.get("kept"), "kept": by_corpus.get(c, 0)} for c, n in corpora.items()}


def _warn(
    result: StageResult,
    run: StageRun,
    decontamination: str,
    summary: dict,
    outcomes: pl.DataFrame,
    built,
    warn_removed_fraction: float | None,
) -> None:
    """The removal warning and, when contaminated documents are kept, the contamination warning."""
    result.warn(
        removal_warning(
            f"{run.asset[0]} corpus (raw_corpus -> ... -> filtered_text)",
            summary["input"],
            [r for r in outcomes.iter_rows() if r[0] != "kept"],
            warn_removed_fraction,
        ),
        key="removal_warning",
    )
    if built.stats["contaminated"] and decontamination == "report":
        result.warn(
            f"{run.name}: {built.stats['contaminated']:,} documents share a 13-word n-gram with an evaluation item and "
            f"are kept (decontamination: report); listed in {built.path / CONTAMINATED}. The check "
            "no_evaluation_item_in_training_data on evaluation fails for a model trained on them.",
            key="contamination_warning",
        )


def _report(result: StageResult, text: Artifact, built, acc: dict, summary: dict, outcomes: pl.DataFrame) -> None:
    """The stats, metadata and accounting check of a run (see :func:`filtered_text`)."""
    stats = built.stats
    result.stats = {
        **stats,
        "documents": summary,
        "corpus": text.stats.get("corpus"),
        "deduplicated_text": text.data_version,
    }
    result.metadata |= {
        "accounting": count_table(summary, ("outcome", "documents")),
        "outcomes_by_reason": Markdown(markdown_table(outcomes)),
        "outcomes_table": built.path / "outcomes.parquet",
        **{f"documents_{k}": v for k, v in summary.items()},
        "filtered_by_reason": count_table(stats["filtered_by_reason"]),
        "relevance_threshold": stats["threshold"] if stats["threshold"] is not None else "none",
        "relevance_scores": Json(stats["scored"]),
        "kept_relevance_scores": Json(stats["kept_scores"]),
        "contaminated_by_set": Json(stats["contaminated_by_set"]),
        "contaminated_report": built.path / CONTAMINATED,
        "examples": Json(stats["examples"]),
        "examples_table": Markdown(examples_markdown(stats["examples"])),
    }
    result.checks["accounting"] = Check(
        acc["balanced"], {**summary, "intended_repeats": acc["repeats"], "problems": Json(acc["problems"])}
    )


def title(text: str, width: int = 72) -> str:
    """A document's title: its first line holding a letter or digit that is not an rst comment or
    directive (``..``), without markdown's leading ``#``, cut to ``width`` characters."""
    for line in text.splitlines():
        line = line.strip().lstrip("#").strip()
        if line and not line.startswith("..") and any(c.isalnum() for c in line):
            return line if len(line) <= width else line[: width - 3] + "..."
    return ""


def examples(in_dir: Path, out_dir: Path, removed: pl.DataFrame, n: int = EXAMPLES) -> dict:
    """The ``n`` kept documents with the highest scores, the ``n`` relevance-removed ones with the
    lowest, and the first ``n`` contaminated ones (with their item and n-gram), each ``{doc_id, title,
    relevance_score}``; the titles read from ``in_dir`` (the deduplicated text) for these documents only."""
    kept = (
        pl.scan_parquet(part_files(out_dir))
        .select("doc_id", SCORE)
        .sort(SCORE, "doc_id", descending=[True, False])
        .head(n)
        .collect()
        if part_files(out_dir)
        else pl.DataFrame(schema={"doc_id": pl.Utf8, SCORE: pl.Float32})
    )
    low = removed.filter(pl.col("reason") == "relevance").sort(SCORE, "doc_id").head(n).select("doc_id", SCORE)
    report = pl.read_parquet(Path(out_dir) / CONTAMINATED).head(n)
    wanted = kept["doc_id"].to_list() + low["doc_id"].to_list() + report["doc_id"].to_list()
    titles = _titles(in_dir, wanted)
    scores = _contaminated_scores(out_dir, removed, report)

    def rows(df: pl.DataFrame) -> list[dict]:
        return [{"doc_id": d, "title": titles.get(d, ""), SCORE: round(float(s), 4)} for d, s in df.iter_rows()]

    return {
        "kept": rows(kept),
        "removed": rows(low),
        "contaminated": [
            {
                "doc_id": d,
                "title": titles.get(d, ""),
                "eval_set": s,
                "item_id": i,
                "ngram": g,
                SCORE: round(float(scores[d]), 4) if d in scores else None,
            }
            for d, s, i, g in report.select("doc_id", "eval_set", "item_id", "ngram").iter_rows()
        ],
    }


def _titles(in_dir: Path, doc_ids: list[str]) -> dict[str, str]:
    """The :func:`title` of each of ``doc_ids`` in the text of ``in_dir``."""
    if not doc_ids:
        return {}
    return dict(
        pl.scan_parquet(part_files(in_dir))
        .select("doc_id", "text")
        .filter(pl.col("doc_id").is_in(doc_ids))
        .collect()
        .select("doc_id", pl.col("text").map_elements(title, return_dtype=pl.Utf8))
        .iter_rows()
    )


def _contaminated_scores(out_dir: Path, removed: pl.DataFrame, report: pl.DataFrame) -> dict[str, float]:
    """The relevance score of each contaminated document of ``report``, kept (``out_dir``) or ``removed``."""
    if not report.height:
        return {}
    return dict(
        pl.concat(
            [
                pl.scan_parquet(part_files(out_dir)).select("doc_id", SCORE).collect(),
                removed.select("doc_id", SCORE),
            ]
        )
        .filter(pl.col("doc_id").is_in(report["doc_id"].implode()))
        .iter_rows()
    )


def examples_markdown(ex: dict) -> str:
    """The :func:`examples` as a markdown table: what, document, title, score (and item)."""
    rows = [
        f"| {what} | `{e['doc_id']}` | {e['title']} | {e[SCORE]} |" for what in ("kept", "removed") for e in ex[what]
    ]
    rows += [
        f'| contaminated ({e["eval_set"]}/{e["item_id"]}: "{e["ngram"]}") | `{e["doc_id"]}` | {e["title"]} | '
        f"{e[SCORE]} |"
        for e in ex["contaminated"]
    ]
    return "| | document | title | relevance_score |\n|---|---|---|---|\n" + "\n".join(rows) if rows else "none"
