"""The run dispatcher: placed runs on executing nodes become orders to their
node agents, and the agents' reports become the run's lifecycle events
(docs/execution.md).

It runs in the placement service and acts only while the process holds the
cluster's placement lease.  Two durable consumers and a timer:

1. JOBS (``dispatcher-<cluster>``): ``JobPlaced`` on nodes that all execute
   (``NodeInfo.executes``) -> a ``StartRun`` per node, planned by
   :func:`trainyard.core.execution.plan` from the job's spec in the caught-up
   projection; ``PreemptionNotice`` -> ``SignalRun`` to each node;
   ``JobCancelled`` / ``RunFailed`` / ``RunSucceeded`` of the run ->
   ``StopRun`` to each node that still holds a process of it.
2. WORK reports (``dispatcher-reports-<cluster>``, see :mod:`.reports`).
3. Start timeouts: a run not started on every node within ``start_timeout_s``
   is failed as ``lost`` (requeued, its GPUs freed) and stopped.

Per-run state lives in Redis (:mod:`.runbook`), so a restart or a standby
taking over carries on.  Every message has an id derived from the run id
(``<run_id>:start:<node>``, ``<run_id>:failed``, ...), so a message handled
twice is stored once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

import msgspec

from trainyard.bus import Bus, ConsumerSpec, Delivery, JobEvents, Outcome, PublishRequest, run_consumer
from trainyard.bus.subscription import each
from trainyard.core.execution import choose_port, plan
from trainyard.core.lifecycle import JobRecord
from trainyard.domain.node import NodeInfo
from trainyard.events import JobCancelled, JobEvent, JobPlaced, PreemptionNotice, RunFailed, RunSucceeded, subjects
from trainyard.events.work import SignalRun, StartRun, StopReason, StopRun
from trainyard.store import Store, views
from trainyard_placement.handlers import Leadership
from trainyard_placement.reports import Reports, run_failed
from trainyard_placement.runbook import RunBook, RunMeta, RunState

log = logging.getLogger(__name__)

ACK_WAIT_S = 5.0  # the dispatcher's consumers: every message is handled in a few Redis round trips

_node = msgspec.json.Decoder(NodeInfo)

#: Why the run's processes are stopped, by the JOBS event that ended it.
_FAILURE_STOPS: dict[str, StopReason] = {
    "timeout": "timeout",
    "preempted": "preempted",
    "workload_error": "peer_failed",
    "node_failure": "lost",
    "lost": "lost",
}


def stops(run_id: str, meta: RunMeta, nodes: Sequence[str], reason: StopReason, at: float) -> list[PublishRequest]:
    """``StopRun`` to each of ``nodes``: one per node and run, whatever the reason (the first is kept)."""
    return [
        PublishRequest(
            subjects.work_orders(meta.cluster, node),
            StopRun(
                at=at,
                job_id=meta.job_id,
                tenant=meta.tenant,
                run_id=run_id,
                node_id=node,
                reason=reason,
                signal=meta.stop_signal,
                grace_period_s=meta.stop_grace_s,
            ),
            f"{run_id}:stop:{node}",
        )
        for node in nodes
    ]


class JobOrders(JobEvents):
    """The JOBS side: job events -> orders to the nodes of runs on executing nodes."""

    def __init__(self, dispatcher: RunDispatcher) -> None:
        self.d = dispatcher
        self.book = dispatcher.book
        self.store = dispatcher.store

    async def handle(self, batch: Sequence[Delivery[JobEvent]]) -> list[Outcome]:
        if not self.d.leading:
            return [Outcome.retry("not the placement leader", 1.0)] * len(batch)
        return await each(batch, self._one)

    async def _one(self, delivery: Delivery[JobEvent]) -> Outcome:
        event = delivery.event
        if isinstance(event, JobPlaced):
            return await self._placed(event, delivery.seq)
        if isinstance(event, PreemptionNotice):
            return await self._notice(event)
        if isinstance(event, JobCancelled):
            return await self._ended(event.job_id, event.run_id, "cancelled", event.at)
        if isinstance(event, RunFailed):
            return await self._ended(event.job_id, event.run_id, _FAILURE_STOPS.get(event.reason, "lost"), event.at)
        if isinstance(event, RunSucceeded):
            return await self._ended(event.job_id, event.run_id, "run_over", event.at)
        return Outcome.done()

    async def _placed(self, event: JobPlaced, seq: int) -> Outcome:
        # 1. Only runs whose every node has an agent that executes.
        node_ids = sorted({r.node_id for r in event.replicas})
        raw = await self.store.redis.hmget(self.store.key("nodeinfo"), node_ids)
        if any(r is None for r in raw):
            return Outcome.wait("the node projection has not caught up with this placement")
        nodes = {n: _node.decode(r) for n, r in zip(node_ids, raw, strict=True)}
        executing = [n for n, info in nodes.items() if info.executes]
        if not executing:
            return Outcome.done()  # the emulator's
        if len(executing) < len(nodes):
            log.warning("dispatch: run %s spans executing and emulated nodes; left to the emulator", event.run_id)
            return Outcome.done()
        # 2. The job as the projection holds it once it has folded this placement.
        _, applied = await self.store.projection_state("jobs")
        if applied < seq:
            return Outcome.wait("the job projection has not caught up with this placement")
        job = await views.get_job(self.store, event.job_id)
        if job is None or job.run_id != event.run_id or job.status not in views.HOLDING:
            return Outcome.done()  # the run is over or was superseded
        spec = job.job_spec
        if spec is None:
            return Outcome.poison(f"job {event.job_id} has no spec in the projection")
        # 3. Its port on the rank-0 node (the first one recorded: the same on every redelivery), and the plan.
        master = min(event.replicas, key=lambda r: r.rank).node_id
        port, taken = await self.book.port(event.run_id, master)
        port = port if port is not None else choose_port(event.run_id, taken)

        def planned(port: int) -> dict[str, StartRun]:
            at = self.d.clock()
            return plan(spec, event.job_id, event.tenant, event.run_id, job.attempt, event.cluster, event.replicas,
                        nodes, port, job.last_checkpoint_step, at)  # fmt: skip

        orders = planned(port)
        meta = RunMeta(
            job_id=event.job_id,
            tenant=event.tenant,
            cluster=event.cluster,
            ranks={node_id: [p.rank for p in order.processes] for node_id, order in orders.items()},
            master=master,
            port=port,
            stop_signal=spec.stop_signal,
            stop_grace_s=spec.stop_grace_s,
            deadline=self.d.clock() + self.d.start_timeout_s,  # from its first orders (kept on redelivery)
        )
        kept = await self.book.open(event.run_id, meta, started=job.status == "running")
        if kept.port != port:
            orders = planned(kept.port)
        return Outcome.done(
            *(
                PublishRequest(subjects.work_orders(event.cluster, node_id), order, f"{event.run_id}:start:{node_id}")
                for node_id, order in orders.items()
            )
        )

    async def _notice(self, event: PreemptionNotice) -> Outcome:
        state = await self.book.get(event.run_id)
        if state is None or state.over:
            return Outcome.done()
        await self.book.mark(event.run_id, "signalled")
        meta = state.meta
        signals = [
            PublishRequest(
                subjects.work_orders(meta.cluster, node),
                SignalRun(
                    at=self.d.clock(),
                    job_id=meta.job_id,
                    tenant=meta.tenant,
                    run_id=event.run_id,
                    node_id=node,
                    signal=meta.stop_signal,
                    grace_period_s=event.grace_period_s,
                ),
                f"{event.run_id}:signal:{node}",
            )
            for node in state.holding()
        ]
        # Every rank already gone: the run ends now.
        ended = await self.d.reports.conclude(event.run_id) if not signals else []
        return Outcome.done(*signals, *ended)

    async def _ended(self, job_id: str, run_id: str | None, reason: StopReason, at: float) -> Outcome:
        if run_id is None:  # a cancel names no run: the job's current one
            job = await views.get_job(self.store, job_id, ("run_id",))
            run_id = job.run_id if job is not None else None
        state = await self.book.get(run_id) if run_id else None
        if state is None or run_id is None:
            return Outcome.done()
        await self.book.mark(run_id, "over", reason)
        await self.book.done_starting(run_id)
        holding = state.holding()
        if not holding:
            await self.book.close(run_id, state.meta)
        return Outcome.done(*stops(run_id, state.meta, holding, reason, self.d.clock()))


class RunDispatcher:
    def __init__(
        self,
        bus: Bus,
        store: Store,
        cluster: str,
        clock: Callable[[], float],
        lease: Leadership | None = None,
        start_timeout_s: float = 60.0,
    ) -> None:
        self.bus = bus
        self.store = store
        self.cluster = cluster
        self.clock = clock
        self.lease = lease  # None: always act (a test's single dispatcher)
        self.start_timeout_s = start_timeout_s
        self.book = RunBook(store)
        self.orders = JobOrders(self)
        self.reports = Reports(
            self.book,
            clock,
            lambda: self.leading,
            lambda run_id, meta, nodes, at: stops(run_id, meta, nodes, "peer_failed", at),
        )

    @property
    def leading(self) -> bool:
        return self.lease is None or self.lease.held

    # --- start timeouts ---

    async def check_start_timeouts(self) -> int:
        """Fail and stop every run whose start timeout is up; returns how many."""
        failed = 0
        for run_id in await self.book.due(self.clock()):
            state = await self.book.get(run_id)
            if state is None or state.all_started or state.over or state.failure is not None:
                await self.book.done_starting(run_id)
                continue
            job = await views.get_job(self.store, state.meta.job_id, ("run_id",))
            if job is None or job.run_id != run_id or job.status != "placed":
                await self.book.done_starting(run_id)
                continue
            await self._start_timed_out(run_id, state, job)
            failed += 1
        return failed

    async def _start_timed_out(self, run_id: str, state: RunState, job: JobRecord) -> None:
        meta = state.meta
        missing = [n for n in meta.nodes if n not in state.started]
        message = f"not started within {self.start_timeout_s:g} s on {', '.join(missing)}"
        message = await self.book.mark(run_id, "failure", message)  # no success or other failure after this
        now = self.clock()
        requests = [
            run_failed(meta, run_id, "lost", message, now, missing[0] if missing else None),
            *stops(run_id, meta, meta.nodes, "start_timeout", now),
        ]
        for result in await self.bus.publish_many(requests):
            if isinstance(result, Exception):
                raise result
        await self.book.done_starting(run_id)
        log.warning("dispatch: run %s of %s %s", run_id, job.job_id, message)

    async def _timeouts(self, stop: asyncio.Event) -> None:
        every = min(1.0, max(self.start_timeout_s / 4, 0.05))
        while not stop.is_set():
            try:
                await self.check_start_timeouts()
            except Exception as err:  # noqa: BLE001 - NATS or Redis away: look again next tick
                log.warning("dispatch: start timeouts not checked: %r", err)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)

    # --- running ---

    def consumers(self) -> list[tuple[ConsumerSpec, JobOrders | Reports]]:
        # A short ack wait: a message the last leader's pull took as it stepped down is redelivered within seconds.
        return [
            (
                ConsumerSpec(
                    stream="JOBS",
                    durable=f"dispatcher-{self.cluster}",
                    filter_subject=subjects.JOBS_ALL,
                    ack_wait_s=ACK_WAIT_S,
                ),
                self.orders,
            ),
            (
                ConsumerSpec(
                    stream="WORK",
                    durable=f"dispatcher-reports-{self.cluster}",
                    filter_subject=subjects.work_reports_of(self.cluster),
                    ack_wait_s=ACK_WAIT_S,
                ),
                self.reports,
            ),
        ]

    async def _lead(self, stop: asyncio.Event) -> None:
        """The consumers and the timer, until ``stop``."""
        await asyncio.gather(
            *(run_consumer(self.bus, spec, sub, stop) for spec, sub in self.consumers()), self._timeouts(stop)
        )

    async def run(self, stop: asyncio.Event, poll_s: float = 0.1) -> None:
        """Dispatch while this process holds the lease; stand by otherwise."""
        await while_leading(stop, lambda: self.leading, self._lead, poll_s)


async def while_leading(
    stop: asyncio.Event,
    leading: Callable[[], bool],
    body: Callable[[asyncio.Event], Awaitable[None]],
    poll_s: float = 0.1,
) -> None:
    """Run ``body`` whenever ``leading()`` holds, setting its event to stop it when it no longer does."""
    stopped = asyncio.ensure_future(stop.wait())
    try:
        while not stop.is_set():
            if not leading():
                await asyncio.wait([stopped], timeout=poll_s)
                continue
            inner = asyncio.Event()
            task = asyncio.ensure_future(body(inner))
            try:
                while not stop.is_set() and leading() and not task.done():
                    await asyncio.wait([task, stopped], timeout=poll_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                inner.set()
                try:
                    await task
                except Exception as err:  # noqa: BLE001 - a consumer not made (NATS away): lead again shortly
                    log.warning("dispatch: stopped (%r); starting again", err)
                    await asyncio.wait([stopped], timeout=1.0)
    finally:
        stopped.cancel()
