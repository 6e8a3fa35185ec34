"""Two placement processes on the local stack: the leader is SIGKILLed in the
middle of a run and the standby takes over once the lease expires.  Every job
is placed exactly once and succeeds once, and no GPU is given twice."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from test_job_life import check_exactly_once, submit_all, wait_all_succeeded, workload

from trainyard.bus import Bus
from trainyard.bus.lease import BUCKET
from trainyard.events import JobPlaced
from trainyard.local import LocalStack
from trainyard.store import Store, views
from trainyard.testing.streams import read_job_events
from trainyard_placement.main import lease_key

pytestmark = pytest.mark.e2e


async def lease_holder(bus: Bus, cluster: str, timeout: float = 15.0) -> int:
    """The pid of the placement process that holds the cluster's lease."""
    kv = await bus.js.key_value(BUCKET)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            entry = await kv.get(lease_key(cluster))
            if entry.value:
                return int(entry.value.decode())
        except Exception:  # noqa: BLE001 - no holder yet (expired, deleted or not written)
            pass
        await asyncio.sleep(0.1)
    raise AssertionError("no placement process holds the lease")


async def wait_for_holder(bus: Bus, cluster: str, pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await lease_holder(bus, cluster, timeout) == pid:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"process {pid} did not take the placement lease")


async def test_the_standby_takes_over_when_the_placement_leader_is_killed(stack: LocalStack) -> None:
    assert stack.nats and stack.redis
    bus = await Bus.connect(stack.nats.admin_url, "e2e")
    store = Store.from_url(stack.redis.admin_url)
    cluster = stack.config.cluster
    log_path = stack.data_dir / "logs" / "placement-standby.log"
    with open(log_path, "ab") as log:
        second = subprocess.Popen(
            [sys.executable, "-m", "trainyard_placement"],
            # A second process on this host: its own metrics port (0: none), not the leader's.
            env={
                **stack.service_env("placement"),
                "TRAINYARD_LOG_LEVEL": "INFO",
                "TRAINYARD_PLACEMENT_METRICS_PORT": "0",
            },
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    jobs = workload(200, seed=17)
    try:
        leader = await lease_holder(bus, cluster)
        pids = {stack.procs["placement"].pid, second.pid}
        assert leader in pids
        standby = (pids - {leader}).pop()
        submitting = asyncio.create_task(submit_all(stack, bus, jobs))
        # Kill the leader once it has placed part of the work.
        deadline, placed_at_kill = time.monotonic() + 60, 0
        while time.monotonic() < deadline and placed_at_kill < 40:
            counts = await views.status_counts(store)
            placed_at_kill = sum(counts.get(s, 0) for s in ("placed", "running", "succeeded"))
            await asyncio.sleep(0.1)
        assert 40 <= placed_at_kill < len(jobs)  # the rest can only be placed by the standby
        if leader == second.pid:
            os.kill(second.pid, signal.SIGKILL)
            second.wait()
        else:
            stack.kill("placement")
        await wait_for_holder(bus, cluster, standby, timeout=30)
        await submitting
        await wait_all_succeeded(store, len(jobs), timeout=180)
        await check_exactly_once(stack, bus, store, jobs)

        # Each job was placed exactly once, by either process.
        placed = Counter(e.job_id for e in await read_job_events(bus) if isinstance(e, JobPlaced))
        assert set(placed) == {j for j, _ in jobs} and set(placed.values()) == {1}
        assert await lease_holder(bus, cluster) == standby
        if standby == second.pid:
            assert "placement: leading" in log_path.read_text(errors="replace")
        assert {n: rc for n, rc in stack.exited().items() if n != "placement"} == {}
    finally:
        if second.poll() is None:
            second.send_signal(signal.SIGTERM)
            try:
                second.wait(15)
            except subprocess.TimeoutExpired:
                second.kill()
                second.wait()
        print(f"--- placement standby (exit {second.poll()}) ---\n{log_path.read_text(errors='replace')[-4000:]}")
        await bus.close()
        await store.close()
