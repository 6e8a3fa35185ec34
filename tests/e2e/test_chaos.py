"""Chaos, short: the benchmark's faults on the whole stack (SIGKILLs of
services, nats-server and Redis, a FLUSHALL with every finished job read
back while the projection rebuilds, a stall, the emulator and nats-server
restarting together), counted from the log the same way (bench/chaos.py
runs the long version)."""

from __future__ import annotations

import pytest

from trainyard.bus import Bus
from trainyard.local import LocalStack
from trainyard.store import Store
from trainyard.testing.chaos import Chaos, ChaosPlan

pytestmark = pytest.mark.e2e


async def test_a_short_chaos_run_loses_duplicates_and_strands_nothing(stack: LocalStack) -> None:
    assert stack.redis
    # A restart pair silent for longer than the stack's 15 s heartbeat timeout (see conftest).
    plan = ChaosPlan(
        jobs=200,
        rate=20.0,
        kills=8,
        flushes=1,
        stalls=1,
        stall_s=3.0,
        seed=11,
        drain_timeout_s=240.0,
        restart_pairs=1,
        pair_gap_s=10.0,
    )
    bus = await Bus.connect(stack.nats_admin_url, "e2e-chaos")
    store = Store.from_url(stack.redis.admin_url)
    try:
        report = await Chaos(stack, plan, bus, store, lambda line: None).run()
    finally:
        await bus.close()
        await store.close()

    assert sum(report.faults.values()) == plan.kills + plan.flushes + plan.stalls + plan.restart_pairs
    assert (report.lost, report.accepted_twice, report.run_twice, report.stuck, report.double_allocations) == (
        0,
        0,
        0,
        0,
        0,
    ), report
    assert report.ledger_minus_stream_gpu_s == pytest.approx(0.0, abs=1e-3)
    assert report.nodes_lost == report.failed_runs.get("node_failure", 0) == 0, report  # no false node loss
    assert report.reads.get("missing", 0) == report.reads.get("stale", 0) == 0, report
    # Filtered lists against per-job reads: after the wipe's rebuild, and over every job at the end.
    assert report.lists["checks"] == plan.flushes + 1 and report.lists["compared"] >= plan.jobs, report.lists
    assert report.lists.get("unlisted", 0) == report.lists.get("listed_wrongly", 0) == 0, report.lists
    assert report.statuses == {"succeeded": plan.jobs}, report
