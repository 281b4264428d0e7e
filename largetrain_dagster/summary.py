"""Print what the last materialization of each asset recorded: `python -m largetrain_dagster.summary`.

Reads the Dagster instance under DAGSTER_HOME (the materialization metadata), so it shows what
Dagster recorded, not what is on disk.
"""

from __future__ import annotations

import argparse
import sys

from dagster import AssetKey, DagsterInstance

from largetrain_core.provenance import describe


def _metadata(instance: DagsterInstance, *path: str) -> dict:
    event = instance.get_latest_materialization_event(AssetKey(list(path)))
    if event is None or event.asset_materialization is None:
        return {}
    return {k: getattr(v, "value", v) for k, v in event.asset_materialization.metadata.items()}


def _fmt(value, spec: str = ",") -> str:
    if value is None:
        return "n/a"
    return format(value, spec) if isinstance(value, (int, float)) else str(value)


def corpus_version(corpus: dict | None) -> str:
    """The corpus's provenance in one line, or the content digests of the files read when it has none."""
    if not corpus:
        return "n/a"
    if corpus.get("provenance"):
        line = describe(corpus["provenance"])
        return line + (f" -- {corpus['provenance']['note']}" if corpus["provenance"].get("note") else "")
    digests = corpus.get("content_digests") or {}
    return "no provenance file; content digests " + ", ".join(f"{k} {(d or 'n/a')[:16]}" for k, d in sorted(digests.items()))


def render(instance: DagsterInstance) -> str:
    lines = []
    for role, label in (("pretrain", "pretraining corpus"), ("domain", "domain corpus")):
        raw = _metadata(instance, role, "raw_corpus")
        dedup = _metadata(instance, role, "deduplicated_text")
        shards = _metadata(instance, role, "token_shards")
        lines.append(f"{role} ({label}; source {raw.get('source', 'n/a')})")
        lines.append(f"  corpus version: {corpus_version(dedup.get('corpus'))}")
        lines.append(f"  documents read {_fmt(dedup.get('documents_input'))} / kept {_fmt(dedup.get('documents_kept'))} / "
                     f"filtered {_fmt(dedup.get('documents_filtered'))} / duplicates {_fmt(dedup.get('documents_duplicate'))} / "
                     f"rejected {_fmt(dedup.get('documents_rejected'))} ({_fmt(dedup.get('partitions'))} partitions)")
        lines.append(f"  token shards: {_fmt(shards.get('total_tokens'))} tokens; sequences train {_fmt(shards.get('train_sequences'))}, "
                     f"validation {_fmt(shards.get('validation_sequences'))}; {shards.get('path', 'n/a')}")
    for key, label in (("base_checkpoint", "base model"), ("lora_adapter", "LoRA adapter")):
        m = _metadata(instance, key)
        lines.append(f"{label}: loss {_fmt(m.get('first_loss'), '.3f')} -> {_fmt(m.get('last_loss'), '.3f')} "
                     f"in {_fmt(m.get('steps'))} steps (validation loss {_fmt(m.get('eval_loss'), '.3f')}, "
                     f"perplexity {_fmt(m.get('eval_perplexity'), '.1f')}), {_fmt(m.get('tokens_per_s'), ',.0f')} tokens/s, "
                     f"MFU {_fmt(m.get('mfu_percent'), '.1f')} %, "
                     f"{m.get('precision', 'n/a')} on {_fmt(m.get('world_size'))} ranks; {m.get('output', 'n/a')}")
    ev = _metadata(instance, "evaluation")
    cut = ev.get("adapter_domain_perplexity_reduction_percent")
    lines.append("held-out perplexity: base on kernel docs {}, base on Shakespeare {}, base + adapter on Shakespeare {} ({} lower)".format(
        _fmt(ev.get("base_pretrain_perplexity"), ".1f"), _fmt(ev.get("base_domain_perplexity"), ".1f"),
        _fmt(ev.get("adapter_domain_perplexity"), ".1f"), "n/a" if cut is None else f"{cut:.1f} %"))
    lines.append(f"evaluation: {ev.get('path', 'n/a')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__).parse_args(argv)
    with DagsterInstance.get() as instance:
        print("== largetrain demo summary ==")
        print(render(instance))
    return 0


if __name__ == "__main__":
    sys.exit(main())
