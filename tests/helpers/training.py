"""Inputs, runs and readers of the training tests: sentences of kernel prose for tiny token shards, the
entry point under torchrun, the 8-step run the resume tests compare, a training's per-step metrics,
and what MLflow and W&B hold of an exported directory."""

import json
import os
import subprocess
from pathlib import Path

import numpy as np

from helpers import REPO
from largetrain_core.launch import torchrun_command

SENTENCES = [
    "the kernel schedules tasks on every processor and balances the load between them",
    "a driver registers with the bus and receives a probe call for each matching device",
    "memory is allocated in pages and the allocator keeps free lists of each order",
    "interrupts are handled in two halves so that the top half returns quickly",
    "the file system caches pages of files and writes them back in the background",
]


def metrics(out: Path) -> dict[int, dict]:
    """metrics.jsonl by step; a step run again after a resume overrides the killed run's row."""
    return {r["step"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


def wandb_artifacts(runs: list[Path]) -> dict[str, dict[str, str]]:
    """``{artifact name: {file path: md5 digest (base64)}}`` of the artifacts logged in W&B offline run
    directories ``runs``, read from each one's ``run-<id>.wandb``: W&B's transaction log (a 7-byte
    ``:W&B`` header, then LevelDB's log format: 32 KiB blocks of chunks, each a 7-byte header of crc32,
    length and type FULL/FIRST/MIDDLE/LAST) of ``wandb_internal_pb2.Record`` messages, the ones
    ``wandb sync`` uploads. A later artifact of the same name replaces an earlier one."""
    from wandb.proto import wandb_internal_pb2

    out = {}
    for run in sorted(runs):
        (log,) = run.glob("run-*.wandb")
        data = log.read_bytes()
        assert data[:4] == b":W&B", log
        pos, block, pending, records = 7, 32768, b"", []
        while pos + 7 <= len(data):
            if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
                pos += block - pos % block
                continue
            length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
            chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
            if kind in (1, 2):
                pending = chunk
            elif kind in (3, 4):
                pending += chunk
            if kind in (1, 4):
                records.append(wandb_internal_pb2.Record.FromString(pending))
        for r in records:
            if r.WhichOneof("record_type") == "artifact":
                out[r.artifact.name] = {e.path: e.digest for e in r.artifact.manifest.contents}
    return out


def md5_base64(path: Path) -> str:
    """A file's MD5 as W&B's manifests record it (base64 of the digest)."""
    import base64
    import hashlib

    return base64.b64encode(hashlib.md5(path.read_bytes()).digest()).decode()


def assert_logged_with_card(directory: Path, tracker_records: dict, tmp: Path) -> None:
    """The exported ``directory`` (its largetrain model card README.md and lineage.json written) is what
    MLflow and W&B hold of it: MLflow's copy of every file, downloaded, has the same bytes; W&B's
    artifact lists every file with its MD5 (issue 23 item 8d)."""
    from mlflow.tracking import MlflowClient

    assert "largetrain" in (directory / "README.md").read_text() and (directory / "lineage.json").exists()
    assert "# Model Card for Model ID" not in (directory / "README.md").read_text()  # not PEFT's template
    files = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())
    ml = tracker_records["mlflow"]
    got = Path(MlflowClient(tracking_uri=ml["tracking_uri"]).download_artifacts(ml["run_id"], directory.name, str(tmp)))
    assert sorted(p.relative_to(got).as_posix() for p in got.rglob("*") if p.is_file()) == files
    assert all((got / f).read_bytes() == (directory / f).read_bytes() for f in files)
    wb = tracker_records["wandb"]
    runs = list(Path(wb["dir"]).glob(f"offline-run-*-{wb['run_id']}"))
    logged = wandb_artifacts(runs)[f"{wb['run_id']}-{directory.name}"]
    assert logged == {f: md5_base64(directory / f) for f in files}


def someones_tokenizer(src: Path) -> tuple[int, int]:
    """A byte-level BPE of 300 ids whose EOS is ``</s>`` and BOS ``<s>`` (not this project's
    ``<|endoftext|>``), saved into ``src`` as tokenizer.json + tokenizer_config.json; returns (bos, eos)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    rng = np.random.default_rng(1)
    texts = [" ".join(rng.permutation(SENTENCES)) for _ in range(40)]
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<s>", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tok.save(str(src / "tokenizer.json"))
    (src / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return tok.token_to_id("<s>"), tok.token_to_id("</s>")


def launch(
    config_path: Path,
    nproc: int = 2,
    fault: str | None = None,
    log_dir: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    entry: tuple[str, ...] = ("-m", "largetrain_core.training"),
) -> subprocess.CompletedProcess:
    """The training entry point (or the script or module ``entry``) on ``config_path`` under torchrun on this
    host (``--standalone``, ``nproc`` ranks, torchrun's ``--log-dir`` ``log_dir``) in a session of its own,
    with OMP_NUM_THREADS=1, LARGETRAIN_FAULT ``fault`` (none inherited) and ``env`` added. Its exit status
    is not checked."""
    run_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    run_env.pop("LARGETRAIN_FAULT", None)
    if fault:
        run_env["LARGETRAIN_FAULT"] = fault
    cmd = torchrun_command([*entry, str(config_path)], nproc, log_dir=log_dir)
    return subprocess.run(
        cmd, env=run_env, cwd=REPO, capture_output=True, text=True, timeout=timeout, start_new_session=True
    )


def torchrun(
    cfg,
    tmp: Path,
    nproc: int = 2,
    fault: str | None = None,
    env: dict[str, str] | None = None,
    name: str | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess:
    """:func:`launch` of ``cfg`` (its config written in ``tmp`` as config-``name``.json, by default the mode and
    the output directory's name); its output in ``output_dir``/torchrun-``fault`` or ``run``.log; asserts
    success, or, with ``fault`` (LARGETRAIN_FAULT), that it was killed."""
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / f"config-{name or f'{cfg.mode}-{Path(cfg.output_dir).name}'}.json"
    path.write_text(json.dumps(cfg.to_dict()))
    proc = launch(path, nproc, fault, env=env, timeout=timeout)
    out = Path(cfg.output_dir) if Path(cfg.output_dir).is_dir() else tmp
    (out / f"torchrun-{fault or 'run'}.log").write_text(proc.stdout + proc.stderr)
    if fault:
        assert proc.returncode == -9, f"expected SIGKILL from LARGETRAIN_FAULT={fault}: " + proc.stderr[-3000:]
    else:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def resume_config(out: Path, shards: Path, report_to: list[str] = (), **settings):
    """The TrainConfig of the 8-step run the resume tests crash and compare (run on 2 ranks: ZeRO-2, fp32,
    micro-batch 2, checkpoints at steps 3, 6 and 8); ``settings`` override TrainConfig.from_settings'
    keywords."""
    from largetrain_core.training.config import TrainConfig

    return TrainConfig.from_settings(
        **{
            "output_dir": str(out),
            "train_shards": str(shards),
            "preset": "llama-tiny",
            "zero_stage": 2,
            "precision": "fp32",
            "activation_checkpointing": False,
            "micro_batch_size": 2,
            "max_steps": 8,
            "learning_rate": 5e-3,
            "warmup_steps": 2,
            "save_steps": 3,
            "save_total_limit": 3,
            "logging_steps": 4,
            "report_to": list(report_to),
            "run_name": "crashed",
            "tokenizer": str(shards),
            **settings,
        }
    )
