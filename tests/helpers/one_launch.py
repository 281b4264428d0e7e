"""Several trainings or calibrations in one torchrun, one after the other in the same ranks (as the optimization
ablation runs its variants): ``torchrun ... tests/helpers/one_launch.py SPECS.json``, SPECS a JSON list of
``{"train": TrainConfig as a dict}`` (a training: largetrain_core.training.trainer.run) or calibration specs
(largetrain_core.training.calibrate: ``train``, ``steps``, ``profiled_steps``, ``measure_checkpoint``). Each
writes its own outputs. One process start for all of them: the imports and the process group once.
:func:`launch_many` starts it and checks that it succeeded."""

import json
import logging
import sys
from pathlib import Path


def launch_many(specs: list[dict], spec_file: Path, nproc: int = 2, timeout: float = 1200):
    """Write ``specs`` to ``spec_file`` and run them under torchrun (helpers.training.launch, ``nproc`` ranks);
    asserts exit status 0, with the output's tail; returns the finished process (its ``stderr``: the ranks' log)."""
    from helpers.training import launch  # here: the ranks run this file as a script, without tests/ on the path

    spec_file.write_text(json.dumps(specs))
    proc = launch(spec_file, nproc, timeout=timeout, entry=(__file__,))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from largetrain_core.rank_signals import finish_rank
    from largetrain_core.training.config import TrainConfig

    specs = json.loads(Path(sys.argv[1]).read_text())
    cfgs = [TrainConfig.from_dict(spec["train"]) for spec in specs]
    if not any("mlflow" in cfg.tracking.report_to for cfg in cfgs):  # as the entry point (skip_mlflow_unless_used)
        sys.modules.setdefault("mlflow", None)
    from largetrain_core.training import calibrate, preflight, trainer

    for spec, cfg in zip(specs, cfgs):
        if "steps" in spec:
            cfg.validate()
            calibrate.run(cfg, spec["steps"], spec["profiled_steps"], spec["measure_checkpoint"])
        else:  # as the training entry point (largetrain_core.training.__main__) runs it
            preflight.check(cfg)
            trainer.run(cfg)
    finish_rank()


if __name__ == "__main__":
    main()
