"""tokenizer: a byte-level BPE trained on the deduplicated pretraining corpus (largetrain_core.tokenizer),
or a pretrained model's tokenizer copied; shared by both corpus chains.

Data version: the code version, the settings (a pretrained model's tokenizer files by content, not
by location; the sample settings only when the sample leaves documents out) and the corpus's data
version.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from largetrain_core.artifacts import CODE_VERSIONS
from largetrain_core.digest import files_digest
from largetrain_core.stages.base import Artifact, StageError, StageResult, StageRun
from largetrain_core.storage import data_version, fetch_tree, part_files
from largetrain_core.tokenizer import MAX_PRETOKEN_CHARS, MAX_TRAINING_BYTES, copy_tokenizer, train_bpe, training_sample

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")  # what largetrain_core.tokenizer.copy_tokenizer copies


@dataclass(frozen=True)
class TokenizerSettings:
    """The tokenizer: a byte-level BPE trained on the pretraining corpus, or a pretrained model's."""

    vocab_size: int = field(default=8192, metadata={"description": "BPE vocabulary size including the EOS token."})
    min_frequency: int = field(
        default=2,
        metadata={"description": ("A pair is merged only when it occurs at least this often (tokenizers BpeTrainer).")},
    )
    max_pretoken_chars: int = field(
        default=MAX_PRETOKEN_CHARS,
        metadata={
            "description": (
                "Runs of more than this many whitespace or non-whitespace characters are cut into pieces of this "
                "length before training (the trainer's time grows with the square of a pre-token's length; "
                "largetrain_core.tokenizer says why 1,000 is safe); counted as long_runs_split."
            )
        },
    )
    max_training_bytes: int | None = field(
        default=MAX_TRAINING_BYTES,
        metadata={
            "description": (
                "Train on a seeded sample of about this many bytes of text (documents drawn by a hash of their id; "
                "largetrain_core.tokenizer, Training sample, says why 10^9 suffices); a smaller corpus is trained on "
                "whole. null: always the whole corpus."
            )
        },
    )
    sample_seed: int = field(
        default=0, metadata={"description": "Seed of the document-id hash that draws the training sample."}
    )
    pretrained_model: str | None = field(
        default=None,
        metadata={
            "description": (
                "A local Hugging Face model directory: take its tokenizer instead of training one (set the same "
                "directory as base_checkpoint's pretrained_model, so that the shards speak the model's vocabulary)."
            )
        },
    )


def tokenizer(settings: TokenizerSettings, text: Artifact, run: StageRun) -> StageResult:
    """Train (or copy) the tokenizer from the deduplicated corpus ``text`` into ``<root>/tokenizer/<version>/``.
    Stats: vocab_size, eos_id, sha256 (of tokenizer.json), the trainer's counts, pretrained_model."""
    versioned = {
        k: v for k, v in dataclasses.asdict(settings).items() if k not in ("max_training_bytes", "sample_seed")
    }
    sample = None
    if not settings.pretrained_model:
        try:
            sample = training_sample(part_files(text.path), settings.max_training_bytes, settings.sample_seed)
        except ValueError as e:
            raise StageError(f"tokenizer: {e}") from e
        if sample.fraction < 1:  # in the version only when it leaves documents out: a whole corpus keeps its version
            versioned["sample"] = {
                "max_training_bytes": settings.max_training_bytes,
                "sample_seed": settings.sample_seed,
            }
    if settings.pretrained_model:  # the version holds the tokenizer files' content, not the directory's location
        src = fetch_tree(settings.pretrained_model)  # a URL: downloaded into the local cache
        versioned["pretrained_model"] = files_digest(src, [src / n for n in TOKENIZER_FILES if (src / n).is_file()])
    version = data_version(CODE_VERSIONS["tokenizer"], versioned, text.data_version)

    def build(out: Path) -> dict:
        if settings.pretrained_model:
            info, trained = copy_tokenizer(src, out), {}
        else:
            drawn: dict = {}
            info, trained = train_bpe(
                sample.texts(drawn), settings.vocab_size, out, settings.min_frequency, settings.max_pretoken_chars
            )
            trained = {**trained, **drawn, **sample.describe()}
        return {"vocab_size": info.vocab_size, "eos_id": info.eos_id, "sha256": info.sha256, **trained}

    result = StageResult.built(run.build_or_reuse(version, build), version)
    result.stats = {**result.stats, "pretrained_model": settings.pretrained_model}  # named in the model cards
    return result
