"""Invariants over the job log, checked in tests and the simulator.

:class:`JobLogFold` replays job events in log order through the lifecycle
fold (:mod:`trainyard.core.lifecycle`, the rules the Redis projection
applies) and records every violation of the non-negotiables: a GPU held by
two runs at once, a job that succeeded twice, a run started twice.
"""

from __future__ import annotations

from collections.abc import Iterable

from trainyard.core.lifecycle import ACTIVE, SUCCEEDED, JobRecord, JobTable
from trainyard.events.jobs import JobEvent, RunStarted, RunSucceeded

__all__ = ["ACTIVE", "JobLogFold", "check_job_log"]


class JobLogFold:
    """The lifecycle fold over a whole log, numbering events 1, 2, ... as
    their sequence, plus the checks the fold alone does not make."""

    def __init__(self) -> None:
        self.table = JobTable()
        self.status: dict[str, str] = {}  # job -> status
        self.current_run: dict[str, str] = {}  # job -> its current (or last) run id, once admitted
        self.successes: dict[str, int] = {}  # job -> successful runs
        self._started: set[str] = set()  # runs reported started
        self._violations: list[str] = []  # found here, beside the GPU holders'

    @property
    def jobs(self) -> dict[str, JobRecord]:
        return self.table.jobs

    @property
    def holders(self) -> dict[tuple[str, int], str]:
        """(node, gpu) -> run id holding it."""
        return self.table.holders.by_gpu

    @property
    def violations(self) -> list[str]:
        return sorted(self._violations + self.table.holders.violations, key=_seq_of)

    def apply(self, event: JobEvent) -> None:
        seq = self.table.last_seq + 1
        if isinstance(event, RunStarted):
            if event.run_id in self._started:
                self._violations.append(f"seq {seq}: run {event.run_id} started twice")
            self._started.add(event.run_id)
        applied = self.table.apply(event, seq)
        record = self.table.jobs.get(event.job_id)
        if record is not None:
            self.status[event.job_id] = record.status
            if record.run_id is not None:
                self.current_run[event.job_id] = record.run_id
        if applied and isinstance(event, RunSucceeded) and record is not None and record.status == SUCCEEDED:
            n = self.successes[event.job_id] = self.successes.get(event.job_id, 0) + 1
            if n > 1:
                self._violations.append(f"seq {seq}: job {event.job_id} succeeded twice")


def _seq_of(violation: str) -> int:
    return int(violation.split(":", 1)[0].removeprefix("seq "))


def check_job_log(events: Iterable[JobEvent]) -> JobLogFold:
    fold = JobLogFold()
    for event in events:
        fold.apply(event)
    return fold
