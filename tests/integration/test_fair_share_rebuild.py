"""Fair-share standing lives on the log: the admission cycle admits and ends
runs and fair-share preemptions are noticed through real NATS and Redis; the
standing it folded, cycle by cycle, is then rebuilt from the JOBS stream alone
after FLUSHALL, byte for byte and through :class:`FairShareStandings`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from trainyard.bus import Bus
from trainyard.config.tenancy import compile_tenancy, load_tenancy
from trainyard.core.admission import AdmissionPolicy
from trainyard.core.admission.usage_fold import held
from trainyard.domain import JobSpec, NodeInfo, Role
from trainyard.events import JobAccepted, JobAdmitted, NodeRegistered, PreemptionNotice, RunSucceeded, subjects
from trainyard.local.servers import Server, start_redis
from trainyard.store import Projector, Store, views
from trainyard.store.fairshare import FairShareLog, FairShareStandings
from trainyard.testing.publish import publish_event
from trainyard.testing.streams import read_job_events
from trainyard_admission.cycle import AdmissionCycle
from trainyard_admission.tenancy import TenancyHolder

NOW = 1_700_000_000.0
HALF_LIFE = 3600.0
TENANCY = f"""
flavors: [{{name: H100, node_pool: h100}}]
priority_classes: [{{name: standard, priority: 500}}]
organisations:
  - name: org
    quota: {{H100: {{nominal: 16}}}}
    teams:
      - name: acme
        quota: {{H100: {{nominal: 8}}}}
        queues: [{{name: a, quota: {{H100: {{nominal: 8}}}}}}]
      - name: beta
        quota: {{H100: {{nominal: 8}}}}
        queues: [{{name: b, quota: {{H100: {{nominal: 8}}}}}}]
fair_share: {{half_life_s: {HALF_LIFE}}}
preemption: {{within_queue: false, reclaim: false, fair_share: false, grace_period_s: 0}}
"""


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[Server]:
    """A Redis of this test's own: it is flushed whole."""
    server = start_redis(tmp_path / "redis")
    yield server
    server.stop()


@pytest.fixture
async def own_store(own_redis: Server) -> AsyncIterator[Store]:
    store = Store.from_url(own_redis.url)
    yield store
    await store.close()


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def spec(tenant: str, queue: str, gpus: int) -> JobSpec:
    return JobSpec(
        tenant=tenant,
        queue=queue,
        priority_class="standard",
        max_runtime_s=86_400,
        roles=[Role(name="t", replicas=1, gpus_per_replica=gpus)],
    )


async def submit(bus: Bus, job_id: str, job: JobSpec, at: float) -> None:
    await publish_event(bus, JobAccepted(at=at, job_id=job_id, spec=job, submitted_at=at), msg_id=f"{job_id}:acc")


async def test_fair_share_standing_is_rebuilt_from_the_log_byte_for_byte(bus: Bus, own_store: Store) -> None:
    store = own_store
    for node in ("n1", "n2"):
        info = NodeInfo(node_id=node, cluster="c1", gpu_type="H100", gpus=8, rack="r1")
        await bus.publish(
            subjects.node("c1", node), NodeRegistered(at=NOW - 100, node=info, boot_id="b1"), f"reg-{node}"
        )
    jobs, nodes = Projector(bus, store, "JOBS"), Projector(bus, store, "NODES")
    stop = asyncio.Event()
    tasks = [asyncio.create_task(jobs.run(stop)), asyncio.create_task(nodes.run(stop))]
    holder = TenancyHolder()
    cfg = load_tenancy(TENANCY)
    holder.set(compile_tenancy(cfg), cfg, 1)
    clock = Clock()
    cycle = AdmissionCycle(
        bus, store, jobs, AdmissionPolicy(), clock, node_projector=(nodes,), tenancy=holder, placement_timeout_s=1e9
    )
    standings = FairShareStandings(store)
    try:
        # 1. a1 (8 GPUs, queue a) and b1 (4 GPUs, queue b) are admitted at NOW.
        await submit(bus, "a1", spec("acme", "a", 8), NOW - 10)
        await submit(bus, "b1", spec("beta", "b", 4), NOW - 10)
        await cycle.run_once()
        assert {j.job_id for j in await views.get_jobs(store, ["a1", "b1"]) if j.status == "admitted"} == {"a1", "b1"}
        # 2. b1 ends after 600 s; a fair-share preemption is noticed at the same time.
        clock.now = NOW + 600
        await publish_event(bus, RunSucceeded(at=clock.now, job_id="b1", tenant="beta", run_id="b1-r1"), "b1-r1:done")
        notice = PreemptionNotice(
            at=clock.now,
            job_id="a1",
            tenant="acme",
            run_id="a1-r1",
            preemptor="b2",
            reason="fair_share",
            grace_period_s=60,
        )
        await publish_event(bus, notice, msg_id="a1-r1:notice")
        await cycle.run_once()
        # 3. b2 (2 GPUs) is admitted at NOW + 1800, when a1's grace is over and it is stopped;
        #    a1 is admitted again at NOW + 2100.
        clock.now = NOW + 1800
        await submit(bus, "b2", spec("beta", "b", 2), clock.now - 5)
        await cycle.run_once()
        clock.now = T = NOW + 2100
        await cycle.run_once()
        await FairShareLog(bus, store).catch_up(HALF_LIFE)  # the cycle's own writes folded too
        before_raw = await standings.raw()
        before = await standings.read(T, window_s=3600)

        # What the cycles folded is the closed form over the event times.
        a1 = [(type(e).__name__, e.at - NOW) for e in await read_job_events(bus) if e.job_id == "a1"]
        assert a1[1:] == [("JobAdmitted", 0), ("PreemptionNotice", 600), ("RunFailed", 1800), ("JobAdmitted", 2100)]
        expected_a = held(8, NOW, NOW + 1800, T, HALF_LIFE)  # its second run has held GPUs for no time yet
        expected_b = held(4, NOW, NOW + 600, T, HALF_LIFE) + held(2, NOW + 1800, T, T, HALF_LIFE)
        assert before.usage["acme/a"]["H100"] == pytest.approx(expected_a, rel=1e-12)
        assert before.usage["beta/b"]["H100"] == pytest.approx(expected_b, rel=1e-12)
        assert before.preemptions == [NOW + 600]
        assert (await standings.read(T, window_s=60)).preemptions == []

        # 4. Redis is thrown away; the projections rebuild themselves, fair share from the log.
        await store.redis.flushall()
        assert await standings.raw() == {}
        assert (await standings.read(T)).usage == {}
        await FairShareLog(bus, store).catch_up(HALF_LIFE)
        assert await standings.raw() == before_raw
        assert await standings.read(T, window_s=3600) == before

        # 5. A cycle after the rebuild reads the same standing the one before did.
        assert await cycle._fair_share_state() == (before.usage, [])  # window 600 s: the notice is older
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def test_a_new_half_life_folds_the_log_again(bus: Bus, own_store: Store) -> None:
    job = spec("acme", "a", 8)
    await submit(bus, "a1", job, NOW)
    admitted = JobAdmitted(
        at=NOW, job_id="a1", tenant="acme", run_id="a1-r1", attempt=1, queue="a", gpus_by_type={"H100": 8}
    )
    await publish_event(bus, admitted, msg_id="a1:admit:1")
    await publish_event(bus, RunSucceeded(at=NOW + 100, job_id="a1", tenant="acme", run_id="a1-r1"), "a1-r1:done")
    log, standings = FairShareLog(bus, own_store), FairShareStandings(own_store)
    await log.catch_up(3600.0)
    hour = (await standings.read(NOW + 100)).usage["acme/a"]["H100"]
    await log.catch_up(60.0)
    minute = (await standings.read(NOW + 100)).usage["acme/a"]["H100"]
    assert hour == pytest.approx(held(8, NOW, NOW + 100, NOW + 100, 3600.0), rel=1e-12)
    assert minute == pytest.approx(held(8, NOW, NOW + 100, NOW + 100, 60.0), rel=1e-12)
    assert minute < hour < 800.0
