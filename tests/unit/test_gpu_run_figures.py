"""benchmarks/gpu_run.py's fp16 figures from metrics rows: the loss-scale history and the resume's bitwise
comparison, which the CPU rehearsal (tests/integration/test_gpu_run.py, fp32: no loss scale) cannot reach."""

import importlib.util
import math
from pathlib import Path

from helpers import REPO


def gpu_run():
    spec = importlib.util.spec_from_file_location("gpu_run", REPO / "benchmarks" / "gpu_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(scales, skipped, start=1):
    out, total = [], 0
    for i, (scale, skip) in enumerate(zip(scales, skipped)):
        total += skip
        out.append(
            {
                "step": start + i,
                "loss": 10.0 - i / 8,
                "loss_scale": scale,
                "skipped_steps": total,
                "step_skipped": bool(skip),
            }
        )
    return out


def test_loss_scale_history_lists_each_change_and_the_skipped_steps():
    g = gpu_run()
    scales = [2.0**16, 2.0**16, 2.0**15, 2.0**15, 2.0**14, 2.0**14]
    skipped = [1, 0, 1, 0, 1, 0]
    h = g.loss_scale_history(rows(scales, skipped))
    assert h["loss_scale_history"] == [[1, 2.0**16, 1], [3, 2.0**15, 2], [5, 2.0**14, 3]]
    assert h["skipped_steps"] == 3 and h["skipped_step_numbers"] == [1, 3, 5]
    none = g.loss_scale_history([{"step": 1, "loss": 1.0}])  # fp32, bf16: no loss scale
    assert none == {"loss_scale_history": None, "skipped_steps": None, "skipped_step_numbers": None}


def test_resume_is_bitwise_equal_only_when_every_scale_and_skip_count_is():
    g = gpu_run()
    scales, skipped = [2.0**16, 2.0**15, 2.0**15, 2.0**15], [1, 1, 0, 0]
    first = {"summary": {"precision": "fp16"}, "rows": rows(scales, skipped)}
    ckpt = Path("/x/fp16_zero2_ac/checkpoints/step-000002")

    def resumed(scales_after, skipped_after, saved=2.0**15):
        r = rows(scales, skipped)[2:]
        for row, s, k in zip(r, scales_after, skipped_after):
            row["loss_scale"], row["skipped_steps"] = s, k
        return {"rows": r, "error": None, "seconds": 1.0, "checkpoint_loss_scale": saved}

    same = g.resume_figures(first, resumed([2.0**15, 2.0**15], [2, 2]), ckpt)
    assert same["loss_scale_bitwise_equal"] is True and same["losses_equal"] is True
    assert same["resumed_from_step"] == 2 and same["steps_compared"] == 2
    assert same["checkpoint_loss_scale"] == same["uninterrupted_loss_scale_at_checkpoint"] == 2.0**15
    one_ulp = math.nextafter(2.0**15, 0.0)
    assert g.resume_figures(first, resumed([2.0**15, one_ulp], [2, 2]), ckpt)["loss_scale_bitwise_equal"] is False
    assert g.resume_figures(first, resumed([2.0**15, 2.0**15], [2, 3]), ckpt)["loss_scale_bitwise_equal"] is False
    # a scale not restored: the checkpoint's differs from the uninterrupted run's at that step
    assert (
        g.resume_figures(first, resumed([2.0**15, 2.0**15], [2, 2], saved=2.0**16), ckpt)["loss_scale_bitwise_equal"]
        is False
    )
