"""A simple demand forecast: the ordinary least-squares straight line through
daily demand, extended forward.

For days ``x = 0, 1, ..., n-1`` with demand ``y`` (GPU-hours per day):

    slope     = sum((x - mean_x) * (y - mean_y)) / sum((x - mean_x) ** 2)
    intercept = mean_y - slope * mean_x
    forecast(x) = max(0, intercept + slope * x)

With one day of history the trend is flat (slope 0); with none there is no
forecast.  ``r2`` (coefficient of determination) says how well a straight
line fits: near 1 a steady trend, near 0 noise around a level.  Pure and
deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec


class Trend(msgspec.Struct, frozen=True):
    slope: float  # change of demand per day, in GPU-hours per day
    intercept: float  # fitted demand on day 0, GPU-hours
    r2: float  # 0..1; 1.0 when every point lies on the line (or all are equal)
    days: int  # days of history the line was fitted to

    def at(self, day: float) -> float:
        """Fitted demand on ``day`` (days after the first day of history), never negative."""
        return max(0.0, self.intercept + self.slope * day)


def fit_trend(values: Sequence[float]) -> Trend | None:
    """The least-squares line through ``values`` (one per day, oldest first)."""
    n = len(values)
    if n == 0:
        return None
    mean_x = (n - 1) / 2
    mean_y = sum(values) / n
    sxx = sum((x - mean_x) ** 2 for x in range(n))
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(values))
    slope = sxy / sxx if sxx else 0.0
    intercept = mean_y - slope * mean_x
    ss_tot = sum((y - mean_y) ** 2 for y in values)
    ss_res = sum((y - (intercept + slope * x)) ** 2 for x, y in enumerate(values))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 1e-12 else 1.0
    return Trend(slope=slope, intercept=intercept, r2=max(0.0, min(1.0, r2)), days=n)


def extend(trend: Trend, horizon: int) -> list[float]:
    """Forecast demand for the ``horizon`` days after the history."""
    return [trend.at(trend.days + i) for i in range(horizon)]


def first_day_over(forecast: Sequence[float], capacity: float) -> int | None:
    """Index of the first forecast day whose demand exceeds ``capacity``."""
    for i, value in enumerate(forecast):
        if value > capacity + 1e-9:
            return i
    return None
