"""Automatic recovery on the emulated cluster, every service in its own
process: a fatal XID on a node that runs part of a 4-node gang isolates the
node, and the whole gang is placed again on healthy nodes and finishes."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from trainyard.agent.control import ControlRequest, decode_reply, emulator_control_subject, encode
from trainyard.bus import Bus
from trainyard.core.invariants import check_job_log
from trainyard.domain import JobSpec, Role
from trainyard.events import JobAdmitted, JobPlaced, RunFailed, SubmitJob, subjects
from trainyard.ledger import Ledger
from trainyard.local import LocalStack
from trainyard.store import Store, views
from trainyard.testing.streams import read_job_events

pytestmark = pytest.mark.e2e

GANG = "gang-4x8"


def spec(name: str, replicas: int, gpus: int, duration: float, tenant: str = "acme") -> JobSpec:
    return JobSpec(
        tenant=tenant,
        queue="default",
        name=name,
        simulated_duration_s=duration,
        roles=[Role(name="trainer", replicas=replicas, gpus_per_replica=gpus)],
    )


async def submit(bus: Bus, job_id: str, job: JobSpec) -> None:
    await bus.publish(
        subjects.intake(job.tenant), SubmitJob(at=time.time(), spec=job, job_id=job_id), msg_id=f"e2e:{job_id}"
    )


async def until(predicate, timeout: float, what: str, interval: float = 0.05):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def inject(bus: Bus, request: ControlRequest) -> str:
    msg = await bus.nc.request(emulator_control_subject("local"), encode(request), timeout=5)
    reply = decode_reply(msg.data)
    assert reply.ok, reply.message
    return reply.message


async def test_a_fatal_xid_isolates_the_node_and_the_whole_gang_runs_again_elsewhere(stack: LocalStack) -> None:
    assert stack.nats and stack.redis
    bus = await Bus.connect(stack.nats.admin_url, "e2e")
    store = Store.from_url(stack.redis.admin_url)
    try:
        # 1. A 4-node gang and filler jobs; wait until the gang runs.
        await submit(bus, GANG, spec("gang", replicas=4, gpus=8, duration=8.0))
        fillers = [
            (f"filler-{i}", spec(f"filler-{i}", 1, (1, 2, 4, 8)[i % 4], 2.0 + i % 3, tenant="globex"))
            for i in range(10)
        ]
        for job_id, job in fillers:
            await submit(bus, job_id, job)

        async def gang_running():  # type: ignore[no-untyped-def]
            job = await views.get_job(store, GANG)
            return job if job is not None and job.status == "running" else None

        first = await until(gang_running, 60, "the gang to run")
        assert first.placement is not None
        victim = first.placement[1].node_id

        # 2. The node's GPU falls off the bus (XID 79).
        injected_at = time.time()
        await inject(bus, ControlRequest(op="xid", node_id=victim, gpu=0, xid=79, by="e2e"))

        async def isolated():  # type: ignore[no-untyped-def]
            state = await store.redis.hget(store.key("nodestate"), victim)
            return state if state not in (None, "healthy") else None

        state = await until(isolated, 10, f"{victim} to leave service")
        isolated_after = time.time() - injected_at
        assert state in ("draining", "repair")

        # 3. The gang runs again (a new run, none of it on the isolated node) and finishes.
        async def rerun():  # type: ignore[no-untyped-def]
            job = await views.get_job(store, GANG)
            return job if job and job.run_id != first.run_id and job.status in ("running", "succeeded") else None

        second = await until(rerun, 30, "the gang to run again")
        assert second.placement is not None
        assert victim not in {r.node_id for r in second.placement}

        async def all_done():  # type: ignore[no-untyped-def]
            counts = await views.status_counts(store)
            return counts if counts.get("succeeded", 0) == 1 + len(fillers) else None

        await until(all_done, 90, "every job to succeed", interval=0.25)

        # 4. The log: two runs of the gang, the first failed for the node, no GPU given twice.
        events = await read_job_events(bus)
        fold = check_job_log(events)
        assert fold.violations == []
        assert await views.violations(store) == []
        gang_runs = [e.run_id for e in events if isinstance(e, JobAdmitted) and e.job_id == GANG]
        assert len(gang_runs) == 2
        failures = [e for e in events if isinstance(e, RunFailed) and e.job_id == GANG]
        assert [(f.run_id, f.reason, f.node_id) for f in failures] == [(first.run_id, "node_failure", victim)]
        isolation = await node_isolated_at(bus, victim)
        late = [
            e
            for e in events
            if isinstance(e, JobPlaced) and e.at > isolation and victim in {r.node_id for r in e.replicas}
        ]
        assert late == [], "work was placed on the isolated node"

        # 5. The ledger: the first run ended with a node failure and lost work.
        ledger = Ledger(stack.ledger_url)
        try:

            async def first_run_closed():  # type: ignore[no-untyped-def]
                rows = {r.run_id: r for r in await asyncio.to_thread(ledger.runs, job_id=GANG)}
                row = rows.get(first.run_id)
                return row if row is not None and row.ended_at is not None else None

            row = await until(first_run_closed, 30, "the ledger to close the failed run", interval=0.25)
        finally:
            ledger.close()
        assert row.outcome == "failed:node_failure"
        assert (row.lost_seconds or 0) > 0

        # 6. The operator surface: history, then an uncordon returns the node.
        async with httpx.AsyncClient(base_url=stack.api_url, timeout=10, headers=stack.admin_headers()) as http:
            history = (await http.get(f"/v1/nodes/{victim}/history")).json()
            assert [h["to_state"] for h in history["history"]][:1] == ["draining"]
            assert "XID 79" in history["history"][0]["detail"]
            response = await http.post(f"/v1/nodes/{victim}/uncordon", json={"reason": "GPU reseated"})
            assert response.status_code == 202, response.text

        async def back():  # type: ignore[no-untyped-def]
            return await store.redis.hget(store.key("nodestate"), victim) == "healthy"

        await until(back, 10, f"{victim} back in service")
        print(f"isolated {isolated_after:.3f}s after the XID")
        assert stack.exited() == {}
    finally:
        await bus.close()
        await store.close()


async def node_isolated_at(bus: Bus, node_id: str) -> float:
    """When health's first state change took the node out of service."""
    from trainyard.events import decode_node_event
    from trainyard.events.nodes import NodeStateChanged
    from trainyard.testing.streams import read_raw

    for _, _, data in await read_raw(bus, "NODES"):
        event = decode_node_event(data)
        if isinstance(event, NodeStateChanged) and event.node_id == node_id and event.state != "healthy":
            return event.at
    raise AssertionError(f"no state change of {node_id} on NODES")
