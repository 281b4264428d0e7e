"""evaluation: held-out perplexity of the base on both corpora and of base + adapter on the domain
corpus, sample generations (largetrain_core.evaluate), and benchmarks through lm-evaluation-harness
(largetrain_core.harness: the built-in cloze over the held-out domain documents and local task
files) of the base and of base + adapter; check ``adapter_beats_base_on_domain``.

Data version: the code version, the settings and the data versions of the base, the adapter, both
corpora's shards and the domain corpus's deduplicated text (the cloze's sentences).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from largetrain_core.artifacts import CODE_VERSIONS
from largetrain_core.harness import BenchmarkSettings, TaskFileError, flat_metrics, results_table
from largetrain_core.stages.base import (
    Artifact,
    Check,
    Markdown,
    StageError,
    StageResult,
    StageRun,
    percent,
    rounded,
    text_block,
)
from largetrain_core.storage import data_version, local_copy, read_json, write_json_atomic


@dataclass(frozen=True)
class EvaluationSettings:
    """What the evaluation measures and generates."""

    max_sequences: int = field(default=64, metadata={"description": "Validation sequences evaluated per corpus."})
    prompts: tuple[str, ...] = field(
        default=("To be, or not to be,", "My lord, the king", "The kernel"),
        metadata={"description": "Prompts continued greedily by the base and by base + adapter."},
    )
    max_new_tokens: int = field(default=24, metadata={"description": "Tokens generated per prompt (greedy)."})
    benchmark: BenchmarkSettings = field(
        default_factory=BenchmarkSettings,
        metadata={
            "description": (
                "Benchmarks through lm-evaluation-harness (largetrain_core.harness), on the base and on base + adapter."
            )
        },
    )


def evaluation(
    settings: EvaluationSettings,
    base: Artifact,
    adapter: Artifact,
    pretrain_shards: Artifact,
    domain_shards: Artifact,
    run: StageRun,
    domain_text: Artifact | None = None,
) -> StageResult:
    """Evaluate into ``<root>/evaluation/<version>/`` (perplexity.json, samples.json; benchmark/ with
    benchmark.json, the task files, per-item samples and the model cards with the results, base_card/
    and adapter_card/). Stats: ``<model>_<corpus>_perplexity`` for base_pretrain, base_domain and
    adapter_domain, and ``lm_eval/<model>/<task>/<metric>`` (+ ``_stderr``) for model base and adapter;
    metadata the reduction in percent, 100 (1 - adapter / base), the generations and the benchmark
    table. Check ``adapter_beats_base_on_domain``: base + adapter has the lower held-out domain
    perplexity. ``domain_text``: the domain corpus's deduplicated_text, whose documents in the domain
    shards' validation split make the cloze task (without it, no cloze)."""
    _check_settings(settings, adapter)
    version = _version(settings, base, adapter, pretrain_shards, domain_shards, domain_text)
    model_dir, adapter_dir = local_copy(base.stats["output"]), local_copy(adapter.stats["output"])

    def build(out: Path) -> dict:
        stats = _perplexities_and_samples(out, settings, model_dir, adapter_dir, pretrain_shards, domain_shards)
        if settings.benchmark.cloze_items or settings.benchmark.tasks:
            stats.update(benchmarks(settings.benchmark, model_dir, adapter_dir, domain_shards, domain_text, out, run))
        return stats

    try:
        result = StageResult.built(run.build_or_reuse(version, build), version)
    except TaskFileError as e:
        raise StageError(f"evaluation: benchmark task file: {e}") from e
    _report(result)
    return result


def _check_settings(settings: EvaluationSettings, adapter: Artifact) -> None:
    """StageError on bad benchmark settings or an adapter that is not a language-modelling one."""
    problems = settings.benchmark.problems()
    if problems:
        raise StageError("evaluation: " + "; ".join(problems))
    if adapter.stats.get("task", "causal_lm") != "causal_lm":
        raise StageError(
            f"evaluation measures a language-modelling adapter's perplexity; lora_adapter is a {adapter.stats['task']} "
            "adapter, evaluated on its held-out test split by the lora_adapter asset itself (its metadata and "
            "evaluation.json): materialize lora_adapter without evaluation"
        )


def _version(
    settings: EvaluationSettings,
    base: Artifact,
    adapter: Artifact,
    pretrain_shards: Artifact,
    domain_shards: Artifact,
    domain_text: Artifact | None,
) -> str:
    """The data version: settings, inputs' versions, the domain text's (with cloze items) and the task files' digests."""
    try:
        tasks = _task_digests(settings.benchmark.tasks)
    except TaskFileError as e:
        raise StageError(f"evaluation: benchmark task file: {e}") from e
    return data_version(
        CODE_VERSIONS["evaluation"],
        dataclasses.asdict(settings),
        base.data_version,
        adapter.data_version,
        pretrain_shards.data_version,
        domain_shards.data_version,
        domain_text.data_version if domain_text and settings.benchmark.cloze_items else None,
        *tasks,
    )


def _perplexities_and_samples(
    out: Path,
    settings: EvaluationSettings,
    model_dir: Path,
    adapter_dir: Path,
    pretrain_shards: Artifact,
    domain_shards: Artifact,
) -> dict:
    """Write perplexity.json and samples.json for base and base + adapter; the ``<model>_<corpus>_perplexity`` stats."""
    from largetrain_core.evaluate import load_for_eval, perplexity, sample_generations

    n = settings.max_sequences
    model = load_for_eval(model_dir)
    res = {
        "base_pretrain": perplexity(model, pretrain_shards.path, max_sequences=n),
        "base_domain": perplexity(model, domain_shards.path, max_sequences=n),
    }
    tuned = load_for_eval(model_dir, adapter_dir)
    res["adapter_domain"] = perplexity(tuned, domain_shards.path, max_sequences=n)
    write_json_atomic(out / "perplexity.json", res)
    prompts = list(settings.prompts)
    samples = {
        "base": sample_generations(model, model_dir, prompts, settings.max_new_tokens),
        "adapter": sample_generations(tuned, model_dir, prompts, settings.max_new_tokens),
    }
    write_json_atomic(out / "samples.json", samples)
    return {f"{k}_perplexity": v["perplexity"] for k, v in res.items()}


def _report(result: StageResult) -> None:
    """The perplexity reduction, generations and benchmark metadata, and the check adapter_beats_base_on_domain."""
    base_ppl, adapter_ppl = result.stats["base_domain_perplexity"], result.stats["adapter_domain_perplexity"]
    reduction = percent(base_ppl - adapter_ppl, base_ppl)
    samples = read_json(result.path / "samples.json", "sample generations (samples.json)")
    result.metadata = {
        "adapter_domain_perplexity_reduction_percent": reduction,
        "sample_generations": Markdown(generations_markdown(samples["base"], samples["adapter"])),
    }
    bench = result.path / "benchmark" / "benchmark.json"
    record = read_json(bench, "benchmark results (benchmark.json)") if bench.exists() else {}
    if record.get("skipped"):
        result.warn(f"evaluation: {record['skipped']}", key="benchmark_warning")
    if record.get("results"):
        result.metadata["benchmark_results"] = Markdown(
            results_table({"base": record["results"]["base"], "base + adapter": record["results"]["adapter"]})
        )
        result.metadata["benchmark_cards"] = result.path / "benchmark"
    result.checks["adapter_beats_base_on_domain"] = Check(
        adapter_ppl < base_ppl,
        {
            "reduction_percent": reduction,
            "base_domain_perplexity": rounded(base_ppl),
            "adapter_domain_perplexity": rounded(adapter_ppl),
        },
    )


def benchmarks(
    settings: BenchmarkSettings,
    model_dir: Path,
    adapter_dir: Path,
    domain_shards: Artifact,
    domain_text: Artifact | None,
    out: Path,
    run: StageRun,
) -> dict:
    """lm-eval on the base and on base + adapter into ``out/benchmark/`` (largetrain_core.harness.run_benchmarks),
    the cloze from the domain documents the shards hold out, and each model's card with the results;
    returns the flat metrics (``lm_eval/<model>/<task>/<metric>``)."""
    from largetrain_core.harness import held_out_documents, run_benchmarks, write_benchmark_card

    held_out = None
    if settings.cloze_items and domain_text is not None:
        manifest = read_json(domain_shards.path / "manifest.json", "token shard manifest (manifest.json)")
        if manifest.get("source_data_version") != domain_text.data_version:
            run.log.warning(
                f"evaluation: the domain shards were made from deduplicated_text "
                f"{manifest.get('source_data_version')}, the latest is {domain_text.data_version}: the cloze "
                "takes the latest's documents that the shards' split holds out (none of them is in the "
                "shards' train split: the split is a hash of the document id)"
            )
        held_out = held_out_documents(domain_text.path, manifest)
    record = run_benchmarks(
        settings, {"base": (model_dir, None), "adapter": (model_dir, adapter_dir)}, out / "benchmark", held_out=held_out
    )
    if record.get("skipped"):
        run.log.warning(f"evaluation: {record['skipped']}")
    if not record["results"]:
        return {"lm_eval_cloze_items": 0}
    write_benchmark_card(model_dir, record["results"]["base"], out / "benchmark" / "base_card", "base model")
    write_benchmark_card(
        adapter_dir, record["results"]["adapter"], out / "benchmark" / "adapter_card", "base model + LoRA adapter"
    )
    run.log.info(
        "benchmarks (lm-evaluation-harness):\n"
        + results_table({"base": record["results"]["base"], "base + adapter": record["results"]["adapter"]})
    )
    scores = {label: flat_metrics(record["results"][label], f"lm_eval/{label}") for label in ("base", "adapter")}
    for label, model in (("base", model_dir), ("adapter", adapter_dir)):
        logged = report_to_trackers(model.parent, scores[label])
        if logged:
            run.log.info(f"benchmarks of the {label} logged to its training's runs: {', '.join(logged)}")
    return {**scores["base"], **scores["adapter"], "lm_eval_cloze_items": (record["cloze"] or {}).get("items", 0)}


def report_to_trackers(train_dir: Path, metrics: dict) -> list[str]:
    """``metrics`` logged to the W&B and MLflow runs of the training in ``train_dir`` (trackers.log_outputs),
    at its last step; nothing for a model that was not trained here (no train_config.json: imported)."""
    from largetrain_core.training.trackers import log_outputs

    if not (train_dir / "train_config.json").exists() or not (train_dir / "summary.json").exists():
        return []
    return log_outputs(train_dir, [], metrics)


def _task_digests(tasks) -> list[str]:
    """The content digest of every local task: its YAML and the data files it names (harness.task_digest)."""
    from largetrain_core.harness import task_digest

    return [task_digest(tasks)] if tasks else []


def generations_markdown(base: list[dict], adapter: list[dict]) -> str:
    """Each prompt and its greedy continuations by the base and by base + adapter, as verbatim text blocks."""
    parts = []
    for i, (b, a) in enumerate(zip(base, adapter), 1):
        parts.append(
            f"**Prompt {i}**\n\n{text_block(b['prompt'])}\n\n*base* continues:\n\n{text_block(b['completion'])}"
            f"\n\n*base + adapter* continues:\n\n{text_block(a['completion'])}"
        )
    return "\n\n".join(parts)
