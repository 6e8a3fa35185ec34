"""The admission cycle against events projected through real NATS and Redis:
what it hands the core (run-time limits, submission times, expected ends, the
cluster), topology-aware preemption through to placement, and runs stopped at
their run-time limit."""

from __future__ import annotations

import pytest
from test_placement_cycle import CLUSTER, NOW, Harness, harness

from trainyard.bus import Bus
from trainyard.config.tenancy import compile_tenancy, load_tenancy
from trainyard.core.admission import AdmissionPolicy
from trainyard.domain import JobSpec, Role
from trainyard.domain.job import TopologyConstraint, TopologyLevel
from trainyard.events import CheckpointSaved, JobCancelled, PreemptionNotice, RunFailed
from trainyard.store import Store, job_hash, views, waiting
from trainyard.testing.publish import publish_event
from trainyard.testing.streams import read_job_events
from trainyard_admission.cycle import AdmissionCycle
from trainyard_admission.tenancy import TenancyHolder

TENANCY = """
flavors: [{name: H100, node_pool: h100}]
priority_classes:
  - {name: production, priority: 1000, preemptible: false}
  - {name: standard, priority: 500}
organisations:
  - name: org
    quota: {H100: {nominal: 32}}
    teams:
      - name: acme
        quota: {H100: {nominal: 32}}
        queues:
          - {name: default, quota: {H100: {nominal: 32, borrowing_limit: 0}}}
preemption: {within_queue: true, reclaim: false, fair_share: false, grace_period_s: 0}
"""


def spec(
    replicas: int = 1, gpus: int = 8, priority_class: str = "standard", rack: bool = False, max_runtime_s: int = 3600
) -> JobSpec:
    topology = TopologyConstraint(TopologyLevel.RACK, required=True) if rack else None
    return JobSpec(
        tenant="acme",
        queue="default",
        priority_class=priority_class,
        max_runtime_s=max_runtime_s,
        roles=[Role(name="trainer", replicas=replicas, gpus_per_replica=gpus)],
        topology=topology,
    )


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def admission(h: Harness, clock: Clock, cluster: str | None = CLUSTER) -> AdmissionCycle:
    holder = TenancyHolder()
    cfg = load_tenancy(TENANCY)
    holder.set(compile_tenancy(cfg), cfg, 1)
    return AdmissionCycle(
        h.bus,
        h.store,
        h.jobs,
        AdmissionPolicy(),
        clock,
        node_projector=(h.nodes,),
        tenancy=holder,
        placement_timeout_s=1e9,
        cluster=cluster,
    )


async def checkpoint(h: Harness, job_id: str, at: float) -> None:
    event = CheckpointSaved(at=at, job_id=job_id, tenant="acme", run_id=f"{job_id}-r1", step=100)
    await publish_event(h.bus, event, msg_id=f"{job_id}-r1:ckpt")


async def test_the_core_gets_limits_submission_times_expected_ends_and_the_cluster(bus: Bus, store: Store) -> None:
    async with harness(bus, store) as h:
        for node in ("n1", "n2"):
            await h.node(node, rack="r1")
        await h.running("long", spec(max_runtime_s=7200), {"n1": list(range(8))}, started_at=NOW - 100)
        await h.submit("waits", spec(priority_class="production", max_runtime_s=600), admit=False)
        # A job whose first run held 8 GPUs for 100 s before it was preempted.
        await h.running("again", spec(), {"n2": list(range(8))}, started_at=NOW - 300)
        failed = RunFailed(at=NOW - 200, job_id="again", tenant="acme", run_id="again-r1", reason="preempted")
        await publish_event(bus, failed, msg_id="again-r1:failed")
        await h.settle()
        snapshot, _ = await admission(h, Clock(NOW)).snapshot()
    pending = {p.job_id: p for p in snapshot.pending}
    assert (pending["waits"].runtime_limit_s, pending["waits"].submitted_at) == (600.0, NOW - 500)
    assert (pending["waits"].attained_gpu_s, pending["again"].attained_gpu_s) == (0.0, 800.0)
    [running] = snapshot.running
    assert (running.job_id, running.expected_end) == ("long", NOW - 100 + 7200)
    assert snapshot.cluster is not None
    assert {(v.info.node_id, len(v.free_gpus)) for v in snapshot.cluster.nodes} == {("n1", 0), ("n2", 8)}
    assert [(a.job_id, a.replicas[0].node_id) for a in snapshot.cluster.running] == [("long", "n1")]
    assert set(snapshot.specs) == {"waits", "again"}


async def test_a_production_job_preempts_a_standard_gang_whose_gpus_it_then_uses(bus: Bus, store: Store) -> None:
    async with harness(bus, store) as h:
        # r1 holds a standard 2-node gang; r2 and r3 one node each, half held by cheap single-node runs.
        for node, rack in (("n1", "r1"), ("n2", "r1"), ("n3", "r2"), ("n4", "r3")):
            await h.node(node, rack=rack)
        await h.running("gang", spec(replicas=2), {"n1": list(range(8)), "n2": list(range(8))}, NOW - 900)
        await h.running("small-3", spec(gpus=4), {"n3": [0, 1, 2, 3]}, NOW - 900)
        await h.running("small-4", spec(gpus=4), {"n4": [0, 1, 2, 3]}, NOW - 900)
        await checkpoint(h, "gang", NOW - 600)
        for small in ("small-3", "small-4"):
            await checkpoint(h, small, NOW - 60)  # cheaper per GPU, but freeing them leaves no rack whole
        await h.submit("prod", spec(replicas=2, priority_class="production", rack=True), admit=False)
        await h.settle()
        clock = Clock(NOW)
        cycle = admission(h, clock)
        # 1. The gang is told to stop, and only the gang.
        await cycle.run_once()
        notices = [e for e in await read_job_events(bus) if isinstance(e, PreemptionNotice)]
        assert [(n.job_id, n.preemptor, n.reason) for n in notices] == [("gang", "prod", "priority")]
        assert (await waiting.read(store, await views.get_jobs(store, ["prod"])))["prod"].reason == "preempting"
        # 2. Its grace period over, it is stopped and keeps its place; the production job is admitted.
        for _ in range(3):
            clock.now += 1
            await cycle.run_once()
            if (await views.get_job(store, "prod")).status == "admitted":
                break
        assert (await views.get_job(store, "gang")).status == "pending"
        assert (await views.get_job(store, "prod")).status == "admitted"
        for small in ("small-3", "small-4"):
            assert (await views.get_job(store, small)).status == "running"
        # 3. Placement puts it on the rack the gang freed.
        await h.settle()
        assert await h.cycle(clock=clock.now).run_once() == 1
        prod = await views.get_job(store, "prod")
    assert prod.status == "placed"
    assert sorted(r.node_id for r in prod.placement) == ["n1", "n2"]


@pytest.mark.parametrize("ran_h, stopped", [(5, True), (3, False)], ids=["ran 5 hours", "ran 3 hours"])
async def test_a_new_job_stops_a_run_that_has_had_more_service(
    bus: Bus, store: Store, ran_h: int, stopped: bool
) -> None:
    # Least attained service is on by default: a run that has held 8 GPUs for hours (past the first level,
    # 1 GPU-hour) yields to a new job of the same priority once it has run the 4-hour minimum, not before.
    async with harness(bus, store) as h:
        await h.node("n1", rack="r1")
        started = NOW - ran_h * 3600
        await h.running("long", spec(max_runtime_s=86_400), {"n1": list(range(8))}, started, started)
        await h.submit("new", spec(max_runtime_s=3600), admit=False)
        await h.settle()
        await admission(h, Clock(NOW)).run_once()
        notices = [e for e in await read_job_events(bus) if isinstance(e, PreemptionNotice)]
        reason = (await waiting.read(store, await views.get_jobs(store, ["new"])))["new"].reason
    assert [(n.job_id, n.preemptor, n.reason) for n in notices] == ([("long", "new", "service")] if stopped else [])
    assert (reason == "preempting") is stopped


async def test_without_the_cluster_victims_are_chosen_by_gpu_counts(bus: Bus, store: Store) -> None:
    async with harness(bus, store) as h:
        for node, rack in (("n1", "r1"), ("n2", "r1"), ("n3", "r2"), ("n4", "r3")):
            await h.node(node, rack=rack)
        await h.running("gang", spec(replicas=2), {"n1": list(range(8)), "n2": list(range(8))}, NOW - 900)
        await h.running("small-3", spec(gpus=4), {"n3": [0, 1, 2, 3]}, NOW - 900)
        await h.running("small-4", spec(gpus=4), {"n4": [0, 1, 2, 3]}, NOW - 900)
        await checkpoint(h, "gang", NOW - 600)
        for small in ("small-3", "small-4"):
            await checkpoint(h, small, NOW - 60)
        await h.submit("prod", spec(replicas=2, priority_class="production", rack=True), admit=False)
        await h.settle()
        await admission(h, Clock(NOW), cluster=None).run_once()
        notices = [e for e in await read_job_events(bus) if isinstance(e, PreemptionNotice)]
    assert sorted(n.job_id for n in notices) == ["small-3", "small-4"]  # scattered: no rack for the gang


@pytest.mark.parametrize(
    ("after_start", "stopped"),
    [
        pytest.param(3600.0, True, id="a run is stopped at its run-time limit and retried after a backoff"),
        pytest.param(3599.0, False, id="a run within its run-time limit keeps running"),
    ],
)
async def test_runs_are_stopped_at_their_run_time_limit(
    bus: Bus, store: Store, after_start: float, stopped: bool
) -> None:
    async with harness(bus, store) as h:
        await h.node("n1")
        await h.running("long", spec(max_runtime_s=3600), {"n1": list(range(8))}, started_at=NOW)
        await h.settle()
        await admission(h, Clock(NOW + after_start)).run_once()
        failures = [e for e in await read_job_events(bus) if isinstance(e, RunFailed)]
        job = await views.get_job(store, "long")
    if stopped:
        assert [(f.job_id, f.run_id, f.reason) for f in failures] == [("long", "long-r1", "timeout")]
        assert job.status == "pending" and job.not_before is not None and job.not_before > NOW + after_start
    else:
        assert failures == [] and job.status == "running"


async def behind_a_full_node(h: Harness, *waiting_ids: str) -> AdmissionCycle:
    """One node whose GPUs job "first" holds, ``waiting_ids`` queued behind it,
    and an admission cycle that has run once."""
    await h.node("n1")
    await h.running("first", spec(), {"n1": list(range(8))}, NOW - 100)
    for job_id in waiting_ids:
        await h.submit(job_id, spec(), admit=False)
    await h.settle()
    cycle = admission(h, Clock(NOW))
    await cycle.run_once()
    return cycle


async def cancel(h: Harness, job_id: str) -> None:
    await publish_event(
        h.bus, JobCancelled(at=NOW, job_id=job_id, tenant="acme", reason="not needed"), msg_id=f"{job_id}:cancel"
    )
    await h.settle()


async def test_why_a_job_waits_is_kept_beside_its_record_and_forgotten_once_it_is_admitted_or_cancelled(
    bus: Bus, store: Store
) -> None:
    async with harness(bus, store) as h:
        # 1. The GPUs are all held: the three wait, in line, and say why.
        cycle = await behind_a_full_node(h, "second", "third", "fourth")
        why = await waiting.read(store, await views.get_jobs(store, ["first", "second", "third", "fourth"]))
        assert {j: w.position for j, w in why.items()} == {"second": 1, "third": 2, "fourth": 3}
        for job_id in ("second", "third", "fourth"):
            assert set(await store.redis.hkeys(store.key("job", job_id))) <= set(job_hash.FIELDS)
            assert await store.redis.hget(store.key("job", job_id), "reason") is None  # the fold's field, untouched
        # 2. The first job ends and the second is admitted; the fourth is cancelled.
        await h.finish("first", "first-r1")
        await cancel(h, "fourth")
        await cycle.run_once()
        await h.settle()
        assert (await views.get_job(store, "second")).status == "admitted"
        assert sorted(await store.redis.hkeys(store.key("why", "pending"))) == ["third"]
        # 3. The next cycle moves the third up the line.
        await cycle.run_once()
        assert (await waiting.read(store, await views.get_jobs(store, ["third"])))["third"].position == 1


async def test_a_reason_written_as_the_job_was_cancelled_is_never_shown_and_is_forgotten_by_the_next_cycle(
    bus: Bus, store: Store
) -> None:
    async with harness(bus, store) as h:
        cycle = await behind_a_full_node(h, "late")
        # The job is cancelled and folded; a decider that read it as pending writes its reason after that.
        await cancel(h, "late")
        await waiting.write(store, "pending", {"late": waiting.Waiting("quota_exhausted", 1)})
        assert await waiting.read(store, await views.get_jobs(store, ["late"])) == {}
        await cycle.run_once()
        assert await store.redis.hkeys(store.key("why", "pending")) == []
