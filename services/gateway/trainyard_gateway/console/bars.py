"""Usage as stacked bars, drawn on the server as SVG: one bar per bucket (day
or hour), one segment per tenant (or queue, or GPU type) stacked in palette
order.  A bar stands for its own bucket only, so ten minutes of use today is a
short bar today, never a slope drawn across yesterday."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from trainyard_gateway.console.palette import Palette

WIDTH, HEIGHT = 960, 300
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 12, 40
MAX_LABELS = 16


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5 or 5 times a power of ten at or above ``value`` (1 for nothing)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(float(m * power) for m in (1, 2, 2.5, 5, 10) if m * power >= value - 1e-12)


def bucket_label(at: float, bucket_s: float) -> str:
    when = dt.datetime.fromtimestamp(at, dt.UTC)
    if bucket_s >= 86_400:
        return when.strftime("%b %d")
    return when.strftime("%b %d %H:00" if when.hour == 0 else "%H:00")


def stacked_bars(
    x: list[float], series: dict[str, list[float]], palette: Palette, bucket_s: float, unit: str = "GPU-h"
) -> dict[str, Any]:
    """Rectangles, axis ticks and labels of the chart of ``series`` (values per
    bucket starting at ``x``), in an SVG of WIDTH x HEIGHT user units."""
    n = len(x)
    totals = [sum(values[i] for values in series.values()) for i in range(n)]
    top = nice_ceiling(max(totals, default=0.0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(1, n)
    bar_w = max(1.0, slot * 0.8)
    order = [name for name, _ in palette.legend(series)] + sorted(set(series) - set(palette.swatches))
    bars = []
    for i in range(n):
        base = 0.0
        for name in order:
            value = series[name][i]
            if value <= 0:
                continue
            y0, y1 = base / top * plot_h, (base + value) / top * plot_h
            sw = palette(name)
            bars.append(
                {
                    "key": name,
                    "bucket": bucket_label(x[i], bucket_s),
                    "value": value,
                    "x": round(LEFT + i * slot + (slot - bar_w) / 2, 2),
                    "y": round(TOP + plot_h - y1, 2),
                    "w": round(bar_w, 2),
                    "h": round(max(y1 - y0, 0.5), 2),
                    "colour": sw.colour,
                    "pattern": sw.pattern,
                }
            )
            base += value
    stride = max(1, math.ceil(n / MAX_LABELS))
    return {
        "width": WIDTH,
        "height": HEIGHT,
        "left": LEFT,
        "right": WIDTH - RIGHT,
        "bottom": TOP + plot_h,
        "bars": bars,
        "totals": totals,
        "y_ticks": [{"y": round(TOP + plot_h - k / 4 * plot_h, 2), "label": f"{top * k / 4:g}"} for k in range(5)],
        "x_labels": [
            {"x": round(LEFT + i * slot + slot / 2, 2), "label": bucket_label(x[i], bucket_s)}
            for i in range(0, n, stride)
        ],
        "unit": unit,
    }
