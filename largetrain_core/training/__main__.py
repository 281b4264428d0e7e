"""The training entry point: ``torchrun --nproc_per_node N -m largetrain_core.training CONFIG.json``
(a :class:`~largetrain_core.training.config.TrainConfig` as JSON; a local path or a URL such as
``s3://bucket/.../train_config.json``, read through largetrain_core.fs). Exit status 0 after a finished run.

An uncaught exception is recorded in torchrun's per-rank error file (largetrain_core.error_records.record)
before it ends the process: its full type, message, rank and the file it concerns reach the launcher."""

import json
import logging
import os
import sys

from largetrain_core.fs import filesystem
from largetrain_core.error_records import concerning, record
from largetrain_core.rank_signals import finish_rank, raise_on_sigterm


def read_bytes(location: str) -> bytes:
    """The bytes of a local file or of an object at a URL."""
    fs, path = filesystem(location)
    return fs.cat_file(path)


def skip_mlflow_unless_used(cfg) -> None:
    """Make MLflow absent, before DeepSpeed loads, for a training that does not report to it: DeepSpeed
    imports it when it is installed, for its autotuner's experiments (deepspeed/autotuning/autotuner.py),
    which a training never runs, and goes without it when it is not. That import is 2.7 CPU s of every
    rank's start (py-spy, a 1-rank tiny training)."""
    if "mlflow" not in cfg.tracking.report_to:
        sys.modules.setdefault("mlflow", None)


@record
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: torchrun --nproc_per_node N -m largetrain_core.training CONFIG.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    raise_on_sigterm()  # a cancelled run unwinds: its trackers' runs end killed, not left running
    # A W&B service inherited from the launching process (WANDB_SERVICE, set by any process that used
    # wandb) would outlive a rank killed by SIGKILL and keep its run ID in use: the resume would fail
    # with "run ID ... is in use". Each training's rank 0 starts its own, which ends with it.
    os.environ.pop("WANDB_SERVICE", None)
    from largetrain_core.training.config import TrainConfig

    with concerning(argv[0], "reading the training config"):
        cfg = TrainConfig.from_dict(json.loads(read_bytes(argv[0])))
        skip_mlflow_unless_used(cfg)
        from largetrain_core.training import preflight

        preflight.check(cfg)
    from largetrain_core.training.trainer import run

    run(cfg)
    finish_rank()


if __name__ == "__main__":
    sys.exit(main())
