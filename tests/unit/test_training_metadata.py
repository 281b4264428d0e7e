"""The training assets' metadata that a person reads on the asset page (largetrain_core.stages.training_metadata)."""

import math

from largetrain_core.stages.training_metadata import SPARK_LEVELS, loss_sparkline


def test_the_loss_sparkline_draws_each_span_of_steps_by_its_mean_loss():
    rows = [{"step": s, "loss": 9.0 - s} for s in range(1, 9)]  # 8.0 ... 1.0, falling evenly
    assert loss_sparkline(rows, width=8) == "loss 8.000 → 1.000, steps 1-8: █▇▆▅▄▃▂▁"
    # two steps per span: the spans' means 7.5, 5.5, 3.5, 1.5 drawn at the top, 2/3, 1/3 and the bottom
    assert loss_sparkline(rows, width=4).endswith(": █▆▃▁")
    flat = [{"step": s, "loss": 2.0} for s in range(1, 4)]
    assert loss_sparkline(flat).endswith(f": {SPARK_LEVELS[0] * 3}")


def test_skipped_steps_and_non_finite_losses_are_left_out_of_the_sparkline():
    rows = [
        {"step": 1, "loss": 4.0},
        {"step": 2, "loss": math.inf, "step_skipped": True},  # fp16 overflow: no update
        {"step": 3, "loss": math.nan},
        {"step": 4, "loss": 1.0},
    ]
    assert loss_sparkline(rows, width=4) == "loss 4.000 → 1.000, steps 1-4: █▁"
    assert loss_sparkline([{"step": 1, "loss": math.nan}]) == ""
