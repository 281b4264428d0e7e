"""Data preparation of one corpus role (``pretrain``: the pretraining corpus, ``domain``: the corpus the
LoRA adapter specializes on), keyed ``<role>/<asset>``:

    raw_corpus [partition] -> cleaned_text [partition] -> deduplicated_text (global)

raw_corpus and cleaned_text, the per-document steps, are hash-partitioned (largetrain_dagster.partitions);
deduplicated_text is the global step: it reads every partition (MinHash-LSH clustering over all of them,
then the accounting over all of them). Checks: ``accounting`` (in the asset) and ``no_exact_duplicates``
(recounted from the kept files), both blocking.
"""

from pathlib import Path
from typing import Optional

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetIn,
    Failure,
    MetadataValue,
    Output,
    asset,
    asset_check,
)
from pydantic import Field

from largetrain_core.accounting import corpus_accounting, markdown_table, outcome_table, removal_warning
from largetrain_core.balance import NULL_LABEL, balance_parts, histogram_markdown, label_histogram, repeat_counts
from largetrain_core.clean import QualityConfig
from largetrain_core.corpus import ReaderConfig, describe_rejections, duplicate_ids, fingerprint, rejection_error
from largetrain_core.dedup import DedupConfig, key_hashes
from largetrain_core.provenance import check_provenance, describe, read_provenance
from largetrain_core.storage import data_version, part_files
from largetrain_dagster import partitions
from largetrain_dagster.artefacts import CODE_VERSIONS, asset_output, build_or_reuse, md_table, mib, percent
from largetrain_dagster.configs import dagster_config
from largetrain_dagster.engine import DataEngine, engine_metadata
from largetrain_dagster.resources import Storage

ROLES = partitions.ROLES


RawCorpusConfig = dagster_config(ReaderConfig, "RawCorpusConfig", defaults={"path": ""}, exclude=("partition", "partitions"))
# Our default, no paper's: the demo removes a third of the kernel docs on purpose (configs/demo.yaml); more
# than half of a corpus gone is rarely what a user meant (93% of short records under the Gopher defaults).
WARN_REMOVED = 0.5


def _warn_removed_field(what: str):
    return Field(default=WARN_REMOVED, description=(
        f"Log a WARNING (and metadata removal_warning) when {what} removes more than this share of its input "
        "documents, with the top reasons and the setting that changes each. null: never. Not part of the data version."))


_QualitySettings = dagster_config(QualityConfig, "QualitySettings")


class CleanedTextConfig(_QualitySettings):
    """The quality rules (largetrain_core.rules): each group's on/off switch and each rule's threshold."""

    warn_removed_fraction: Optional[float] = _warn_removed_field("this partition's cleaning")

    def to_core(self) -> QualityConfig:
        return _QualitySettings(**self.model_dump(exclude={"warn_removed_fraction"})).to_core()


class DeduplicatedTextConfig(dagster_config(DedupConfig, "DedupSettings")):
    """Exact + MinHash-LSH near-duplicate removal (largetrain_core.dedup), then optional class balancing."""

    warn_removed_fraction: Optional[float] = _warn_removed_field(
        "the corpus's whole chain (rejected, filtered, duplicate, balanced away, over every partition)")

    balance_target: Optional[dict[str, float]] = Field(default=None, description=(
        "Class balancing after dedup (largetrain_core.balance; needs raw_corpus label_field): target share per "
        "label (normalized; `<null>` names documents without a label; a class left out or at 0 is dropped). "
        "{} = uniform over the classes present. null = no balancing (with labels read, a WARNING gives the documents "
        "per class). Set without labels read: the step fails before any work."))
    balance_mode: str = Field(default="downsample", description=(
        "downsample: sample every class without replacement, dropped documents count as filtered "
        "(balance_downsample); upsample: keep every document once and draw seeded extra copies of the minority "
        "classes, kept as a `copies` weight per document (never as rows, so they are not duplicates); "
        "token_shards repeats each document `copies` times in its train split."))
    balance_seed: int = Field(default=0, description="Seed of the balancing draw (numpy PCG64).")

    def to_core(self) -> DedupConfig:
        """The dedup settings (the balance fields are read by :meth:`balancing`)."""
        return DedupConfig(**self.model_dump(exclude={"balance_target", "balance_mode", "balance_seed", "warn_removed_fraction"}))

    def balancing(self) -> Optional[dict]:
        """The balance settings (None without a target); raises Failure on an unknown balance_mode."""
        if self.balance_target is None:
            return None
        modes = {"downsample": "down", "upsample": "up"}
        if self.balance_mode not in modes:
            raise Failure(f"balance_mode must be downsample or upsample, got {self.balance_mode!r}")
        return {"target": dict(sorted(self.balance_target.items())) or None, "mode": modes[self.balance_mode],
                "seed": self.balance_seed}


def corpus_assets(role: str) -> list:
    """raw_corpus and cleaned_text (partitioned) and deduplicated_text (global) of ``role``, keyed ``<role>/<name>``."""
    default_source, description = ROLES[role]
    group = f"{role}_data"

    @asset(key=[role, "raw_corpus"], group_name=group, code_version=CODE_VERSIONS["raw_corpus"], partitions_def=partitions.DATA_PARTITIONS,
           io_manager_key="handles", kinds={"parquet"},
           description=f"{description} One hash partition of its files read into Parquet {{doc_id, source, text}}.")
    def raw_corpus(context: AssetExecutionContext, config: RawCorpusConfig, storage: Storage, engine: DataEngine) -> Output:
        source = config.path or str(storage.path(default_source))
        if not Path(source).exists():
            raise Failure(f"{role} corpus not found at {source}: run `make corpora` or set config path")
        pk, keys = context.partition_key, partitions.DATA_PARTITIONS.get_partition_keys()
        part = {"partition": keys.index(pk), "partitions": len(keys)}
        # the version: the settings but not the corpus's location, and the content of this partition's files
        settings = config.model_dump(exclude={"path"})
        if settings["label_field"] is None:  # unlabelled corpora keep the versions they had before label_field
            del settings["label_field"]
        try:
            provenance = read_provenance(source)
        except ValueError as e:
            raise Failure(str(e)) from e
        digest = fingerprint(source, **part, cache_file=storage.path("_cache", "digests", role, f"{pk}.json"))
        version = data_version(CODE_VERSIONS["raw_corpus"], settings, part, digest)
        reader = config.to_core(path=source, **part)
        path, stats, reused = build_or_reuse(context, storage, [role, "raw_corpus", pk], version,
                                             lambda out: {**engine.ingest(context, reader, out), **part})
        rejected = path / "rejected.parquet"
        error = rejection_error(stats, reader, rejected)
        if error:
            raise Failure(f"{source} (partition {pk}): {error.removesuffix('.')}. Every rejected record: {rejected}")
        read = stats["documents"] + stats["not_sampled"] + stats["rejected"]  # every record read, before subsetting
        extra = {"source": MetadataValue.path(source), "content_digest": digest, "size_mib": mib(stats["bytes"]),
                 "rejected_percent": percent(stats["rejected"], read), **engine_metadata(stats)}
        if stats["rejected"]:
            reasons = describe_rejections(rejected)
            context.log.warning(f"{source} (partition {pk}): {stats['rejected']:,} of {read:,} records rejected (left out of "
                                f"the corpus; more than max_rejected_fraction={reader.max_rejected_fraction} would fail "
                                f"the run). {reasons} Every rejected record: {rejected}")
            extra |= {"rejected_reasons": MetadataValue.text(reasons), "rejected_file": MetadataValue.path(str(rejected))}
        if provenance:
            extra.update(provenance=MetadataValue.json(provenance), corpus_version=describe(provenance))
            mismatch = check_provenance(source, provenance)
            if mismatch:
                context.log.warning(f"{source} no longer matches its provenance file: {'; '.join(mismatch)}")
            extra["provenance_matches"] = not mismatch
        stats = {**stats, "source": str(Path(source).resolve()), "content_digest": digest, "provenance": provenance}
        if stats["skipped_files"]:
            context.log.warning(f"{source} (partition {pk}): {stats['skipped_files']} files with a suffix no reader knows "
                                f"were not read; listed in {path / 'skipped_files.txt'}")
            extra["skipped_files_list"] = MetadataValue.path(str(path / "skipped_files.txt"))
        if stats["renamed_ids"]:
            context.log.warning(f"{source} (partition {pk}): {stats['renamed_ids']} documents repeat an earlier document's "
                                f"id and were renamed <id>@<file>:<line or row>; listed in {path / 'renamed_ids.parquet'}")
        return asset_output(path, version, stats, config, reused, extra)

    @asset(key=[role, "cleaned_text"], ins={"raw": AssetIn(key=[role, "raw_corpus"])}, group_name=group,
           code_version=CODE_VERSIONS["cleaned_text"], partitions_def=partitions.DATA_PARTITIONS, io_manager_key="handles",
           kinds={"parquet", "polars"},
           description="NFC, control characters and NUL removed, LF line endings; Gopher quality/repetition and C4 line rules with a reason code per removed document.")
    def cleaned_text(context: AssetExecutionContext, config: CleanedTextConfig, storage: Storage, engine: DataEngine,
                     raw: dict) -> Output:
        quality = config.to_core()
        version = data_version(CODE_VERSIONS["cleaned_text"], quality.to_dict(), raw["data_version"])
        part = {k: raw["stats"][k] for k in ("partition", "partitions")}
        path, stats, reused = build_or_reuse(context, storage, [role, "cleaned_text", context.partition_key], version,
                                     lambda out: {**engine.clean(context, Path(raw["path"]), out, quality), **part})
        extra = {"filtered_by_reason": md_table(stats["filtered_by_reason"]), "kept_percent": percent(stats["kept"], stats["input"]),
                 "kept_mib": mib(stats["bytes_kept"]), **engine_metadata(stats)}
        warning = removal_warning(f"{role}/cleaned_text partition {context.partition_key}", stats["input"],
                                  [("filtered", r, n) for r, n in stats["filtered_by_reason"].items()],
                                  config.warn_removed_fraction)
        if warning:
            context.log.warning(warning)
            extra["removal_warning"] = MetadataValue.text(warning)
        return asset_output(path, version, stats, config, reused, extra)

    @asset(key=[role, "deduplicated_text"], group_name=group, code_version=CODE_VERSIONS["deduplicated_text"],
           ins={"raw": AssetIn(key=[role, "raw_corpus"]), "cleaned": AssetIn(key=[role, "cleaned_text"])},
           io_manager_key="handles", kinds={"parquet"},
           check_specs=[AssetCheckSpec("accounting", asset=[role, "deduplicated_text"], blocking=True,
                                       description="kept + filtered + duplicate + rejected == input, recounted from the files")],
           description="Global over every partition: exact (NFKC, case-folded, whitespace-collapsed key) and MinHash-LSH near duplicates removed; the first copy in corpus order (partition, file, row) is kept per cluster.")
    def deduplicated_text(context: AssetExecutionContext, config: DeduplicatedTextConfig, storage: Storage,
                          engine: DataEngine, raw: dict, cleaned: dict):
        # raw and cleaned: {partition: handle} for every partition, each made with this deployment's partitioning
        keys = sorted(cleaned)
        for name, handles in (("raw_corpus", raw), ("cleaned_text", cleaned)):
            for i, k in enumerate(keys):
                made = (handles[k]["stats"].get("partition"), handles[k]["stats"].get("partitions"))
                if made != (i, len(keys)):
                    raise Failure(f"partition {k} of {role}/{name} was made as partition {made[0]} of {made[1]}, but "
                                  f"LARGETRAIN_DATA_PARTITIONS is now {len(keys)}: its files belong to other partitions. "
                                  f"Re-materialize {role}/raw_corpus and {role}/cleaned_text for every partition.")
        raw_dirs, cleaned_dirs = [Path(raw[k]["path"]) for k in keys], [Path(cleaned[k]["path"]) for k in keys]
        dcfg, bal = config.to_core(), config.balancing()
        if bal:  # before any work: balancing needs labels
            read = label_histogram(raw_dirs)
            if read is None or set(read) <= {NULL_LABEL}:
                raise Failure(
                    f"{role}/deduplicated_text: balance_target is set but no labels were read: "
                    + ("raw_corpus label_field is null (set it to the field holding the class)" if read is None else
                       f"none of the {read.get(NULL_LABEL, 0):,} documents has the field raw_corpus label_field names")
                    + f". Set label_field and re-materialize {role}/raw_corpus for every partition, "
                    "or set balance_target: null.")
        # the balance settings enter the version only when set, so unbalanced versions stay as they were
        version = data_version(CODE_VERSIONS["deduplicated_text"], {**dcfg.to_dict(), **({"balance": bal} if bal else {})},
                               [(k, cleaned[k]["data_version"]) for k in keys])

        def build(out: Path) -> dict:
            clash = duplicate_ids(raw_dirs, keys)
            if clash.height:
                shown = "; ".join(f"{i!r} in {', '.join(where)}" for i, where in clash.head(5).iter_rows())
                raise Failure(f"{role}: {clash.height} document ids occur in more than one partition (ids repeat across "
                              f"files), e.g. {shown}. Make the ids unique, or set raw_corpus id_field: null to name "
                              f"documents by file and line, and re-materialize {role}/raw_corpus.")
            stats = {**engine.deduplicate(context, cleaned_dirs, out, dcfg), "partitions": len(keys)}
            if bal:
                try:
                    stats["balance"] = balance_parts(out, bal["target"], bal["mode"], bal["seed"])
                except ValueError as e:
                    raise Failure(f"{role} deduplicated_text: cannot balance: {e}") from e
                stats["kept"] = stats["kept"] - stats["balance"]["balance_dropped"]
            outcome_table(raw_dirs, cleaned_dirs, out).write_parquet(out / "outcomes.parquet")
            return stats

        path, stats, reused = build_or_reuse(context, storage, [role, "deduplicated_text"], version, build)
        extra = engine_metadata(stats)
        rejected_files = [str(Path(raw[k]["path"]) / "rejected.parquet") for k in keys if raw[k]["stats"].get("rejected")]
        if rejected_files:  # the partitions' rejected records, for the summary (each raw_corpus run logged its reasons)
            extra["rejected_files"] = MetadataValue.json(rejected_files)
        if "balance" in stats:
            b = stats["balance"]
            extra |= {"class_histogram": MetadataValue.md(histogram_markdown(b["before"], b["after"])),
                     "balance": MetadataValue.json(b), "balance_dropped": b["balance_dropped"],
                     "balance_repeats": b["balance_repeats"], "repeated_documents": b["repeated_documents"]}
        elif (classes := label_histogram([path])) is not None:  # labels read, not balanced: say so
            shown = ", ".join(f"{c} {n:,}" for c, n in sorted(classes.items(), key=lambda e: (-e[1], e[0])))
            context.log.warning(
                f"{role} corpus: labels were read (raw_corpus label_field) but not balanced: balance_target is null. "
                f"Documents per class: {shown}. deduplicated_text `balance_target: {{}}` gives every class an equal "
                "share ({a: 2, b: 1}: those shares), with balance_mode downsample or upsample."
                + (" No document has the label field: check label_field." if set(classes) == {NULL_LABEL} else ""))
            extra["labels_not_balanced"] = MetadataValue.json(classes)
        acc = corpus_accounting(raw_dirs, cleaned_dirs, path)
        summary = {k: acc[k] for k in ("input", "kept", "filtered", "duplicate", "rejected")}
        outcomes = pl.read_parquet(path / "outcomes.parquet")
        warning = removal_warning(f"{role} corpus (raw_corpus -> cleaned_text -> deduplicated_text)", summary["input"],
                                  [r for r in outcomes.iter_rows() if r[0] != "kept"], config.warn_removed_fraction)
        if warning:
            context.log.warning(warning)
            extra["removal_warning"] = MetadataValue.text(warning)
        corpus = corpus_lineage(raw, cleaned)
        stats = {**stats, "documents": summary, "corpus": corpus}  # for the model cards (largetrain_dagster.model_cards)
        yield asset_output(path, version, stats, config, reused, {"corpus": MetadataValue.json(corpus),
            "accounting": md_table(summary, ("outcome", "documents")),
            "outcomes_by_reason": MetadataValue.md(markdown_table(outcomes)),
            "outcomes_table": MetadataValue.path(str(path / "outcomes.parquet")),
            **{f"documents_{k}": v for k, v in summary.items()},
            **{f"{k}_percent": percent(summary[k], summary["input"]) for k in ("kept", "filtered", "duplicate", "rejected")},
            **extra})
        yield AssetCheckResult(check_name="accounting", passed=acc["balanced"],
                               metadata={**summary, "intended_repeats": acc["repeats"],
                                         "problems": MetadataValue.json(acc["problems"])})

    return [raw_corpus, cleaned_text, deduplicated_text]



def corpus_lineage(raw: dict, cleaned: dict) -> dict:
    """What deduplicated_text was made from, from the partitions' handles: the corpus source, its
    provenance (the provenance file beside it, or None), the content digest of each partition's files
    and the data versions of raw_corpus and cleaned_text per partition."""
    stats = [raw[k]["stats"] for k in sorted(raw)]
    return {"source": next((s["source"] for s in stats if s.get("source")), None),
            "provenance": next((s["provenance"] for s in stats if s.get("provenance")), None),
            "content_digests": {k: raw[k]["stats"].get("content_digest") for k in sorted(raw)},
            "data_versions": {"raw_corpus": {k: raw[k]["data_version"] for k in sorted(raw)},
                              "cleaned_text": {k: cleaned[k]["data_version"] for k in sorted(cleaned)}}}


def count_exact_duplicates(directory: Path, batch: int = 10_000) -> tuple[int, int, list[str]]:
    """Recount ``part-*.parquet`` under ``directory``: (documents, documents whose dedup key was seen
    before, up to 5 of their doc ids). Memory: 8 bytes per distinct key (a set of xxh3-64 hashes)."""
    seen: set[int] = set()
    docs, dups, examples = 0, 0, []
    for part in part_files(directory):
        for df in pl.read_parquet(part, columns=["doc_id", "text"]).iter_slices(batch):
            for doc_id, h in zip(df["doc_id"].to_list(), key_hashes(df["text"]).to_list()):
                docs += 1
                if h in seen:
                    dups += 1
                    if len(examples) < 5:
                        examples.append(doc_id)
                seen.add(h)
    return docs, dups, examples


def no_exact_duplicates_check(key: list[str]):
    """A blocking check on ``key`` (a deduplicated_text asset): no two kept documents share a dedup key."""

    @asset_check(asset=key, name="no_exact_duplicates", blocking=True,
                 description="Recounted from the files: no two kept documents have the same dedup key (NFKC, case-folded, "
                             "whitespace-collapsed). Intended repetition (balancing's `copies` weight) is no duplicate: "
                             "it is counted apart (intended_repeats).")
    def _check(handle: dict) -> AssetCheckResult:
        docs, dups, examples = count_exact_duplicates(Path(handle["path"]))
        repeated, repeats = repeat_counts(Path(handle["path"]))
        return AssetCheckResult(passed=dups == 0, metadata={"documents": docs, "duplicates": dups,
                                                            "examples": MetadataValue.json(examples),
                                                            "intended_repeats": repeats, "repeated_documents": repeated})

    return _check


def dedup_checks(roles) -> list:
    return [no_exact_duplicates_check([role, "deduplicated_text"]) for role in roles]
