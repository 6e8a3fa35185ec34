"""Admission policy on the running system: a tenancy configuration applied
while it runs takes effect at once, and a higher-priority job preempts a
lower-priority one with notice, which checkpoints, stops, keeps its place and
later resumes from its checkpoint."""

from __future__ import annotations

import asyncio
import time

import pytest

from trainyard.bus import Bus
from trainyard.config.store import ConfigStore
from trainyard.core.invariants import check_job_log
from trainyard.domain import JobSpec, Role
from trainyard.events import CheckpointSaved, JobAdmitted, JobRejected, PreemptionNotice, RunFailed, SubmitJob, subjects
from trainyard.ledger import Ledger
from trainyard.local import LocalStack
from trainyard.store import Store, views, waiting
from trainyard.testing.streams import read_job_events
from trainyard.testing.waiting import eventually

pytestmark = pytest.mark.e2e


def tenancy(acme_h100: int, grace_s: float = 2.0) -> str:
    return f"""
flavors: [{{name: H100, node_pool: emulated, gpus_per_node: 8}}]
priority_classes:
  - {{name: production, priority: 1000, preemptible: false}}
  - {{name: standard, priority: 500}}
  - {{name: preemptible, priority: 100}}
default_priority_class: standard
fair_share: {{half_life_s: 3600}}
preemption: {{within_queue: true, reclaim: true, fair_share: false, min_runtime_s: 0, grace_period_s: {grace_s}}}
organisations:
  - name: lab
    quota: {{H100: {{nominal: 128}}}}
    teams:
      - name: acme
        quota: {{H100: {{nominal: {acme_h100}, borrowing_limit: 0}}}}
        priority_classes: [production, standard, preemptible]  # production is granted, not given
        queues:
          - name: default
            quota: {{H100: {{nominal: {acme_h100}, borrowing_limit: 0}}}}
"""


def job(
    tenant: str = "acme",
    gpus: int = 8,
    duration: float = 60.0,
    priority_class: str = "standard",
    checkpoint_every: float | None = None,
) -> JobSpec:
    return JobSpec(
        tenant=tenant,
        queue="default",
        priority_class=priority_class,
        roles=[Role(name="trainer", gpus_per_replica=gpus)],
        simulated_duration_s=duration,
        simulated_checkpoint_interval_s=checkpoint_every,
    )


async def submit(bus: Bus, job_id: str, spec: JobSpec) -> None:
    await bus.publish(subjects.intake(spec.tenant), SubmitJob(at=time.time(), spec=spec, job_id=job_id), msg_id=job_id)


async def status(store: Store, job_id: str) -> str | None:
    job = await views.get_job(store, job_id)
    return job.status if job else None


@pytest.fixture
async def clients(stack: LocalStack):  # type: ignore[no-untyped-def]
    assert stack.nats and stack.redis
    bus = await Bus.connect(stack.nats.admin_url, "e2e")
    store = Store.from_url(stack.redis.admin_url)
    yield bus, store, await ConfigStore.open(bus)
    await bus.close()
    await store.close()


async def test_a_tenancy_change_takes_effect_while_the_system_runs(clients) -> None:  # type: ignore[no-untyped-def]
    bus, store, config = clients
    revision, _ = await config.apply(tenancy(acme_h100=16), actor="test:e2e", reason="first quota")
    await asyncio.sleep(1.0)  # admission follows the key

    await submit(bus, "stranger", job(tenant="globex"))
    for i in range(3):
        await submit(bus, f"q{i}", job())
    await eventually(lambda: status(store, "stranger"), what="the stranger's job to be answered")
    rejected = next(e for e in await read_job_events(bus) if isinstance(e, JobRejected))
    assert rejected.job_id == "stranger"
    assert any(e.field == "tenant" and "unknown tenant 'globex'" in e.message for e in rejected.errors)

    async def two_running_one_waiting():  # type: ignore[no-untyped-def]
        jobs = await views.get_jobs(store, ["q0", "q1", "q2"])
        why = await waiting.read(store, jobs)
        return [j.status for j in jobs] == ["running", "running", "pending"] and why.get("q2")

    why = await eventually(two_running_one_waiting, what="a 16-GPU quota to hold two 8-GPU jobs")
    assert why.reason in ("quota", "cohort_exhausted")

    new_revision, changes = await config.apply(tenancy(acme_h100=24), actor="test:e2e", reason="more quota")
    assert new_revision > revision and any("24" in c for c in changes)
    await eventually(lambda: _is(store, "q2", "running"), what="the third job to start under the new quota")
    audit = await bus.js.get_last_msg("AUDIT", "trainyard.audit.config")
    assert b"more quota" in audit.data


async def _is(store: Store, job_id: str, wanted: str) -> bool:
    return await status(store, job_id) == wanted


async def test_a_higher_priority_job_preempts_with_notice_and_the_victim_resumes_from_its_checkpoint(
    stack: LocalStack, clients
) -> None:  # type: ignore[no-untyped-def]
    bus, store, config = clients
    await config.apply(tenancy(acme_h100=128, grace_s=3.0), actor="test:e2e")
    await asyncio.sleep(1.0)
    # Fill the whole cluster (16 nodes x 8 GPUs) with preemptible jobs that checkpoint every second.
    fillers = [f"fill{i:02d}" for i in range(16)]
    for job_id in fillers:
        await submit(bus, job_id, job(duration=20.0, priority_class="preemptible", checkpoint_every=1.0))

    async def all_running():  # type: ignore[no-untyped-def]
        return all([await _is(store, j, "running") for j in fillers])

    await eventually(all_running, what="the fillers to run")
    await asyncio.sleep(2.5)  # a couple of checkpoints each

    await submit(bus, "urgent", job(duration=2.0, priority_class="production"))
    await eventually(lambda: _is(store, "urgent", "succeeded"), timeout=40, what="the production job to run")

    events = await read_job_events(bus)
    [notice] = [e for e in events if isinstance(e, PreemptionNotice)]
    victim = notice.job_id
    assert notice.preemptor == "urgent" and notice.grace_period_s == 3.0
    stopped = [e for e in events if isinstance(e, RunFailed) and e.job_id == victim]
    assert [e.reason for e in stopped] == ["preempted"]
    last_checkpoint = max(e.step for e in events if isinstance(e, CheckpointSaved) and e.run_id == notice.run_id)
    assert last_checkpoint >= 2

    # The victim kept its place: it is the first job admitted when room frees up,
    # and its new run resumes from the checkpoint it wrote on notice.
    await eventually(lambda: _is(store, victim, "running"), timeout=30, what="the victim to run again")
    events = await read_job_events(bus)
    resumed = [e for e in events if isinstance(e, JobAdmitted) and e.job_id == victim]
    assert [e.attempt for e in resumed] == [1, 2]
    assert resumed[1].resume_from_step is not None and resumed[1].resume_from_step >= last_checkpoint
    assert check_job_log(events).violations == []

    # Accounting measured the lost work from the last checkpoint, not from the start of the run.
    ledger = Ledger(stack.ledger_url)
    try:

        async def first_run_metered():  # type: ignore[no-untyped-def]
            rows = await asyncio.to_thread(ledger.runs, job_id=victim)
            return next((r for r in rows if r.run_id == notice.run_id and r.ended_at is not None), None)

        first = await eventually(first_run_metered, what="the preempted run in the ledger")
    finally:
        ledger.close()
    assert first.outcome == "failed:preempted"
    assert 0 <= first.lost_seconds < first.gpu_seconds / 2
