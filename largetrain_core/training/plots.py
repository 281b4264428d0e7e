"""The training loss curve as a standalone SVG (no plotting library needed; any browser shows it)."""

from __future__ import annotations

import math
import os
from pathlib import Path

def loss_curve_svg(rows: list[dict], out: Path, title: str = "training loss") -> Path:
    """Write the loss curve (x: optimizer step, y: loss in nats, linear axes, min/max labelled) as a
    standalone SVG (no plotting library needed; any browser shows it). Atomic write. Returns ``out``."""
    pts = [(r["step"], r["loss"]) for r in rows if r.get("loss") is not None and math.isfinite(r["loss"])]
    w, h, left, right, top, bottom = 640, 360, 60, 20, 30, 40
    if pts:
        x0, x1 = pts[0][0], max(pts[-1][0], pts[0][0] + 1)
        y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
        y1 = y1 if y1 > y0 else y0 + 1
        sx = lambda x: left + (x - x0) / (x1 - x0) * (w - left - right)  # noqa: E731
        sy = lambda y: top + (y1 - y) / (y1 - y0) * (h - top - bottom)  # noqa: E731
        path = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for i, (x, y) in enumerate(pts))
    else:
        x0 = x1 = 0
        y0 = y1 = float("nan")
        path = ""
    svg = f"""<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="{w}" height="{h}" fill="white"/>
<text x="{w / 2}" y="18" text-anchor="middle" font-size="14">{title}</text>
<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" stroke="black"/>
<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="black"/>
<text x="{left}" y="{h - bottom + 16}" text-anchor="middle">{x0}</text>
<text x="{w - right}" y="{h - bottom + 16}" text-anchor="middle">{x1}</text>
<text x="{w / 2}" y="{h - 8}" text-anchor="middle">step</text>
<text x="{left - 6}" y="{top + 4}" text-anchor="end">{y1:.3f}</text>
<text x="{left - 6}" y="{h - bottom}" text-anchor="end">{y0:.3f}</text>
<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" text-anchor="middle">loss (nats)</text>
<path d="{path}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>
</svg>
"""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(svg)
    os.replace(tmp, out)
    return out
