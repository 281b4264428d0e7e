#!/usr/bin/env bash
# GPU check (run by hand on a CUDA machine; needs an environment with CUDA torch, DeepSpeed and this
# project installed, e.g. `make install` on that machine). No downloads: the tokens come from the kernel
# docs under .largetrain/corpora when present (`make corpora`), else from generated English-like text.
#
#   benchmarks/gpu_check.sh [OUT_DIR]      # default benchmarks/results/gpu_check
#
# ~125M-parameter Llama (preset llama-125m, vocab 16,384, seq_len 1,024), precision auto (= fp16 with
# dynamic loss scaling on CUDA), ZeRO-2, activation checkpointing, 200 steps of 16 x 1,024 tokens on one
# GPU. Prints tokens/s, MFU (peak from largetrain_core.training.flops.CUDA_PEAK_FLOPS by device name), peak memory
# and the loss-scale history (every change, and the skipped-step count). Budget: well under 8 minutes on
# one H200 (data prep ~1 min on CPU, training ~1 min).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-benchmarks/results/gpu_check}
mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.venv/torch_extensions}
"$PY" - "$OUT" <<'PYEOF'
import json, random, sys
from pathlib import Path
import polars as pl
from largetrain_core.shards import build_token_shards
from largetrain_core.tokenizer import train_bpe
from largetrain_core.training.config import TrainConfig
out = Path(sys.argv[1]).resolve()
docs = out / "docs"; docs.mkdir(parents=True, exist_ok=True)
src = Path(".largetrain/corpora/linux-doc")
if src.is_dir():
    files = sorted(src.rglob("*.txt"))[:3000] or sorted(src.rglob("*.rst*"))[:3000]
    texts = [f.read_text(errors="replace") for f in files]
else:
    rng = random.Random(0)
    words = ("the a kernel driver memory page device process thread lock queue buffer interrupt file system "
             "user call returns value when each with for not can must should be is are of to in on").split()
    texts = [" ".join(rng.choice(words) for _ in range(2000)) for _ in range(2000)]
pl.DataFrame({"doc_id": [f"d{i}" for i in range(len(texts))], "source": ["gpu_check"] * len(texts),
              "text": texts}).write_parquet(docs / "part-00000.parquet")
if not (out / "tok" / "tokenizer.json").exists():
    train_bpe([texts], 16384, out / "tok")
shards = out / "shards"
if not (shards / "manifest.json").exists():
    shards.mkdir(exist_ok=True)
    build_token_shards(docs, out / "tok", shards, seq_len=1024, validation_fraction=0.01)
cfg = TrainConfig(output_dir=str(out / "run"), train_shards=str(shards), preset="llama-125m", zero_stage=2,
                  precision="auto", activation_checkpointing=True, micro_batch_size=16, max_steps=200,
                  learning_rate=6e-4, warmup_steps=20, save_steps=200, save_total_limit=1, logging_steps=20,
                  resume_from_checkpoint="never", report_to=["wandb"], tokenizer=str(shards))
(out / "train_config.json").write_text(json.dumps(cfg.to_dict()))
PYEOF
rm -rf "$OUT/run"
OMP_NUM_THREADS=4 timeout 420 "$PY" -m torch.distributed.run --standalone --nproc_per_node 1 \
  -m largetrain_core.training "$OUT/train_config.json" 2>&1 | tee "$OUT/train.log" | grep -E "largetrain.training|Error" || true
"$PY" - "$OUT" <<'PYEOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
s = json.loads((out / "run" / "summary.json").read_text())
rows = [json.loads(l) for l in (out / "run" / "metrics.jsonl").read_text().splitlines()]
print(f"steps {s['steps']}, precision {s['precision']} ({s['precision_reason']})")
print(f"parameters {s['parameters']:,}; tokens/s {s['tokens_per_s']:.0f}; MFU {s['mfu']}; peak {s['peak_flops_source']}")
print(f"peak memory {max(r.get('peak_memory_gib', 0) for r in rows):.2f} GiB; loss {s['first_loss']:.3f} -> {s['last_loss']:.3f}")
hist, last = [], None
for r in rows:
    if r.get("loss_scale") != last:
        hist.append((r["step"], r.get("loss_scale"), r.get("skipped_steps")))
        last = r.get("loss_scale")
print("loss-scale history (step, scale, skipped steps so far):", hist)
print("skipped steps at the end:", rows[-1].get("skipped_steps"))
PYEOF
