"""The run dispatcher with three real node agents posing as three nodes, each
running real processes: a 3-replica gang gets one process per node with
ranks 0..2 and one master, starts once, and succeeds; a rank that exits 3
fails the run once, naming it, and its peers' processes are stopped."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from trainyard.agent.running import RunningAgent
from trainyard.bus import Bus
from trainyard.domain import JobSpec, NodeInfo, Role
from trainyard.events import (
    JobAccepted,
    JobAdmitted,
    JobPlaced,
    PreemptionNotice,
    ReplicaPlacement,
    RunFailed,
    RunStarted,
)
from trainyard.events.work import ProcessExited, StartRun, decode_work
from trainyard.gpu import FakeGpuBackend
from trainyard.store import Projector, Store, views
from trainyard.testing.publish import publish_event
from trainyard.testing.streams import read_job_events, read_raw
from trainyard.testing.waiting import eventually
from trainyard_placement.dispatch import RunDispatcher

CLUSTER = "local"
NODES = ("n1", "n2", "n3")

#: Writes what it was given to <dir>/rank-<RANK>.json; rank FAIL exits 3, the others then wait.
SCRIPT = """
import json, os, sys, time
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "NNODES", "MASTER_ADDR", "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES", "TRAINYARD_RUN_ID")
with open(os.path.join(sys.argv[1], "rank-" + os.environ["RANK"] + ".json"), "w") as f:
    json.dump({k: os.environ.get(k) for k in keys} | {"pid": os.getpid()}, f)
if sys.argv[2] == os.environ["RANK"]:
    print("loss went to nan at step 7", flush=True)
    sys.exit(3)
if sys.argv[2] != "none":
    time.sleep(120)
"""


@pytest.fixture
async def stack(bus: Bus, store: Store, tmp_path: Path) -> AsyncIterator[RunDispatcher]:
    stop = asyncio.Event()
    agents = [
        RunningAgent.build(
            bus,
            NodeInfo(n, CLUSTER, "H100", 2, address="127.0.0.1", executes=True),
            FakeGpuBackend(2, clock=time.time),
            tmp_path / n,
            executor_options={"poll_s": 0.05},
            heartbeat_interval_s=0.2,
        )
        for n in NODES
    ]
    dispatcher = RunDispatcher(bus, store, CLUSTER, time.time)
    jobs, nodes = Projector(bus, store, "JOBS"), Projector(bus, store, "NODES")
    tasks = [asyncio.ensure_future(c) for c in (jobs.run(stop), nodes.run(stop), dispatcher.run(stop))]
    tasks += [asyncio.ensure_future(a.run(stop)) for a in agents]

    async def registered() -> bool:
        return len(await views.list_nodes(store)) == len(NODES)

    await eventually(registered, what="three agents registered")
    try:
        yield dispatcher
    finally:
        for agent in agents:
            for run in list(agent.executor.runs.values()):
                agent.executor.stop(run, "SIGKILL", 0, "cancelled")
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)


async def place(bus: Bus, out: Path, fail_rank: str) -> None:
    spec = JobSpec(
        tenant="acme",
        queue="default",
        roles=[Role(name="trainer", replicas=3)],
        command=[sys.executable, "-c", SCRIPT, str(out), fail_rank],
        max_retries=0,
        stop_grace_s=2.0,
    )
    now = time.time()
    await publish_event(bus, JobAccepted(at=now, job_id="j1", spec=spec, submitted_at=now), "j1:a")
    await publish_event(bus, JobAdmitted(at=now, job_id="j1", tenant="acme", run_id="j1-r1", attempt=1), "j1:adm")
    replicas = [ReplicaPlacement("trainer", i, i, n, [1]) for i, n in enumerate(NODES)]
    placed = JobPlaced(at=now, job_id="j1", tenant="acme", run_id="j1-r1", cluster=CLUSTER, replicas=replicas)
    await publish_event(bus, placed, "j1-r1:placed")


async def status(store: Store, wanted: str) -> bool:
    job = await views.get_job(store, "j1")
    return job is not None and job.status == wanted


async def test_three_agents_run_one_rank_each_and_the_gang_succeeds(
    bus: Bus, store: Store, stack: RunDispatcher, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    await place(bus, out, fail_rank="none")
    await eventually(lambda: status(store, "succeeded"), what="the job succeeded")
    seen = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(3)]
    assert [(s["RANK"], s["LOCAL_RANK"], s["NODE_RANK"], s["NNODES"], s["WORLD_SIZE"]) for s in seen] == [
        (str(r), "0", str(r), "3", "3") for r in range(3)
    ]
    assert {(s["MASTER_ADDR"], s["MASTER_PORT"], s["CUDA_VISIBLE_DEVICES"], s["TRAINYARD_RUN_ID"]) for s in seen} == {
        ("127.0.0.1", seen[0]["MASTER_PORT"], "1", "j1-r1")
    }
    assert len({s["pid"] for s in seen}) == 3
    events = await read_job_events(bus)
    assert sum(isinstance(e, RunStarted) for e in events) == 1


async def test_a_rank_exiting_3_fails_the_run_once_naming_it_and_its_peers_are_stopped(
    bus: Bus, store: Store, stack: RunDispatcher, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    await place(bus, out, fail_rank="1")
    await eventually(lambda: status(store, "failed"), what="the job failed")
    [failed] = [e for e in await read_job_events(bus) if isinstance(e, RunFailed)]
    assert failed.reason == "workload_error" and failed.node_id == "n2"
    assert failed.message.startswith("rank 1 on n2 exited with code 3") and "loss went to nan" in failed.message
    # Ranks 0 and 2, on the other nodes, are stopped: each reports its exit, and no process of theirs is left.

    async def peers_exited() -> list[ProcessExited] | None:
        exits = [
            m
            for _, _, data in await read_raw(bus, "WORK")
            if isinstance(m := decode_work(data), ProcessExited) and m.rank in (0, 2)
        ]
        return exits if len({e.rank for e in exits}) == 2 else None

    exits = await eventually(peers_exited, what="ranks 0 and 2 reported gone")
    assert {(e.node_id, e.stopped) for e in exits} == {("n1", "peer_failed"), ("n3", "peer_failed")}
    pids = [json.loads(f.read_text())["pid"] for f in out.glob("rank-*.json")]
    assert not [pid for pid in pids if _alive(pid)]
    assert len([e for e in await read_job_events(bus) if isinstance(e, RunFailed)]) == 1


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


async def test_a_preempted_gang_checkpoints_exits_and_its_next_run_resumes_from_the_step(
    bus: Bus, store: Store, stack: RunDispatcher
) -> None:
    spec = JobSpec(
        tenant="acme",
        queue="default",
        roles=[Role(name="trainer", replicas=3)],
        simulated_duration_s=120.0,
        simulated_checkpoint_interval_s=0.5,
        stop_grace_s=10.0,
    )
    now = time.time()
    await publish_event(bus, JobAccepted(at=now, job_id="j1", spec=spec, submitted_at=now), "j1:a")
    await publish_event(bus, JobAdmitted(at=now, job_id="j1", tenant="acme", run_id="j1-r1", attempt=1), "j1:adm")
    replicas = [ReplicaPlacement("trainer", i, i, n, [0]) for i, n in enumerate(NODES)]
    placed = JobPlaced(at=now, job_id="j1", tenant="acme", run_id="j1-r1", cluster=CLUSTER, replicas=replicas)
    await publish_event(bus, placed, "j1-r1:placed")

    async def checkpointed() -> bool:
        job = await views.get_job(store, "j1")
        return job is not None and job.status == "running" and (job.last_checkpoint_step or 0) >= 1

    await eventually(checkpointed, what="the run running with a checkpoint")
    notice = PreemptionNotice(
        at=time.time(), job_id="j1", tenant="acme", run_id="j1-r1", preemptor="j9", reason="priority", grace_period_s=10
    )
    await publish_event(bus, notice, "j1-r1:notice")
    await eventually(lambda: status(store, "pending"), what="the victim requeued")
    [failed] = [e for e in await read_job_events(bus) if isinstance(e, RunFailed)]
    exits = [m for _, _, d in await read_raw(bus, "WORK") if isinstance(m := decode_work(d), ProcessExited)]
    assert failed.reason == "preempted" and len(exits) == 3 and all(e.ok for e in exits)
    # The GPUs are given back only once every rank is gone, and the run ends when its last process did.
    assert failed.at == max(e.exited_at if e.exited_at is not None else e.at for e in exits)
    job = await views.get_job(store, "j1")
    assert job is not None and job.placement == () and job.last_checkpoint_step is not None
    saved = job.last_checkpoint_step
    # The next run starts from that step.
    again = JobAdmitted(at=time.time(), job_id="j1", tenant="acme", run_id="j1-r2", attempt=2, resume_from_step=saved)
    await publish_event(bus, again, "j1:adm2")
    placed = JobPlaced(at=time.time(), job_id="j1", tenant="acme", run_id="j1-r2", cluster=CLUSTER, replicas=replicas)
    await publish_event(bus, placed, "j1-r2:placed")

    async def resumed() -> list[StartRun] | None:
        starts = [
            m for _, _, d in await read_raw(bus, "WORK") if isinstance(m := decode_work(d), StartRun) and m.attempt == 2
        ]
        return starts if len(starts) == 3 else None

    starts = await eventually(resumed, what="the second run's StartRuns")
    assert {(s.resume_from_step, s.processes[0].env["TRAINYARD_RESUME_STEP"]) for s in starts} == {(saved, str(saved))}
    await eventually(lambda: status(store, "running"), what="the second run running")
