"""Charts as PNG files (matplotlib's Agg renderer, no display needed): a training run's curves
(:func:`training_curves_png`), bar charts against a baseline (:func:`bars_png`) and the size distribution of
duplicate clusters (:func:`cluster_sizes_png`). The same inputs
give the same bytes (no time stamp is written)."""

from __future__ import annotations

import io
import math
import os
from pathlib import Path


def _figure(width: float, height: float, rows: int, cols: int = 1, sharex: bool = False):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, cols, sharex=sharex, squeeze=False)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _save(fig, out: Path) -> Path:
    """Write ``fig`` as PNG to ``out`` atomically (a temporary sibling renamed into place)."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_bytes(_png(fig))
    os.replace(tmp, out)
    return out


def _finite(rows: list[dict], key: str) -> tuple[list, list]:
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return [p[0] for p in pts], [p[1] for p in pts]


def training_curves_png(rows: list[dict], out: Path, title: str = "training") -> Path:
    """Two panels over the optimizer step (metrics.jsonl rows, ascending): the training loss of every
    step and the validation loss of every evaluation (``eval_loss``), in nats; and the learning rate.
    Labelled axes and ticks; non-finite values are left out. Atomic write. Returns ``out``."""
    from matplotlib.ticker import MaxNLocator

    fig, axes = _figure(8, 6, 2, sharex=True)
    ax_loss, ax_lr = axes[0][0], axes[1][0]
    x, y = _finite(rows, "loss")
    ax_loss.plot(x, y, color="#1f77b4", linewidth=1.2, label="training loss")
    ex, ey = _finite(rows, "eval_loss")
    if ex:
        ax_loss.plot(ex, ey, color="#d62728", marker="o", markersize=4, linewidth=1.2, label="validation loss")
    ax_loss.set_ylabel("loss (nats)")
    ax_loss.set_title(title)
    ax_loss.grid(True, alpha=0.3)
    ax_loss.legend(loc="upper right")
    x, y = _finite(rows, "lr")
    ax_lr.plot(x, y, color="#2ca02c", linewidth=1.2)
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("optimizer step")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    ax_lr.grid(True, alpha=0.3)
    ax_lr.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _save(fig, out)


def bars_png(panels: list[tuple[str, dict[str, float | None], str]], baseline: str, out: Path, title: str) -> Path:
    """One bar panel per ``(y label, {bar name: value}, "ratio" | "difference")``, in a grid of two
    columns; the ``baseline`` bar's value is drawn as a dashed line across each panel and every other
    bar is labelled with its ratio to it ("1.23x") or its difference ("+0.012"). Missing values (None)
    leave an empty slot labelled "n/a". Atomic write."""
    cols = 2
    rows = math.ceil(len(panels) / cols)
    fig, axes = _figure(5.5 * cols, 3.6 * rows, rows, cols)
    for i, (label, values, how) in enumerate(panels):
        ax = axes[i // cols][i % cols]
        names = list(values)
        heights = [values[n] if values[n] is not None else 0.0 for n in names]
        colors = ["#7f7f7f" if n == baseline else "#1f77b4" for n in names]
        bars = ax.bar(range(len(names)), heights, color=colors)
        base = values.get(baseline)
        if base:
            ax.axhline(base, color="#7f7f7f", linestyle="--", linewidth=1)
        for n, bar in zip(names, bars):
            v = values[n]
            if v is None or n == baseline or base is None:
                text = "n/a" if v is None else "baseline" if n == baseline else f"{v:.3g}"
            else:
                text = f"{v - base:+.3f}" if how == "difference" else f"{v / base:.2f}x" if base else f"{v:.3g}"
            ax.annotate(
                text,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
                xytext=(0, 2),
                textcoords="offset points",
            )
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
        ax.margins(y=0.15)
    for j in range(len(panels), rows * cols):
        axes[j // cols][j % cols].set_visible(False)
    fig.suptitle(title)
    return _save(fig, out)


def cluster_sizes_png(series: dict[str, dict[int, int]], title: str) -> bytes:
    """Duplicate clusters by size, one series per kind (``{"exact": {size: clusters}, "near": ...}``; a
    cluster's size counts its kept document and every document removed as its copy), on log-log axes: the
    heavy tail that a chain of templated documents makes (marin#6854) stands out. Returns the PNG's bytes."""
    fig, axes = _figure(6, 3.6, 1)
    ax = axes[0][0]
    colors = {"exact": "#7f7f7f", "near": "#d62728"}
    for kind, counts in series.items():
        if counts:
            sizes = sorted(counts)
            ax.plot(
                sizes,
                [counts[s] for s in sizes],
                marker="o",
                markersize=4,
                linewidth=1,
                label=kind,
                color=colors.get(kind),
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("cluster size (documents: the kept one and its removed copies)")
    ax.set_ylabel("clusters")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if any(series.values()):
        ax.legend(loc="upper right")
    return _png(fig)
