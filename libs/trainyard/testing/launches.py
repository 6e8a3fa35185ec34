"""How long runs took to start, read back from the streams: from a run's
``JobPlaced`` (on JOBS) to each node's ``ProcessesStarted`` report (on WORK)
and to the gang's ``RunStarted``.  Every time is the ``at`` its producer
stamped, all on one machine's clock.  Used by ``bench/launch.py``."""

from __future__ import annotations

import math
from collections import Counter

import msgspec

from trainyard.bus import Bus
from trainyard.events import JobEvent, JobPlaced, RunStarted
from trainyard.events.work import ProcessesStarted, StartRun, WorkMessage, decode_work
from trainyard.testing.streams import read_job_events, read_raw


class Latencies(msgspec.Struct):
    """Seconds per run (or per node of a run), in no particular order."""

    to_order: list[float]  # JobPlaced -> the dispatcher's StartRun, per node
    to_node_started: list[float]  # JobPlaced -> ProcessesStarted, per node
    to_run_started: list[float]  # JobPlaced -> RunStarted, per run
    placed: int  # runs placed
    started: int  # runs with a RunStarted
    launches_by_node: dict[str, int]  # ProcessesStarted per node


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summary(values: list[float]) -> dict[str, float]:
    """p50, p99 and max in milliseconds."""
    return {name: percentile(values, q) * 1000 for name, q in (("p50_ms", 0.5), ("p99_ms", 0.99), ("max_ms", 1.0))}


def latencies(events: list[JobEvent], work: list[WorkMessage], job_ids: set[str] | None = None) -> Latencies:
    """The latencies of the runs of ``job_ids`` (every job when None)."""
    placed: dict[str, float] = {}
    started: dict[str, float] = {}
    for e in events:
        if job_ids is not None and e.job_id not in job_ids:
            continue
        if isinstance(e, JobPlaced):
            placed.setdefault(e.run_id, e.at)
        elif isinstance(e, RunStarted):
            started.setdefault(e.run_id, e.at)
    orders: dict[tuple[str, str], float] = {}
    nodes: dict[tuple[str, str], float] = {}
    for m in work:
        key = (m.run_id, m.node_id)
        if isinstance(m, StartRun):
            orders.setdefault(key, m.at)
        elif isinstance(m, ProcessesStarted):
            nodes.setdefault(key, m.at)
    return Latencies(
        to_order=[at - placed[run] for (run, _), at in orders.items() if run in placed],
        to_node_started=[at - placed[run] for (run, _), at in nodes.items() if run in placed],
        to_run_started=[at - placed[run] for run, at in started.items() if run in placed],
        placed=len(placed),
        started=sum(1 for run in started if run in placed),
        launches_by_node=dict(Counter(node for (run, node) in nodes if run in placed)),
    )


async def read_work(bus: Bus) -> list[WorkMessage]:
    """Every order and report on the WORK stream."""
    return [decode_work(data) for _, _, data in await read_raw(bus, "WORK")]


async def read_latencies(bus: Bus, job_ids: set[str] | None = None) -> Latencies:
    return latencies(await read_job_events(bus), await read_work(bus), job_ids)
