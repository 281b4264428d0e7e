"""The plan (:class:`Plan`): its figures, what does not fit, its table and dict; the plan beside what a finished run measured."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from largetrain_core.training.plan.memory import ModelShape
from largetrain_core.training.plan.settings import GiB, PlanSettings
from largetrain_core.training.plan.throughput import Throughput


@dataclass
class Plan:
    """A training's plan; :meth:`to_dict` is plan.json. Bytes are per device unless named otherwise."""

    settings: PlanSettings
    config: dict  # the settings of the TrainConfig that matter here
    shape: ModelShape
    world_size: int
    precision: str
    seq_len: int
    tokens_per_step: int
    start_step: int
    memory: dict
    disk: dict
    device_memory: Optional[float]
    device_memory_source: str
    free_disk: Optional[float]
    free_disk_source: str
    throughput: Optional[Throughput]
    throughput_note: str = ""
    alternatives: list = field(default_factory=list)  # memory-saving changes that fit, when the peak does not

    @property
    def steps_to_run(self) -> int:
        return max(0, self.config["max_steps"] - self.start_step)

    @property
    def tokens_total(self) -> int:
        return self.config["max_steps"] * self.tokens_per_step

    @property
    def usable_memory(self) -> Optional[float]:
        return None if self.device_memory is None else self.device_memory * self.settings.usable_memory_fraction

    def timing(self) -> dict:
        """Seconds per step and for the run (the steps left to run, their evaluations and checkpoints, setup);
        None without a throughput. Evaluation is forward only: (2N + 4LHS) / (4N + 2N_t + 12LHS) of a training
        step's FLOPs per token (flops.model_flops_per_token)."""
        if self.throughput is None:
            return {"step_s": None, "run_s": None}
        c, s = self.config, self.shape
        step_s = self.tokens_per_step / self.throughput.tokens_per_s
        forward = (2 * s.parameters + 4 * s.layers * s.hidden * self.seq_len) / (
            4 * s.parameters + 2 * s.trainable + 12 * s.layers * s.hidden * self.seq_len
        )
        steps = self.steps_to_run
        evals = 0 if c["eval_strategy"] == "no" else steps // c["eval_steps"] + 1
        eval_tokens = (
            min(c["eval_max_sequences"], c.get("validation_sequences") or c["eval_max_sequences"]) * self.seq_len
        )
        eval_s = evals * eval_tokens * forward / self.throughput.tokens_per_s
        saves = steps // c["save_steps"] + 1 if steps else 0
        save_s = saves * (self.throughput.checkpoint_save_s or 0.0)
        setup_s = self.throughput.setup_s or 0.0
        return {
            "step_s": step_s,
            "train_s": steps * step_s,
            "eval_s": eval_s,
            "evaluations": evals,
            "checkpoint_s": save_s,
            "checkpoints": saves,
            "setup_s": setup_s,
            "run_s": steps * step_s + eval_s + save_s + setup_s,
            "checkpoint_time_known": self.throughput.checkpoint_save_s is not None,
        }

    def cost(self) -> Optional[float]:
        t = self.timing()["run_s"]
        price = self.settings.price_per_device_hour
        return None if t is None or price is None else t / 3600 * self.world_size * price

    def problems(self) -> list[str]:
        """What does not fit, each with what to change; [] when the plan fits (or nothing is known to check)."""
        p, gib = [], (lambda b: f"{b / GiB:.2f} GiB")
        m = self.memory
        if self.usable_memory is not None and m["peak"] > self.usable_memory:
            fits = "; ".join(f"{a['change']}: peak {gib(a['peak'])}" for a in self.alternatives if a["fits"])
            tried = "; ".join(f"{a['change']}: {gib(a['peak'])}" for a in self.alternatives if not a["fits"])
            p.append(
                f"memory: the planned peak per device is {gib(m['peak'])} (model states {gib(m['model_states'])}, "
                f"DeepSpeed buffers {gib(m['buffers'])}, activations {gib(m['activations'])}), more than "
                f"{self.settings.usable_memory_fraction:g} x {gib(self.device_memory)} of device memory "
                f"({self.device_memory_source}). "
                + (
                    f"Changes that fit: {fits}."
                    if fits
                    else f"None of these fits alone or together: {tried}; "
                    "use more ranks or a smaller model/sequence length."
                )
                + " (Or set plan.device_memory_gib / plan.usable_memory_fraction if the device has more.)"
            )
        need = self.disk["needed"]
        if self.free_disk is not None and need > self.free_disk:
            p.append(
                f"disk: the training needs {gib(need)} more on the storage root ({self.disk['formula']}), "
                f"{gib(self.free_disk)} is free ({self.free_disk_source}). Lower save_total_limit (now "
                f"{self.config['save_total_limit']}), free space, or use another storage root (LARGETRAIN_ROOT)"
            )
        t = self.timing()
        hours = None if t["run_s"] is None else t["run_s"] / 3600
        if self.settings.max_hours is not None and hours is not None and hours > self.settings.max_hours:
            p.append(
                f"time: planned {hours:.2f} h ({self.steps_to_run} steps x {t['step_s']:.3g} s + evaluation, "
                f"checkpoints, setup), more than max_hours {self.settings.max_hours:g}. "
                f"{self._steps_within(self.settings.max_hours * 3600)}, raise max_hours, or use more ranks"
            )
        cost = self.cost()
        if self.settings.max_cost is not None and cost is not None and cost > self.settings.max_cost:
            budget_s = self.settings.max_cost / (self.world_size * self.settings.price_per_device_hour) * 3600
            p.append(
                f"cost: planned {cost:.2f} {self.settings.currency} ({hours:.2f} h x {self.world_size} device(s) x "
                f"{self.settings.price_per_device_hour:g}), more than max_cost {self.settings.max_cost:g}. "
                f"{self._steps_within(budget_s)}, or raise max_cost"
            )
        return p

    def budget_problems(self) -> list[str]:
        """A max_hours or max_cost that cannot be checked because no throughput is known."""
        budgets = [n for n in ("max_hours", "max_cost") if getattr(self.settings, n) is not None]
        if not budgets or self.throughput is not None:
            return []
        return [
            f"time: {' and '.join('plan.' + b for b in budgets)} set, but no throughput is known to check "
            f"{'it' if len(budgets) == 1 else 'them'} against ({self.throughput_note}). Set plan.throughput to "
            "calibrate (or auto), or materialize optimization_report for this model and hardware"
        ]

    def _steps_within(self, seconds: float) -> str:
        t = self.timing()
        fixed = t["run_s"] - t["train_s"]
        per_step = t["step_s"] * (1 + (t["eval_s"] + t["checkpoint_s"]) / max(t["train_s"], 1e-9))
        steps = int(max(0.0, seconds - t["setup_s"]) // per_step) if per_step else 0
        return (
            f"Lower max_steps to about {self.start_step + steps} (the budget's {seconds / 3600:.2f} h; "
            f"{fixed:.0f} s of it fixed)"
            if steps > 0
            else "Not even one step fits the budget"
        )

    def to_dict(self) -> dict:
        t = self.timing()
        return {
            "settings": asdict(self.settings),
            "config": self.config,
            "model": asdict(self.shape),
            "world_size": self.world_size,
            "precision": self.precision,
            "seq_len": self.seq_len,
            "tokens_per_step": self.tokens_per_step,
            "start_step": self.start_step,
            "steps_to_run": self.steps_to_run,
            "tokens_total": self.tokens_total,
            "tokens_per_parameter": self.tokens_total / self.shape.parameters,
            "tokens_per_trainable_parameter": self.tokens_total / self.shape.trainable,
            "memory": self.memory,
            "disk": self.disk,
            "device_memory_bytes": self.device_memory,
            "device_memory_source": self.device_memory_source,
            "usable_memory_bytes": self.usable_memory,
            "free_disk_bytes": self.free_disk,
            "free_disk_source": self.free_disk_source,
            "throughput": asdict(self.throughput) if self.throughput else None,
            "throughput_note": self.throughput_note,
            "timing": t,
            "cost": self.cost(),
            "alternatives": self.alternatives,
            "problems": self.problems(),
        }

    def table(self) -> str:
        """The plan as a markdown table (quantity, planned value, how)."""

        def gib(b):
            return "" if b is None else f"{b / GiB:.3f} GiB"

        m, t, s = self.memory, self.timing(), self.shape
        rows = [
            ("parameters", f"{s.parameters:,}", f"{s.model_type}, {s.layers} layers, hidden {s.hidden}"),
            ("trainable parameters", f"{s.trainable:,}", self.config["mode"]),
            (
                "tokens per step",
                f"{self.tokens_per_step:,}",
                f"{self.config['micro_batch_size']} x {self.config['gradient_accumulation_steps']} x {self.world_size} "
                f"ranks x {self.seq_len}",
            ),
            (
                "tokens per parameter",
                f"{self.tokens_total / s.parameters:.2f}",
                f"{self.tokens_total:,} tokens in {self.config['max_steps']} steps (compute-optimal is ~20: "
                "Hoffmann et al. 2022)",
            ),
            ("weights per device", gib(m["weights"]), m["formulas"]["weights"]),
            ("gradients per device", gib(m["gradients"]), m["formulas"]["gradients"]),
            ("optimizer states per device", gib(m["optimizer_states"]), m["formulas"]["optimizer_states"]),
            (
                "model states per device",
                gib(m["model_states"]),
                f"ZeRO stage {self.config['zero_stage']}, N_d = {self.world_size} (Rajbhandari et al. 2020)",
            ),
            ("DeepSpeed buffers per device", gib(m["buffers"]), m["formulas"].get("buffers", "none at stage 0")),
            ("activations per device", gib(m["activations"]), m["formulas"]["activations"]),
            ("peak memory per device", gib(m["peak"]), m["formulas"]["peak"]),
            (
                "usable device memory",
                gib(self.usable_memory),
                f"{self.settings.usable_memory_fraction:g} x {gib(self.device_memory)} ({self.device_memory_source})",
            ),
            ("checkpoint size", gib(self.disk["checkpoint"]), self.disk["formula"]),
            (
                "disk needed",
                gib(self.disk["needed"]),
                f"{self.disk['formula_total']}; {self.free_disk_source}: {gib(self.free_disk) or 'unknown'}",
            ),
            (
                "throughput",
                "" if not self.throughput else f"{self.throughput.tokens_per_s:,.0f} tokens/s",
                self.throughput.detail if self.throughput else self.throughput_note,
            ),
            ("time per step", "" if t["step_s"] is None else f"{t['step_s']:.3g} s", "tokens per step / throughput"),
            (
                "time for the run",
                "" if t["run_s"] is None else f"{t['run_s'] / 3600:.3f} h",
                ""
                if t["run_s"] is None
                else f"{self.steps_to_run} steps {t['train_s']:.0f} s + {t['evaluations']} evaluations {t['eval_s']:.0f} s + "
                f"{t['checkpoints']} checkpoints {t['checkpoint_s']:.0f} s"
                f"{'' if t['checkpoint_time_known'] else ' (save time not measured)'} + setup {t['setup_s']:.0f} s",
            ),
            (
                "cost",
                "" if self.cost() is None else f"{self.cost():.2f} {self.settings.currency}",
                "no price_per_device_hour"
                if self.settings.price_per_device_hour is None
                else f"hours x {self.world_size} device(s) x {self.settings.price_per_device_hour:g}",
            ),
        ]
        return "| quantity | plan | how |\n|---|---|---|\n" + "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows)


def plan_numbers(plan: dict) -> dict:
    """The planned figures of plan.json's dict as flat numbers, the unit in the name (GiB to 4 significant
    decimals, seconds, hours, the cost in the plan's currency): for metadata and plots."""
    t = plan["timing"]
    n = {
        "plan_parameters": plan["model"]["parameters"],
        "plan_trainable_parameters": plan["model"]["trainable"],
        "plan_tokens_per_step": plan["tokens_per_step"],
        "plan_peak_memory_gib": round(plan["memory"]["peak"] / GiB, 4),
        "plan_model_states_gib": round(plan["memory"]["model_states"] / GiB, 4),
        "plan_activations_gib": round(plan["memory"]["activations"] / GiB, 4),
        "plan_checkpoint_gib": round(plan["disk"]["checkpoint"] / GiB, 4),
        "plan_tokens_per_parameter": round(plan["tokens_per_parameter"], 3),
        "plan_throughput_source": plan["throughput"]["source"] if plan.get("throughput") else "none",
    }
    if t.get("step_s") is not None:
        n.update(plan_step_seconds=round(t["step_s"], 4), plan_run_hours=round(t["run_s"] / 3600, 4))
    if plan.get("cost") is not None:
        n["plan_cost"] = round(plan["cost"], 2)
    return n


def plan_vs_measured(plan: dict, summary: dict, rows: list[dict], calibration: dict | None = None) -> dict:
    """The plan (plan.json's dict) beside what the finished run measured: ``rows`` of (quantity, planned,
    measured, measured / planned) and ``table`` (markdown). Memory: the trainer's peak per rank (CUDA's
    peak allocation; on CPU the peak resident set, which also counts the interpreter and libraries),
    and the calibration's peak allocation (``calibration``: its calibration.json, when one ran before the
    launch); time: the median step time of ``rows`` (metrics.jsonl) and the run's wall time of this start."""
    import statistics

    out = []

    def add(name, planned, measured, unit, note=""):
        ratio = measured / planned if planned and measured is not None else None
        out.append(
            {"quantity": name, "planned": planned, "measured": measured, "unit": unit, "ratio": ratio, "note": note}
        )

    last = rows[-1] if rows else {}
    cuda_mem = last.get("peak_memory_gib")
    cpu_mem = last.get("peak_rss_gib")
    measured_mem = cuda_mem if cuda_mem is not None else cpu_mem
    add(
        "peak memory per device",
        plan["memory"]["peak"] / GiB,
        measured_mem,
        "GiB",
        "CUDA peak allocated" if cuda_mem is not None else "CPU peak resident set: also the interpreter and libraries",
    )
    if calibration is not None:
        add(
            "peak memory per device, calibration",
            plan["memory"]["peak"] / GiB,
            calibration["peak_step_bytes"] / GiB,
            "GiB",
            f"{calibration['memory_measure']}, before the launch",
        )
    times = [r["step_time_s"] for r in rows if r.get("step_time_s") is not None]
    add(
        "time per step",
        plan["timing"].get("step_s"),
        statistics.median(times) if times else None,
        "s",
        "median over the run's steps",
    )
    train_s = summary.get("train_seconds")
    add(
        "time for the run",
        plan["timing"].get("run_s"),
        train_s,
        "s",
        "wall time of this start (steps, evaluation, saves)",
    )
    add(
        "tokens per second",
        plan["throughput"]["tokens_per_s"] if plan.get("throughput") else None,
        summary.get("tokens_per_s"),
        "tokens/s",
        "the run's, evaluation excluded",
    )

    def fmt(v):
        return "" if v is None else f"{v:,.4g}"

    table = "| quantity | planned | measured | measured / planned | note |\n|---|---|---|---|---|\n" + "\n".join(
        f"| {r['quantity']} ({r['unit']}) | {fmt(r['planned'])} | {fmt(r['measured'])} | "
        f"{'' if r['ratio'] is None else format(r['ratio'], '.2f')} | {r['note']} |"
        for r in out
    )
    return {"rows": out, "table": table}
