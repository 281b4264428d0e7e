"""relevance_classifier: a classifier of the wanted text trained on examples (largetrain_core.relevance):
positives from a file or the domain corpus (domain/deduplicated_text), negatives from a file or a
seeded sample of the pretraining corpus (pretrain/deduplicated_text); held-out precision, recall and
AUC and the most informative n-grams in its metadata.

Data version: the code version, the settings, and the data versions of the corpora it sampled (or the
content of the files it read).
"""

from __future__ import annotations

from pathlib import Path

import xxhash

from largetrain_core.artifacts import CODE_VERSIONS
from largetrain_core.relevance import RelevanceConfig, read_examples, sample_texts, train
from largetrain_core.stages.base import Artifact, Json, Markdown, StageError, StageResult, StageRun
from largetrain_core.storage import data_version


def _source(file: str | None, corpus: Artifact) -> tuple[str, str]:
    """(what the examples come from, its version): the file's content digest, or the corpus's data version
    (the corpus named ``<role>/<asset>/<version>``, its place under any storage root or local copy of one)."""
    if file:
        if not Path(file).is_file():
            raise StageError(f"relevance_classifier: examples file {file} does not exist")
        return f"file {file}", xxhash.xxh3_128_hexdigest(Path(file).read_bytes())
    return f"corpus {'/'.join(Path(corpus.path).parts[-3:])}", corpus.data_version


def _no_negatives(n_pos: int, n_neg: int, pos_src: str, neg_src: str, domain: Artifact, pretrain: Artifact) -> str:
    """Why the pretraining corpus gave (almost) no negative example, and the settings that fix it."""
    source = (domain.stats.get("corpus") or {}).get("source")
    same = source is not None and source == (pretrain.stats.get("corpus") or {}).get("source")
    return (
        f"{n_pos:,} positive examples ({pos_src}) but {n_neg} negative "
        f"({neg_src}, every text that is also a positive left out): "
        + (
            f"the domain corpus is the pretraining corpus ({source}), "
            if same
            else "the pretraining corpus holds no other text than the positives, "
        )
        + "so there is nothing to tell the wanted text from. Set relevance_classifier `negatives_file` to examples of "
        'text you do not want (JSONL, one {"text": ...} per line, or one example per line); with relevance filtering '
        "off (pretrain/filtered_text relevance_threshold and relevance_top_fraction null) the classifier only scores "
        "the documents, and such a file is all it needs. Or point the domain corpus at the text the model should "
        "specialize on."
    )


def relevance_classifier(cfg: RelevanceConfig, domain: Artifact, pretrain: Artifact, run: StageRun) -> StageResult:
    """Train the classifier into ``<root>/relevance_classifier/<version>/`` (model.json, weights.npz).
    Stats: ``metrics`` (held-out precision, recall, auc, counts, train_seconds), ``features``,
    ``positives``/``negatives`` (their source). Raises StageError for a missing or bad examples file
    or too few examples; when the pretraining corpus gives fewer than 2 negatives that are not also
    positives (the domain corpus is the pretraining corpus), saying that ``negatives_file`` fixes it."""
    pos_src, pos_v = _source(cfg.positives_file, domain)
    neg_src, neg_v = _source(cfg.negatives_file, pretrain)
    version = data_version(CODE_VERSIONS["relevance_classifier"], cfg.to_dict(), pos_v, neg_v)

    def build(out: Path) -> dict:
        try:
            pos = (
                read_examples(cfg.positives_file)
                if cfg.positives_file
                else sample_texts([domain.path], cfg.max_examples, cfg.seed)
            )
            n_neg = min(cfg.max_examples, max(2, int(len(pos) * cfg.negatives_per_positive)))
            neg = (
                read_examples(cfg.negatives_file)
                if cfg.negatives_file
                else sample_texts([pretrain.path], n_neg, cfg.seed, set(pos))
            )
            if len(neg) < 2 and not cfg.negatives_file:
                raise ValueError(_no_negatives(len(pos), len(neg), pos_src, neg_src, domain, pretrain))
            model = train(pos, neg, cfg)
        except ValueError as e:
            raise StageError(f"relevance_classifier: {e}") from e
        model.save(out)
        return {
            "metrics": model.meta["metrics"],
            "features": model.meta["features"],
            "positives": pos_src,
            "negatives": neg_src,
            **{f"heldout_{k}": model.meta["metrics"][k] for k in ("precision", "recall", "auc")},
            "train_seconds": model.meta["metrics"]["train_seconds"],
        }

    result = StageResult.built(run.build_or_reuse(version, build), version)
    feats = result.stats["features"]
    rows = [
        f"| {', '.join(f['ngrams']) or '?'} | {f['weight']} | {side} |"
        for side in ("relevant", "irrelevant")
        for f in feats[side][:10]
    ]
    result.metadata |= {
        "metrics": Json(result.stats["metrics"]),
        "informative_features": Markdown("| n-grams | weight | for |\n|---|---|---|\n" + "\n".join(rows)),
    }
    return result
