"""Token shards: packing documents into fixed-length sequences, the shard files, the manifest, the
zero-copy reader and the distributed sampler (docs/ARCHITECTURE.md, Shard format).

Packing: each document is encoded with the EOS/BOS policy of largetrain_core.tokenizer. The unit of
packing is one part file of the input (a deduplicated_text part, ~1,024 documents): per split, the
token stream of a part's documents in corpus order is cut into consecutive, non-overlapping windows
of ``seq_len + 1`` tokens (a sequence's input is ``window[:-1]``, its target ``window[1:]``), and
what is left at the part's end, shorter than a window, is its tail. The tails of every part are
concatenated in part order and cut into windows the same way, after the parts' windows; the last
tail shorter than a window is dropped and counted in the manifest as ``dropped_remainder_tokens``.
No window is padded, ragged or empty. So the sequences and their order depend only on the part
files, not on how they are grouped into partitions or tasks: the parts are tokenized in parallel
(:func:`tokenize_partition`, a contiguous range of part files each, :func:`partition_parts`) and one
global step (:func:`assemble_token_shards`) packs the tails and writes ``manifest.json``, which lists
the partitions' shard files where they lie (paths relative to the manifest), so it copies no shard.

Split: a document goes to ``validation`` when ``xxh64(doc_id, seed) / 2**64 < validation_fraction``
(stable under reordering and re-batching); if that leaves validation empty while there are at least
two documents, the document with the smallest hash is moved there, so both splits exist (found by
the global step from each run's smallest hash; the corpus, a small one: the chance is
``(1 - validation_fraction) ** documents``, is then packed again there, in one process).

Intended repetition: a document whose ``copies`` column (largetrain_core.balance: up-sampling, or any
whole-copy data-mixing weight) is ``c > 1`` goes into the train split ``c`` times: once in corpus
order with every other document, then once more in each of the passes 2..c over the documents with
at least that many copies, so a document's copies lie far apart in the token stream rather than in
one window (per part and pass: the windows of pass 1 over every part, then of pass 2 over every part,
..., then the tails in the same order). The validation split holds each of its documents once (held-out perplexity measures the
corpus as it is). The manifest counts them apart from the documents: ``repeated_documents``,
``repeat_copies`` (the extra copies) and ``repeat_tokens`` per split.

Mixture (``mixture``: a weight per corpus, the documents' ``corpus`` column naming theirs): each
corpus's train documents are packed on their own (no window holds two corpora: per corpus its parts'
windows, then its parts' tails), then the train split is made of ``round(weight x N)`` windows of each
corpus, N the windows of every corpus together (the split keeps its size; weights normalized to sum
1). The weight applies in tokens (windows of ``seq_len + 1``), after dedup and balancing. A corpus
above its natural share is up-sampled: its windows whole ``floor(f)`` times, f = target / its
windows, then a systematic sample of the rest (every window i with ``floor((i + 1)r + u) > floor(ir +
u)``, r the remaining fraction, u a seeded offset in [0, 1): evenly spread, exactly the count); one
below is down-sampled to a systematic sample. The manifest says so without copying a window: a shard
listed again for each whole pass, and with ``select`` (start, fraction, offset of the systematic
sample) for a sample, which the reader applies. Repeated windows are intended repetition, counted
apart (``repeat_sequences``); left-out windows are counted (``downsampled_sequences``); the manifest's
``mixture`` gives each corpus's target and realised token share. A weight that would repeat a corpus's
sequences more than ``max_repeats`` times per pass is refused, naming the corpus and its repeat factor
(repeated tokens lose their worth: Muennighoff et al. 2023, "Scaling Data-Constrained Language
Models"; Megatron-LM#547). The validation split holds every corpus's validation documents once, unweighted.

Shard file: an uncompressed Arrow IPC file with one column
``input_ids: fixed_size_list<uint16|uint32>[seq_len + 1]`` and schema metadata ``seq_len``,
``dtype``, ``eos_id``, ``vocab_size``, ``tokenizer_sha256``. ``manifest.json`` lists every shard
with its sequence count, byte size and xxh3-128 checksum.

Exports for other loaders: Megatron-Core ``IndexedDataset`` of the documents (``export_megatron``) and HDF5
(``export_hdf5``); the CLI: ``python -m largetrain_core.shards {inspect,export-megatron,export-hdf5}``.
litdata and mosaicml-streaming: :mod:`largetrain_core.streaming_export`.
"""

from largetrain_core.shards.writer import FORMAT, LOG, SPLITS, ShardError, _SplitWriter
from largetrain_core.shards.mixture import CORPUS, mixture_targets, mixture_weights, systematic
from largetrain_core.shards.pack import (
    Packing,
    TOKENIZED,
    TOKENIZED_FORMAT,
    partition_parts,
    run_files,
    split_hashes,
    split_of,
    tokenize_partition,
    tokenize_parts,
    tokenizer_engines,
)
from largetrain_core.shards.assemble import assemble_token_shards, build_token_shards
from largetrain_core.shards.reader import TokenShards, zero_copy
from largetrain_core.shards.sampler import DistributedSampler, _permutation
from largetrain_core.shards.export import (
    MEGATRON_DTYPE_CODES,
    MEGATRON_INDEX_HEADER,
    _exportable,
    document_offsets,
    export_hdf5,
    export_megatron,
    inspect,
    main,
    megatron_paths,
    split_documents,
)

__all__ = [
    "FORMAT",
    "LOG",
    "SPLITS",
    "ShardError",
    "_SplitWriter",
    "CORPUS",
    "mixture_targets",
    "mixture_weights",
    "systematic",
    "Packing",
    "TOKENIZED",
    "TOKENIZED_FORMAT",
    "partition_parts",
    "run_files",
    "split_hashes",
    "split_of",
    "tokenize_partition",
    "tokenize_parts",
    "tokenizer_engines",
    "assemble_token_shards",
    "build_token_shards",
    "TokenShards",
    "zero_copy",
    "DistributedSampler",
    "_permutation",
    "MEGATRON_DTYPE_CODES",
    "MEGATRON_INDEX_HEADER",
    "_exportable",
    "document_offsets",
    "export_hdf5",
    "export_megatron",
    "inspect",
    "main",
    "megatron_paths",
    "split_documents",
]
