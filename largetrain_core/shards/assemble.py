"""The global step: the partitions' runs assembled into the splits, the tails packed, a mixture's train split sampled, ``manifest.json`` written."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from largetrain_core import dataset_card
from largetrain_core.storage import ArtifactError, part_files
from largetrain_core.tokenizer import TokenizerInfo, load_tokenizer_info
from largetrain_core.shards.mixture import mixture_targets, systematic
from largetrain_core.shards.pack import (
    Packing,
    TOKENIZED,
    _header,
    _key,
    _read_tokenized,
    run_files,
    tokenize_partition,
    tokenize_parts,
)
from largetrain_core.shards.writer import FORMAT, SPLITS, _SplitWriter


def assemble_token_shards(
    partition_dirs: list[Path],
    in_dir: Path | list[Path],
    tokenizer_path: Path,
    out_dir: Path,
    packing: Packing = Packing(),
    source_data_version: str = "",
    final_dir: Path | None = None,
    extra: dict | None = None,
) -> dict:
    """The global step: from the :func:`tokenize_partition` directories of every partition of the input
    ``in_dir``, in partition order, write the tails' windows (``<split>-tail-NNNNN.arrow``), the
    tokenizer and ``manifest.json`` into ``out_dir``; the manifest lists every shard, the partitions'
    by their path relative to ``out_dir``. When no document hashed into validation (module doc,
    Split), the whole input is tokenized again here with the smallest-hash document in validation.
    ``final_dir``: where ``out_dir`` will lie when complete (a temporary directory renamed into place),
    the directory the manifest's paths are relative to. ``extra``: more manifest entries (the
    documents' relevance score distribution). Returns the manifest. Raises ArtifactError when
    the partitions do not cover the input's part files exactly once, in order, with this tokenizer and
    these settings (naming the partition)."""
    out_dir = Path(out_dir)
    final_dir = Path(final_dir) if final_dir is not None else out_dir
    info = load_tokenizer_info(tokenizer_path)
    header = _header(info, packing)
    parts = part_files(in_dir)
    summaries = [(Path(d), _read_tokenized(Path(d))) for d in partition_dirs]
    _check_partitions(summaries, header, len(parts), in_dir)
    runs = [(d, r) for d, s in summaries for r in s["runs"]]
    runs = _with_validation(runs, parts, tokenizer_path, out_dir, packing)
    # a run in out_dir is listed as one in final_dir (the directory it becomes)
    runs = [(final_dir if d.resolve() == out_dir.resolve() else d, r) for d, r in runs]
    passes = sorted({int(key.split("/")[1]) for _, r in runs for key in r["writers"]})
    splits = {}
    for split in SPLITS:
        if split == "train" and packing.mixture is not None:
            splits[split] = _mixed(runs, passes, out_dir, info, packing, final_dir)
            continue
        splits[split] = _stream(runs, passes, split, None, out_dir, info, packing, final_dir)
    mixture = splits["train"].pop("mixture", None)
    manifest = {
        "format": FORMAT,
        **header,
        "source_data_version": source_data_version,
        "splits": splits,
        "total_tokens": sum(s["tokens"] for s in splits.values()),
        **(extra or {}),
    }
    if mixture is not None:
        manifest["mixture"] = mixture
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the shards carry the tokenizer that made them
        if (info.path.parent / name).exists():
            shutil.copy(info.path.parent / name, out_dir / name)
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    files = {split: [s["file"] for s in splits[split]["shards"]] for split in SPLITS if splits[split]["shards"]}
    dataset_card.write(out_dir, "token_shards", files, dataset_card.SHARDS_DESCRIPTION)
    return manifest


def _check_partitions(summaries: list[tuple[Path, dict]], header: dict, parts: int, in_dir) -> None:
    """ArtifactError unless the partitions' summaries cover the ``parts`` part files of ``in_dir``
    exactly once, in order, with the settings ``header`` (naming the partition)."""
    expect = 0
    for d, s in summaries:
        differs = {k: (s.get(k), v) for k, v in header.items() if s.get(k) != v}
        if differs or s["input_parts"] != parts or s["first_part"] != expect:
            raise ArtifactError(
                f"{d / TOKENIZED}: partition {s.get('partition')} of {s.get('partitions')} does not fit "
                f"the others: "
                + (
                    f"made with {differs} (the partition's, now)"
                    if differs
                    else f"parts {s['first_part']}.. of {s['input_parts']}, expected part {expect} of {parts}"
                )
                + "; tokenize every partition again with the same tokenizer and settings"
            )
        expect += s["parts"]
    if expect != parts:
        raise ArtifactError(
            f"the partitions hold {expect} of the {parts} part files of {in_dir}: tokenize every partition"
        )


def _with_validation(
    runs: list[tuple[Path, dict]], parts: list[Path], tokenizer_path: Path, out_dir: Path, packing: Packing
) -> list[tuple[Path, dict]]:
    """The runs, or, when no document hashed into validation (module doc, Split), one run of the whole
    input tokenized again into ``out_dir`` with the smallest-hash document in validation."""
    documents = sum(r["documents"] for _, r in runs)
    if not (packing.validation_fraction > 0 and documents >= 2 and not sum(r["validation_documents"] for _, r in runs)):
        return runs
    forced = min((tuple(r["smallest_split_hash"]) for _, r in runs if r["smallest_split_hash"]))[1]
    for d, r in runs:  # a run written here is replaced (same file names); the partitions' stay theirs
        if d.resolve() == out_dir.resolve():
            for f in run_files(r):
                (d / f).unlink()
    return [(out_dir, tokenize_parts(parts, 0, tokenizer_path, out_dir, packing, forced=forced))]


_TOTALS = ("documents", "document_tokens", "repeated_documents", "repeat_copies", "repeat_tokens")


def _stream(
    runs: list[tuple[Path, dict]],
    passes: list[int],
    split: str,
    corpus: str | None,
    out_dir: Path,
    info: TokenizerInfo,
    packing: Packing,
    final_dir: Path,
) -> dict:
    """One stream of the manifest (a split, or a corpus of a mixture's train split): every pass's part
    windows from the runs (shards listed where they lie), then the runs' tails of the stream cut into
    windows written into ``out_dir`` (``<split>[-m<corpus number>]-tail-NNNNN.arrow``; paths in the
    manifest relative to ``final_dir``, the directory ``out_dir`` becomes). Returns the
    split record: shards, sequences, tokens, the counts, dropped_remainder_tokens, tail_sequences and
    units (per part: its windows and tail tokens, in the order of the windows)."""
    shards, units, totals = [], [], dict.fromkeys(_TOTALS, 0)
    for k in passes:
        for d, r in runs:
            w = r["writers"].get(_key(split, k, corpus))
            if w is None:
                continue
            shards += [{**e, "file": os.path.relpath(d / e["file"], final_dir)} for e in w["shards"]]
            units += [[windows, tail] for _, windows, tail in r["units"].get(_key(split, k, corpus), [])]
            for key in totals:
                totals[key] += w[key]
    number = list(packing.mixture or {}).index(corpus) if corpus is not None else None
    name = "-".join([split, *([f"m{number:03d}"] if number is not None else []), "tail"])
    tail = _SplitWriter(out_dir, name, packing.seq_len, info, packing.sequences_per_shard)
    for k in passes:
        for d, r in runs:
            if r["tails"]:
                t = pa.ipc.open_file(pa.memory_map(str((out_dir if d == final_dir else d) / r["tails"]))).read_all()
                rows = pc.and_(pc.equal(t["split"], split), pc.equal(t["pass"], k))
                rows = pc.and_(rows, pc.is_null(t["corpus"]) if corpus is None else pc.equal(t["corpus"], corpus))
                for tokens in t.filter(rows)["tokens"].to_numpy(zero_copy_only=False):
                    tail.add([tokens])
    done = tail.finish()
    shards += done["shards"]  # written into out_dir: their names are their paths from final_dir
    sequences = sum(e["sequences"] for e in shards)
    return {
        "shards": shards,
        "sequences": sequences,
        "tokens": sequences * (packing.seq_len + 1),
        **totals,
        "dropped_remainder_tokens": done["dropped_remainder_tokens"],
        "tail_sequences": done["sequences"],
        "units": units,
    }


# the mixture record of a corpus with weight 0 and no documents
_EMPTY_CORPUS = {
    "weight": 0.0,
    "documents": 0,
    "document_tokens": 0,
    "sequences_packed": 0,
    "sequences": 0,
    "repeat_sequences": 0,
    "downsampled_sequences": 0,
    "natural_share": 0.0,
    "target_share": 0.0,
    "realised_share": 0.0,
}


def _mixed(
    runs: list[tuple[Path, dict]],
    passes: list[int],
    out_dir: Path,
    info: TokenizerInfo,
    packing: Packing,
    final_dir: Path,
) -> dict:
    """A mixture's train split (module doc, Mixture): each corpus's stream (:func:`_stream`), then per
    corpus its shards listed once per whole pass and, for the rest, with the ``select`` of a systematic
    sample; no window is copied. Returns the split record with its ``mixture`` record (popped by the
    caller into the manifest). Raises ValueError naming a corpus with a weight above 0 and no train
    window."""
    weights = packing.mixture
    natural = packing.natural
    corpora = sorted({key.split("/")[2] for _, r in runs for key in r["writers"] if key.startswith("train/")})
    streams = {c: _stream(runs, passes, "train", c, out_dir, info, packing, final_dir) for c in corpora}
    sequences = {c: s["sequences"] for c, s in streams.items()}
    targets = _mixture_sequences(sequences, packing)
    record = {"weights": None if natural else weights, "corpora": {}, "applies_to": _applies_to(natural)}
    shards, totals, dropped = [], dict.fromkeys(_TOTALS, 0), 0
    total = sum(targets.values())
    for corpus in corpora:
        f, n, want = streams[corpus], sequences[corpus], targets[corpus]
        shards += _sampled_shards(f["shards"], n, want, corpus, packing.seed)
        for key in totals:
            totals[key] += f[key]
        dropped += f["dropped_remainder_tokens"]
        target = None if natural else weights.get(corpus, 0.0)
        record["corpora"][corpus] = {
            "weight": target,
            "documents": f["documents"],
            "document_tokens": f["document_tokens"],
            "sequences_packed": n,
            "sequences": want,
            "repeat_sequences": max(0, want - n),
            "downsampled_sequences": max(0, n - want),
            "natural_share": n / sum(sequences.values()),
            "target_share": target,
            "realised_share": want / total if total else 0.0,
        }
    for corpus in sorted(set(weights) - set(corpora)):  # weight 0 and no documents
        record["corpora"][corpus] = dict(_EMPTY_CORPUS)
    sequences_total = sum(e["sequences"] for e in shards)
    return {
        "shards": shards,
        "sequences": sequences_total,
        "tokens": sequences_total * (packing.seq_len + 1),
        **totals,
        "dropped_remainder_tokens": dropped,
        **{
            f"mixture_{k}": sum(r[k] for r in record["corpora"].values())
            for k in ("repeat_sequences", "downsampled_sequences")
        },
        "mixture": record,
    }


def _applies_to(natural: bool) -> str:
    """What a mixture record's weights apply to (none when ``natural``)."""
    if natural:
        return "no weights: every corpus in its natural proportion, nothing re-sampled"
    return (
        "train split, in sequences of seq_len + 1 tokens, after dedup and balancing; the split "
        "keeps its size; validation unweighted"
    )


def _mixture_sequences(sequences: dict[str, int], packing: Packing) -> dict[str, int]:
    """Train sequences per corpus after weighting (its packed ones when natural). Raises ValueError
    naming a corpus with a weight above 0 and no train sequence, or one repeated above max_repeats."""
    weights = packing.mixture
    empty = [c for c, w in weights.items() if w > 0 and not sequences.get(c)]
    if empty:
        raise ValueError(
            f"mixture: corpus {', '.join(map(repr, empty))} has weight > 0 but no train sequence of "
            f"{packing.seq_len + 1} tokens (no documents, or fewer tokens than one sequence), so it cannot "
            f"be sampled to its weight; set its weight to 0 or add documents"
        )
    targets = dict(sequences) if packing.natural else mixture_targets(sequences, weights)
    over = {c: targets[c] / n for c, n in sequences.items() if n and packing.max_repeats is not None}
    over = {c: f for c, f in over.items() if f > packing.max_repeats}
    if over:
        raise ValueError(
            "mixture: "
            + "; ".join(
                f"corpus {c!r} (weight {weights[c]:.4g}) would repeat each of its {sequences[c]:,} train sequences "
                f"{f:.1f} times per pass ({targets[c]:,} sequences)"
                for c, f in sorted(over.items())
            )
            + f", above max_repeats {packing.max_repeats:g}; lower its weight, add documents to it, or raise max_repeats"
        )
    return targets


def _sampled_shards(shards: list[dict], n: int, want: int, corpus: str, seed: int) -> list[dict]:
    """A corpus's ``n`` packed sequences (its ``shards``) to ``want``: every shard once per whole pass,
    then the rest by a systematic sample (``select``), offset by the corpus's hash."""
    passes_, rest = divmod(want, n) if n else (0, 0)
    offset = (xxhash.xxh64_intdigest(corpus.encode(), seed) % 2**32) / 2**32
    out = shards * passes_
    start = 0
    for e in shards if rest else []:
        picked = int(systematic(start, e["sequences"], rest / n, offset).sum())
        if picked:
            out.append({**e, "sequences": picked, "select": {"start": start, "fraction": rest / n, "offset": offset}})
        start += e["sequences"]
    return out


def build_token_shards(
    in_dir: Path,
    tokenizer_path: Path,
    out_dir: Path,
    *,
    seq_len: int = 1024,
    validation_fraction: float = 0.05,
    seed: int = 0,
    sequences_per_shard: int = 8192,
    batch_documents: int = 512,
    source_data_version: str = "",
    mixture: dict[str, float] | None = None,
    natural: bool = False,
    extra: dict | None = None,
    max_repeats: float | None = None,
) -> dict:
    """Tokenize the ``part-*.parquet`` documents of ``in_dir`` and write shards + manifest.json to ``out_dir``
    in one process: :func:`tokenize_partition` of the one partition into ``out_dir``, then
    :func:`assemble_token_shards`. The same sequences in the same order as any partitioning.

    Memory is bounded by ``batch_documents`` documents plus one shard's open record batch per stream. A
    ``copies`` column repeats documents in the train split (module docstring). ``mixture``: a weight
    per corpus (``corpus`` column), the train split sampled to it (module docstring); with ``natural``
    the weights are ignored: each corpus packed on its own in its natural proportion, its share reported.
    ``max_repeats``: the most times per pass a mixture may repeat a corpus's sequences (ValueError naming
    the corpus and its repeat factor above it; None: no limit). ``extra``: more manifest entries. Returns the
    manifest (dict). Raises ValueError on bad arguments and, naming the part file, on a ``copies``
    value that is null or below 1, a missing ``corpus`` column, or a corpus without a weight.
    """
    packing = Packing(
        seq_len, validation_fraction, seed, sequences_per_shard, batch_documents, mixture, natural, max_repeats
    )
    out_dir = Path(out_dir)
    tokenize_partition(in_dir, tokenizer_path, out_dir, 0, 1, packing)
    return assemble_token_shards([out_dir], in_dir, tokenizer_path, out_dir, packing, source_data_version, extra=extra)
