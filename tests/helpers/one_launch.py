"""Calibrate several training configs in one torchrun (tests/integration/test_plan.py): ``torchrun ... tests/helpers/calibrate_many.py
SPECS.json``, SPECS a JSON list of calibration specs (largetrain_core.training.calibrate: ``train``, ``steps``,
``profiled_steps``, ``measure_checkpoint``), run one after the other on every rank; each writes its own
calibration.json. One process start for all of them: DeepSpeed's import and the process group once."""

import json
import logging
import sys
from pathlib import Path


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from largetrain_core.launch import finish_rank
    from largetrain_core.training.calibrate import run
    from largetrain_core.training.config import TrainConfig

    for spec in json.loads(Path(sys.argv[1]).read_text()):
        cfg = TrainConfig.from_dict(spec["train"])
        cfg.validate()
        run(cfg, spec["steps"], spec["profiled_steps"], spec["measure_checkpoint"])
    finish_rank()


if __name__ == "__main__":
    main()
