"""Tokenization engines side by side: tiktoken against tokenizers on the same texts, one thread each.

    python benchmarks/tokenizer_engines.py [--quick] [--out benchmarks/results/tokenizer_engines.json]

Input: the demo corpora (``.largetrain/corpora``: linux-doc, shakespeare, python-faq, fortunes) read
by ``ingest`` (raw text, uncleaned: every character the readers pass on; python-faq's conversations
as their messages joined by blank lines); a byte-level BPE of 8,192
ids trained by ``train_bpe`` on all of them (``--quick``: a seeded 25% document sample of each).
Keys:

* ``identical``: per corpus, whether tiktoken's ids (``largetrain_core.tokenizer.document_encoder``,
  engine tiktoken) equal tokenizers' (``encode_documents``: ``encode_batch_fast``, special-token text as
  plain text, EOS by id) for every document, and the documents and tokens compared.
* ``tokens_per_s_per_core``: trained tokens (the tokens of the documents, EOS included) per second on
  one thread (RAYON_NUM_THREADS=1, tiktoken's ``encode_ordinary`` in one thread) of
  ``tokenizers_encode_batch`` (the stage's engine before: ``Tokenizer.encode_batch``),
  ``tokenizers_encode_batch_fast`` (without offsets, what ``encode_documents`` calls), ``tiktoken``
  (``Encoding.encode_ordinary``), and the stage's encoder with each engine, ids to numpy arrays
  included (``stage_tokenizers``, ``stage_tiktoken``).
* ``speedup_tiktoken_vs_encode_batch``, ``speedup_tiktoken_vs_encode_batch_fast``,
  ``speedup_stage_encoder``: the ratios of those rates. Goal (issue 44): at least 3x over the stage's
  engine.

Every timing is the best of ``--repeats`` interleaved runs on all the corpora's documents; the raw
seconds go into the JSON with the load average.
"""

from __future__ import annotations

import os

os.environ["RAYON_NUM_THREADS"] = "1"  # one thread: before tokenizers starts its pool

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import polars as pl  # noqa: E402
import tiktoken  # noqa: E402
import tokenizers  # noqa: E402

from largetrain_core.corpus import ingest  # noqa: E402
from largetrain_core.readers import ReaderConfig  # noqa: E402
from largetrain_core.tokenizer import document_encoder, encode_documents, read_tokenizer, train_bpe  # noqa: E402
from tokenize_load import interleaved  # noqa: E402  (benchmarks/, the script's own folder, is on sys.path)

REPO = Path(__file__).resolve().parents[1]
CORPORA = ("linux-doc", "shakespeare", "python-faq", "fortunes")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a 25%% document sample of each corpus")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "tokenizer_engines.json"))
    p.add_argument("--root", default=str(Path(os.environ.get("LARGETRAIN_ROOT", REPO / ".largetrain")) / "corpora"))
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    work = Path(tempfile.mkdtemp(prefix="lt-engines-"))
    texts: dict[str, list[str]] = {}
    for name in CORPORA:
        raw = work / name
        raw.mkdir()
        ingest(ReaderConfig(str(Path(args.root) / name), sample_fraction=0.25 if args.quick else 1.0, seed=0), raw)
        parts = sorted(raw.glob("part-*.parquet"))
        if parts:
            texts[name] = pl.concat([pl.read_parquet(f, columns=["text"]) for f in parts])["text"].to_list()
        else:  # a chat corpus (python-faq): each conversation's messages, one document
            texts[name] = [
                "\n\n".join(m["content"] for m in json.loads(line)["messages"])
                for f in sorted((Path(args.root) / name).glob("*.jsonl"))
                for line in f.read_text().splitlines()
                if line.strip()
            ]
    everything = [t for name in CORPORA for t in texts[name]]
    info, _ = train_bpe([everything], 8192, work / "tok")
    fast, slow = document_encoder(info), document_encoder(info, "tokenizers")
    assert fast.engine == "tiktoken", fast.reason
    tok = read_tokenizer(info.path)
    tok.encode_special_tokens = True  # as encode_documents: special-token text is plain text

    identical = {}
    for name in CORPORA:
        ours, theirs = fast(texts[name]), encode_documents(tok, info, texts[name])
        identical[name] = {
            "identical": all(a.tolist() == b.tolist() for a, b in zip(ours, theirs)) and len(ours) == len(theirs),
            "documents": len(ours),
            "tokens": int(sum(len(a) for a in ours)),
        }
    n_tokens = sum(v["tokens"] for v in identical.values())
    n_bytes = sum(len(t.encode()) for t in everything)

    times = interleaved(
        {
            "tokenizers_encode_batch": lambda: tok.encode_batch(everything, add_special_tokens=False),
            "tokenizers_encode_batch_fast": lambda: tok.encode_batch_fast(everything, add_special_tokens=False),
            "tiktoken": lambda: [fast.tiktoken.encode_ordinary(t) for t in everything],
            "stage_tokenizers": lambda: slow(everything),
            "stage_tiktoken": lambda: fast(everything),
        },
        args.repeats,
    )
    rate = {k: n_tokens / min(v) for k, v in times.items()}
    result = {
        "identical": identical,
        "all_identical": all(v["identical"] for v in identical.values()),
        "speedup_tiktoken_vs_encode_batch": rate["tiktoken"] / rate["tokenizers_encode_batch"],
        "speedup_tiktoken_vs_encode_batch_fast": rate["tiktoken"] / rate["tokenizers_encode_batch_fast"],
        "speedup_stage_encoder": rate["stage_tiktoken"] / rate["stage_tokenizers"],
        "tokens_per_s_per_core": rate,
        "mb_per_s_per_core": {k: n_bytes / min(v) / 1e6 for k, v in times.items()},
        "tokens": n_tokens,
        "text_bytes": n_bytes,
        "documents": len(everything),
        "vocab_size": info.vocab_size,
        "raw_seconds": times,
        "quick": args.quick,
        "repeats": args.repeats,
        "threads": 1,
        "command": "python benchmarks/tokenizer_engines.py" + (" --quick" if args.quick else ""),
        "tiktoken_version": tiktoken.__version__,
        "tokenizers_version": tokenizers.__version__,
        "load_average_at_end": os.getloadavg(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "raw_seconds"}, indent=2))


if __name__ == "__main__":
    main()
