"""The lineage (DESIGN.md section 2) as software-defined assets.

For each corpus role (``pretrain``: the pretraining corpus, ``domain``: the corpus the LoRA
adapter specializes on) the same chain of assets, keyed ``<role>/<asset>``:

    raw_corpus [partition] -> cleaned_text [partition] -> deduplicated_text -> token_shards

then ``tokenizer`` (trained on pretrain/deduplicated_text, used by both chains),
``base_checkpoint`` (pretrained on pretrain/token_shards), ``lora_adapter`` (on domain/token_shards)
and ``evaluation`` (held-out perplexities). Each asset body reads its config, calls one function of
largetrain_core and returns a small JSON handle (output path, data version, counts).

Partitions (DESIGN.md section 2): raw_corpus and cleaned_text, the per-document steps, are
partitioned by ``DATA_PARTITIONS``: partition ``i`` of ``n`` holds the corpus files that
largetrain_core.corpus.partition_of hashes to ``i`` (``n`` = LARGETRAIN_DATA_PARTITIONS, default 4;
a terabyte corpus of ~1,000 files of ~1 GB sets e.g. 256), so each partition is its own run (its
own pod on Kubernetes) and a new or changed file redoes one partition. deduplicated_text is the
global step: it reads every partition (MinHash-LSH clustering over all of them, then the
accounting over all of them); token_shards, the tokenizer and training are unpartitioned.

Versioning: each asset's data version is a hash of its code version, its config and its inputs'
data versions; its files live at ``<root>/<asset key>/[<partition>/]<data version>/``. A directory already
complete for the same version is reused instead of recomputed (and the metadata says so).
"""


import json
import os
import time
from pathlib import Path
from typing import Callable, Optional

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetIn,
    Backoff,
    Config,
    DataVersion,
    Failure,
    MetadataValue,
    Output,
    RetryPolicy,
    StaticPartitionsDefinition,
    asset,
)
from pydantic import Field

from largetrain_core.accounting import corpus_accounting, markdown_table, outcome_table
from largetrain_core.balance import balance_parts, histogram_markdown
from largetrain_core.clean import QualityConfig, clean_corpus
from largetrain_core.corpus import ReaderConfig, fingerprint, ingest
from largetrain_core.dedup import DedupConfig, deduplicate
from largetrain_core.model import import_pretrained, tokenizer_mismatch
from largetrain_core.shards import TokenShards, build_token_shards
from largetrain_core.storage import atomic_dir, data_version, part_files, write_json_atomic
from largetrain_core.tokenizer import copy_tokenizer, train_bpe
from largetrain_core.train import LoraSettings, TrainConfig
from largetrain_dagster.resources import Storage, TorchrunLauncher, WandbSettings

ROLES = {
    "pretrain": ("corpora/linux-doc", "Pretraining corpus (demo: Linux kernel documentation, rst sources)."),
    "domain": ("corpora/shakespeare", "Domain corpus for the LoRA adapter (demo: Shakespeare's plays, markdown)."),
}
CODE_VERSIONS = {"raw_corpus": "4", "cleaned_text": "5", "deduplicated_text": "4", "tokenizer": "1",
                 "token_shards": "2", "base_checkpoint": "1", "lora_adapter": "1", "evaluation": "2"}


def data_partitions(count: str | int) -> StaticPartitionsDefinition:
    """``count`` partitions keyed ``000``, ``001``, ... (zero-padded to at least 3 digits).
    Raises ValueError naming LARGETRAIN_DATA_PARTITIONS unless count is an integer >= 1."""
    try:
        n = int(count)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"LARGETRAIN_DATA_PARTITIONS must be an integer >= 1, got {count!r}")
    width = max(3, len(str(n - 1)))
    return StaticPartitionsDefinition([f"{i:0{width}d}" for i in range(n)])


DATA_PARTITIONS = data_partitions(os.environ.get("LARGETRAIN_DATA_PARTITIONS", "4"))

# ------------------------------------------------------------------------------------------------
# configs


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


class TokenizerConfig(Config):
    vocab_size: int = Field(default=8192, description="BPE vocabulary size including the EOS token.")
    min_frequency: int = 2
    pretrained_model: Optional[str] = Field(default=None, description=(
        "A local Hugging Face model directory: take its tokenizer instead of training one (set the same "
        "directory as base_checkpoint's pretrained_model, so that the shards speak the model's vocabulary)."))


class TokenShardsConfig(Config):
    seq_len: int = Field(default=1024, description="Sequence length in tokens; windows hold seq_len + 1.")
    validation_fraction: float = Field(default=0.05, description="Share of documents held out for validation.")
    seed: int = 0
    sequences_per_shard: int = 8192


class TrainingConfig(Config):
    zero_stage: int = Field(default=2, description="DeepSpeed ZeRO stage 0-3.")
    offload_optimizer: bool = False
    precision: str = Field(default="auto", description="auto (fp16 on CUDA, fp32 on CPU), fp32, fp16 or bf16.")
    activation_checkpointing: bool = True
    micro_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    max_steps: int = 1000
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = 200
    keep_checkpoints: int = 2
    log_every: int = 10
    resume: str = Field(default="auto", description="auto (newest complete checkpoint), never, or a checkpoint directory.")
    peak_flops: Optional[float] = Field(default=None, description="Peak FLOP/s of the job's hardware for MFU; null = derive.")


class BaseCheckpointConfig(TrainingConfig):
    preset: str = Field(default="llama-20m", description="Model preset (largetrain_core.model.PRESETS).")
    pretrained_model: Optional[str] = Field(default=None, description=(
        "A local Hugging Face causal-LM directory (config.json, safetensors, tokenizer) to import instead of "
        "pretraining; the tokenizer asset must then take the same directory's tokenizer."))


class LoraAdapterConfig(TrainingConfig):
    max_steps: int = 300
    lr: float = 2e-3
    weight_decay: float = 0.0
    warmup_steps: int = 10
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_target_modules: Optional[list[str]] = Field(default=None, description="Default: every linear layer in the blocks.")
    lora_adapter_name: str = Field(default="default", description="The adapter's name inside the PEFT model.")
    lora_merge_export: bool = Field(default=False, description="Also write merged/: base + adapter merged (merge_and_unload).")


class EvaluationConfig(Config):
    max_sequences: int = Field(default=64, description="Validation sequences evaluated per corpus.")
    prompts: list[str] = Field(default=["To be, or not to be,", "My lord, the king", "The kernel"],
                               description="Prompts continued greedily by the base and by base + adapter.")
    max_new_tokens: int = 24


# ------------------------------------------------------------------------------------------------
# helpers


def _stage(context: AssetExecutionContext, storage: Storage, key: list[str], version: str,
           build: Callable[[Path], dict]) -> tuple[Path, dict, bool]:
    """Build ``<root>/<key>/<version>/`` atomically with ``build(tmp_dir) -> stats``, or reuse it if complete."""
    final = storage.path(*key, version)
    stats_file = final / "stats.json"
    if stats_file.exists():
        context.log.info(f"{'/'.join(key)} {version} is already complete at {final}: reusing it")
        return final, json.loads(stats_file.read_text()), True
    t0 = time.perf_counter()
    with atomic_dir(final) as tmp:
        stats = build(tmp)
        stats["seconds"] = round(time.perf_counter() - t0, 3)
        write_json_atomic(tmp / "stats.json", stats)
    return final, stats, False


def _output(path: Path, version: str, stats: dict, config: Config | dict, reused: bool, extra: dict | None = None) -> Output:
    cfg = config if isinstance(config, dict) else config.model_dump()
    handle = {"path": str(path), "data_version": version, "stats": stats}
    md = {"path": MetadataValue.path(str(path)), "data_version": version, "reused": reused,
          "config": MetadataValue.json(cfg)}
    md.update({k: v for k, v in stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
    md.update(extra or {})
    return Output(handle, metadata=md, data_version=DataVersion(version))


def _md_counts(counts: dict, header=("reason", "documents")) -> MetadataValue:
    rows = "\n".join(f"| {k} | {v} |" for k, v in sorted(counts.items()))
    return MetadataValue.md(f"| {header[0]} | {header[1]} |\n|---|---|\n{rows}" if counts else "none")


def _texts(directory: Path, batch: int = 1000):
    for part in part_files(directory):
        for df in pl.read_parquet(part, columns=["text"]).iter_slices(batch):
            yield df["text"].to_list()


# ------------------------------------------------------------------------------------------------
# the per-corpus chain


def corpus_assets(role: str) -> list:
    default_source, description = ROLES[role]
    group = f"{role}_data"

    @asset(key=[role, "raw_corpus"], group_name=group, code_version=CODE_VERSIONS["raw_corpus"], partitions_def=DATA_PARTITIONS,
           io_manager_key="handles", kinds={"parquet"},
           description=f"{description} One hash partition of its files read into Parquet {{doc_id, source, text}}.")
    def raw_corpus(context: AssetExecutionContext, config: RawCorpusConfig, storage: Storage) -> Output:
        source = config.path or str(storage.path(default_source))
        if not Path(source).exists():
            raise Failure(f"{role} corpus not found at {source}: run `make corpora` or set config path")
        pk, keys = context.partition_key, DATA_PARTITIONS.get_partition_keys()
        part = {"partition": keys.index(pk), "partitions": len(keys)}
        settings = config.model_dump()
        if settings["label_field"] is None:  # unlabelled corpora keep the versions they had before label_field
            del settings["label_field"]
        version = data_version(CODE_VERSIONS["raw_corpus"], settings, part, fingerprint(source, **part))
        reader = ReaderConfig(source, config.text_field, config.id_field, config.batch_size, config.label_field, **part)
        path, stats, reused = _stage(context, storage, [role, "raw_corpus", pk], version, lambda out: {**ingest(
            reader, out, max_documents=config.max_documents, sample_fraction=config.sample_fraction, seed=config.seed), **part})
        total = stats["documents"] + stats["not_sampled"] + stats["rejected"]  # every record read, before subsetting
        if total and stats["rejected"] / total > config.max_rejected_fraction:
            raise Failure(f"{source} (partition {pk}): {stats['rejected']} of {total} records rejected, more than "
                          f"max_rejected_fraction={config.max_rejected_fraction}; see {path / 'rejected.parquet'}")
        extra = {"source": MetadataValue.path(source)}
        if stats["skipped_files"]:
            context.log.warning(f"{source} (partition {pk}): {stats['skipped_files']} files with a suffix no reader knows "
                                f"were not read; listed in {path / 'skipped_files.txt'}")
            extra["skipped_files_list"] = MetadataValue.path(str(path / "skipped_files.txt"))
        return _output(path, version, stats, config, reused, extra)

    @asset(key=[role, "cleaned_text"], ins={"raw": AssetIn(key=[role, "raw_corpus"])}, group_name=group,
           code_version=CODE_VERSIONS["cleaned_text"], partitions_def=DATA_PARTITIONS, io_manager_key="handles",
           kinds={"parquet", "polars"},
           description="NFC, control characters and NUL removed, LF line endings; Gopher quality/repetition and C4 line rules with a reason code per removed document.")
    def cleaned_text(context: AssetExecutionContext, config: CleanedTextConfig, storage: Storage, raw: dict) -> Output:
        quality = config.quality()
        version = data_version(CODE_VERSIONS["cleaned_text"], quality.to_dict(), raw["data_version"])
        part = {k: raw["stats"][k] for k in ("partition", "partitions")}
        path, stats, reused = _stage(context, storage, [role, "cleaned_text", context.partition_key], version,
                                     lambda out: {**clean_corpus(Path(raw["path"]), out, quality), **part})
        return _output(path, version, stats, config, reused, {"filtered_by_reason": _md_counts(stats["filtered_by_reason"])})

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

        path, stats, reused = _stage(context, storage, [role, "deduplicated_text"], version, build)
        extra = {}
        if "balance" in stats:
            b = stats["balance"]
            extra = {"class_histogram": MetadataValue.md(histogram_markdown(b["before"], b["after"])),
                     "balance": MetadataValue.json(b), "balance_dropped": b["balance_dropped"],
                     "balance_repeats": b["balance_repeats"]}
        acc = corpus_accounting(raw_dirs, cleaned_dirs, path)
        summary = {k: acc[k] for k in ("input", "kept", "filtered", "duplicate", "rejected")}
        outcomes = pl.read_parquet(path / "outcomes.parquet")
        yield _output(path, version, stats, config, reused, {
            "accounting": _md_counts(summary, ("outcome", "documents")),
            "outcomes_by_reason": MetadataValue.md(markdown_table(outcomes)),
            "outcomes_table": MetadataValue.path(str(path / "outcomes.parquet")),
            **{f"documents_{k}": v for k, v in summary.items()}, **extra})
        yield AssetCheckResult(check_name="accounting", passed=acc["balanced"],
                               metadata={**summary, "problems": MetadataValue.json(acc["problems"])})

    @asset(key=[role, "token_shards"], group_name=group, code_version=CODE_VERSIONS["token_shards"],
           ins={"text": AssetIn(key=[role, "deduplicated_text"]), "tokenizer": AssetIn(key="tokenizer")},
           io_manager_key="handles", kinds={"arrow"},
           check_specs=[AssetCheckSpec("token_ids_below_vocab", asset=[role, "token_shards"], blocking=True,
                                       description="every id < vocab size; shard sizes and checksums match manifest.json")],
           description="EOS after every document, packed into seq_len+1 windows, Arrow IPC shards + manifest.json, train/validation split by document.")
    def token_shards(context: AssetExecutionContext, config: TokenShardsConfig, storage: Storage, text: dict, tokenizer: dict):
        version = data_version(CODE_VERSIONS["token_shards"], config.model_dump(), text["data_version"], tokenizer["data_version"])

        def build(out: Path) -> dict:
            m = build_token_shards(Path(text["path"]), Path(tokenizer["path"]), out, seq_len=config.seq_len,
                                   validation_fraction=config.validation_fraction, seed=config.seed,
                                   sequences_per_shard=config.sequences_per_shard, source_data_version=text["data_version"])
            return {"total_tokens": m["total_tokens"], "dtype": m["dtype"], "vocab_size": m["vocab_size"],
                    **{f"{s}_{k}": v for s, d in m["splits"].items() for k, v in d.items() if k != "shards"}}

        path, stats, reused = _stage(context, storage, [role, "token_shards"], version, build)
        yield _output(path, version, stats, config, reused)
        max_id, vocab = -1, stats["vocab_size"]
        problems = []
        for split in ("train", "validation"):
            try:
                shards = TokenShards(path, split, verify_checksums=True)
            except ValueError as e:
                problems.append(str(e))
                continue
            for i in range(0, len(shards), 4096):
                max_id = max(max_id, int(shards.take(range(i, min(len(shards), i + 4096))).max()))
        yield AssetCheckResult(check_name="token_ids_below_vocab", passed=not problems and max_id < vocab,
                               metadata={"max_id": max_id, "vocab_size": vocab, "problems": MetadataValue.json(problems)})

    return [raw_corpus, cleaned_text, deduplicated_text, token_shards]


@asset(key="tokenizer", group_name="tokenizer", code_version=CODE_VERSIONS["tokenizer"],
       ins={"text": AssetIn(key=["pretrain", "deduplicated_text"])}, io_manager_key="handles", kinds={"huggingface"},
       description="Byte-level BPE trained with Hugging Face tokenizers on the cleaned pretraining corpus; EOS <|endoftext|>.")
def tokenizer(context: AssetExecutionContext, config: TokenizerConfig, storage: Storage, text: dict) -> Output:
    version = data_version(CODE_VERSIONS["tokenizer"], config.model_dump(), text["data_version"])

    def build(out: Path) -> dict:
        if config.pretrained_model:
            info = copy_tokenizer(Path(config.pretrained_model), out)
        else:
            info = train_bpe(_texts(Path(text["path"])), config.vocab_size, out, config.min_frequency)
        return {"vocab_size": info.vocab_size, "eos_id": info.eos_id, "sha256": info.sha256}

    path, stats, reused = _stage(context, storage, ["tokenizer"], version, build)
    return _output(path, version, stats, config, reused)


# ------------------------------------------------------------------------------------------------
# training


def _loss_check(metrics_file: Path) -> AssetCheckResult:
    losses = [json.loads(line)["loss"] for line in metrics_file.read_text().splitlines() if line.strip()]
    import math

    finite = bool(losses) and all(math.isfinite(x) for x in losses)
    k = max(1, len(losses) // 10)
    start, end = (sum(losses[:k]) / k, sum(losses[-k:]) / k) if losses else (float("nan"), float("nan"))
    return AssetCheckResult(check_name="loss_finite_and_decreasing", passed=finite and end < start,
                            metadata={"steps_logged": len(losses), "mean_loss_first_10pct": start, "mean_loss_last_10pct": end})


def _train(context: AssetExecutionContext, storage: Storage, launcher: TorchrunLauncher, wandb: WandbSettings,
           key: str, version: str, train_cfg: dict, config: Config) -> tuple[Path, dict, bool]:
    """Run (or resume, or reuse) one training under ``<root>/<key>/<version>/``."""
    out = storage.path(key, version)
    summary_file = out / "summary.json"
    final = out / ("model" if key == "base_checkpoint" else "adapter")
    if summary_file.exists() and final.exists():
        context.log.info(f"{key} {version} already trained at {out}: reusing it")
        return out, json.loads(summary_file.read_text()), True
    out.mkdir(parents=True, exist_ok=True)
    cfg = TrainConfig.from_dict({**train_cfg, "output_dir": str(out), "wandb_mode": wandb.mode,
                                 "wandb_project": wandb.project, "wandb_entity": wandb.entity,
                                 "wandb_run_name": f"{key}-{version}"})
    cfg.validate()  # fail here, before any process starts
    cfg_path = out / "train_config.json"
    write_json_atomic(cfg_path, cfg.to_dict())
    reported = launcher.run(context, cfg_path, out / "train.log")
    context.log.info(f"rank 0 reported {sorted(reported)}")
    return out, json.loads(summary_file.read_text()), False


def _train_output(out: Path, version: str, summary: dict, config: Config, reused: bool) -> Output:
    import base64

    from largetrain_core.train import read_metrics

    rows = read_metrics(out / "metrics.jsonl")
    every = max(1, len(rows) // 20)
    curve = "\n".join(f"| {r['step']} | {r['loss']:.4f} | {r['lr']:.2e} | {r.get('mfu') or float('nan'):.3f} |"
                      for r in rows[::every])
    stats = {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    extra = {**stats, "loss_curve": MetadataValue.md(f"| step | loss | lr | MFU |\n|---|---|---|---|\n{curve}"),
             "precision": summary["precision"], "precision_reason": summary["precision_reason"],
             "peak_flops_source": str(summary.get("peak_flops_source")), "output": MetadataValue.path(summary["output"])}
    svg = Path(summary.get("loss_curve") or out / "loss_curve.svg")
    if svg.exists():
        extra["loss_curve_svg"] = MetadataValue.path(str(svg))
        b64 = base64.b64encode(svg.read_bytes()).decode()
        extra["loss_curve_plot"] = MetadataValue.md(f"![loss curve](data:image/svg+xml;base64,{b64})")
    return _output(out, version, {**summary}, config, reused, extra)


# Settings that do not change the trained weights stay out of the data version, so that changing them
# (e.g. resume: never after a bad checkpoint) reuses the same output directory and its checkpoints.
NOT_VERSIONED = {"resume", "peak_flops"}
TRAIN_RETRY = RetryPolicy(max_retries=1, delay=5, backoff=Backoff.LINEAR)


@asset(key="base_checkpoint", group_name="training", code_version=CODE_VERSIONS["base_checkpoint"],
       ins={"shards": AssetIn(key=["pretrain", "token_shards"])}, io_manager_key="handles", pool="accelerators",
       retry_policy=TRAIN_RETRY, kinds={"deepspeed", "pytorch"},
       check_specs=[AssetCheckSpec("loss_finite_and_decreasing", asset="base_checkpoint", blocking=True)],
       description="A causal LM pretrained from a preset with DeepSpeed (torchrun, ZeRO, activation checkpointing); a Hugging Face directory.")
def base_checkpoint(context: AssetExecutionContext, config: BaseCheckpointConfig, storage: Storage,
                    launcher: TorchrunLauncher, wandb: WandbSettings, shards: dict):
    if config.pretrained_model:
        yield from _import_base(context, config, storage, shards)
        return
    version = data_version(CODE_VERSIONS["base_checkpoint"], config.model_dump(exclude=NOT_VERSIONED), shards["data_version"],
                           launcher.nproc_per_node)
    train_cfg = {**config.model_dump(exclude={"pretrained_model"}), "mode": "pretrain", "train_shards": shards["path"],
                 "tokenizer": shards["path"]}
    out, summary, reused = _train(context, storage, launcher, wandb, "base_checkpoint", version, train_cfg, config)
    yield _train_output(out, version, summary, config, reused)
    yield _loss_check(out / "metrics.jsonl")


def _import_base(context: AssetExecutionContext, config: BaseCheckpointConfig, storage: Storage, shards: dict):
    """base_checkpoint from an existing local HF model: checked against the shards' tokenizer, copied as
    config.json + model.safetensors + tokenizer into ``<version>/model/``; no training, so the loss
    check passes vacuously with the reason in its metadata."""
    src = Path(config.pretrained_model)
    files = sorted((f.relative_to(src).as_posix(), f.stat().st_size, f.stat().st_mtime_ns) for f in src.rglob("*") if f.is_file())
    version = data_version(CODE_VERSIONS["base_checkpoint"], {"pretrained_model": str(src.resolve()), "files": files},
                           shards["data_version"])
    manifest = TokenShards(Path(shards["path"]), "train").manifest
    problem = tokenizer_mismatch(src, manifest, Path(shards["path"]))
    if problem:
        raise Failure(f"base_checkpoint imports {src}, but pretrain/token_shards do not use its tokenizer: {problem}. "
                      f"Set the tokenizer asset's pretrained_model to {src} and re-materialize the shards.")

    def build(out: Path) -> dict:
        info = import_pretrained(src, out / "model")
        return {**info, "imported_from": str(src)}

    path, stats, reused = _stage(context, storage, ["base_checkpoint"], version, build)
    stats["output"] = str(path / "model")
    yield _output(path, version, stats, config, reused, {"output": MetadataValue.path(stats["output"]),
                                                         "imported_from": MetadataValue.path(str(src))})
    yield AssetCheckResult(check_name="loss_finite_and_decreasing", passed=True,
                           metadata={"note": "imported pretrained model: no training run to check"})


@asset(key="lora_adapter", group_name="training", code_version=CODE_VERSIONS["lora_adapter"],
       ins={"base": AssetIn(key="base_checkpoint"), "shards": AssetIn(key=["domain", "token_shards"])},
       io_manager_key="handles", pool="accelerators", retry_policy=TRAIN_RETRY, kinds={"peft", "deepspeed"},
       check_specs=[AssetCheckSpec("loss_finite_and_decreasing", asset="lora_adapter", blocking=True)],
       description="A LoRA adapter (peft) on the base checkpoint, trained with DeepSpeed on the domain shards; a PEFT directory.")
def lora_adapter(context: AssetExecutionContext, config: LoraAdapterConfig, storage: Storage,
                 launcher: TorchrunLauncher, wandb: WandbSettings, base: dict, shards: dict):
    problem = tokenizer_mismatch(Path(base["stats"]["output"]), TokenShards(Path(shards["path"]), "train").manifest,
                                 Path(shards["path"]))
    if problem:
        raise Failure(f"domain shards {shards['path']} do not fit the base model {base['stats']['output']}: {problem}; "
                      f"re-materialize tokenizer and domain/token_shards")
    version = data_version(CODE_VERSIONS["lora_adapter"], config.model_dump(exclude=NOT_VERSIONED), base["data_version"],
                           shards["data_version"], launcher.nproc_per_node)
    fields = config.model_dump()
    lora = LoraSettings(rank=fields.pop("lora_rank"), alpha=fields.pop("lora_alpha"), dropout=fields.pop("lora_dropout"),
                        target_modules=fields.pop("lora_target_modules"), adapter_name=fields.pop("lora_adapter_name"),
                        merge_export=fields.pop("lora_merge_export"))
    train_cfg = {**fields, "mode": "lora", "train_shards": shards["path"], "base_model": base["stats"]["output"],
                 "lora": lora.__dict__}
    out, summary, reused = _train(context, storage, launcher, wandb, "lora_adapter", version, train_cfg, config)
    yield _train_output(out, version, summary, config, reused)
    yield _loss_check(out / "metrics.jsonl")


@asset(key="evaluation", group_name="training", code_version=CODE_VERSIONS["evaluation"], io_manager_key="handles",
       ins={"base": AssetIn(key="base_checkpoint"), "adapter": AssetIn(key="lora_adapter"),
            "pretrain_shards": AssetIn(key=["pretrain", "token_shards"]), "domain_shards": AssetIn(key=["domain", "token_shards"])},
       check_specs=[AssetCheckSpec("adapter_beats_base_on_domain", asset="evaluation", blocking=True,
                                   description="base + adapter has lower held-out domain perplexity than the base "
                                               "(blocking: a run whose adapter does not help fails)")],
       kinds={"pytorch"}, description="Held-out perplexity: base on both corpora, base + adapter on the domain corpus.")
def evaluation(context: AssetExecutionContext, config: EvaluationConfig, storage: Storage, base: dict, adapter: dict,
               pretrain_shards: dict, domain_shards: dict):
    from largetrain_core.evaluate import load_for_eval, perplexity, sample_generations

    version = data_version(CODE_VERSIONS["evaluation"], config.model_dump(), base["data_version"], adapter["data_version"],
                           pretrain_shards["data_version"], domain_shards["data_version"])

    def build(out: Path) -> dict:
        model = load_for_eval(Path(base["stats"]["output"]))
        res = {"base_pretrain": perplexity(model, Path(pretrain_shards["path"]), max_sequences=config.max_sequences),
               "base_domain": perplexity(model, Path(domain_shards["path"]), max_sequences=config.max_sequences)}
        tuned = load_for_eval(Path(base["stats"]["output"]), Path(adapter["stats"]["output"]))
        res["adapter_domain"] = perplexity(tuned, Path(domain_shards["path"]), max_sequences=config.max_sequences)
        write_json_atomic(out / "perplexity.json", res)
        tok_dir = Path(base["stats"]["output"])
        samples = {"base": sample_generations(model, tok_dir, config.prompts, config.max_new_tokens),
                   "adapter": sample_generations(tuned, tok_dir, config.prompts, config.max_new_tokens)}
        write_json_atomic(out / "samples.json", samples)
        return {f"{k}_perplexity": v["perplexity"] for k, v in res.items()}

    path, stats, reused = _stage(context, storage, ["evaluation"], version, build)
    gain = 1 - stats["adapter_domain_perplexity"] / stats["base_domain_perplexity"]
    samples = json.loads((path / "samples.json").read_text())
    table = "\n".join(f"| {b['prompt']!r} | {b['completion']!r} | {a['completion']!r} |"
                      for b, a in zip(samples["base"], samples["adapter"]))
    yield _output(path, version, {**stats, "adapter_domain_perplexity_reduction": gain}, config, reused, {
        "sample_generations": MetadataValue.md(f"| prompt | base | base + adapter |\n|---|---|---|\n{table}")})
    yield AssetCheckResult(check_name="adapter_beats_base_on_domain", passed=gain > 0,
                           metadata={"reduction": gain, "base": stats["base_domain_perplexity"],
                                     "adapter": stats["adapter_domain_perplexity"]})
