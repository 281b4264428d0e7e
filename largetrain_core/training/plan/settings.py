"""The plan's settings (:class:`PlanSettings`), its error and the files it writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from largetrain_core.settings import described


GiB = 2**30
THROUGHPUT_SOURCES = ("auto", "calibrate", "optimization_report", "none")
PLAN, PLAN_TABLE = "plan.json", "plan.md"  # written into the training's output directory before its launch


@dataclass
class PlanSettings:
    """What the training plan checks against, and where its throughput comes from."""

    check: bool = field(
        default=True,
        metadata=described(
            "Refuse to launch a training whose plan does not fit the device memory, the storage root's free disk, "
            "max_hours or max_cost (the failure says what to change); false = compute and show the plan only."
        ),
    )
    device_memory_gib: Optional[float] = field(
        default=None,
        metadata=described(
            "Memory of one device (GiB). null = detected: CUDA, the calibration's device (or nvidia-smi); CPU, this "
            "host's MemAvailable divided by the ranks on the host."
        ),
    )
    usable_memory_fraction: float = field(
        default=0.9,
        metadata=described(
            "Share of device_memory_gib the planned peak may use, in (0, 1]: headroom for what tensor allocations do "
            "not count (the CUDA context, allocator fragmentation; on CPU the interpreter and libraries, ~0.5 GiB per "
            "rank). An assumption: set it from your own peak reserved / peak allocated."
        ),
    )
    throughput: Literal["auto", "calibrate", "optimization_report", "none"] = field(
        default="auto",
        metadata=described(
            f"Where tokens/s come from, one of {', '.join(THROUGHPUT_SOURCES)}: calibrate (a short run of the real "
            "training on the real ranks before the launch: calibration_steps timed steps), optimization_report (its "
            "figures for the same model, hardware, ranks and settings), auto (the report when it matches, else a "
            "calibration when max_hours, max_cost or price_per_device_hour asks for a time, else no time estimate), "
            "none (no time or cost estimate)."
        ),
    )
    calibration_steps: int = field(
        default=3,
        metadata=described(
            "Timed optimizer steps of the calibration (after 2 profiled ones that measure memory), >= 1."
        ),
    )
    price_per_device_hour: Optional[float] = field(
        default=None,
        metadata=described(
            "Price of one device (GPU; on CPU one rank) for one hour, in `currency`; null = no cost estimate."
        ),
    )
    currency: str = field(default="USD", metadata=described("Currency of price_per_device_hour and max_cost."))
    max_hours: Optional[float] = field(
        default=None,
        metadata=described(
            "Refuse a training planned to take longer than this many hours (wall clock); null = no limit."
        ),
    )
    max_cost: Optional[float] = field(
        default=None,
        metadata=described(
            "Refuse a training planned to cost more than this (needs price_per_device_hour); null = no limit."
        ),
    )

    def problems(self) -> list[str]:
        p = []
        if self.throughput not in THROUGHPUT_SOURCES:
            p.append(f"plan.throughput must be one of {', '.join(THROUGHPUT_SOURCES)}, not {self.throughput!r}")
        if not 0 < self.usable_memory_fraction <= 1:
            p.append(f"plan.usable_memory_fraction must be within (0, 1], not {self.usable_memory_fraction}")
        if self.calibration_steps < 1:
            p.append(f"plan.calibration_steps must be >= 1, not {self.calibration_steps}")
        for name in ("device_memory_gib", "price_per_device_hour", "max_hours", "max_cost"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                p.append(f"plan.{name} must be > 0 or null, not {v}")
        if self.max_cost is not None and self.price_per_device_hour is None:
            p.append("plan.max_cost needs plan.price_per_device_hour (the cost is hours x devices x price)")
        if (self.max_hours is not None or self.max_cost is not None) and self.throughput == "none":
            p.append("plan.max_hours and plan.max_cost need a throughput: set plan.throughput to auto or calibrate")
        return p


class PlanError(ValueError):
    """A training whose plan does not fit; the message says what and what to change."""
