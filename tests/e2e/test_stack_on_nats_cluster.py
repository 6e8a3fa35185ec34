"""The whole stack on a 3-node NATS cluster (``trainyard up --nats-cluster 3``):
jobs run through while the JOBS stream's leader node is SIGKILLed; the
supervisor starts the node again, it catches up, and every job succeeds once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import nats.errors
import pytest

from trainyard.bus import Bus
from trainyard.core.invariants import check_job_log
from trainyard.domain import JobSpec, Role
from trainyard.events import RunSucceeded, SubmitJob, subjects
from trainyard.local import LocalStack, StackConfig
from trainyard.local.supervisor import Supervisor
from trainyard.testing.streams import read_job_events
from trainyard.testing.waiting import eventually

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster_stack(tmp_path: Path) -> Iterator[tuple[LocalStack, Supervisor]]:
    config = StackConfig(
        data_dir=str(tmp_path / "stack"),
        nats_cluster=3,
        nodes=4,
        racks=1,
        heartbeat_timeout_s=15.0,
        log_level="WARNING",
    )
    stack = LocalStack(config)
    supervisor = Supervisor(stack)
    watcher = threading.Thread(target=supervisor.run, args=(stack.stopping, 0.2), daemon=True)
    try:
        stack.start()
        watcher.start()
        yield stack, supervisor
    finally:
        stack.request_stop()
        if watcher.is_alive():
            watcher.join()
        for name in stack.procs:  # shown by pytest only when the test failed
            print(f"--- {name} (exit {stack.procs[name].poll()}) ---\n{stack.log_tail(name, 40)}")
        stack.stop()
    # The cluster runs on the locked bus too: no node refused a service anything.
    refused = [
        line
        for node in stack.nats_nodes
        for line in node.log_path.read_text(errors="replace").splitlines()
        if "Violation" in line
    ]
    assert refused == []


async def submit(bus: Bus, job_id: str) -> None:
    """Submit as a portal does: a publish that fails while NATS elects a
    leader is repeated with the same message id."""
    job = JobSpec(
        tenant="acme",
        queue="default",
        name=job_id,
        simulated_duration_s=1.0,
        roles=[Role(name="trainer", replicas=1, gpus_per_replica=2)],
    )

    async def published() -> bool:
        try:
            await bus.publish(
                subjects.intake("acme"), SubmitJob(at=time.time(), spec=job, job_id=job_id), msg_id=f"e2e:{job_id}"
            )
        except (TimeoutError, nats.errors.Error):
            return False
        return True

    await eventually(published, timeout=30, what=f"{job_id} submitted")


async def test_jobs_run_through_while_a_nats_node_is_killed(cluster_stack: tuple[LocalStack, Supervisor]) -> None:
    stack, supervisor = cluster_stack
    bus = await Bus.connect(stack.nats_admin_url, "e2e")
    try:
        assert stack.service_env("admission")["TRAINYARD_NATS_URL"].count(",") == 2

        async def succeeded() -> Counter[str]:
            try:
                events = await read_job_events(bus)
            except (TimeoutError, nats.errors.Error):
                return Counter()
            return Counter(e.job_id for e in events if isinstance(e, RunSucceeded))

        # 1. Jobs before the kill; wait until some have run.
        for i in range(8):
            await submit(bus, f"before-{i}")
        await eventually(lambda: _at_least(succeeded, 2), timeout=60, what="jobs succeed before the kill")
        buckets = ("KV_trainyard-auth", "KV_trainyard-config", "KV_trainyard-leases")  # leases: made by the deciders
        for stream in ("JOBS", "INTAKE", "NODES", "TELEMETRY", *buckets):
            assert (await bus.js.stream_info(stream)).config.num_replicas == 3, stream

        # 2. SIGKILL the node leading JOBS, and submit more while it is down.
        leader = (await bus.js.stream_info("JOBS")).cluster.leader  # type: ignore[union-attr]
        node = next(n for n in stack.nats_nodes if n.name == leader)
        node.kill()
        for i in range(8):
            await submit(bus, f"after-{i}")

        # 3. Every job succeeds exactly once; the supervisor restarted the node and it caught up.
        done = await eventually(lambda: _at_least(succeeded, 16), timeout=90, what="every job succeeds")
        assert set(done.values()) == {1}, f"a job ran to success twice: {done}"
        events = await read_job_events(bus)
        assert check_job_log(events).violations == []
        assert supervisor.restarts.get(leader) == 1

        async def caught_up() -> bool:
            info = await bus.js.stream_info("JOBS")
            peers = info.cluster.replicas or [] if info.cluster else []
            return len(peers) == 2 and all(p.current and not p.lag for p in peers)

        await eventually(caught_up, timeout=30, what=f"{leader} caught up with JOBS")
    finally:
        await bus.close()


async def _at_least(count, n: int) -> Counter[str] | None:  # type: ignore[no-untyped-def]
    found = await count()
    return found if len(found) >= n else None
