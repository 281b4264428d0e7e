"""The tokenizer: a byte-level BPE trained on the cleaned pretraining corpus (or a pretrained model's
tokenizer), shared by both corpus chains (largetrain_core.stages.tokenizer)."""

from dagster import AssetExecutionContext, AssetIn, asset

from largetrain_core.stages.base import Artifact
from largetrain_core.stages.tokenizer import TOKENIZER_FILES, TokenizerSettings  # noqa: F401 (TOKENIZER_FILES: public)
from largetrain_core.stages.tokenizer import tokenizer as tokenizer_stage
from largetrain_dagster.artifacts import CODE_VERSIONS, materialize_stage, stage_run
from largetrain_dagster.configs import dagster_config
from largetrain_dagster.resources import Storage

TokenizerConfig = dagster_config(TokenizerSettings, "TokenizerConfig")


@asset(
    key="tokenizer",
    group_name="tokenizer",
    code_version=CODE_VERSIONS["tokenizer"],
    ins={"text": AssetIn(key=["pretrain", "deduplicated_text"])},
    io_manager_key="handles",
    kinds={"huggingface"},
    description="Byte-level BPE trained with Hugging Face tokenizers on the cleaned pretraining corpus; EOS <|endoftext|>.",
)
def tokenizer(context: AssetExecutionContext, config: TokenizerConfig, storage: Storage, text: dict):
    yield from materialize_stage(
        context, config, tokenizer_stage, config.to_core(), Artifact.of(text), stage_run(context, storage)
    )
