"""``python -m largetrain_core.training.plan TRAIN_CONFIG.json [options]`` (__main__.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from largetrain_core.training.config import TrainConfig
from largetrain_core.training.plan.build import make_plan
from largetrain_core.training.plan.settings import PlanSettings
from largetrain_core.training.plan.throughput import calibrate_here, from_calibration, from_report


def main(argv: list[str] | None = None) -> int:
    """``python -m largetrain_core.training.plan TRAIN_CONFIG.json [options]``: print the plan of a training
    config (a train_config.json) as a markdown table and its problems; exit status 1 when it does not fit."""
    import argparse
    import json
    import sys

    ap = argparse.ArgumentParser(prog="python -m largetrain_core.training.plan", description=main.__doc__)
    ap.add_argument("config", help="a TrainConfig JSON file (the train_config.json a training asset writes)")
    ap.add_argument("--ranks", type=int, default=1, help="ranks in all (data-parallel size N_d)")
    ap.add_argument("--ranks-per-host", type=int, default=None, help="ranks on each host (default: --ranks)")
    ap.add_argument("--storage-root", default=None, help="where the checkpoints go (default: the config's output_dir)")
    ap.add_argument("--report", default=None, help="an optimization report.json to take the throughput from")
    ap.add_argument(
        "--calibrate",
        action="store_true",
        help="measure the throughput: run the calibration under torchrun on this host with --ranks ranks first",
    )
    ap.add_argument(
        "--settings",
        default="{}",
        help='plan settings as JSON, e.g. \'{"max_hours": 2, "price_per_device_hour": 2.5}\' (PlanSettings\' fields)',
    )
    args = ap.parse_args(argv)
    import torch

    from largetrain_core.training.ablation import device_name

    cfg = TrainConfig.from_dict(json.loads(Path(args.config).read_text()))
    settings = PlanSettings(**json.loads(args.settings))
    cuda = torch.cuda.is_available()
    per_host = args.ranks_per_host or args.ranks
    root = args.storage_root or cfg.output_dir
    throughput, note, calibration = None, "no --report or --calibrate: no time or cost estimate", None
    if args.report:
        plan = make_plan(
            cfg, replace(settings, throughput="none", max_hours=None, max_cost=None), args.ranks, per_host, cuda, root
        )
        throughput, note = from_report(
            json.loads(Path(args.report).read_text()),
            cfg,
            plan.shape,
            args.ranks,
            device_name(),
            plan.precision,
            plan.seq_len,
        )
    if args.calibrate and throughput is None:
        calibration = calibrate_here(cfg, args.ranks, Path(cfg.output_dir) / "calibration", settings.calibration_steps)
        throughput = from_calibration(calibration)
    plan = make_plan(cfg, settings, args.ranks, per_host, cuda, root, throughput, note, calibration)
    print(plan.table())
    problems = plan.problems()
    for p in problems:
        print(f"does not fit: {p}", file=sys.stderr)
    return 1 if problems and settings.check else 0
