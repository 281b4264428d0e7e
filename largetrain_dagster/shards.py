"""Token shards of one corpus role (largetrain_core.stages.token_shards): every document + EOS packed
into ``seq_len + 1`` windows, Arrow IPC shards + manifest.json, train/validation split by document;
blocking check ``token_ids_below_vocab``.

``<role>/token_shards`` is a graph-backed asset, partitioned like the data steps: ``plan`` says how
many partitions (LARGETRAIN_DATA_PARTITIONS, at most one per part file; none when the shards are
complete already), ``tokenize`` runs once per partition as a step of its own (dynamic outputs: in
parallel processes under the multiprocess executor, one pod each under dagster-k8s's
``k8s_job_executor``) on the data-preparation ``executor`` resource (Spark: one task per run of the
partition's part files), and ``assemble``, the global step, writes the manifest. Its run config is the
asset's own (``ops: {<role>__token_shards: {config: {seq_len: ...}}}``), mapped onto the steps. What
passes between the steps is a small JSON document through the handle IO manager, never a pickle.
"""

from dagster import (
    AssetCheckResult,
    AssetIn,
    ConfigMapping,
    DynamicOut,
    DynamicOutput,
    Failure,
    In,
    OpExecutionContext,
    Out,
    Output,
    asset_check,
    graph_asset,
    op,
)

from largetrain_core.executors.base import RECORD
from largetrain_core.stages.base import Artifact, StageError, StageRun
from largetrain_core.stages.token_shards import MIN_VALIDATION_SEQUENCES, TokenShardsSettings, tiny_validation_warning  # noqa: F401
from largetrain_core.stages.token_shards import ids_below_vocab, token_shard_partition, token_shard_partitions
from largetrain_core.stages.token_shards import token_shards as shards_stage
from largetrain_dagster import partitions as data_partitions
from largetrain_dagster.artifacts import CODE_VERSIONS, asset_output, metadata_values
from largetrain_dagster.configs import dagster_config
from largetrain_dagster.executor import DataExecutor
from largetrain_dagster.resources import Storage

TokenShardsConfig = dagster_config(TokenShardsSettings, "TokenShardsConfig")


def _run(context: OpExecutionContext, storage: Storage, role: str, executor: DataExecutor | None = None) -> StageRun:
    return StageRun(
        root=storage.root,
        asset=(role, "token_shards"),
        log=context.log,
        executor=executor.bind(context) if executor is not None else None,
    )


def _stage(fn, *args, **kwargs):
    """A core stage call; its StageError becomes a Dagster Failure with its message."""
    try:
        return fn(*args, **kwargs)
    except StageError as e:
        raise Failure(str(e), allow_retries=e.retryable) from e


def token_shards_asset(role: str) -> list:
    """``<role>/token_shards`` from ``<role>/deduplicated_text`` (``<role>/filtered_text`` for a role that
    filters its text: partitions.shards_text) and the shared tokenizer (the graph of the module doc),
    and its blocking check ``token_ids_below_vocab``."""
    key = [role, "token_shards"]
    plan, tokenize, assemble = _plan_op(role), _tokenize_op(role), _assemble_op(role)

    def mapping(cfg: dict) -> dict:
        return {plan.name: {"config": cfg}, assemble.name: {"config": cfg}}

    @graph_asset(
        key=key,
        group_name=f"{role}_data",
        code_version=CODE_VERSIONS["token_shards"],
        ins={"text": AssetIn(key=[role, data_partitions.shards_text(role)]), "tokenizer": AssetIn(key="tokenizer")},
        config=ConfigMapping(config_fn=mapping, config_schema=TokenShardsConfig.to_config_schema()),
        kinds={"arrow"},
        description="EOS after every document, packed into seq_len+1 windows, Arrow IPC shards + manifest.json, "
        "train/validation split by document; tokenized per partition, in parallel.",
    )
    def token_shards(text, tokenizer):
        return assemble(text, tokenizer, plan(text, tokenizer).map(tokenize).collect())

    return [token_shards, _ids_check(key)]


def _plan_op(role: str):
    """The op that plans ``<role>/token_shards``: one dynamic output per partition to tokenize."""

    @op(
        name=f"{role}__token_shards_plan",
        out=DynamicOut(io_manager_key="handles"),
        description="How many partitions tokenize the corpus (none when the shards are complete already).",
    )
    def plan(context: OpExecutionContext, config: TokenShardsConfig, storage: Storage, text: dict, tokenizer: dict):
        n = _stage(
            token_shard_partitions,
            config.to_core(),
            Artifact.of(text),
            Artifact.of(tokenizer),
            _run(context, storage, role),
            len(data_partitions.DATA_PARTITIONS.get_partition_keys()),
        )
        context.log.info(
            f"{role}/token_shards: {n} partitions to tokenize"
            if n
            else f"{role}/token_shards: complete already, nothing to tokenize"
        )
        for i in range(n):
            yield DynamicOutput(
                {
                    "partition": i,
                    "partitions": n,
                    "settings": config.model_dump(),
                    "text": text,
                    "tokenizer": tokenizer,
                },
                mapping_key=f"p{i:03d}",
            )

    return plan


def _tokenize_op(role: str):
    """The op that tokenizes one partition of ``<role>/token_shards``."""

    @op(
        name=f"{role}__token_shards_tokenize",
        out=Out(io_manager_key="handles"),
        description="One partition of the corpus's part files tokenized and packed into its own shard files.",
    )
    def tokenize(context: OpExecutionContext, storage: Storage, executor: DataExecutor, part: dict) -> Output[dict]:
        result = _stage(
            token_shard_partition,
            TokenShardsConfig(**part["settings"]).to_core(),
            Artifact.of(part["text"]),
            Artifact.of(part["tokenizer"]),
            _run(context, storage, role, executor),
            part["partition"],
            part["partitions"],
        )
        context.log.info(
            f"{role}/token_shards partition {part['partition']} of {part['partitions']}: "
            f"{result.stats['sequences']:,} sequences of {result.stats['parts']} parts at {result.path}"
            + (" (reused)" if result.reused else f" on the {result.stats[RECORD]['executor']} executor")
        )
        return Output(result.handle())  # an Output: a Pipes session (the Spark executor) makes the step yield events

    return tokenize


def _assemble_op(role: str):
    """The op of ``<role>/token_shards``'s global step: tails and manifest over every partition."""

    @op(
        name=f"{role}__token_shards_assemble",
        ins={"parts": In(list)},
        out=Out(io_manager_key="handles"),
        description="The global step: the tails' windows and manifest.json over every partition's shards.",
    )
    def assemble(
        context: OpExecutionContext,
        config: TokenShardsConfig,
        storage: Storage,
        text: dict,
        tokenizer: dict,
        parts: list,
    ):
        done = sorted(parts, key=lambda h: h["stats"]["partition"])
        result = _stage(
            shards_stage,
            config.to_core(),
            Artifact.of(text),
            Artifact.of(tokenizer),
            _run(context, storage, role),
            [Artifact.of(h) for h in done],
        )
        for warning in result.warnings:
            context.log.warning(warning)
        return asset_output(
            result.path, result.data_version, result.stats, config, result.reused, metadata_values(result.metadata)
        )

    return assemble


def _ids_check(key: list[str]):
    """The blocking check ``token_ids_below_vocab`` of the token shards ``key``."""

    @asset_check(
        asset=key,
        name="token_ids_below_vocab",
        blocking=True,
        description="every id < vocab size; shard sizes and checksums match manifest.json",
    )
    def ids_check(shards: dict) -> AssetCheckResult:
        check = ids_below_vocab(Artifact.of(shards).path, shards["stats"]["vocab_size"])
        return AssetCheckResult(passed=bool(check.passed), metadata=metadata_values(check.metadata))

    return ids_check
