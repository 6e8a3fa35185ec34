"""Recovery benchmark: fatal faults on a loaded 64-node emulated cluster.

Starts the local stack (real NATS and Redis, every service in its own
process) with 64 emulated nodes x 8 GPUs in 8 racks, keeps it busy with a
seeded stream of jobs (single GPUs to 4-node gangs, 4-12 s each, about 60% of
the GPUs), then injects fatal faults (XID 79, "fallen off the bus") one at a
time, spread over the run, each on a node that runs at least one job.  After
every affected job runs again the node is repaired (fault cleared, operator
uncordon) so that the blast-radius limit never holds an isolation back.

Rack correlation is switched off for the run (``rack_fault_min_nodes``
1000): 50 faults on 8 racks within minutes would otherwise, rightly, be
reported as rack faults instead of isolating nodes.

Prints, over the faults: time from the fault to the node taken out of service
(the NodeStateChanged event reaching a subscriber) and from the fault to each
affected job running again (its new run's RunStarted), p50 / p99 / max.

    .venv/bin/python bench/recovery.py [--faults 50] [--nodes 64] [--seed 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time

import httpx
import msgspec

from trainyard.agent.control import ControlRequest, decode_reply, emulator_control_subject, encode
from trainyard.bus import Bus
from trainyard.core.invariants import check_job_log
from trainyard.domain import JobSpec, Role
from trainyard.events import RunFailed, RunStarted, SubmitJob, decode_job_event, decode_node_event, subjects
from trainyard.events.nodes import NodeStateChanged
from trainyard.local import LocalStack, StackConfig
from trainyard.store import Store, views
from trainyard.testing.streams import read_job_events

SHAPES = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 8)]  # (replicas, GPUs per replica)
WEIGHTS = [3, 3, 3, 4, 2, 1]


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


class Watcher:
    """Arrival times of node state changes and run starts / failures, from core subscriptions."""

    def __init__(self) -> None:
        self.isolated: dict[str, list[float]] = {}  # node -> arrival times of out-of-service changes
        self.started: dict[str, list[tuple[str, float]]] = {}  # job -> (run id, arrival)
        self.failed: dict[str, tuple[str, str]] = {}  # run id -> (reason, node)

    async def subscribe(self, bus: Bus) -> None:
        async def on_node(msg) -> None:  # type: ignore[no-untyped-def]
            now = time.time()
            try:
                event = decode_node_event(msg.data)
            except msgspec.MsgspecError:
                return
            if isinstance(event, NodeStateChanged) and event.previous == "healthy" and event.state != "healthy":
                self.isolated.setdefault(event.node_id, []).append(now)

        async def on_job(msg) -> None:  # type: ignore[no-untyped-def]
            now = time.time()
            try:
                event = decode_job_event(msg.data)
            except msgspec.MsgspecError:
                return
            if isinstance(event, RunStarted):
                self.started.setdefault(event.job_id, []).append((event.run_id, now))
            elif isinstance(event, RunFailed):
                self.failed[event.run_id] = (event.reason, event.node_id or "")

        await bus.nc.subscribe(subjects.NODES_ALL, cb=on_node)
        await bus.nc.subscribe(subjects.JOBS_ALL, cb=on_job)


async def load(bus: Bus, store: Store, rng: random.Random, stop: asyncio.Event, target_gpus: int) -> int:
    """Keep about ``target_gpus`` GPUs asked for by pending and running jobs."""
    n = 0
    while not stop.is_set():
        counts = await views.status_counts(store)
        busy = int((await views.gpus_by_type(store, "inuse")).get("H100", 0))
        pending = counts.get("pending", 0) + counts.get("admitted", 0)
        while busy < target_gpus and pending < 8:
            replicas, gpus = rng.choices(SHAPES, WEIGHTS)[0]
            spec = JobSpec(
                tenant=rng.choice(["acme", "globex"]),
                queue="default",
                name=f"load-{n}",
                roles=[Role(name="w", replicas=replicas, gpus_per_replica=gpus)],
                simulated_duration_s=round(rng.uniform(4.0, 12.0), 1),
            )
            job_id = f"load-{n:05d}"
            await bus.publish(
                subjects.intake(spec.tenant), SubmitJob(at=time.time(), spec=spec, job_id=job_id), msg_id=job_id
            )
            busy += replicas * gpus
            pending += 1
            n += 1
        await asyncio.sleep(0.2)
    return n


async def running_jobs_on(store: Store, node_id: str) -> dict[str, str]:
    jobs = await views.get_jobs(store, await views.jobs_on_node(store, node_id), ("run_id",))
    return {j.job_id: j.run_id for j in jobs if j.status == "running" and j.run_id}


async def control(bus: Bus, request: ControlRequest) -> float:
    msg = await bus.nc.request(emulator_control_subject("local"), encode(request), timeout=5)
    reply = decode_reply(msg.data)
    if not reply.ok:
        raise RuntimeError(reply.message)
    return float(reply.details.get("injected_at", time.time()))


async def one_fault(
    bus: Bus,
    store: Store,
    http: httpx.AsyncClient,
    watcher: Watcher,
    rng: random.Random,
    nodes: list[str],
    isolate: list[float],
    rerun: list[float],
    notes: list[str],
) -> None:
    # 1. A node running at least one job.
    for _ in range(200):
        node = rng.choice(nodes)
        if await store.redis.hget(store.key("nodestate"), node) == "healthy" and (
            affected := await running_jobs_on(store, node)
        ):
            break
        await asyncio.sleep(0.05)
    else:
        notes.append("no busy healthy node found")
        return
    # 2. The fault.
    seen_before = len(watcher.isolated.get(node, []))
    fault_at = await control(bus, ControlRequest(op="xid", node_id=node, gpu=rng.randrange(8), xid=79, by="bench"))
    # 3. Isolated, then every affected job running again (or finished before the fault reached it).
    deadline = time.time() + 60
    while len(watcher.isolated.get(node, [])) <= seen_before and time.time() < deadline:
        await asyncio.sleep(0.005)
    if len(watcher.isolated.get(node, [])) > seen_before:
        isolate.append(watcher.isolated[node][seen_before] - fault_at)
    else:
        notes.append(f"{node} was not isolated")
    waiting = dict(affected)
    while waiting and time.time() < deadline:
        for job_id, old_run in list(waiting.items()):
            failure = watcher.failed.get(old_run)
            if failure is None:
                job = await views.get_job(store, job_id)
                if job is not None and job.status == "succeeded" and job.run_id == old_run:
                    del waiting[job_id]  # it finished before the fault reached it
                continue
            later = [at for run, at in watcher.started.get(job_id, []) if run != old_run and at >= fault_at]
            if later:
                rerun.append(later[0] - fault_at)
                del waiting[job_id]
        await asyncio.sleep(0.005)
    if waiting:
        notes.append(f"{len(waiting)} job(s) of {node} not running again within 60 s")
    # 4. Repair: clear the fault and return the node.
    await control(bus, ControlRequest(op="clear", node_id=node, by="bench"))
    for _ in range(100):
        r = await http.post(f"/v1/nodes/{node}/uncordon", json={"reason": "bench repair", "operator": "bench"})
        if r.status_code == 202:
            break
        await asyncio.sleep(0.1)  # still draining: uncordon applies once health has moved it


async def main(args: argparse.Namespace) -> None:
    os.environ["TRAINYARD_HEALTH_POLICY"] = json.dumps({"rack_fault_min_nodes": 1000})
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        stack = LocalStack(StackConfig(data_dir=tmp, nodes=args.nodes, racks=8, log_level="WARNING"))
        stack.start()
        assert stack.nats and stack.redis
        bus = await Bus.connect(stack.nats.admin_url, "bench")
        store = Store.from_url(stack.redis.admin_url)
        watcher = Watcher()
        await watcher.subscribe(bus)
        stop = asyncio.Event()
        try:
            nodes = [f"n{i:02d}" for i in range(args.nodes)]
            submitter = asyncio.create_task(load(bus, store, rng, stop, int(args.nodes * 8 * args.load)))
            await asyncio.sleep(args.warmup)
            isolate: list[float] = []
            rerun: list[float] = []
            notes: list[str] = []
            started = time.time()
            async with httpx.AsyncClient(base_url=stack.api_url, timeout=10, headers=stack.admin_headers()) as http:
                for _ in range(args.faults):
                    await one_fault(bus, store, http, watcher, rng, nodes, isolate, rerun, notes)
                    await asyncio.sleep(rng.uniform(0.2, 0.8))
            stop.set()
            submitted = await submitter
            events = await read_job_events(bus)
            violations = check_job_log(events).violations + await views.violations(store)
            print(
                f"recovery: {args.nodes} nodes x 8 GPUs, {submitted} jobs submitted, {args.faults} XID 79 faults "
                f"over {time.time() - started:.0f} s, load target {args.load:.0%}"
            )
            for name, values in (
                ("fault -> node out of service", isolate),
                ("fault -> affected job running again", rerun),
            ):
                print(
                    f"  {name:38s} n={len(values):3d}  p50 {pct(values, 50) * 1000:7.0f} ms  "
                    f"p99 {pct(values, 99) * 1000:7.0f} ms  max {max(values, default=float('nan')) * 1000:7.0f} ms"
                    f"  mean {statistics.fmean(values) * 1000 if values else float('nan'):7.0f} ms"
                )
            print(f"  invariant violations: {len(violations)}; services exited: {stack.exited() or 'none'}")
            for note in sorted(set(notes)):
                print(f"  note: {note} (x{notes.count(note)})")
        finally:
            stop.set()
            await bus.close()
            await store.close()
            stack.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--faults", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--load", type=float, default=0.6, help="share of GPUs kept asked for")
    parser.add_argument("--warmup", type=float, default=8.0, help="seconds of load before the first fault")
    asyncio.run(main(parser.parse_args()))
