"""The GPU run (issue 44, part A): prepared on a CPU machine with network, run on an air-gapped GPU host
whose image has Python 3.12, CUDA torch, transformers, peft, tokenizers, pyarrow, safetensors and xxhash,
but no DeepSpeed, polars, Dagster, W&B or zstandard. Two commands:

    benchmarks/gpu_prepare.sh                      # here: writes gpu_bundle/ (ignored by git), prints its size
    python3 benchmarks/gpu_run.py run              # there, in the project's root: results in $OUT or gpu_bundle/results

``prepare`` writes into the bundle (default ``gpu_bundle/``):

* ``wheels/``: the packages the training needs that the image lacks (:data:`CARRIED`), for cp312
  manylinux x86-64: DeepSpeed built here from its sdist (``pip wheel --no-deps --no-build-isolation``,
  DS_BUILD_OPS=0: pure Python, its ops compile just in time with the host's nvcc) and the others
  downloaded as wheels, each at the version this virtualenv has. Every unconditional requirement of a
  carried wheel must be carried or in the image (:data:`IMAGE`), else prepare fails naming it.
  Their install is tried for Python 3.12 on that platform (``pip install --target``, a scratch folder).
  ``--no-wheels`` skips them (the rehearsal: the training then uses this virtualenv's DeepSpeed).
* ``shards/``: token shards (largetrain_core.shards) of ``--seq-len`` with their tokenizer: a byte-level
  BPE of ``--vocab`` ids (largetrain_core.tokenizer.train_bpe) trained on real text, the kernel docs of
  the demo (``$LARGETRAIN_ROOT/corpora/linux-doc``, `make corpora`) when present, else generated
  English-like text; at most ``--max-chars`` characters (the runs cycle through the train split).
* ``configs/``: one TrainConfig JSON per figure (:data:`FIGURES`), its paths filled in by ``run``.
* ``bundle.json``: what was prepared; ``absent/sitecustomize.py``: makes the packages the image lacks
  (:data:`ABSENT`) unimportable in the trainings, where this machine has them (the rehearsal).

``run`` installs the wheels (``pip install --no-index --no-deps --target``, then PYTHONPATH) and starts
one torchrun of one rank (largetrain_core.launch.torchrun_command) of :func:`worker`, which measures the
device's peak with a matrix-product microbenchmark, then trains each figure and the resume in turn
through the training entry point's steps (largetrain_core.training.__main__: config, preflight,
trainer.run), each planned first as a launcher plans it (largetrain_core.training.plan). One process
for all: the imports, and on CUDA the fused Adam's nvcc build, are paid once. The run then writes
``gpu_run.json``, ``gpu_run.log`` and ``trainings.log`` (the trainings' output) into the results folder
(``$OUT`` if set). Exit status 1 when a training failed (its figures are then null, its error recorded).

The figures (llama-125m, seq_len 1,024 by default): fp16 (precision auto: fp16 with dynamic loss scaling
on CUDA) + ZeRO-2 + activation checkpointing; bf16 + ZeRO-2; bf16 + ZeRO-0 (DDP-equivalent). For each:
tokens/s (the whole run's and the median step's after the first ``WARM_STEPS``), MFU against the
measured peak and against the data sheet's (largetrain_core.training.flops), peak memory beside the
plan's estimate, the loss-scale history and skipped steps. The resume: the fp16 run's checkpoint at
half its steps, resumed in a fresh output directory; its loss scale (the checkpoint's own and every
resumed step's) compared bitwise with the uninterrupted run's.

On a CPU (the rehearsal, tests/integration/test_gpu_run.py) the same code runs with precision auto =
fp32, the bf16 figures in bf16 on DeepSpeed's CPU accelerator; there is no loss scale to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# Packages the training imports that the GPU image lacks (pip names). DeepSpeed and its requirement
# chain: hjson; pydantic -> pydantic-core, annotated-types, typing-inspection.
CARRIED = ("deepspeed", "hjson", "pydantic", "pydantic-core", "annotated-types", "typing-inspection")
# What the image has, of the carried wheels' requirements (/work/.library/device/KINDS.md's package list;
# issue 44 names torch, transformers, peft, tokenizers, pyarrow, safetensors, xxhash).
IMAGE = frozenset(
    "einops msgpack ninja numpy packaging psutil py-cpuinfo torch tqdm typing-extensions nvidia-ml-py "
    "transformers peft tokenizers pyarrow safetensors xxhash fsspec matplotlib filelock pyyaml".split()
)
# Packages the image lacks and the training must not import (issue 44).
ABSENT = ("polars", "dagster", "dagster_pipes", "wandb", "zstandard", "mlflow")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
FIGURES = ("fp16_zero2_ac", "bf16_zero2", "bf16_zero0")
RESUME = "fp16_resume"
WARM_STEPS = 5  # steps left out of the steady tokens/s (CUDA kernels' autotuning, allocator growth)
WORDS = (
    "the a kernel driver memory page device process thread lock queue buffer interrupt file system user call "
    "returns value when each with for not can must should be is are of to in on"
).split()


def log(msg: str, logf=None) -> None:
    line = f"{time.strftime('%H:%M:%S')} gpu_run: {msg}"
    print(line, flush=True)
    if logf is not None:
        logf.write(line + "\n")
        logf.flush()


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


# ----------------------------------------------------------------------------------------------
# prepare


def build_wheels(dest: Path) -> list[str]:
    """The :data:`CARRIED` wheels at this virtualenv's versions into ``dest``; returns their file names.
    Raises RuntimeError naming a requirement that is neither carried nor in :data:`IMAGE`."""
    from importlib.metadata import version

    import zipfile

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    dest.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "-q"]
    ds = f"deepspeed=={version('deepspeed')}"
    subprocess.run(
        [*pip, "wheel", ds, "--no-deps", "--no-build-isolation", "--no-binary", "deepspeed", "-w", str(dest)],
        check=True,
        env={**os.environ, "DS_BUILD_OPS": "0"},
    )
    # the GPU host's interpreter and platform, for both the download and the trial install
    host = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
    host += [a for p in PLATFORMS for a in ("--platform", p)]
    others = [f"{n}=={version(n)}" for n in CARRIED if n != "deepspeed"]
    subprocess.run(
        [
            *pip,
            "download",
            "--no-deps",
            *host,
            "-d",
            str(dest),
            *others,
        ],
        check=True,
    )
    carried, have = {canonicalize_name(n) for n in CARRIED}, {canonicalize_name(n) for n in IMAGE}
    names = sorted(p.name for p in dest.glob("*.whl"))
    for name in names:
        with zipfile.ZipFile(dest / name) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            for line in z.read(meta).decode().splitlines():
                if not line.startswith("Requires-Dist:"):
                    continue
                req = Requirement(line.split(":", 1)[1].strip())
                if req.marker is not None and not req.marker.evaluate({"extra": "", "python_version": "3.12"}):
                    continue
                if canonicalize_name(req.name) not in carried | have:
                    raise RuntimeError(f"{name} requires {req}, which is neither carried nor in the GPU image")
    with tempfile.TemporaryDirectory() as target:  # the install of the GPU host, for its Python and platform
        subprocess.run(
            [
                *pip,
                "install",
                "--no-index",
                "--no-deps",
                *host,
                "--target",
                target,
                *(str(dest / n) for n in names),
            ],
            check=True,
        )
    return names


def corpus_texts(source: Path | None, max_chars: int) -> tuple[list[str], str]:
    """Documents of at most ``max_chars`` characters in all, and where they came from: the ``*.txt``
    files under ``source`` (sorted), or generated English-like text when ``source`` is None or missing."""
    texts, total = [], 0
    if source is not None and source.is_dir():
        for f in sorted(source.rglob("*.txt")):
            t = f.read_text(errors="replace")
            texts.append(t[: max_chars - total])
            total += len(texts[-1])
            if total >= max_chars:
                break
        return texts, f"{source} (*.txt, first {total:,} characters)"
    rng = random.Random(0)
    while total < max_chars:
        t = " ".join(rng.choice(WORDS) for _ in range(min(2000, max(1, (max_chars - total) // 6))))
        texts.append(t)
        total += len(t)
    return texts, f"generated English-like text ({total:,} characters, {len(WORDS)} words, seed 0)"


def figure_configs(preset: str, steps: int, micro_batch: int) -> dict:
    """The TrainConfig of each figure and of the resume, paths left for ``run`` to fill in."""
    from largetrain_core.training.config import TrainConfig

    half = max(1, steps // 2)
    base = dict(
        output_dir="",
        train_shards="",
        preset=preset,
        micro_batch_size=micro_batch,
        max_steps=steps,
        warmup_steps=max(1, steps // 10),
        learning_rate=6e-4,
        save_steps=steps,
        save_total_limit=1,
        logging_steps=max(1, steps // 4),
        resume_from_checkpoint="never",
        report_to=[],
        eval_strategy="no",
    )
    out = {
        # the checkpoint at half the steps is the resume's starting point
        "fp16_zero2_ac": dict(
            base, precision="auto", zero_stage=2, activation_checkpointing=True, save_steps=half, save_total_limit=2
        ),
        "bf16_zero2": dict(base, precision="bf16", zero_stage=2, activation_checkpointing=False),
        "bf16_zero0": dict(base, precision="bf16", zero_stage=0, activation_checkpointing=False),
    }
    out[RESUME] = dict(out["fp16_zero2_ac"], resume_from_checkpoint="auto")
    return {k: TrainConfig.from_settings(**v).to_dict() for k, v in out.items()}


def prepare(args) -> dict:
    """Write the bundle (module docstring); return bundle.json's dict."""
    import polars as pl

    from largetrain_core.shards import build_token_shards
    from largetrain_core.tokenizer import train_bpe

    bundle = Path(args.bundle).resolve()
    shutil.rmtree(bundle, ignore_errors=True)
    bundle.mkdir(parents=True)
    t0 = time.perf_counter()
    wheels = [] if args.no_wheels else build_wheels(bundle / "wheels")
    source = (
        Path(args.text)
        if args.text
        else Path(os.environ.get("LARGETRAIN_ROOT", REPO / ".largetrain")) / "corpora" / "linux-doc"
    )
    texts, text_source = corpus_texts(source, args.max_chars)
    work = bundle / "_text"
    (work / "docs").mkdir(parents=True)
    pl.DataFrame(
        {"doc_id": [f"d{i}" for i in range(len(texts))], "source": ["gpu_run"] * len(texts), "text": texts}
    ).write_parquet(work / "docs" / "part-00000.parquet")
    train_bpe([texts], args.vocab, work / "tok")
    shards = bundle / "shards"
    shards.mkdir()
    manifest = build_token_shards(work / "docs", work / "tok", shards, seq_len=args.seq_len, validation_fraction=0.01)
    shutil.rmtree(work)
    (bundle / "configs").mkdir()
    for name, cfg in figure_configs(args.preset, args.steps, args.micro_batch).items():
        (bundle / "configs" / f"{name}.json").write_text(json.dumps(cfg, indent=1))
    (bundle / "absent").mkdir()
    (bundle / "absent" / "sitecustomize.py").write_text(
        '"""The GPU image lacks these packages: the trainings must run without them (benchmarks/gpu_run.py)."""\n'
        f"import sys\nfor _name in {ABSENT!r}:\n    sys.modules.setdefault(_name, None)\n"
    )
    info = {
        "preset": args.preset,
        "seq_len": args.seq_len,
        "vocab_size": manifest["vocab_size"],
        "steps": args.steps,
        "micro_batch_size": args.micro_batch,
        "text": text_source,
        "train_sequences": sum(s["sequences"] for s in manifest["splits"]["train"]["shards"]),
        "wheels": wheels,
        "figures": list(FIGURES),
        "resume": RESUME,
        "prepare_seconds": round(time.perf_counter() - t0, 1),
    }
    info["bytes"] = {
        "wheels": dir_bytes(bundle / "wheels") if wheels else 0,
        "shards": dir_bytes(shards),
        "configs": dir_bytes(bundle / "configs"),
    }
    (bundle / "bundle.json").write_text(json.dumps(info, indent=1))
    info["bytes"]["total"] = dir_bytes(bundle)
    (bundle / "bundle.json").write_text(json.dumps(info, indent=1))
    mib = {k: round(v / 2**20, 2) for k, v in info["bytes"].items()}
    print(
        f"carried size: {mib['total']} MiB (goal < 40 MiB; the GPU call's limit is 64 MiB with the working tree): "
        f"wheels {mib['wheels']} MiB ({len(wheels)}), shards {mib['shards']} MiB "
        f"({info['train_sequences']:,} train sequences of {args.seq_len}), configs {mib['configs']} MiB; {bundle}"
    )
    return info


# ----------------------------------------------------------------------------------------------
# run


def install_wheels(bundle: Path, site: Path, logf) -> bool:
    """``pip install --no-index --no-deps --target site`` of the bundle's wheels; False when it has none."""
    wheels = sorted((bundle / "wheels").glob("*.whl")) if (bundle / "wheels").is_dir() else []
    if not wheels:
        log("no wheels in the bundle: the training uses this interpreter's packages", logf)
        return False
    shutil.rmtree(site, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--no-cache-dir",
        "--target",
        str(site),
        *map(str, wheels),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    logf.write(r.stdout + r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"pip install of {len(wheels)} wheels failed:\n{r.stderr[-3000:]}")
    log(f"installed {', '.join(w.name for w in wheels)} into {site}", logf)
    return True


def matmul_peak(dtype_name: str) -> dict:
    """Measured peak FLOP/s of one square matrix product in ``dtype_name`` on this device: CUDA, n =
    8,192, the mean of 10 timed products after 3 warm-ups (CUDA events); CPU, fp32 only, n = 1,024,
    best of 5 after one warm-up. 2n^3 FLOPs per product."""
    import torch

    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    cuda = torch.cuda.is_available()
    n = 8192 if cuda else 1024
    dev = "cuda" if cuda else "cpu"
    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    flops = 2.0 * n**3
    if cuda:
        for _ in range(3):
            a @ b
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            a @ b
        end.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(end) / 1000 / 10
        how = f"{n}x{n}x{n} {dtype_name} matmul, mean of 10 after 3 warm-ups"
    else:
        a @ b
        times = []
        for _ in range(5):
            t = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t)
        seconds = min(times)
        how = f"{n}x{n}x{n} {dtype_name} matmul on {torch.get_num_threads()} threads, best of 5"
    return {"flops": flops / seconds, "how": how}


def device_facts() -> dict:
    import torch

    from largetrain_core.training.cpu import cpu_fields

    cuda = torch.cuda.is_available()
    facts = {"cuda": cuda, "torch": torch.__version__, "python": sys.version.split()[0]}
    from importlib.metadata import PackageNotFoundError, version

    for name in ("deepspeed", "transformers", "peft", "tokenizers"):
        try:
            facts[name] = version(name)
        except PackageNotFoundError:
            facts[name] = None
    if cuda:
        p = torch.cuda.get_device_properties(0)
        facts.update(
            device=torch.cuda.get_device_name(),
            memory_gib=round(p.total_memory / 2**30, 2),
            multiprocessors=p.multi_processor_count,
        )
    else:
        facts.update(device=f"CPU ({cpu_fields().get('model name', 'unknown')}, {len(os.sched_getaffinity(0))} cores)")
    return facts


def worker(spec_path: str) -> None:
    """The trainings, in one process under torchrun (one rank): measure the peak of each precision the
    runs train in (:func:`matmul_peak`), then for each run of the spec: the training entry point's
    steps (largetrain_core.training.__main__: the config read, preflight, trainer.run) with
    ``peak_flops`` set to the measured peak, the memory released and the peak-memory counter reset
    between runs (what was still allocated before each is recorded). A ``copy_checkpoint`` [from, to]
    is copied first (the resume). A run that raises is recorded, and the next one runs. Writes
    ``worker.json`` beside the spec; ends the rank as the entry point does (rank_signals.finish_rank)."""
    import gc
    import logging
    import traceback

    import torch

    from largetrain_core.rank_signals import finish_rank, raise_on_sigterm
    from largetrain_core.training import preflight
    from largetrain_core.training.__main__ import read_bytes, skip_mlflow_unless_used
    from largetrain_core.training.config import TrainConfig
    from largetrain_core.training.deepspeed_config import resolve_precision
    from largetrain_core.training.trainer import reset_peak_memory
    from largetrain_core.training.trainer import run as train_run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    raise_on_sigterm()
    os.environ.pop("WANDB_SERVICE", None)
    from largetrain_core.training.flops import CUDA_PEAK_FLOPS
    from largetrain_core.training.plan import PLAN, PlanSettings, make_plan

    spec_file = Path(spec_path)
    spec = json.loads(spec_file.read_text())
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    facts = device_facts()
    datasheet = next((v for k, v in CUDA_PEAK_FLOPS.items() if cuda and k in facts["device"]), None)
    out = {"device": facts, "datasheet_peak_flops": datasheet, "peak_flops": {}, "runs": {}}
    for r in spec["runs"]:
        p = resolve_precision(TrainConfig.from_dict(json.loads(read_bytes(r["config"]))).precision.dtype, cuda)[0]
        if p not in out["peak_flops"]:
            out["peak_flops"][p] = matmul_peak(p)
            print(f"measured peak {p}: {out['peak_flops'][p]}", flush=True)
    for r in spec["runs"]:
        name = r["name"]
        print(f"=== {name}", flush=True)
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        reset_peak_memory(device)
        rec = {"allocated_before_gib": torch.cuda.memory_allocated(device) / 2**30 if cuda else None}
        t = time.perf_counter()
        try:
            if r.get("copy_checkpoint"):
                src, dst = map(Path, r["copy_checkpoint"])
                if not src.is_dir():
                    raise FileNotFoundError(f"{src}: no checkpoint to resume from")
                rec["checkpoint_loss_scale"] = saved_loss_scale(src)
                shutil.copytree(src, dst)
            cfg = TrainConfig.from_dict(json.loads(read_bytes(r["config"])))
            precision = resolve_precision(cfg.precision.dtype, cuda)[0]
            cfg = cfg.with_settings(peak_flops=out["peak_flops"][precision]["flops"])
            skip_mlflow_unless_used(cfg)
            preflight.check(cfg)
            run_dir = Path(cfg.output_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "train_config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
            if r.get("plan"):  # as a launcher plans before the launch (largetrain_core.training.plan)
                try:
                    (run_dir / PLAN).write_text(
                        json.dumps(make_plan(cfg, PlanSettings(), 1, 1, cuda, run_dir).to_dict())
                    )
                except Exception as e:  # noqa: BLE001 - the run's figures stand without it; said in its record
                    rec["plan_error"] = f"{type(e).__name__}: {e}"
            train_run(cfg)
            rec["error"] = None
        except Exception as e:  # noqa: BLE001 - recorded with its traceback; the next run goes on
            traceback.print_exc()
            rec["error"] = f"{type(e).__name__}: {e}"
            e.__traceback__ = None
        rec["seconds"] = round(time.perf_counter() - t, 2)
        out["runs"][name] = rec
        (spec_file.parent / "worker.json").write_text(json.dumps(out, indent=1))
    out["image_check"] = {  # what the image lacks: kept out by absent/sitecustomize.py here, and never imported
        "blocked": [n for n in ABSENT if n in sys.modules and sys.modules[n] is None],
        "imported": [n for n in ABSENT if sys.modules.get(n) is not None],
    }
    (spec_file.parent / "worker.json").write_text(json.dumps(out, indent=1))
    finish_rank()


def launch_worker(spec: Path, env: dict, log_path: Path, logf, limit_s: float) -> int:
    """One torchrun (one rank, largetrain_core.launch.torchrun_command) of :func:`worker` with ``spec``,
    stopped (SIGTERM, then SIGKILL after 10 s) once it has run ``limit_s`` seconds: the runs finished by
    then keep their figures."""
    from largetrain_core.launch import module_entry, torchrun_command
    from largetrain_core.processes import run_in_group

    cmd = torchrun_command(module_entry("benchmarks.gpu_run", "worker", spec), 1, log_dir=spec.parent / "torchrun")
    log(" ".join(cmd), logf)
    deadline = time.monotonic() + limit_s

    def tick() -> None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the trainings ran past --limit-s {limit_s:g} s")

    try:
        return run_in_group(cmd, env, log_path, 10.0, on_tick=tick, cwd=REPO)
    except TimeoutError as e:
        log(f"stopped: {e}", logf)
        return 124


def outputs(cfg) -> tuple[dict | None, list[dict]]:
    """A finished training's summary.json (None when it did not finish) and metrics.jsonl rows."""
    from largetrain_core.training.trackers import METRICS, read_metrics

    out = Path(cfg.output_dir)
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else None
    return summary, read_metrics(out / METRICS) if (out / METRICS).exists() else []


def loss_scale_history(rows: list[dict]) -> dict:
    """Every change of the loss scale (step, scale, skipped steps so far), the skipped steps and their count;
    all None without a loss scale (fp32, bf16)."""
    if not rows or rows[0].get("loss_scale") is None:
        return {"loss_scale_history": None, "skipped_steps": None, "skipped_step_numbers": None}
    hist, last = [], None
    for r in rows:
        if r["loss_scale"] != last:
            hist.append([r["step"], r["loss_scale"], r["skipped_steps"]])
            last = r["loss_scale"]
    return {
        "loss_scale_history": hist,
        "skipped_steps": rows[-1]["skipped_steps"],
        "skipped_step_numbers": [r["step"] for r in rows if r.get("step_skipped")],
    }


def figures(cfg, res: dict, plan: dict | None, datasheet: float | None) -> dict:
    """One run's figures (module docstring) from its summary, metrics rows and plan; ``res`` also holds the
    worker's record (error, seconds, allocated_before_gib, plan_error)."""
    from largetrain_core.training.plan import GiB, plan_vs_measured

    s, rows = res["summary"], res["rows"]
    peak = cfg.tracking.peak_flops
    fig = {
        "error": res["error"],
        "seconds": res["seconds"],
        "zero_stage": cfg.parallelism.zero_stage,
        "activation_checkpointing": cfg.parallelism.activation_checkpointing,
        "micro_batch_size": cfg.schedule.micro_batch_size,
        "steps": len(rows),
        "precision": s and s["precision"],
        "parameters": s and s["parameters"],
        "tokens_per_step": None,
        "tokens_per_s": s and s["tokens_per_s"],
        "tokens_per_s_steady": None,
        "mfu": s and s["mfu"],
        "mfu_steady": None,
        "mfu_steady_datasheet": None,
        "peak_flops": peak,
        "peak_memory_gib": None,
        "allocated_before_gib": res["allocated_before_gib"],
        "plan_peak_memory_gib": round(plan["memory"]["peak"] / GiB, 4) if plan else None,
        "plan_error": res.get("plan_error"),
        "plan_vs_measured": None,
        "first_loss": s and s["first_loss"],
        "last_loss": s and s["last_loss"],
        **loss_scale_history(rows),
    }
    if s and rows:
        steady = rows[min(WARM_STEPS, len(rows) - 1) :]
        tps = statistics.median(r["tokens_per_s"] for r in steady)
        fig["tokens_per_step"] = round(rows[-1]["tokens_per_s"] * rows[-1]["step_time_s"])
        fig["tokens_per_s_steady"] = tps
        fig["mfu_steady"] = tps * s["flops_per_token"] / peak if peak else None
        fig["mfu_steady_datasheet"] = tps * s["flops_per_token"] / datasheet if datasheet else None
        fig["peak_memory_gib"] = max(r.get("peak_memory_gib", r.get("peak_rss_gib", 0)) for r in rows)
        if plan:
            fig["plan_vs_measured"] = plan_vs_measured(plan, s, rows)["rows"]
    return fig


def saved_loss_scale(ckpt: Path) -> float | None:
    """The loss scale DeepSpeed stored in checkpoint ``ckpt`` (its optimizer state's ``loss_scaler``), or
    None when it holds none (fp32, bf16)."""
    import torch

    for f in sorted(ckpt.rglob("*optim_states.pt")):
        state = torch.load(f, map_location="cpu", weights_only=False)
        stack = [state]
        while stack:
            d = stack.pop()
            if isinstance(d, dict):
                scaler = d.get("loss_scaler")
                if scaler is not None:
                    return float(getattr(scaler, "cur_scale", getattr(scaler, "loss_scale", float("nan"))))
                stack.extend(v for v in d.values() if isinstance(v, dict))
    return None


def bits(x: float | None) -> str | None:
    return None if x is None else struct.pack(">d", x).hex()


def resume_figures(first: dict, resumed: dict, ckpt: Path) -> dict:
    """The resumed fp16 run against the uninterrupted one: the loss scale stored in the checkpoint
    (``resumed["checkpoint_loss_scale"]``, read by the worker) against the uninterrupted run's at that
    step, then step for step after it the loss scale and skipped-step count, bitwise (IEEE-754 binary64
    of each); the loss too."""
    before = {r["step"]: r for r in first["rows"]}
    after = resumed["rows"]
    from_step = int(ckpt.name.split("-")[1])
    saved = resumed.get("checkpoint_loss_scale")
    at = before.get(from_step, {}).get("loss_scale")
    pairs = [(r, before.get(r["step"])) for r in after]
    out = {
        "error": resumed["error"],
        "seconds": resumed["seconds"],
        "resumed_from_step": from_step,
        "checkpoint_loss_scale": saved,
        "uninterrupted_loss_scale_at_checkpoint": at,
        "steps_compared": len([p for p in pairs if p[1] is not None]),
        "loss_scale_resumed": [r.get("loss_scale") for r in after],
        "loss_scale_uninterrupted": [b and b.get("loss_scale") for _, b in pairs],
        "skipped_steps_resumed": [r.get("skipped_steps") for r in after],
        "skipped_steps_uninterrupted": [b and b.get("skipped_steps") for _, b in pairs],
        "loss_scale_bitwise_equal": None,
        "losses_equal": None,
    }
    if after and all(b is not None for _, b in pairs):
        out["losses_equal"] = all(r["loss"] == b["loss"] for r, b in pairs)
        if at is not None:
            out["loss_scale_bitwise_equal"] = bits(saved) == bits(at) and all(
                bits(r.get("loss_scale")) == bits(b.get("loss_scale"))
                and r.get("skipped_steps") == b.get("skipped_steps")
                for r, b in pairs
            )
    if at is None:
        precision = (first["summary"] or {}).get("precision")
        out["note"] = f"precision {precision}: no loss scale to restore" if precision else "the fp16 run did not finish"
    return out


def run(args) -> int:
    """Every figure in one go (module docstring); writes gpu_run.json; 1 when a training failed."""
    bundle = Path(args.bundle).resolve()
    info = json.loads((bundle / "bundle.json").read_text())
    results = Path(args.out or os.environ.get("OUT") or bundle / "results").resolve()
    results.mkdir(parents=True, exist_ok=True)
    work = Path(args.work).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t0 = time.perf_counter()
    with open(results / "gpu_run.log", "w") as logf:
        site = work / "site"
        paths = [str(REPO)]
        carried = install_wheels(bundle, site, logf)
        if carried:
            paths.append(str(site))
            sys.path.insert(0, str(site))
        import importlib.util

        absent_here = [n for n in ABSENT if importlib.util.find_spec(n) is not None]
        if absent_here:  # a machine that has them (the rehearsal): the trainings run as on the image
            paths.append(str(bundle / "absent"))
            log(f"made unimportable in the trainings (the GPU image lacks them): {', '.join(absent_here)}", logf)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH")] if p]),
            "PYTHONUNBUFFERED": "1",
        }
        from largetrain_core.training import checkpoints
        from largetrain_core.training.config import TrainConfig
        from largetrain_core.training.plan import PLAN

        if carried:  # the carried DeepSpeed's ops (the fused Adam: nvcc, by the first training) in the work folder;
            # else this interpreter's, where they were built (largetrain_core.training.distributed)
            env.setdefault("TORCH_EXTENSIONS_DIR", str(work / "torch_extensions"))
        report = {
            "device": None,
            "bundle": info,
            "peak_flops": None,
            "datasheet_peak_flops": None,
            "image_check": None,
            "runs": {},
            "resume": None,
            "faster_bf16_zero_stage": None,
            "failed": None,
            "ok": False,
        }

        cfgs = {}
        for name in (*FIGURES, RESUME):
            d = json.loads((bundle / "configs" / f"{name}.json").read_text())
            d["output_dir"], d["train_shards"] = str(work / "runs" / name), str(bundle / "shards")
            cfgs[name] = TrainConfig.from_dict(d)
            (work / "configs").mkdir(exist_ok=True)
            (work / "configs" / f"{name}.json").write_text(json.dumps(cfgs[name].to_dict(), indent=1))
        half = cfgs["fp16_zero2_ac"].checkpointing.save_steps
        ckpt = work / "runs" / "fp16_zero2_ac" / "checkpoints" / checkpoints.tag(half)
        spec = {"runs": [{"name": n, "config": str(work / "configs" / f"{n}.json"), "plan": True} for n in FIGURES]}
        spec["runs"].append(
            {
                "name": RESUME,
                "config": str(work / "configs" / f"{RESUME}.json"),
                "copy_checkpoint": [str(ckpt), str(work / "runs" / RESUME / "checkpoints" / ckpt.name)],
            }
        )
        (work / "spec.json").write_text(json.dumps(spec, indent=1))
        code = launch_worker(
            work / "spec.json", env, results / "trainings.log", logf, args.limit_s - (time.perf_counter() - t0)
        )
        log(f"trainings: exit {code} after {time.perf_counter() - t0:.1f} s (their log: trainings.log)", logf)
        done = json.loads((work / "worker.json").read_text()) if (work / "worker.json").exists() else {"runs": {}}
        for key in ("device", "peak_flops", "datasheet_peak_flops", "image_check"):
            report[key] = done.get(key)
        if report["device"]:
            d = report["device"]
            log(
                f"device {d['device']}, torch {d['torch']}, deepspeed {d['deepspeed']}, transformers {d['transformers']}",
                logf,
            )
        failed = [n for n in (*FIGURES, RESUME) if (done["runs"].get(n) or {"error": "did not run"})["error"]]
        results_of = {}
        for name in (*FIGURES, RESUME):
            used = work / "runs" / name / "train_config.json"
            cfg = TrainConfig.from_dict(json.loads(used.read_text())) if used.exists() else cfgs[name]
            summary, rows = outputs(cfg)
            rec = done["runs"].get(name) or {"error": "did not run", "seconds": None, "allocated_before_gib": None}
            results_of[name] = {"summary": summary, "rows": rows, **rec}
            if name == RESUME:
                continue
            plan_file = work / "runs" / name / PLAN
            plan = json.loads(plan_file.read_text()) if plan_file.exists() else None
            report["runs"][name] = figures(cfg, results_of[name], plan, report["datasheet_peak_flops"])
        report["resume"] = resume_figures(results_of["fp16_zero2_ac"], results_of[RESUME], ckpt)
        z0, z2 = report["runs"]["bf16_zero0"], report["runs"]["bf16_zero2"]
        if z0["tokens_per_s_steady"] and z2["tokens_per_s_steady"]:
            report["faster_bf16_zero_stage"] = {
                "zero_stage": 0 if z0["tokens_per_s_steady"] >= z2["tokens_per_s_steady"] else 2,
                "zero0_over_zero2": z0["tokens_per_s_steady"] / z2["tokens_per_s_steady"],
            }
        if code != 0 and not failed:
            failed = [f"the trainings' process (exit {code})"]
        if report["image_check"] and report["image_check"]["imported"]:
            failed.append(f"imported what the GPU image lacks: {', '.join(report['image_check']['imported'])}")
        report["failed"] = failed
        report["ok"] = not failed
        report["wall_s"] = round(time.perf_counter() - t0, 1)
        (results / "gpu_run.json").write_text(json.dumps(report, indent=1))
        for name, f in report["runs"].items():
            log(
                f"{name}: {f['precision']}, ZeRO-{f['zero_stage']}, tokens/s {f['tokens_per_s_steady'] or 0:,.0f}, "
                f"MFU {f['mfu_steady'] or 0:.3f} (measured peak), {f['mfu_steady_datasheet'] or 0:.3f} (data sheet), "
                f"peak memory {f['peak_memory_gib'] or 0:.2f} GiB (plan {f['plan_peak_memory_gib'] or 0:.2f}), "
                f"loss-scale history {f['loss_scale_history']}, skipped {f['skipped_steps']}"
                + (f"; ERROR {f['error']}" if f["error"] else ""),
                logf,
            )
        r = report["resume"]
        log(
            f"resume from step {r['resumed_from_step']}: loss scale bitwise equal {r['loss_scale_bitwise_equal']}"
            f"{'; ' + r['note'] if r.get('note') else ''}",
            logf,
        )
        log(
            f"{'all figures' if not failed else 'FAILED: ' + ', '.join(failed)} in {report['wall_s']} s; "
            f"{results / 'gpu_run.json'}",
            logf,
        )
    return 0 if not failed else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="write the bundle (here, with network)")
    p.add_argument("--bundle", default=str(REPO / "gpu_bundle"))
    p.add_argument("--preset", default="llama-125m")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=16384, help="BPE ids (EOS included)")
    p.add_argument("--steps", type=int, default=50, help="optimizer steps per figure")
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--max-chars", type=int, default=6_000_000, help="characters of text to tokenize")
    p.add_argument("--text", default=None, help="a folder of *.txt documents (default: the demo's kernel docs)")
    p.add_argument("--no-wheels", action="store_true", help="no wheels (the rehearsal: this virtualenv's DeepSpeed)")
    r = sub.add_parser("run", help="every figure in one go (there, on the GPU host)")
    r.add_argument("--bundle", default=str(REPO / "gpu_bundle"))
    r.add_argument("--out", default=None, help="results folder (default: $OUT, else <bundle>/results)")
    r.add_argument("--work", default="/tmp/largetrain_gpu_run", help="the runs' outputs and checkpoints (replaced)")
    r.add_argument("--limit-s", type=float, default=330, help="stop the trainings after this many seconds in all")
    w = sub.add_parser("worker", help="(run starts it under torchrun) the trainings of a spec")
    w.add_argument("spec")
    args = ap.parse_args(argv)
    if args.command == "worker":
        worker(args.spec)
        return 0
    if args.command == "prepare":
        prepare(args)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
