"""Capacity-planning reports: pure computations over the ledger's records
(:mod:`~trainyard.reports.capacity`, :mod:`~trainyard.reports.queue_wait`,
:mod:`~trainyard.reports.forecast`) and their rendering as HTML with inline
SVG charts plus CSV (:mod:`~trainyard.reports.render`), and the reading of
their window's bounds (:mod:`~trainyard.reports.window`).  Reading the ledger
and Redis, and writing files, is the CLI's and the gateway's job."""

from trainyard.reports.capacity import (
    FORECAST_METHOD,
    CapacityReport,
    CapacityRow,
    ForecastRow,
    LostWorkRow,
    TrendRow,
    capacity_from_nodes,
    capacity_report,
    parse_capacity,
    window_problem,
)
from trainyard.reports.forecast import Trend, fit_trend
from trainyard.reports.queue_wait import PendingSpan, WaitStats, pending_spans, percentile, wait_stats
from trainyard.reports.render import report_files
from trainyard.reports.window import parse_instant

__all__ = [
    "FORECAST_METHOD",
    "CapacityReport",
    "CapacityRow",
    "ForecastRow",
    "LostWorkRow",
    "PendingSpan",
    "Trend",
    "TrendRow",
    "WaitStats",
    "capacity_from_nodes",
    "capacity_report",
    "fit_trend",
    "parse_capacity",
    "window_problem",
    "parse_instant",
    "pending_spans",
    "percentile",
    "report_files",
    "wait_stats",
]
