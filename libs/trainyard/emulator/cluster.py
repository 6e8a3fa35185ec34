"""An emulated cluster: fake GPU nodes that register, heartbeat, report GPU telemetry
and "run" the runs placed on them for their simulated duration, then report success.

Each node has a fake GPU backend driven by a ``NodeAgent``, as on a real node;
faults are injected through the control endpoint (see control.py).

One process stands in for many nodes.  It is the emulator binder as well: it
follows ``JobPlaced`` for its nodes, reports ``RunStarted`` and, when the run's
time is up, ``RunSucceeded``.  After a restart it picks up the runs the
projection says are on its nodes, so no run is lost or reported twice (every
report carries a message id derived from the run id).  Whatever it reads from
the projection it reads caught up: a placement the projection has not reached
yet, and a restart during a rebuild, wait for it, never give up.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence

import nats.errors
from redis.exceptions import RedisError

from trainyard.agent.control import agent_control_wildcard, emulator_control_subject
from trainyard.agent.node import NodeAgent
from trainyard.bus import Bus, ConsumerSpec, Delivery, JobEvents, Outcome, PublishRequest, run_consumer
from trainyard.core.lifecycle import JobRecord
from trainyard.domain.node import NodeInfo
from trainyard.emulator.control import EmulatorControl
from trainyard.events import (
    CheckpointSaved,
    JobAccepted,
    JobAdmitted,
    JobCancelled,
    JobEvent,
    JobPlaced,
    NodeHeartbeat,
    NodeRegistered,
    PreemptionNotice,
    RunFailed,
    RunStarted,
    RunSucceeded,
    encode,
    subjects,
)
from trainyard.gpu.fake import FakeGpuBackend
from trainyard.observability.logs import kv
from trainyard.store import Store, views
from trainyard.store.projector import wait_until_projected

log = logging.getLogger(__name__)

DEFAULT_DURATION_S = 5.0


def _duration(job: JobRecord) -> float:
    """How long an emulated run of ``job`` takes."""
    spec = job.job_spec
    return (spec.simulated_duration_s if spec else None) or DEFAULT_DURATION_S


def default_topology(
    cluster: str = "local", nodes: int = 16, gpus: int = 8, racks: int = 2, gpu_type: str = "H100", blocks: int = 1
) -> list[NodeInfo]:
    """``nodes`` nodes spread evenly over ``racks`` racks in ``blocks`` blocks."""
    per_rack = max(1, -(-nodes // racks))
    racks_per_block = max(1, -(-racks // blocks))
    out = []
    for i in range(nodes):
        rack = i // per_rack
        out.append(
            NodeInfo(
                node_id=f"n{i:02d}" if nodes <= 100 else f"n{i:04d}",
                cluster=cluster,
                gpu_type=gpu_type,
                gpus=gpus,
                zone="z1",
                block=f"b{rack // racks_per_block + 1}",
                rack=f"r{rack + 1}",
            )
        )
    return out


class EmulatedCluster(JobEvents):
    """Fake GPU nodes, and the binder of runs placed on them (a subscription to JOBS)."""

    def __init__(
        self,
        bus: Bus,
        store: Store,
        nodes: list[NodeInfo],
        clock: Callable[[], float] = time.time,
        heartbeat_interval_s: float = 1.0,
        telemetry_interval_s: float = 5.0,
    ) -> None:
        self.bus = bus
        self.store = store
        self.nodes = {n.node_id: n for n in nodes}
        self.clock = clock
        self.heartbeat_interval_s = heartbeat_interval_s
        self.boot_id = uuid.uuid4().hex[:12]
        self.silent: set[str] = set()  # nodes that stopped heartbeating (fault injection)
        self.running: dict[str, asyncio.TimerHandle] = {}  # run id -> completion timer
        self.durations: dict[str, float] = {}  # job id -> simulated run time, from JobAccepted
        self.checkpoint_every: dict[str, float] = {}  # job id -> simulated checkpoint interval
        self.progress: dict[str, int] = {}  # job id -> seconds of work in its last checkpoint
        self.runs: dict[str, tuple[str, str, float, int]] = {}  # run id -> (job, tenant, started_at, base step)
        self.checkpointers: dict[str, asyncio.Task] = {}  # run id -> its periodic checkpoint task
        self.finished: set[str] = set()  # runs this process reported done
        self._finished_order: collections.deque[str] = collections.deque()
        self._pending: set[asyncio.Task] = set()
        self.telemetry_interval_s = telemetry_interval_s
        self.backends = {
            n.node_id: FakeGpuBackend(n.gpus, clock=clock, uuid_prefix=f"GPU-{n.node_id}") for n in nodes
        }  # node id -> its fake GPUs
        self.agents = {
            n.node_id: NodeAgent(bus, n, self.backends[n.node_id], clock=clock, boot_id=self.boot_id) for n in nodes
        }  # node id -> the agent reading its fake GPUs
        self.control = EmulatorControl(self.agents, self.backends, self.silent, clock)

    # --- node side ---

    async def register(self) -> None:
        requests = [
            PublishRequest(
                subjects.node(n.cluster, n.node_id),
                NodeRegistered(at=self.clock(), node=n, boot_id=self.boot_id),
                f"register:{n.node_id}:{self.boot_id}",
            )
            for n in self.nodes.values()
        ]
        for r in await self.bus.publish_many(requests):
            if isinstance(r, Exception):
                raise r

    async def heartbeat_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for n in self.nodes.values():
                if n.node_id in self.silent:
                    continue
                beat = NodeHeartbeat(at=self.clock(), node_id=n.node_id, cluster=n.cluster, boot_id=self.boot_id)
                try:
                    await self.bus.nc.publish(subjects.telemetry(n.cluster, n.node_id), encode(beat))
                except Exception as err:  # noqa: BLE001 - NATS down: beat again next tick
                    log.warning("heartbeat failed: %r", err)
                    break
            try:
                await asyncio.wait_for(stop.wait(), self.heartbeat_interval_s)
            except TimeoutError:
                pass

    async def telemetry_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for node_id, agent in self.agents.items():
                if node_id in self.silent:
                    continue
                try:
                    await agent.publish_sample()
                except Exception as err:  # noqa: BLE001 - NATS down: sample again next tick
                    log.warning("telemetry failed: %r", err)
                    break
            try:
                await asyncio.wait_for(stop.wait(), self.telemetry_interval_s)
            except TimeoutError:
                pass

    # --- binder side ---

    def _mine(self, event: JobPlaced) -> bool:
        return any(r.node_id in self.nodes for r in event.replicas)

    async def _start(
        self,
        job_id: str,
        tenant: str,
        run_id: str,
        duration: float,
        started_at: float | None,
        nodes: Sequence[str] = (),
    ) -> None:
        if run_id in self.running:
            return
        if started_at is None:
            await self.bus.publish(
                subjects.job(tenant, job_id, "agent"),
                RunStarted(at=self.clock(), job_id=job_id, tenant=tenant, run_id=run_id),
                msg_id=f"{run_id}:started",
            )
            started_at = self.clock()
            log.info(
                "run started",
                extra=kv(
                    decision="started", job_id=job_id, run_id=run_id, tenant=tenant, nodes=nodes, duration_s=duration
                ),
            )
        # A run resumed from a checkpoint only has the rest of the work to do.
        base = min(self.progress.get(job_id, 0), int(duration))
        delay = max(0.0, started_at + duration - base - self.clock())
        loop = asyncio.get_running_loop()
        self.running[run_id] = loop.call_later(delay, self._finish_soon, job_id, tenant, run_id)
        self.runs[run_id] = (job_id, tenant, started_at, base)
        every = self.checkpoint_every.get(job_id)
        if every:
            self.checkpointers[run_id] = asyncio.ensure_future(self._checkpoint_every(run_id, every))

    def _step(self, run_id: str) -> int:
        _, _, started_at, base = self.runs[run_id]
        return base + int(self.clock() - started_at)

    async def _checkpoint(self, run_id: str) -> None:
        job_id, tenant, _, _ = self.runs[run_id]
        step = self._step(run_id)
        await self.bus.publish(
            subjects.job(tenant, job_id, "agent"),
            CheckpointSaved(at=self.clock(), job_id=job_id, tenant=tenant, run_id=run_id, step=step),
            msg_id=f"{run_id}:checkpoint:{step}",
        )

    async def _checkpoint_every(self, run_id: str, every: float) -> None:
        while run_id in self.running:
            await asyncio.sleep(every)
            if run_id in self.running:
                try:
                    await self._checkpoint(run_id)
                except Exception as err:  # noqa: BLE001 - the next checkpoint may succeed
                    log.warning("checkpoint of %s failed: %r", run_id, err)

    async def _yield(self, run_id: str) -> None:
        """A preemption notice: write a checkpoint, then stop the run."""
        if run_id not in self.running:
            return
        job_id, tenant, _, _ = self.runs[run_id]
        await self._checkpoint(run_id)
        self._stop_run(run_id)
        await self.bus.publish(
            subjects.job(tenant, job_id, "agent"),
            RunFailed(
                at=self.clock(),
                job_id=job_id,
                tenant=tenant,
                run_id=run_id,
                reason="preempted",
                message="stopped at a checkpoint after a preemption notice",
            ),
            msg_id=f"{run_id}:failed",
        )
        log.info(
            "run failed", extra=kv(decision="failed", job_id=job_id, run_id=run_id, tenant=tenant, reason="preempted")
        )

    def _finish_soon(self, job_id: str, tenant: str, run_id: str) -> None:
        task = asyncio.ensure_future(self._finish(job_id, tenant, run_id))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _finish(self, job_id: str, tenant: str, run_id: str) -> None:
        for attempt in range(50):
            try:
                await self.bus.publish(
                    subjects.job(tenant, job_id, "agent"),
                    RunSucceeded(at=self.clock(), job_id=job_id, tenant=tenant, run_id=run_id),
                    msg_id=f"{run_id}:succeeded",
                )
                log.info("run succeeded", extra=kv(decision="succeeded", job_id=job_id, run_id=run_id, tenant=tenant))
                break
            except Exception as err:  # noqa: BLE001 - NATS briefly away; keep the result
                log.warning("reporting %s failed (%r); retrying", run_id, err)
                await asyncio.sleep(min(0.2 * (attempt + 1), 2.0))
        self._stop_run(run_id)
        self.durations.pop(job_id, None)
        self.checkpoint_every.pop(job_id, None)
        self.progress.pop(job_id, None)
        self._remember_finished(run_id)

    def _remember_finished(self, run_id: str, keep: int = 100_000) -> None:
        self.finished.add(run_id)
        self._finished_order.append(run_id)
        if len(self._finished_order) > keep:
            self.finished.discard(self._finished_order.popleft())

    def _stop_run(self, run_id: str | None) -> None:
        handle = self.running.pop(run_id or "", None)
        if handle is not None:
            handle.cancel()
        checkpointer = self.checkpointers.pop(run_id or "", None)
        if checkpointer is not None:
            checkpointer.cancel()
        self.runs.pop(run_id or "", None)

    async def handle(self, batch: Sequence[Delivery[JobEvent]]) -> list[Outcome]:
        outcomes = [Outcome.done()] * len(batch)
        starts: list[tuple[int, int, JobPlaced]] = []  # (index, stream sequence, placement)
        for i, delivery in enumerate(batch):
            event = delivery.event
            if isinstance(event, JobAccepted):
                self.durations[event.job_id] = event.spec.simulated_duration_s or DEFAULT_DURATION_S
                if event.spec.simulated_checkpoint_interval_s:
                    self.checkpoint_every[event.job_id] = event.spec.simulated_checkpoint_interval_s
            elif isinstance(event, JobAdmitted) and event.resume_from_step:
                self.progress[event.job_id] = event.resume_from_step
            elif isinstance(event, CheckpointSaved):
                self.progress[event.job_id] = max(self.progress.get(event.job_id, 0), event.step)
            elif isinstance(event, PreemptionNotice) and event.run_id in self.running:
                task = asyncio.ensure_future(self._yield(event.run_id))
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)
            elif isinstance(event, JobPlaced) and self._mine(event):
                starts.append((i, delivery.seq, event))
            elif isinstance(event, JobCancelled):
                self._stop_run(event.run_id)
                self.durations.pop(event.job_id, None)
            elif isinstance(event, RunFailed):
                self._stop_run(event.run_id)
        # A placement for a job accepted before this process started: the
        # projection knows its duration and whether the run already started.
        unknown = [e.job_id for _, _, e in starts if e.job_id not in self.durations or e.run_id in self.finished]
        jobs = {j.job_id: j for j in await views.get_jobs(self.store, unknown)} if unknown else {}

        async def start(seq: int, event: JobPlaced) -> Outcome:
            if event.run_id in self.finished or event.run_id in self.running:
                return Outcome.done()
            started_at = None
            duration = self.durations.get(event.job_id)
            if duration is None:
                job = jobs.get(event.job_id)
                if job is None or job.last_seq < seq:
                    epoch, applied = await self.store.projection_state("jobs")
                    if job is None and epoch and applied >= seq:
                        return Outcome.poison("a placement of a job the log never accepted")
                    # A valid placement: wait for the projection however long it lags.
                    return Outcome.wait("the job projection has not caught up with this placement")
                if job.run_id != event.run_id or job.status not in ("placed", "running"):
                    return Outcome.done()  # the run is over or was superseded
                duration = _duration(job)
                started_at = job.started_at
            try:
                nodes = sorted({r.node_id for r in event.replicas})
                await self._start(event.job_id, event.tenant, event.run_id, duration, started_at, nodes)
            except Exception as err:  # noqa: BLE001 - settled by the consumer loop
                return Outcome.failed(err)
            return Outcome.done()

        started = await asyncio.gather(*(start(seq, e) for _, seq, e in starts))
        for (i, _, _), outcome in zip(starts, started, strict=True):
            outcomes[i] = outcome
        return outcomes

    async def resume(self, timeout: float | None = None) -> None:
        """Pick up runs on our nodes that were placed or running before a restart,
        once the job projection holds everything the log held when called
        (waiting while it is rebuilt; TimeoutError after ``timeout``)."""
        await wait_until_projected(self.bus, self.store, "JOBS", timeout=timeout)
        job_ids: set[str] = set()
        for node_id in self.nodes:
            job_ids.update(await views.jobs_on_node(self.store, node_id))
        for job in await views.get_jobs(self.store, sorted(job_ids)):
            if job.status in ("placed", "running") and job.run_id:
                duration = _duration(job)
                await self._start(job.job_id, job.tenant, job.run_id, duration, job.started_at)

    async def run(self, stop: asyncio.Event) -> None:
        await self.register()
        cluster = next(iter(self.nodes.values())).cluster
        spec = ConsumerSpec(
            stream="JOBS", durable=f"emulator-{cluster}", filter_subject=subjects.JOBS_ALL, ack_wait_s=5.0
        )
        subs = [
            await self.bus.nc.subscribe(emulator_control_subject(cluster), cb=self.control.on_message),
            await self.bus.nc.subscribe(agent_control_wildcard(cluster), cb=self.control.on_message),
        ]

        async def bind() -> None:
            # The nodes heartbeat meanwhile: waiting for a rebuild must not look like a lost node.
            delay = 0.2
            while not stop.is_set():
                try:
                    await self.resume(timeout=5.0)
                    break
                except TimeoutError:
                    log.warning("still waiting for the job projection before resuming runs")
                except (RedisError, OSError, nats.errors.Error) as err:  # a server restarting: wait it out
                    log.warning("cannot read the job projection to resume runs (%r); trying again in %.1fs", err, delay)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    delay = min(delay * 2, 5.0)
            await run_consumer(self.bus, spec, self, stop)

        try:
            await asyncio.gather(self.heartbeat_loop(stop), self.telemetry_loop(stop), bind())
        finally:
            for handle in self.running.values():
                handle.cancel()
            for sub in subs:
                await sub.unsubscribe()
