"""Evaluation: held-out perplexity of the base on both corpora and of base + adapter on the domain
corpus, sample generations; blocking check ``adapter_beats_base_on_domain``."""

from pathlib import Path

from dagster import AssetCheckResult, AssetCheckSpec, AssetExecutionContext, AssetIn, Config, MetadataValue, asset
from pydantic import Field

from largetrain_core.storage import data_version, read_json, write_json_atomic
from largetrain_dagster.artefacts import CODE_VERSIONS, asset_output, build_or_reuse, percent, rounded, text_block
from largetrain_dagster.resources import Storage


class EvaluationConfig(Config):
    max_sequences: int = Field(default=64, description="Validation sequences evaluated per corpus.")
    prompts: list[str] = Field(default=["To be, or not to be,", "My lord, the king", "The kernel"],
                               description="Prompts continued greedily by the base and by base + adapter.")
    max_new_tokens: int = Field(default=24, description="Tokens generated per prompt (greedy).")


@asset(key="evaluation", group_name="training", code_version=CODE_VERSIONS["evaluation"], io_manager_key="handles",
       ins={"base": AssetIn(key="base_checkpoint"), "adapter": AssetIn(key="lora_adapter"),
            "pretrain_shards": AssetIn(key=["pretrain", "token_shards"]), "domain_shards": AssetIn(key=["domain", "token_shards"])},
       check_specs=[AssetCheckSpec("adapter_beats_base_on_domain", asset="evaluation", blocking=True,
                                   description="base + adapter has lower held-out domain perplexity than the base "
                                               "(blocking: a run whose adapter does not help fails)")],
       kinds={"pytorch"}, description="Held-out perplexity (exp of the mean next-token cross-entropy over validation "
                                      "sequences): base on both corpora, base + adapter on the domain corpus; "
                                      "adapter_domain_perplexity_reduction_percent = 100 (1 - adapter / base); sample generations.")
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

    path, stats, reused = build_or_reuse(context, storage, ["evaluation"], version, build)
    base_ppl, adapter_ppl = stats["base_domain_perplexity"], stats["adapter_domain_perplexity"]
    reduction = percent(base_ppl - adapter_ppl, base_ppl)
    samples = read_json(path / "samples.json", "sample generations (samples.json)")
    yield asset_output(path, version, stats, config, reused, {
        "adapter_domain_perplexity_reduction_percent": reduction,
        "sample_generations": MetadataValue.md(generations_markdown(samples["base"], samples["adapter"]))})
    yield AssetCheckResult(check_name="adapter_beats_base_on_domain", passed=adapter_ppl < base_ppl,
                           metadata={"reduction_percent": reduction, "base_domain_perplexity": rounded(base_ppl),
                                     "adapter_domain_perplexity": rounded(adapter_ppl)})


def generations_markdown(base: list[dict], adapter: list[dict]) -> str:
    """Each prompt and its greedy continuations by the base and by base + adapter, as verbatim text blocks."""
    parts = []
    for i, (b, a) in enumerate(zip(base, adapter), 1):
        parts.append(f"**Prompt {i}**\n\n{text_block(b['prompt'])}\n\n*base* continues:\n\n{text_block(b['completion'])}"
                     f"\n\n*base + adapter* continues:\n\n{text_block(a['completion'])}")
    return "\n\n".join(parts)
