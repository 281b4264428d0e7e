"""What a global step checks of its partitioned inputs before any work (deduplicated_text, filtered_text:
every step that reads several partitions of raw_corpus and cleaned_text): that they are the partitions of
one corpus, read and cleaned with one set of settings. A partition left over from an earlier corpus or
config (a partition run of the new one failed, and the last materialization of that partition is the
old one) would otherwise be mixed in without a word.

What is compared, per partition, from the artifacts' stats: raw_corpus's ``source`` (the corpus read;
not for a chain whose partitions are corpora of their own, the landed files) and ``reader`` (its reader
settings, largetrain_core.stages.raw_corpus.settings_version); cleaned_text's ``quality`` (the quality
rules). A partition made before a setting was recorded carries none: it is compared on what it has.
The MinHash settings are compared by deduplicated_text itself (minhash_settings).
"""

from __future__ import annotations

from largetrain_core.stages.base import Artifact, StageError

# (asset, stats key): the per-partition records compared (the corpus read, the reader settings, the quality
# rules); a dict value is compared field by field
RECORDED = (("raw_corpus", "source"), ("raw_corpus", "reader"), ("cleaned_text", "quality"))


def check_one_corpus(
    where: str,
    raw: dict[str, Artifact],
    cleaned: dict[str, Artifact],
    keys: list[str],
    one_source: bool = True,
) -> None:
    """Raise StageError when the partitions ``keys`` of ``raw`` and ``cleaned`` were read from different
    corpora (``one_source``) or with different settings, naming each setting that differs and the
    partitions holding each value, and what to do. ``where``: the step and corpus, for the message."""
    differences = []
    for asset, name in RECORDED:
        if name == "source" and not one_source:
            continue
        artifacts = raw if asset == "raw_corpus" else cleaned
        values = {k: artifacts[k].stats.get(name) for k in keys if artifacts[k].stats.get(name) is not None}
        if len(values) < 2:
            continue
        if all(isinstance(v, dict) for v in values.values()):
            fields = sorted({f for v in values.values() for f in v})
            for f in fields:
                differences += _differs(f"{asset} {f}", {k: v.get(f) for k, v in values.items()})
        else:
            differences += _differs(f"{asset} {name}", values)
    if differences:
        raise StageError(
            f"{where}: its input partitions do not come from one corpus and one config: "
            + "; ".join(differences)
            + ". A global step reads every partition's latest materialization: one made from another corpus or "
            "config (e.g. left from an earlier run when a partition run of this one failed) would be mixed in. "
            "Re-materialize raw_corpus and cleaned_text for every partition with the same config (each partition "
            "run must succeed), then this step."
        )


def check_made_from(where: str, text: Artifact, raw: dict[str, Artifact], cleaned: dict[str, Artifact]) -> None:
    """Raise StageError when the partitions ``raw`` and ``cleaned`` are not the ones the deduplicated_text
    ``text`` was made from (its stats' ``corpus.data_versions``), naming the partitions that differ: a
    step that reads deduplicated_text beside the partitions (for the accounting) must read the same ones."""
    made = (text.stats.get("corpus") or {}).get("data_versions")
    if not made:
        return
    differ = []
    for asset, artifacts in (("raw_corpus", raw), ("cleaned_text", cleaned)):
        recorded = made.get(asset) or {}
        now = {k: a.data_version for k, a in artifacts.items()}
        if recorded != now:
            keys = sorted(set(recorded) | set(now))
            differ += [
                f"{asset} partition {k}: {now.get(k, 'missing')} now, {recorded.get(k, 'none')} in deduplicated_text"
                for k in keys
                if recorded.get(k) != now.get(k)
            ]
    if differ:
        raise StageError(
            f"{where}: the partitions it reads are not those its deduplicated_text {text.data_version} was made "
            f"from ({'; '.join(differ)}). Materialize deduplicated_text again (it reads the partitions as they are "
            "now), then this step."
        )


def _differs(setting: str, values: dict[str, object]) -> list[str]:
    """``[setting: partitions k1, k2 <value>; partition k3 <value>]`` when ``values`` (partition -> value) differ."""
    by_value: dict[str, list[str]] = {}
    for k, v in values.items():
        by_value.setdefault(repr(v), []).append(k)
    if len(by_value) < 2:
        return []
    shown = ", ".join(
        f"partition{'s' if len(ks) > 1 else ''} {', '.join(ks)}: {v}"
        for v, ks in sorted(by_value.items(), key=lambda e: e[1][0])
    )
    return [f"{setting} differs ({shown})"]
