"""``python -m largetrain_core.training.plan TRAIN_CONFIG.json [options]`` (cli.py)."""

import sys

from largetrain_core.training.plan.cli import main

sys.exit(main())
