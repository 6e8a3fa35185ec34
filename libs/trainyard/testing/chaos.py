"""Chaos against a running local stack, and the count of what it broke.

A :class:`Chaos` run offers jobs through REST and the portals' intake subject
while it SIGKILLs processes (every service, nats-server and Redis), wipes
Redis (FLUSHALL) and stalls processes (SIGSTOP, then SIGCONT), and restarts
the nodes' host and nats-server within seconds of each other (see
:mod:`trainyard.testing.chaos_faults`).  Then it reads the JOBS stream back
and counts, from the log alone: submissions lost, jobs accepted twice, jobs
run twice to success, jobs stuck short of a terminal state, GPUs given to
two runs at once, dead letters, runs failed by a node loss, and the
difference between the ledger's GPU-seconds and the runs' intervals on the
log; and how the gateway answered reads of finished jobs during each rebuild.

Used by ``bench/chaos.py`` (the benchmark) and a short run in the e2e suite.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

import httpx
import msgspec
from nats.js.api import ConsumerConfig, DeliverPolicy

from trainyard.bus import Bus
from trainyard.core.invariants import check_job_log
from trainyard.domain import JobSpec, Role
from trainyard.events import (
    JobAccepted,
    JobCancelled,
    JobEvent,
    JobPlaced,
    JobRejected,
    RunFailed,
    RunStarted,
    RunSucceeded,
    SubmitJob,
    subjects,
)
from trainyard.ledger import Ledger
from trainyard.local import LocalStack
from trainyard.local.supervisor import Backoff, Supervisor, restart_server, servers
from trainyard.store import Store, views
from trainyard.testing.chaos_faults import finished_jobs, nodes_lost, restart_pair
from trainyard.testing.chaos_lists import after_rebuild, check_run, mismatches
from trainyard.testing.streams import read_job_events

TERMINAL = ("succeeded", "failed", "cancelled", "rejected")


class ChaosPlan(msgspec.Struct, frozen=True):
    jobs: int = 10_000
    rate: float = 50.0  # jobs offered per second
    kills: int = 100  # SIGKILLs, spread over the offering
    flushes: int = 10  # FLUSHALLs of Redis
    stalls: int = 10  # SIGSTOP ... SIGCONT
    stall_s: float = 10.0
    seed: int = 1
    drain_timeout_s: float = 600.0  # after the offering, how long every job may take to finish
    victims: tuple[str, ...] = ()  # processes faults may hit; () = every service, nats and redis
    restart_pairs: int = 0  # the emulator stalled, nats-server killed pair_gap_s later, then the emulator
    pair_gap_s: float = 4.0


class ChaosReport(msgspec.Struct):
    seed: int
    jobs: int
    faults: dict[str, int]  # what was injected, by kind
    lost: int  # submitted, never accepted or rejected on the log
    accepted_twice: int
    run_twice: int  # jobs with more than one successful run
    stuck: int  # not terminal when the drain timed out
    double_allocations: int  # invariant violations of the GPU holders
    dead_letters: int
    dead_letter_reasons: dict[str, int]
    ledger_minus_stream_gpu_s: float
    statuses: dict[str, int]
    unplanned_exits: dict[str, int]  # services that exited by themselves (restarted, as by a supervisor)
    failed_runs: dict[str, int]  # RunFailed on the log, by reason (node_failure: a node declared lost)
    violations: list[str]
    offered_s: float
    drained_s: float
    reads: dict[str, int] = {}  # reads of finished jobs during rebuilds: ok, rebuilding, missing, stale
    nodes_lost: int = 0  # NodeLost on the NODES stream: every one false (no node really dies here)
    lists: dict[str, int] = {}  # filtered lists against per-job reads (trainyard.testing.chaos_lists)

    @property
    def clean(self) -> bool:
        return not (
            self.lost
            or self.accepted_twice
            or self.run_twice
            or self.stuck
            or self.double_allocations
            or abs(self.ledger_minus_stream_gpu_s) > 1e-3
            or self.reads.get("missing")
            or self.reads.get("stale")
            or self.nodes_lost
            or mismatches(self.lists)
        )


def workload(n: int, seed: int) -> list[tuple[str, JobSpec]]:
    """Single GPUs to 2-node gangs, 0.2-2 s each, over three tenants."""
    rng = random.Random(seed)
    shapes = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 1)]
    out = []
    for i in range(n):
        r, g = rng.choice(shapes)
        spec = JobSpec(
            tenant=rng.choice(["acme", "globex", "initech"]),
            queue="default",
            name=f"chaos-{i}",
            roles=[Role(name="trainer", replicas=r, gpus_per_replica=g)],
            simulated_duration_s=round(rng.uniform(0.2, 2.0), 2),
        )
        out.append((f"chaos-{seed}-{i:05d}", spec))
    return out


class Chaos:
    def __init__(
        self,
        stack: LocalStack,
        plan: ChaosPlan,
        bus: Bus,
        store: Store,
        progress: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.stack = stack
        self.plan = plan
        self.bus = bus
        self.store = store
        self.progress = progress
        self.rng = random.Random(plan.seed)
        self.faults: Counter[str] = Counter()
        self.stalled: set[str] = set()
        # Restarts what exits by itself; what the chaos kills it restarts at once.
        self.supervisor = Supervisor(stack, say=progress, backoff=lambda: Backoff(first_s=0.5, max_s=5.0))
        self._procs_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self.reads: Counter[str] = Counter()  # answers of the reads during rebuilds
        self.lists: Counter[str] = Counter()  # filtered lists against per-job reads, after rebuilds and at the end

    # --- processes -------------------------------------------------------------

    def victims(self) -> list[str]:
        """Every service, and nats-server (each node of a NATS cluster: ``nats-1``...) and Redis."""
        every = [*self.stack.procs, *servers(self.stack)]
        return [v for v in (self.plan.victims or every) if v not in self.stalled]

    def _proc(self, name: str) -> subprocess.Popen:
        found = servers(self.stack)
        return found[name].proc if name in found else self.stack.procs[name]

    def kill(self, name: str) -> None:
        """SIGKILL ``name`` and start it again, as a crash and a supervisor would."""
        found = servers(self.stack)
        if name not in found:
            if self.stack.procs[name].poll() is None:
                self.stack.kill(name)
            self.stack.start_service(name)
            return
        restart_server(found[name])

    async def stall(self, name: str) -> None:
        proc = self._proc(name)
        self.stalled.add(name)
        try:
            os.kill(proc.pid, signal.SIGSTOP)
            await asyncio.sleep(self.plan.stall_s)
        finally:
            try:
                os.kill(proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.stalled.discard(name)

    async def supervise(self, stop: asyncio.Event) -> None:
        """Restart a process that exited on its own, as ``trainyard up``
        does, and count it: a fault should never make a service give up."""
        while not stop.is_set():
            async with self._procs_lock:
                await asyncio.to_thread(self.supervisor.check)
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except TimeoutError:
                pass

    async def flush(self) -> None:
        for _attempt in range(50):  # Redis may be restarting
            try:
                await self.store.redis.flushall()
                return
            except Exception:  # noqa: BLE001 - retried; a restart is one of the faults
                await asyncio.sleep(0.2)

    # --- the run -------------------------------------------------------------------

    def schedule(self, window_s: float) -> list[tuple[float, str]]:
        kinds = ["kill"] * self.plan.kills + ["flush"] * self.plan.flushes + ["stall"] * self.plan.stalls
        kinds += ["pair"] * self.plan.restart_pairs
        return sorted((self.rng.uniform(0.05, 0.95) * window_s, kind) for kind in kinds)

    async def inject(self, window_s: float) -> None:
        started = time.monotonic()
        for at, kind in self.schedule(window_s):
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            choices, name = self.victims(), ""
            if kind == "flush":
                try:
                    finished = await finished_jobs(self.store)
                except Exception:  # noqa: BLE001 - Redis restarting: nothing known to read back
                    finished = {}
                await self.flush()
                self._spawn(after_rebuild(self, finished))
                self.faults["flush"] += 1
            elif kind == "pair":
                self._spawn(restart_pair(self, self.plan.pair_gap_s))
                self.faults["pair"] += 1
            elif choices:
                name = self.rng.choice(choices)
                if kind == "kill":
                    async with self._procs_lock:
                        await asyncio.to_thread(self.kill, name)
                else:
                    self._spawn(self.stall(name))
                self.faults[f"{kind}:{name}"] += 1
            self.progress(f"{time.monotonic() - started:6.1f}s {kind} {name if kind in ('kill', 'stall') else ''}")
        await asyncio.gather(*self._tasks)

    def _spawn(self, fault: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(fault)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def offer(self, jobs: list[tuple[str, JobSpec]], token: str | None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx.AsyncClient(base_url=self.stack.api_url, timeout=10, headers=headers) as client:
            sem = asyncio.Semaphore(64)
            started = time.monotonic()

            async def one(i: int, job_id: str, spec: JobSpec) -> None:
                await asyncio.sleep(max(0.0, started + i / self.plan.rate - time.monotonic()))
                async with sem:
                    if i % 2 == 0:
                        await submit_rest(client, job_id, spec)
                    else:
                        await submit_event(self.bus, job_id, spec)

            await asyncio.gather(*(one(i, j, s) for i, (j, s) in enumerate(jobs)))

    async def run(self) -> ChaosReport:
        jobs = workload(self.plan.jobs, self.plan.seed)
        window = self.plan.jobs / self.plan.rate
        token = self.stack.admin_token
        t0 = time.monotonic()
        stop = asyncio.Event()
        supervisor = asyncio.create_task(self.supervise(stop))
        try:
            await asyncio.gather(self.offer(jobs, token), self.inject(window))
            offered = time.monotonic() - t0
            self.progress(f"offered {len(jobs)} jobs with {sum(self.faults.values())} faults in {offered:.0f}s")
            drained = await self.drain(len(jobs))
        finally:
            stop.set()
            await supervisor
        return await self.count(jobs, offered, drained)

    async def drain(self, n: int) -> float:
        """Wait until every job is terminal in the projection (or the timeout)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.plan.drain_timeout_s:
            try:
                counts = await views.status_counts(self.store)
            except Exception:  # noqa: BLE001 - Redis may be restarting
                counts = {}
            if sum(counts.get(s, 0) for s in TERMINAL) >= n:
                break
            await asyncio.sleep(0.5)
        return time.monotonic() - t0

    async def count(self, jobs: list[tuple[str, JobSpec]], offered: float, drained: float) -> ChaosReport:
        events = await read_job_events(self.bus)
        fold = check_job_log(events)
        ids = {job_id for job_id, _ in jobs}
        decided = Counter(e.job_id for e in events if isinstance(e, (JobAccepted, JobRejected)))
        statuses = Counter(r.status for j, r in fold.jobs.items() if j in ids)
        letters = await dead_letters(self.bus)
        await check_run(self, sorted(ids))
        return ChaosReport(
            seed=self.plan.seed,
            jobs=len(jobs),
            faults=dict(sorted(self.faults.items())),
            lost=sum(1 for j in ids if decided[j] == 0),
            accepted_twice=sum(1 for j in ids if decided[j] > 1),
            run_twice=sum(1 for j in ids if fold.successes.get(j, 0) > 1),
            stuck=sum(1 for j in ids if j in fold.jobs and fold.jobs[j].status not in TERMINAL),
            double_allocations=sum(1 for v in fold.violations if "while held by" in v),
            dead_letters=sum(letters.values()),
            dead_letter_reasons=dict(letters.most_common(10)),
            ledger_minus_stream_gpu_s=await self.ledger_difference(events),
            statuses=dict(statuses),
            unplanned_exits=dict(self.supervisor.restarts),
            failed_runs=dict(Counter(e.reason for e in events if isinstance(e, RunFailed))),
            violations=fold.violations[:20],
            offered_s=offered,
            drained_s=drained,
            reads=dict(self.reads),
            lists=dict(self.lists),
            nodes_lost=await nodes_lost(self.bus),
        )

    async def ledger_difference(self, events: list[JobEvent], timeout: float = 120.0) -> float:
        """The ledger's GPU-seconds minus the same from the log: each started
        run metered from its start to the first event that ended it."""
        expected = stream_gpu_seconds(events)
        ledger = Ledger(self.stack.ledger_url)
        try:
            deadline = time.monotonic() + timeout
            while True:  # accounting may still be catching up after its own restarts
                total = await asyncio.to_thread(ledger.total_gpu_seconds)
                if abs(total - expected) <= 1e-3 or time.monotonic() > deadline:
                    return total - expected
                await asyncio.sleep(0.5)
        finally:
            ledger.close()


def stream_gpu_seconds(events: list[JobEvent]) -> float:
    gpus: dict[str, int] = {}
    started: dict[str, float] = {}
    total = 0.0
    for e in events:
        if isinstance(e, JobPlaced):
            gpus.setdefault(e.run_id, sum(len(r.gpus) for r in e.replicas))
        elif isinstance(e, RunStarted) and e.run_id in gpus:
            started.setdefault(e.run_id, e.at)
        elif isinstance(e, (RunSucceeded, RunFailed, JobCancelled)) and e.run_id in started:
            total += gpus[e.run_id] * max(0.0, e.at - started.pop(e.run_id))
            gpus.pop(e.run_id)  # a later end of the same run is stale
    return total


async def dead_letters(bus: Bus) -> Counter[str]:
    """Dead letters by reason (the ``Trainyard-Reason`` header, first 80 characters)."""
    info = await bus.js.stream_info("DEADLETTER")
    reasons: Counter[str] = Counter()
    if info.state.messages == 0:
        return reasons
    config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    sub = await bus.js.subscribe(subjects.DEADLETTER_ALL, stream="DEADLETTER", ordered_consumer=True, config=config)
    try:
        seq = 0
        while seq < info.state.last_seq:
            msg = await sub.next_msg(timeout=10)
            seq = msg.metadata.sequence.stream
            reasons[(msg.headers or {}).get("Trainyard-Reason", "?")[:80]] += 1
    finally:
        await sub.unsubscribe()
    return reasons


async def submit_rest(client: httpx.AsyncClient, job_id: str, spec: JobSpec) -> None:
    body = {**msgspec.to_builtins(spec), "job_id": job_id}
    for _ in range(600):  # the gateway, NATS or Redis may be restarting: retry with the same id
        try:
            response = await client.post("/v1/jobs", json=body)
            if response.status_code == 202:
                return
            if response.status_code < 500:
                raise RuntimeError(f"{job_id}: {response.status_code} {response.text}")
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"could not submit {job_id} through REST")


async def submit_event(bus: Bus, job_id: str, spec: JobSpec) -> None:
    command = SubmitJob(at=time.time(), spec=spec, job_id=job_id)
    for _ in range(600):  # NATS may be restarting: the message id makes a retry one submission
        try:
            await bus.publish(subjects.intake(spec.tenant), command, msg_id=f"portal:{job_id}")
            return
        except Exception:  # noqa: BLE001 - retried
            await asyncio.sleep(0.2)
    raise RuntimeError(f"could not submit {job_id} on intake")
