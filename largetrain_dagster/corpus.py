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
    Config,
    Failure,
    MetadataValue,
    Output,
    asset,
    asset_check,
)
from pydantic import Field

from largetrain_core.accounting import corpus_accounting, markdown_table, outcome_table
from largetrain_core.balance import balance_parts, histogram_markdown
from largetrain_core.clean import QualityConfig, clean_corpus
from largetrain_core.corpus import ReaderConfig, fingerprint, ingest
from largetrain_core.dedup import DedupConfig, deduplicate, key_hashes
from largetrain_core.provenance import check_provenance, describe, read_provenance
from largetrain_core.storage import data_version, part_files
from largetrain_dagster import partitions
from largetrain_dagster.artefacts import CODE_VERSIONS, asset_output, build_or_reuse, md_table
from largetrain_dagster.resources import Storage

ROLES = partitions.ROLES


class RawCorpusConfig(Config):
    path: str = Field(default="", description="Corpus directory or file; empty = <storage root>/<the role's default corpus>.")
    text_field: str = Field(default="text", description="JSONL key / Parquet column holding the text.")
    id_field: Optional[str] = Field(default=None, description="JSONL key / Parquet column holding the document id.")
    label_field: Optional[str] = Field(default=None, description=(
        "JSONL key / Parquet column holding a class label: adds a `label` column (null where a record lacks it), "
        "kept through cleaned_text and deduplicated_text; needed by deduplicated_text's balance_target."))
    batch_size: int = Field(default=1024, description="Documents per batch (bounds memory).")
    max_documents: Optional[int] = Field(default=None, description="Subset: keep at most this many documents per partition.")
    sample_fraction: float = Field(default=1.0, description="Subset: seeded hash sample of this share of documents.")
    seed: int = 0
    max_rejected_fraction: float = Field(default=0.05, description="Fail the run when more records than this share are unreadable.")


class CleanedTextConfig(Config):
    """Quality rules (largetrain_core.clean): Gopher quality (Rae et al. 2021, A.1.1), Gopher repetition
    (Table A1) and C4 lines (Raffel et al. 2020), thresholds as datatrove's filters; null switches a rule off."""

    words: str = Field(default="whitespace", description="Word tokenization: whitespace (Gopher) or spacy_like (datatrove).")
    min_words: Optional[int] = 50
    max_words: Optional[int] = 100_000
    min_mean_word_length: Optional[float] = 3.0
    max_mean_word_length: Optional[float] = 10.0
    max_hash_word_ratio: Optional[float] = 0.1
    max_ellipsis_word_ratio: Optional[float] = 0.1
    max_bullet_lines_ratio: Optional[float] = 0.9
    max_ellipsis_lines_ratio: Optional[float] = 0.3
    min_alpha_word_fraction: Optional[float] = 0.8
    min_stop_words: Optional[int] = 2
    gopher_repetition: bool = Field(default=False, description="Apply the Gopher repetition rules.")
    dup_para_fraction: Optional[float] = 0.3
    dup_para_char_fraction: Optional[float] = 0.2
    dup_line_fraction: Optional[float] = 0.3
    dup_line_char_fraction: Optional[float] = 0.2
    top_ngram_char_fractions: list[float] = Field(default=[0.20, 0.18, 0.16], description="Top 2-, 3-, 4-gram character share.")
    dup_ngram_char_fractions: list[float] = Field(default=[0.15, 0.14, 0.13, 0.12, 0.11, 0.10],
                                                  description="Duplicate 5- to 10-gram character share.")
    c4: bool = Field(default=False, description="Apply the C4 line rules (removes lines from kept documents).")
    c4_max_word_length: Optional[int] = 1000
    c4_terminal_punctuation: bool = True
    c4_min_words_per_line: Optional[int] = 3
    c4_curly_bracket: bool = True
    c4_min_sentences: Optional[int] = 5

    def quality(self) -> QualityConfig:
        d = self.model_dump()
        d["top_ngram_char_fractions"] = tuple(zip(range(2, 5), d["top_ngram_char_fractions"]))
        d["dup_ngram_char_fractions"] = tuple(zip(range(5, 11), d["dup_ngram_char_fractions"]))
        return QualityConfig(**d)


class DeduplicatedTextConfig(Config):
    """Exact + MinHash-LSH near-duplicate removal (largetrain_core.dedup)."""

    near: bool = Field(default=True, description="Also remove near duplicates (MinHash-LSH); else exact only.")
    ngram: int = Field(default=5, description="Words per shingle.")
    bands: int = Field(default=14, description="LSH bands; bands x rows permutations (14 x 8: Jaccard ~0.72).")
    rows: int = 8
    seed: int = 1
    balance_target: Optional[dict[str, float]] = Field(default=None, description=(
        "Class balancing after dedup (largetrain_core.balance; needs raw_corpus label_field): target share per "
        "label (normalized; `<null>` names documents without a label; a class left out or at 0 is dropped). "
        "{} = uniform over the classes present. null = no balancing."))
    balance_mode: str = Field(default="downsample", description=(
        "downsample: sample every class without replacement, dropped documents count as filtered "
        "(balance_downsample); upsample: keep every document and add seeded repeats (balance_repeats.parquet)."))
    balance_seed: int = Field(default=0, description="Seed of the balancing draw (numpy PCG64).")

    def dedup(self) -> DedupConfig:
        return DedupConfig(near=self.near, ngram=self.ngram, bands=self.bands, rows=self.rows, seed=self.seed)

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
    def raw_corpus(context: AssetExecutionContext, config: RawCorpusConfig, storage: Storage) -> Output:
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
        reader = ReaderConfig(source, config.text_field, config.id_field, config.batch_size, config.label_field, **part)
        path, stats, reused = build_or_reuse(context, storage, [role, "raw_corpus", pk], version, lambda out: {**ingest(
            reader, out, max_documents=config.max_documents, sample_fraction=config.sample_fraction, seed=config.seed), **part})
        total = stats["documents"] + stats["not_sampled"] + stats["rejected"]  # every record read, before subsetting
        if total and stats["rejected"] / total > config.max_rejected_fraction:
            raise Failure(f"{source} (partition {pk}): {stats['rejected']} of {total} records rejected, more than "
                          f"max_rejected_fraction={config.max_rejected_fraction}; see {path / 'rejected.parquet'}")
        extra = {"source": MetadataValue.path(source), "content_digest": digest}
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
        return asset_output(path, version, stats, config, reused, extra)

    @asset(key=[role, "cleaned_text"], ins={"raw": AssetIn(key=[role, "raw_corpus"])}, group_name=group,
           code_version=CODE_VERSIONS["cleaned_text"], partitions_def=partitions.DATA_PARTITIONS, io_manager_key="handles",
           kinds={"parquet", "polars"},
           description="NFC, control characters and NUL removed, LF line endings; Gopher quality/repetition and C4 line rules with a reason code per removed document.")
    def cleaned_text(context: AssetExecutionContext, config: CleanedTextConfig, storage: Storage, raw: dict) -> Output:
        quality = config.quality()
        version = data_version(CODE_VERSIONS["cleaned_text"], quality.to_dict(), raw["data_version"])
        part = {k: raw["stats"][k] for k in ("partition", "partitions")}
        path, stats, reused = build_or_reuse(context, storage, [role, "cleaned_text", context.partition_key], version,
                                     lambda out: {**clean_corpus(Path(raw["path"]), out, quality), **part})
        return asset_output(path, version, stats, config, reused, {"filtered_by_reason": md_table(stats["filtered_by_reason"])})

    @asset(key=[role, "deduplicated_text"], group_name=group, code_version=CODE_VERSIONS["deduplicated_text"],
           ins={"raw": AssetIn(key=[role, "raw_corpus"]), "cleaned": AssetIn(key=[role, "cleaned_text"])},
           io_manager_key="handles", kinds={"parquet"},
           check_specs=[AssetCheckSpec("accounting", asset=[role, "deduplicated_text"], blocking=True,
                                       description="kept + filtered + duplicate + rejected == input, recounted from the files")],
           description="Global over every partition: exact (NFKC, case-folded, whitespace-collapsed key) and MinHash-LSH near duplicates removed; the first copy in corpus order (partition, file, row) is kept per cluster.")
    def deduplicated_text(context: AssetExecutionContext, config: DeduplicatedTextConfig, storage: Storage,
                          raw: dict, cleaned: dict):
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
        dcfg, bal = config.dedup(), config.balancing()
        # the balance settings enter the version only when set, so unbalanced versions stay as they were
        version = data_version(CODE_VERSIONS["deduplicated_text"], {**dcfg.to_dict(), **({"balance": bal} if bal else {})},
                               [(k, cleaned[k]["data_version"]) for k in keys])

        def build(out: Path) -> dict:
            stats = {**deduplicate(cleaned_dirs, out, dcfg), "partitions": len(keys)}
            if bal:
                try:
                    stats["balance"] = balance_parts(out, bal["target"], bal["mode"], bal["seed"])
                except ValueError as e:
                    raise Failure(f"{role} deduplicated_text: cannot balance: {e}") from e
                stats["kept"] = stats["kept"] - stats["balance"]["balance_dropped"]
            outcome_table(raw_dirs, cleaned_dirs, out).write_parquet(out / "outcomes.parquet")
            return stats

        path, stats, reused = build_or_reuse(context, storage, [role, "deduplicated_text"], version, build)
        extra = {}
        if "balance" in stats:
            b = stats["balance"]
            extra = {"class_histogram": MetadataValue.md(histogram_markdown(b["before"], b["after"])),
                     "balance": MetadataValue.json(b), "balance_dropped": b["balance_dropped"],
                     "balance_repeats": b["balance_repeats"]}
        acc = corpus_accounting(raw_dirs, cleaned_dirs, path)
        summary = {k: acc[k] for k in ("input", "kept", "filtered", "duplicate", "rejected")}
        outcomes = pl.read_parquet(path / "outcomes.parquet")
        corpus = corpus_lineage(raw, cleaned)
        stats = {**stats, "documents": summary, "corpus": corpus}  # for the model cards (largetrain_dagster.model_cards)
        yield asset_output(path, version, stats, config, reused, {"corpus": MetadataValue.json(corpus),
            "accounting": md_table(summary, ("outcome", "documents")),
            "outcomes_by_reason": MetadataValue.md(markdown_table(outcomes)),
            "outcomes_table": MetadataValue.path(str(path / "outcomes.parquet")),
            **{f"documents_{k}": v for k, v in summary.items()}, **extra})
        yield AssetCheckResult(check_name="accounting", passed=acc["balanced"],
                               metadata={**summary, "problems": MetadataValue.json(acc["problems"])})

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
                 description="Recounted from the files: no two kept documents have the same dedup key (NFKC, case-folded, whitespace-collapsed).")
    def _check(handle: dict) -> AssetCheckResult:
        docs, dups, examples = count_exact_duplicates(Path(handle["path"]))
        return AssetCheckResult(passed=dups == 0, metadata={"documents": docs, "duplicates": dups,
                                                            "examples": MetadataValue.json(examples)})

    return _check


def dedup_checks(roles) -> list:
    return [no_exact_duplicates_check([role, "deduplicated_text"]) for role in roles]
