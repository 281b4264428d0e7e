"""What a process loads as it starts, in a fresh interpreter each: the Dagster definitions (imported by
every step process of a multiprocess run, the CLI and the code server) load no torch, transformers or
DeepSpeed; a training rank that does not report to MLflow has DeepSpeed go without it; reading token
shards loads no pandas; the DeepSpeed ops that ``make install`` built load without a compiler."""

import json
import subprocess
import sys

import polars as pl

from helpers import REPO
from largetrain_core.shards import build_token_shards


def _loaded(code: str) -> set[str]:
    """The top-level modules loaded after running ``code`` in a fresh interpreter."""
    probe = (
        code + "\nimport json, sys\nprint(json.dumps(sorted({m.split('.')[0] for m, v in sys.modules.items() if v})))"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_the_dagster_definitions_load_no_training_library():
    loaded = _loaded("import largetrain_dagster.definitions")
    assert "dagster" in loaded and "largetrain_core" in loaded
    assert not loaded & {"torch", "transformers", "deepspeed", "peft", "mlflow"}, loaded


def test_a_rank_without_mlflow_among_its_trackers_has_deepspeed_go_without_it():
    start = (
        "from largetrain_core.training.__main__ import skip_mlflow_unless_used\n"
        "from largetrain_core.training.config import TrainConfig\n"
        "skip_mlflow_unless_used(TrainConfig.from_settings(output_dir='o', train_shards='s', tokenizer='s', "
        "report_to={report_to}))\n"
        "import deepspeed\n"
        "from deepspeed.autotuning import autotuner\n"
        "assert autotuner.has_mlflow is {has}, autotuner.has_mlflow\n"
    )
    assert "mlflow" not in _loaded(start.format(report_to=["wandb"], has=False))
    assert "mlflow" in _loaded(start.format(report_to=["wandb", "mlflow"], has=True))


def test_deepspeeds_op_builders_get_py_cpuinfos_flags_and_load_what_make_install_built():
    """In one fresh interpreter: prepare_op_builds hands DeepSpeed's op builders py-cpuinfo's answer without
    starting an interpreter for it (the same compiler flags, the same CPU); ``make install`` ran build_ops, so
    the fused Adam and the shared-memory collectives are in TORCH_EXTENSIONS_DIR before any training, and
    loading them again rebuilds nothing."""
    probe = (
        "import json, os, subprocess, cpuinfo\n"
        "from pathlib import Path\n"
        "from deepspeed.accelerator import get_accelerator\n"
        "from largetrain_core.training.distributed import CPU_OPS, build_ops, prepare_op_builds\n"
        "builder = get_accelerator().create_op_builder('FusedAdamBuilder')\n"
        "measured, real = builder.cxx_args(), cpuinfo.get_cpu_info()\n"
        "started, Popen = [], subprocess.Popen\n"
        "class Recorded(Popen):\n"
        "    def __init__(self, args, *a, **k):\n"
        "        started.append(args)\n"
        "        super().__init__(args, *a, **k)\n"
        "subprocess.Popen = Recorded\n"
        "prepare_op_builds()\n"
        "answer = cpuinfo.get_cpu_info()\n"
        "ours, launched = builder.cxx_args(), list(started)\n"
        "subprocess.Popen = Popen\n"
        "names = [get_accelerator().create_op_builder(b).name for b in CPU_OPS]\n"
        "libs = [Path(os.environ['TORCH_EXTENSIONS_DIR'], n, n + '.so') for n in names]\n"
        "before = [p.stat().st_mtime_ns if p.exists() else None for p in libs]\n"
        "built = build_ops()\n"
        "after = [p.stat().st_mtime_ns for p in libs]\n"
        "print(json.dumps([measured, ours, real, answer, launched, built, before, after]))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    measured, ours, real, answer, started, built, before, after = json.loads(out.stdout.splitlines()[-1])
    assert ours == measured and any(a.startswith("-march") for a in ours)  # the same build: no rebuild
    assert started == []
    assert {k: real[k] for k in ("arch", "bits", "vendor_id_raw", "brand_raw")} == {
        k: answer[k] for k in ("arch", "bits", "vendor_id_raw", "brand_raw")
    }
    simd = ("avx512", "avx512f", "avx2", "sse4_2")
    assert [f in real["flags"] for f in simd] == [f in answer["flags"] for f in simd]
    assert built == ["FusedAdamBuilder", "ShareMemCommBuilder"]
    assert None not in before and after == before


def test_reading_token_shards_loads_no_pandas(tmp_path, bpe_dir, sentences):
    docs, out = tmp_path / "docs", tmp_path / "shards"
    docs.mkdir(), out.mkdir()
    pl.DataFrame({"doc_id": ["a", "b"], "source": ["t", "t"], "text": [" ".join(sentences)] * 2}).write_parquet(
        docs / "part-00000.parquet"
    )
    build_token_shards(docs, bpe_dir, out, seq_len=16, validation_fraction=0.0)
    read = (
        "from largetrain_core.shards import TokenShards\n"
        f"data = TokenShards({str(out)!r}, 'train')\n"
        "assert len(data) > 1 and data[len(data) - 1].shape == (17,) and not data[0].flags.writeable\n"
    )
    assert "pandas" not in _loaded(read)
