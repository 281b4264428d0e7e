"""evaluation_sets: the benchmark files declared for evaluation (JSONL of prompt and answer), read into
items and their hashed 13-gram index (largetrain_core.decontamination), so that the lineage check on
``evaluation`` can look for them in every corpus a model was trained on. The validation splits of
the token shards are held out by construction (documents picked by a seeded hash of their id, never
in the train split) and need no index.

Data version: the code version, the settings and the content of the files (xxh3-128), so adding or
editing a file makes a new version and the check runs again, without retraining any model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import polars as pl
import xxhash

from largetrain_core.artifacts import CODE_VERSIONS
from largetrain_core.decontamination import ITEM_SCHEMA, MIN_PROMPT_WORDS, N, build_index, read_benchmark
from largetrain_core.stages.base import Artifact, Check, Json, StageError, StageResult, StageRun, Text
from largetrain_core.storage import data_version


@dataclass(frozen=True)
class EvaluationSetsSettings:
    """The evaluation sets declared for the lineage's contamination check."""

    benchmark_files: tuple[str, ...] = field(
        default=(),
        metadata={
            "description": (
                'JSONL files of evaluation items, one {"prompt": ..., "answer": ..., "id": ...} per line (id optional); '
                "each is one set, named by its file's stem. The validation splits are held out by construction."
            )
        },
    )
    n: int = field(
        default=N,
        metadata={
            "description": (
                "Words per n-gram (13, as GPT-3's decontamination, Brown et al. 2020); an item whose prompt has fewer "
                "words is matched by its prompt followed by its answer (largetrain_core.decontamination), or listed as too "
                "short to check."
            )
        },
    )


def evaluation_sets(settings: EvaluationSetsSettings, run: StageRun) -> StageResult:
    """Read the benchmark files into ``<root>/evaluation_sets/<version>/`` (items.parquet, ngrams.parquet,
    too_short.parquet, index.json). Stats: ``sets`` {name: items}, ``items``, ``ngrams``,
    ``too_short_items``. Raises StageError naming a missing file, a bad record (file:line) or two
    files with the same name."""
    files = [Path(f) for f in settings.benchmark_files]
    for f in files:
        if not f.is_file():
            raise StageError(
                f"evaluation_sets: benchmark file {f} does not exist (benchmark_files lists JSONL files "
                "of prompt and answer)"
            )
    names = [f.stem for f in files]
    if len(set(names)) < len(names):
        raise StageError(
            f"evaluation_sets: two benchmark files have the same name {sorted(n for n in names if names.count(n) > 1)}: "
            "a set is named by its file's stem"
        )
    digests = {f.stem: xxhash.xxh3_128_hexdigest(f.read_bytes()) for f in files}
    version = data_version(CODE_VERSIONS["evaluation_sets"], {**asdict(settings), "benchmark_files": None}, digests)

    def build(out: Path) -> dict:
        try:
            items = pl.concat([read_benchmark(f) for f in files]) if files else pl.DataFrame(schema=ITEM_SCHEMA)
        except ValueError as e:
            raise StageError(f"evaluation_sets: {e}") from e
        index = build_index(items, settings.n)
        index.save(out)
        return {
            "sets": dict(items.group_by("eval_set").len().sort("eval_set").iter_rows()),
            "items": items.height,
            "ngrams": int(len(index.hashes)),
            "too_short_items": index.too_short.height,
            "files": {f.stem: str(f.resolve()) for f in files},
            "validation_splits": "held out by construction",
        }

    result = StageResult.built(run.build_or_reuse(version, build), version)
    result.metadata["sets"] = Json(result.stats["sets"])
    if result.stats["too_short_items"]:
        result.warn(
            f"evaluation_sets: {result.stats['too_short_items']} items cannot be checked for contamination: their prompt "
            f"has fewer than {settings.n} words, and fewer than {MIN_PROMPT_WORDS} or no answer for the prompt + answer "
            f"method (listed in {result.path / 'too_short.parquet'})",
            key="too_short_warning",
        )
    return result


def contamination_check(sets: Artifact, models: list[Artifact], root: Path) -> Check:
    """The lineage check of ``evaluation``: no item of the evaluation sets ``sets`` in any corpus upstream
    of the models ``models`` (base_checkpoint, lora_adapter: their exported directories' lineage.json,
    largetrain_core.decontamination.trained_corpora). Fails naming the corpus, the document, the item and
    the n-gram; metadata ``overlaps`` (the first 50), ``corpora_checked``, ``sets``."""
    from largetrain_core.decontamination import describe_overlaps, load_index, overlaps, trained_corpora

    index = load_index(sets.path)
    if not (len(index.hashes) or len(index.short_hashes)):  # no set declared, or only items too short to check
        return Check(
            True,
            {
                "sets": Json(sets.stats.get("sets", {})),
                "too_short_items": index.too_short.height,
                "overlapping_documents": 0,
            },
        )
    dirs = [Path(m.stats["output"]) for m in models if m.stats.get("output")]
    try:
        corpora = trained_corpora(dirs, root)
    except ValueError as e:
        return Check(False, {"problem": Text(str(e))})
    found = overlaps(corpora, index)
    meta = {
        "corpora_checked": Json(sorted(corpora)),
        "sets": Json(sets.stats.get("sets", {})),
        "too_short_items": index.too_short.height,
        "overlapping_documents": found.height,
    }
    if found.height:
        meta |= {"overlaps": Json(found.head(50).to_dicts()), "description": Text(describe_overlaps(found))}
    return Check(found.height == 0, meta)
