"""raw_corpus: one partition of a corpus's files read into Parquet {doc_id, source, text[, label]}, its
rejected records in rejected.parquet (largetrain_core.corpus.ingest, on the run's executor).

Data version: the code version, the reader settings (not the corpus's location), the partition and
the content digest of the partition's files (largetrain_core.corpus.fingerprint). Fails
(:class:`StageError`) when the corpus is missing, its provenance file is damaged, or more than
``max_rejected_fraction`` of the records read are rejected, naming the top reasons.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from largetrain_core import fs
from largetrain_core.artifacts import CODE_VERSIONS
from largetrain_core.corpus import describe_rejections, fingerprint, holds_records, rejection_error, scan
from largetrain_core.provenance import check_provenance, describe, read_provenance
from largetrain_core.readers import ReaderConfig
from largetrain_core.executors import steps
from largetrain_core.stages.base import Json, StageError, StageResult, StageRun, Text, executor_metadata, mib, percent
from largetrain_core.storage import data_version, stored_location


def settings_version(reader: ReaderConfig) -> dict:
    """The reader settings that enter the data version: every field but the location and the
    partition (which enters on its own); ``label_field``, ``labels``, ``require_label`` and ``id_prefix`` only
    when set, ``format`` only when not text."""
    settings = {k: v for k, v in dataclasses.asdict(reader).items() if k not in ("path", "partition", "partitions")}
    if settings["label_field"] is None:
        del settings["label_field"]
    if settings["labels"] is None:  # the label rules, only when set: the versions read before them hold
        del settings["labels"]
    if not settings["require_label"]:
        del settings["require_label"]
    if settings["format"] == "text":  # the default: the versions read before the setting existed hold
        del settings["format"]
    if not settings.get("id_prefix"):  # a mixture's corpus prefixes its ids; a corpus alone keeps its versions
        settings.pop("id_prefix", None)
    return settings


def raw_corpus(reader: ReaderConfig, run: StageRun) -> StageResult:
    """Read partition ``reader.partition`` of ``reader.partitions`` of the corpus at ``reader.path``
    into ``<root>/<asset>/<partition>/<version>/`` on ``run.executor``.

    Stats: the executor's counts (documents, rejected, renamed_ids, bytes, files, skipped_files,
    not_sampled, parts, rejected_by_file), the partition, ``source`` (the corpus, resolved),
    ``content_digest``, ``provenance`` (None without a provenance file) and ``reader`` (the reader
    settings, :func:`settings_version`). Warnings: rejected
    records with the top reasons, files no reader knows, renamed ids, a corpus that no longer matches
    its provenance, a corpus that holds no record (:func:`largetrain_core.corpus.holds_records`, probed
    when this partition read none)."""
    source, shown = reader.path, fs.redact(reader.path)
    where = f"{shown} (partition {run.partition})"
    _check_source(source, run.asset[0])
    try:
        provenance = read_provenance(source)
    except ValueError as e:
        raise StageError(str(e)) from e
    part = {"partition": reader.partition, "partitions": reader.partitions}
    listed = scan(source, **part)  # once: for the fingerprint and for the read
    cache = run.cache_file("digests", run.asset[0], f"{run.partition}.json")
    digest = fingerprint(source, **part, cache_file=cache, listed=listed)
    version = data_version(CODE_VERSIONS["raw_corpus"], settings_version(reader), part, digest)
    built = run.build_or_reuse(
        version, lambda out: {**run.executor.run_global(steps.ingest, out, reader=reader, listed=listed), **part}
    )
    stats, rejected = built.stats, built.path / "rejected.parquet"
    error = rejection_error(stats, reader, rejected)
    if error:
        raise StageError(f"{where}: {error.removesuffix('.')}. Every rejected record: {stored_location(rejected)}")
    read = stats["documents"] + stats["not_sampled"] + stats["rejected"]  # every record read, before subsetting
    result = StageResult.built(
        built,
        version,
        metadata={
            "source": shown if fs.is_url(source) else Path(source),
            "content_digest": digest,
            "size_mib": mib(stats["bytes"]),
            "rejected_percent": percent(stats["rejected"], read),
            **executor_metadata(stats),
        },
    )
    _report_reading(result, run, reader, built.path, read, provenance)
    result.stats = {
        **stats,
        "source": shown if fs.is_url(source) else str(Path(source).resolve()),
        "content_digest": digest,
        "provenance": provenance,
        "reader": settings_version(reader),  # compared across partitions by the global steps (global_inputs)
    }
    return result


def _check_source(source: str, role: str) -> None:
    """StageError before any work when the corpus cannot be reached (object store) or is not there."""
    if fs.is_url(source):  # before any work: a missing bucket or prefix, wrong credentials, no endpoint
        try:
            fs.check_access(source, f"read the {role} corpus")
        except fs.StorageAccessError as e:
            raise StageError(
                f"{e}. Nothing was read: check the corpus path, the endpoint (AWS_ENDPOINT_URL) and the "
                "credentials (the standard chain: environment, profile, instance role)."
            ) from None
    elif not Path(source).exists():
        raise StageError(f"{role} corpus not found at {source}: run `make corpora` or set config path")


def _report_reading(
    result: StageResult, run: StageRun, reader: ReaderConfig, out: Path, read: int, provenance: dict | None
) -> None:
    """Warnings (with their metadata): an empty corpus, rejected records, a provenance mismatch, skipped
    files and renamed ids of the partition read into ``out`` (``read`` records)."""
    source, shown = reader.path, fs.redact(reader.path)
    where = f"{shown} (partition {run.partition})"
    stats, rejected = result.stats, out / "rejected.parquet"
    if not read and not holds_records(source):  # an empty partition is fine; an empty corpus is said at once
        result.warn(
            f"{shown}: the {run.asset[0]} corpus holds no record: each of its corpus files is empty, holds blank "
            "lines only or is a Parquet file of no rows. deduplicated_text, the first global step, will fail on it."
        )
    if stats["rejected"]:
        reasons = describe_rejections(rejected)
        result.warn(
            f"{where}: {stats['rejected']:,} of {read:,} records rejected (left out of the corpus; more than "
            f"max_rejected_fraction={reader.max_rejected_fraction} would fail the run). {reasons} "
            f"Every rejected record: {stored_location(rejected)}"
        )
        result.metadata |= {"rejected_reasons": Text(reasons), "rejected_file": rejected}
    if provenance:
        mismatch = check_provenance(source, provenance)
        result.warn(f"{shown} no longer matches its provenance file: {'; '.join(mismatch)}" if mismatch else None)
        result.metadata |= {
            "provenance": Json(provenance),
            "corpus_version": describe(provenance),
            "provenance_matches": not mismatch,
        }
    if stats["skipped_files"]:
        result.warn(
            f"{where}: {stats['skipped_files']} files with a suffix no reader knows were not read; listed in "
            f"{stored_location(out / 'skipped_files.txt')}"
        )
        result.metadata["skipped_files_list"] = out / "skipped_files.txt"
    if stats["renamed_ids"]:
        result.warn(
            f"{where}: {stats['renamed_ids']} documents repeat an earlier document's id and were renamed "
            f"<id>@<file>:<line or row>; listed in {stored_location(out / 'renamed_ids.parquet')}"
        )
