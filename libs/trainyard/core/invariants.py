"""Invariants over the job log, checked in tests and the simulator.

:class:`JobLogFold` replays job events in stream order the way the projection
does and records every violation of the non-negotiables: a GPU held by two
runs at once, a job that succeeded twice, a run started twice.
"""

from __future__ import annotations

from collections.abc import Iterable

from trainyard.events.jobs import (
    JobAccepted,
    JobAdmitted,
    JobCancelled,
    JobEvent,
    JobPlaced,
    JobRejected,
    RunFailed,
    RunStarted,
    RunSucceeded,
    failure_category,
)

ACTIVE = ("admitted", "placed", "running")


class JobLogFold:
    def __init__(self) -> None:
        self.status: dict[str, str] = {}  # job -> status
        self.current_run: dict[str, str] = {}  # job -> its current run id
        self.holders: dict[tuple[str, int], str] = {}  # (node, gpu) -> run id holding it
        self.successes: dict[str, int] = {}  # job -> successful runs
        self.failures: dict[str, int] = {}  # job -> failures of its own so far
        self.max_retries: dict[str, int] = {}  # job -> from its spec
        self.violations: list[str] = []
        self._held: dict[str, list[tuple[str, int]]] = {}  # run -> GPUs it holds
        self._started: set[str] = set()
        self._n = 0

    def _release(self, job_id: str) -> None:
        run = self.current_run.get(job_id, "")
        for key in self._held.pop(run, []):
            if self.holders.get(key) == run:
                del self.holders[key]

    def _take(self, event: JobPlaced) -> None:
        for r in event.replicas:
            for g in r.gpus:
                key = (r.node_id, g)
                holder = self.holders.get(key)
                if holder is not None and holder != event.run_id:
                    self.violations.append(
                        f"event {self._n}: GPU {r.node_id}/{g} given to {event.run_id} while held by {holder}"
                    )
                self.holders[key] = event.run_id
                self._held.setdefault(event.run_id, []).append(key)

    def apply(self, event: JobEvent) -> None:
        self._n += 1
        job_id = event.job_id
        st = self.status.get(job_id)
        run = getattr(event, "run_id", None)
        current = run is not None and self.current_run.get(job_id) == run
        if isinstance(event, RunStarted):
            if event.run_id in self._started:
                self.violations.append(f"event {self._n}: run {event.run_id} started twice")
            self._started.add(event.run_id)
        if isinstance(event, JobAccepted | JobRejected):
            if isinstance(event, JobAccepted):
                self.max_retries.setdefault(job_id, event.spec.max_retries)
            if st is None:
                self.status[job_id] = "pending" if isinstance(event, JobAccepted) else "rejected"
        elif isinstance(event, JobAdmitted) and st == "pending":
            self.status[job_id], self.current_run[job_id] = "admitted", event.run_id
        elif isinstance(event, JobPlaced) and st == "admitted" and current:
            self._take(event)
            self.status[job_id] = "placed"
        elif isinstance(event, RunStarted) and st == "placed" and current:
            self.status[job_id] = "running"
        elif isinstance(event, RunSucceeded) and st in ACTIVE and current:
            self._release(job_id)
            self.status[job_id] = "succeeded"
            self.successes[job_id] = self.successes.get(job_id, 0) + 1
            if self.successes[job_id] > 1:
                self.violations.append(f"event {self._n}: job {job_id} succeeded twice")
        elif isinstance(event, RunFailed) and st in ACTIVE and current:
            self._release(job_id)
            self.status[job_id] = "pending"
            if failure_category(event.reason)[0] == "own":
                self.failures[job_id] = self.failures.get(job_id, 0) + 1
                if self.failures[job_id] > self.max_retries.get(job_id, 0):
                    self.status[job_id] = "failed"
        elif isinstance(event, JobCancelled) and st in (*ACTIVE, "pending"):
            self._release(job_id)
            self.status[job_id] = "cancelled"


def check_job_log(events: Iterable[JobEvent]) -> JobLogFold:
    fold = JobLogFold()
    for event in events:
        fold.apply(event)
    return fold
