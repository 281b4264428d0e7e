"""The tokenizer: a byte-level BPE trained on the cleaned pretraining corpus (or a pretrained model's
tokenizer), shared by both corpus chains."""

from pathlib import Path
from typing import Optional

from dagster import AssetExecutionContext, AssetIn, Config, Output, asset
from pydantic import Field

from largetrain_core.digest import files_digest
from largetrain_core.storage import data_version
from largetrain_core.tokenizer import MAX_PRETOKEN_CHARS, copy_tokenizer, train_bpe
from largetrain_dagster.artefacts import CODE_VERSIONS, asset_output, build_or_reuse, texts
from largetrain_dagster.resources import Storage


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")  # what largetrain_core.tokenizer.copy_tokenizer copies


class TokenizerConfig(Config):
    vocab_size: int = Field(default=8192, description="BPE vocabulary size including the EOS token.")
    min_frequency: int = Field(default=2, description="A pair is merged only when it occurs at least this often (tokenizers BpeTrainer).")
    max_pretoken_chars: int = Field(default=MAX_PRETOKEN_CHARS, description=(
        "Runs of more than this many whitespace or non-whitespace characters are cut into pieces of this "
        "length before training (the trainer's time grows with the square of a pre-token's length; "
        "largetrain_core.tokenizer says why 1,000 is safe); counted as long_runs_split."))
    pretrained_model: Optional[str] = Field(default=None, description=(
        "A local Hugging Face model directory: take its tokenizer instead of training one (set the same "
        "directory as base_checkpoint's pretrained_model, so that the shards speak the model's vocabulary)."))



@asset(key="tokenizer", group_name="tokenizer", code_version=CODE_VERSIONS["tokenizer"],
       ins={"text": AssetIn(key=["pretrain", "deduplicated_text"])}, io_manager_key="handles", kinds={"huggingface"},
       description="Byte-level BPE trained with Hugging Face tokenizers on the cleaned pretraining corpus; EOS <|endoftext|>.")
def tokenizer(context: AssetExecutionContext, config: TokenizerConfig, storage: Storage, text: dict) -> Output:
    settings = config.model_dump()
    if config.pretrained_model:  # the version holds the tokenizer files' content, not the directory's location
        src = Path(config.pretrained_model)
        settings["pretrained_model"] = files_digest(src, [src / n for n in TOKENIZER_FILES if (src / n).is_file()])
    version = data_version(CODE_VERSIONS["tokenizer"], settings, text["data_version"])

    def build(out: Path) -> dict:
        if config.pretrained_model:
            info = copy_tokenizer(Path(config.pretrained_model), out)
        else:
            info, trained = train_bpe(texts(Path(text["path"])), config.vocab_size, out, config.min_frequency,
                                      config.max_pretoken_chars)
            return {"vocab_size": info.vocab_size, "eos_id": info.eos_id, "sha256": info.sha256, **trained}
        return {"vocab_size": info.vocab_size, "eos_id": info.eos_id, "sha256": info.sha256}

    path, stats, reused = build_or_reuse(context, storage, ["tokenizer"], version, build)
    stats = {**stats, "pretrained_model": config.pretrained_model}  # named in the model cards
    return asset_output(path, version, stats, config, reused)
