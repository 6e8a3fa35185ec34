"""Inline SVG line charts for the HTML reports: no plotting library, text
that diffs and embeds anywhere."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from html import escape

import msgspec

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
WIDTH, HEIGHT = 760, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 170, 28, 44


class Series(msgspec.Struct, frozen=True):
    name: str
    points: list[tuple[float, float]]  # (Unix seconds, value)
    dashed: bool = False
    color: str | None = None


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    step = 10 ** len(str(int(value))) / 10 if value >= 1 else 0.1
    while step * 10 < value:
        step *= 10
    for mult in (1, 2, 2.5, 5, 10):
        if step * mult >= value:
            return step * mult
    return value  # pragma: no cover


def _label_time(at: float, span: float) -> str:
    when = dt.datetime.fromtimestamp(at, dt.UTC)
    return when.strftime("%m-%d %H:%M" if span < 3 * 86_400 else "%Y-%m-%d")


def line_chart(title: str, y_label: str, series: Sequence[Series]) -> str:
    """An SVG line chart of ``series`` against UTC time."""
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points]
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}" font-family="sans-serif" font-size="11">'
        f'<text x="{LEFT}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>'
    )
    if not xs:
        return head + f'<text x="{LEFT}" y="{HEIGHT // 2}">no data in this window</text></svg>'
    x0, x1 = min(xs), max(xs)
    x1 = x1 if x1 > x0 else x0 + 1
    ymax = _nice_max(max(ys))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return TOP + plot_h - y / ymax * plot_h

    parts = [head]
    for i in range(6):
        value = ymax * i / 5
        y = py(value)
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{value:,.4g}</text>')
    for i in range(5):
        x = x0 + (x1 - x0) * i / 4
        parts.append(
            f'<text x="{px(x):.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{_label_time(x, x1 - x0)}</text>'
        )
    parts.append(
        f'<text x="14" y="{TOP + plot_h / 2:.1f}" transform="rotate(-90 14 {TOP + plot_h / 2:.1f})" '
        f'text-anchor="middle">{escape(y_label)}</text>'
    )
    parts.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>')
    for i, s in enumerate(series):
        color = s.color or PALETTE[i % len(PALETTE)]
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
        if len(s.points) == 1:
            x, y = s.points[0]
            parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>')
        ly = TOP + 14 + i * 16
        parts.append(
            f'<line x1="{WIDTH - RIGHT + 10}" y1="{ly - 4}" x2="{WIDTH - RIGHT + 30}" y2="{ly - 4}" '
            f'stroke="{color}" stroke-width="2"{dash}/>'
        )
        parts.append(f'<text x="{WIDTH - RIGHT + 36}" y="{ly}">{escape(s.name)}</text>')
    parts.append("</svg>")
    return "".join(parts)
