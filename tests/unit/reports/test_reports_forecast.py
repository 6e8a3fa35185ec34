"""The demand forecast: an ordinary least-squares straight line through daily demand."""

from __future__ import annotations

import pytest

from trainyard.reports.forecast import extend, first_day_over, fit_trend


@pytest.mark.parametrize(
    ("history", "slope", "intercept", "r2", "next_days"),
    [
        pytest.param(
            [10.0, 20.0, 30.0, 40.0], 10.0, 10.0, 1.0, [50.0, 60.0], id="a steady rise continues at the same pace"
        ),
        pytest.param([50.0, 50.0, 50.0], 0.0, 50.0, 1.0, [50.0, 50.0], id="flat demand forecasts the same level"),
        pytest.param([7.0], 0.0, 7.0, 1.0, [7.0, 7.0], id="one day of history gives a flat trend at that day"),
        pytest.param(
            [40.0, 30.0, 20.0, 10.0], -10.0, 40.0, 1.0, [0.0, 0.0], id="a falling trend is floored at zero demand"
        ),
        pytest.param(
            [0.0, 10.0, 0.0, 10.0],
            2.0,
            2.0,
            0.2,
            [10.0, 12.0],
            id="noise around a level fits a weak trend with a low r2",
        ),
    ],
)
def test_fit_trend(history, slope, intercept, r2, next_days):
    trend = fit_trend(history)

    assert trend is not None
    assert trend.slope == pytest.approx(slope)
    assert trend.intercept == pytest.approx(intercept)
    assert trend.r2 == pytest.approx(r2)
    assert trend.days == len(history)
    assert extend(trend, 2) == pytest.approx(next_days)


def test_no_history_gives_no_trend():
    assert fit_trend([]) is None


@pytest.mark.parametrize(
    ("forecast", "capacity", "day"),
    [
        pytest.param([10.0, 20.0, 30.0], 25.0, 2, id="the first day above capacity is found"),
        pytest.param([10.0, 25.0, 25.0], 25.0, None, id="demand equal to capacity is not over it"),
        pytest.param([], 25.0, None, id="an empty forecast is never over"),
    ],
)
def test_first_day_over(forecast, capacity, day):
    assert first_day_over(forecast, capacity) == day
