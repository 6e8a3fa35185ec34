"""The run dispatcher's WORK side: node agents' reports -> the run's lifecycle
events (``dispatcher-reports-<cluster>``, see dispatch.py).

- ``ProcessesStarted`` from every node of the run -> one ``RunStarted``
  (``<run_id>:started``).
- A ``ProcessExited`` that is neither ok nor stopped by the agent -> one
  ``RunFailed(workload_error)``, :data:`SETTLE_S` after the first such report,
  naming of the ranks that failed by then the one that ended first (rank,
  node, exit code or signal and the tail of its log), and ``StopRun(peer_failed)``
  to every node still holding a rank.
- Every rank exited: ``RunSucceeded`` when all exited 0; after a preemption
  notice ``RunFailed(preempted)``, so the preemptor's GPUs are given only
  once the victim's processes are gone.
- ``CheckpointWritten`` -> ``CheckpointSaved`` (``<run_id>:checkpoint:<step>``).

A report about a run the dispatcher did not start is ignored; one whose
subject is not its own node's reports is dead-lettered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from trainyard.bus import Delivery, Outcome, PoisonMessage, PublishRequest, Subscription
from trainyard.bus.subscription import each
from trainyard.events import CheckpointSaved, RunFailed, RunStarted, RunSucceeded, subjects
from trainyard.events.jobs import FailureReason
from trainyard.events.work import CheckpointWritten, ProcessesStarted, ProcessExited, WorkReport, decode_work
from trainyard_placement.runbook import RunBook, RunMeta

log = logging.getLogger(__name__)

#: How much of a failed rank's output its RunFailed quotes.
LOG_TAIL_CHARS = 2000
#: How long after the first failed rank's report the run's failure is decided: the exits of the
#: peers that failed because of it (a lost connection) come in meanwhile, and the earliest exit
#: (by the nodes' clocks) is the one named, whichever node's report came first.
SETTLE_S = 0.5


def exit_kind(report: ProcessExited) -> str:
    """``ok``, ``stopped`` (by the agent: a stop, a signal or a peer's failure) or ``failed``."""
    if report.ok:
        return "ok"
    return "stopped" if report.stopped is not None else "failed"


def failure_message(report: ProcessExited) -> str:
    """What the run's RunFailed says of the rank that failed first."""
    where = f"rank {report.rank} on {report.node_id}"
    if report.start_error is not None:
        text = f"{where} could not start: {report.start_error}"
    elif report.exit_code is not None:
        text = f"{where} exited with code {report.exit_code}"
    else:
        text = f"{where} was killed by {report.signal or 'a signal'}"
    tail = report.log_tail[-LOG_TAIL_CHARS:].rstrip()
    return f"{text}; last output:\n{tail}" if tail else text


def job_event(meta: RunMeta, event: object, msg_id: str) -> PublishRequest:
    """A run lifecycle event, written by the dispatcher (the ``placement`` writer)."""
    return PublishRequest(subjects.job(meta.tenant, meta.job_id, "placement"), event, msg_id)


def run_failed(
    meta: RunMeta, run_id: str, reason: FailureReason, message: str, at: float, node_id: str | None = None
) -> PublishRequest:
    """The run's one ``RunFailed`` (``<run_id>:failed``, whichever way it failed)."""
    event = RunFailed(
        at=at, job_id=meta.job_id, tenant=meta.tenant, run_id=run_id, reason=reason, message=message, node_id=node_id
    )
    return job_event(meta, event, f"{run_id}:failed")


class Reports(Subscription[WorkReport]):
    def __init__(
        self,
        book: RunBook,
        clock: Callable[[], float],
        leading: Callable[[], bool],
        stop_orders: Callable[[str, RunMeta, Sequence[str], float], list[PublishRequest]],
    ) -> None:
        self.book = book
        self.clock = clock
        self.leading = leading
        self.stop_orders = stop_orders  # StopRun(peer_failed) to the given nodes

    def decode(self, subject: str, data: bytes) -> WorkReport:
        report = decode_work(data)
        if not isinstance(report, ProcessesStarted | ProcessExited | CheckpointWritten):
            raise PoisonMessage(f"{type(report).__name__} is an order, not a report")
        parts = subject.split(".")
        if len(parts) != 5 or parts[3] != report.node_id or parts[4] != "reports":
            raise PoisonMessage(f"a report about node {report.node_id} was sent on {subject}")
        return report

    async def handle(self, batch: Sequence[Delivery[WorkReport]]) -> list[Outcome]:
        if not self.leading():
            return [Outcome.retry("not the placement leader", 1.0)] * len(batch)
        return await each(batch, self._one)

    async def _one(self, delivery: Delivery[WorkReport]) -> Outcome:
        report = delivery.event
        state = await self.book.get(report.run_id)
        if state is None:
            return Outcome.done()  # not a run this dispatcher started (or long forgotten)
        meta = state.meta
        if report.node_id not in meta.ranks:
            return Outcome.poison(f"{report.node_id} reported on run {report.run_id}, which has no process there")
        if isinstance(report, CheckpointWritten):
            saved = CheckpointSaved(
                at=report.at, job_id=meta.job_id, tenant=meta.tenant, run_id=report.run_id, step=report.step
            )
            return Outcome.done(job_event(meta, saved, f"{report.run_id}:checkpoint:{report.step}"))
        if isinstance(report, ProcessesStarted):
            return Outcome.done(*await self._started(report))
        return await self._exited(report)

    async def _started(self, report: ProcessesStarted) -> list[PublishRequest]:
        await self.book.started(report.run_id, report.node_id, report.at)
        state = await self.book.get(report.run_id)
        if state is None or not state.all_started or state.over or state.failure is not None:
            return []
        await self.book.done_starting(report.run_id)
        meta = state.meta
        # Stamped when the last node's processes were up (its agent's time), not when it was heard of:
        # a report delayed by an agent's restart does not move the metered start.
        at = min(state.started_at or self.clock(), self.clock())
        started = RunStarted(at=at, job_id=meta.job_id, tenant=meta.tenant, run_id=report.run_id)
        return [job_event(meta, started, f"{report.run_id}:started")]

    async def _exited(self, report: ProcessExited) -> Outcome:
        run_id = report.run_id
        kind = exit_kind(report)
        await self.book.exited(run_id, report.rank, kind, report.at if report.exited_at is None else report.exited_at)
        state = await self.book.get(run_id)
        if state is None:
            return Outcome.done()
        out: list[PublishRequest] = []
        if kind == "failed" and not state.signalled and not state.over and state.failure is None:
            # The failure is decided SETTLE_S after the first failed rank's report, naming the rank
            # that ended first: a peer that lost its connection to it may be reported before it.
            now = self.clock()
            exited_at = report.at if report.exited_at is None else report.exited_at
            message = failure_message(report)
            due = await self.book.failed_rank(run_id, report.rank, exited_at, report.node_id, message, now + SETTLE_S)
            if now < due:
                return Outcome.retry("the run's first failure is decided once its peers' exits are in", due - now)
            first = await self.book.first_failure(run_id)
            node_id, message = first if first is not None else (report.node_id, message)
            message = await self.book.mark(run_id, "failure", message)
            # Stamped when the rank that failed first ended (its node's clock), not when that was decided.
            ended = await self.book.first_failure_at(run_id)
            out.append(run_failed(state.meta, run_id, "workload_error", message, min(ended or now, now), node_id))
            out += self.stop_orders(run_id, state.meta, state.holding(), now)
            log.info("dispatch: run %s failed: %s", run_id, message.splitlines()[0])
        return Outcome.done(*out, *await self.conclude(run_id))

    async def conclude(self, run_id: str) -> list[PublishRequest]:
        """Once every rank has exited: the run's end, unless JOBS already has it or a failure was reported."""
        state = await self.book.get(run_id)
        if state is None or not state.all_exited:
            return []
        meta = state.meta
        await self.book.close(run_id, meta)
        if state.over is not None or (state.failure is not None and not state.signalled):
            return []
        # Ended when its last process did (by its node's clock), not when that was heard of.
        now = min(state.ended_at or self.clock(), self.clock())
        now = max(now, state.started_at or now)  # never before it started, whatever the nodes' clocks say
        if state.signalled:
            message = await self.book.mark(
                run_id, "failure", "stopped after a preemption notice; every rank has exited"
            )
            return [run_failed(meta, run_id, "preempted", message, now)]
        if all(kind == "ok" for kind in state.exits.values()):
            done = RunSucceeded(at=now, job_id=meta.job_id, tenant=meta.tenant, run_id=run_id)
            return [job_event(meta, done, f"{run_id}:succeeded")]
        return []
