"""Shared by every stage's assets: the Output and metadata an asset returns, and the build-or-reuse of
its artifact directory (largetrain_core.artifacts) with the step's log."""

import warnings
from pathlib import Path
from typing import Callable, Iterator

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    BetaWarning,
    Config,
    DataVersion,
    Failure,
    MetadataValue,
    Output,
)

from largetrain_core import artifacts
from largetrain_core.artifacts import CODE_VERSIONS  # noqa: F401 (the stages' code versions, for the asset definitions)
from largetrain_core.executors.base import ExecutorError
from largetrain_core.stages.base import Json, Markdown, StageError, StageResult, StageRun, Text, Url
from largetrain_core.stages.base import mib, percent, rounded, text_block  # noqa: F401 (for the other asset modules)
from largetrain_core.storage import DiskFullError, stored_location
from largetrain_dagster.resources import Storage


def build_or_reuse(
    context: AssetExecutionContext, storage: Storage, key: list[str], version: str, build: Callable[[Path], dict]
) -> tuple[Path, dict, bool]:
    """largetrain_core.artifacts.build_or_reuse of ``<root>/<key>/<version>/``, logging to the step's log.
    Returns (directory, stats, reused)."""
    return artifacts.build_or_reuse(artifacts.location(storage.root, key, version), build, context.log)


# The numbers a person looks for first on an asset's page, in this order where the asset has them; the rest
# follows as recorded, and the bookkeeping (path, data version, reused, config) last.
HEADLINE = (
    "task",
    "test_accuracy",
    "test_macro_f1",
    "test_assistant_perplexity",
    "adapter_domain_perplexity_reduction_percent",
    "base_pretrain_perplexity",
    "base_domain_perplexity",
    "adapter_domain_perplexity",
    "eval_perplexity",
    "first_loss",
    "last_loss",
    "eval_loss",
    "loss_curve",
    "training_curves",
    "documents_input",
    "documents_kept",
    "documents_filtered",
    "documents_duplicate",
    "documents_rejected",
    "input",
    "kept",
    "filtered",
    "duplicate",
    "duplicate_exact",
    "duplicate_near",
    "documents",
    "rejected",
    "kept_percent",
    "total_tokens",
    "train_sequences",
    "validation_sequences",
)
BOOKKEEPING = ("path", "data_version", "reused", "rebuilt_because", "config")


def headline_first(md: dict) -> dict:
    """``md`` reordered: the :data:`HEADLINE` keys it has, the others as they were, :data:`BOOKKEEPING` last
    (the Dagster UI lists metadata in this order)."""
    head = [k for k in HEADLINE if k in md]
    tail = [k for k in BOOKKEEPING if k in md]
    rest = [k for k in md if k not in head and k not in tail]
    return {k: md[k] for k in [*head, *rest, *tail]}


def asset_output(
    path: Path,
    version: str,
    stats: dict,
    config: Config | dict,
    reused: bool,
    extra: dict | None = None,
    stats_metadata: bool = True,
) -> Output:
    """The asset's Output: the JSON handle (path: where the version is stored, its URL under an
    object-store root; data version, stats, exact) and metadata (path, data
    version, reused, config, every numeric stat unless ``stats_metadata`` is False, ``extra``; the headline
    numbers first: :func:`headline_first`), with the data version Dagster records.

    Metadata is for people and plots: floats (in stats and ``extra``) are rounded to 4 significant
    digits (``rounded``); units go in the label (``seconds``, ``size_mib``, ``kept_percent``)."""
    cfg = config if isinstance(config, dict) else config.model_dump()
    where = stored_location(path)  # a working copy's URL under an object-store root
    handle = {"path": where, "data_version": version, "stats": stats}
    md = {
        "path": MetadataValue.path(where),
        "data_version": version,
        "reused": reused,
        "config": MetadataValue.json(cfg),
    }
    if stats_metadata:  # else the caller shows the stats it chose in ``extra``
        md.update({k: v for k, v in stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
    if stats.get("rebuilt_because"):
        md["rebuilt_because"] = MetadataValue.text(stats["rebuilt_because"])
    md.update(extra or {})
    md = headline_first({k: rounded(v) if isinstance(v, float) else v for k, v in md.items()})
    with warnings.catch_warnings():  # Output's data_version is Dagster's documented way to set it (beta-flagged)
        warnings.simplefilter("ignore", BetaWarning)
        return Output(handle, metadata=md, data_version=DataVersion(version))


def metadata_values(metadata: dict) -> dict:
    """A core stage's metadata (largetrain_core.stages.base: Markdown, Text, Json, paths, numbers) as Dagster's."""

    def value(v):
        if isinstance(v, Markdown):
            return MetadataValue.md(str(v))
        if isinstance(v, Text):
            return MetadataValue.text(str(v))
        if isinstance(v, Url):
            return MetadataValue.url(str(v))
        if isinstance(v, Json):
            return MetadataValue.json(v.value)
        if isinstance(v, Path):
            return MetadataValue.path(stored_location(v))
        return v

    return {k: value(v) for k, v in metadata.items()}


def stage_run(context: AssetExecutionContext, storage: Storage, executor=None) -> StageRun:
    """The StageRun of this step: the storage root, the asset key and partition, the step's log, and
    the executor resource bound to the step (largetrain_dagster.executor)."""
    return StageRun(
        root=storage.root if storage.is_url else Path(storage.root),
        asset=tuple(context.asset_key.path),
        partition=context.partition_key if context.has_partition_key else None,
        log=context.log,
        executor=executor.bind(context) if executor is not None else None,
    )


def materialize_stage(
    context: AssetExecutionContext, config: Config | dict, stage: Callable[..., StageResult], *args, **kwargs
) -> Iterator:
    """Call one core ``stage`` with ``args``, log its warnings, yield its Output (config, stats and metadata)
    and its check results. A StageError (the data or a setting) becomes a dagster Failure with its
    message, not retried unless it says it could succeed again; an ExecutorError (the executor's job
    failed) a Failure that may be retried."""
    try:
        result = stage(*args, **kwargs)
    except StageError as e:
        raise Failure(str(e), allow_retries=e.retryable, metadata=metadata_values(e.metadata)) from e
    except DiskFullError as e:  # named with the file and the free space; a retry would fill the same disk
        raise Failure(f"{e}. Not retried.", allow_retries=False) from e
    except ExecutorError as e:
        raise Failure(str(e)) from e
    for warning in result.warnings:
        context.log.warning(warning)
    yield asset_output(
        result.path,
        result.data_version,
        result.stats,
        config,
        result.reused,
        metadata_values(result.metadata),
        stats_metadata=result.show_stats,
    )
    for name, check in result.checks.items():
        yield AssetCheckResult(
            check_name=name,
            passed=bool(check.passed),
            severity=AssetCheckSeverity.ERROR,
            description=check.description,
            metadata=metadata_values(check.metadata),
        )
