"""Run failures that can only fail the run they are about.

Health fails runs on a node it isolated.  Between reading a job and
publishing its ``RunFailed`` the run may succeed, or the job may start a newer
run: a failure published then would contradict the log.  So each ``RunFailed``
is published with the job subject's expected last sequence (the job's
``last_seq`` in the projection, read only once the projection holds everything
the JOBS stream held), exactly as admission fences its decisions:

1. wait until the job projection has caught up with the JOBS stream;
2. pick the jobs whose *current* run is active and placed on the node;
3. publish each ``RunFailed`` (message id ``<run_id>:failed``) expecting the
   job's last sequence; its ``at`` is read just before publishing;
4. a refused publish (the job moved on) re-reads the job and decides again:
   a run that has since ended, or a newer run, is left alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from trainyard.bus import Bus, PublishRequest, WrongLastSequence
from trainyard.core.lifecycle import JobRecord
from trainyard.events import RunFailed, subjects
from trainyard.observability.logs import kv
from trainyard.store import Store, views

ACTIVE = ("placed", "running")
ATTEMPTS = 5  # re-reads after a refused publish before the caller retries the whole step

log = logging.getLogger(__name__)


class ProjectionBehind(Exception):
    """The job projection did not catch up with the JOBS stream in time (it may be rebuilding)."""


async def jobs_caught_up(bus: Bus, store: Store, timeout_s: float = 10.0) -> None:
    """Wait until the job projection holds everything the JOBS stream held when called."""
    head = (await bus.js.stream_info("JOBS")).state.last_seq
    deadline = time.monotonic() + timeout_s
    while await store.last_seq("jobs") < head:
        if time.monotonic() > deadline:
            raise ProjectionBehind(f"job projection is behind JOBS seq {head}")
        await asyncio.sleep(0.02)


def _targets(jobs: list[JobRecord], node_id: str, gpu: int | None) -> list[JobRecord]:
    out = []
    for job in jobs:
        if job.run_id is None or job.status not in ACTIVE:
            continue
        on_node = [r for r in job.placement or [] if r.node_id == node_id]
        if not on_node or (gpu is not None and not any(gpu in r.gpus for r in on_node)):
            continue
        out.append(job)
    return out


async def publish_failures(
    bus: Bus, clock: Callable[[], float], jobs: list[JobRecord], node_id: str, reason: str, message: str
) -> tuple[int, list[str]]:
    """Publish one ``RunFailed`` per job, each expecting the job's last sequence as read;
    returns how many were failed and the ids of the jobs whose subject had moved on."""
    requests = [
        PublishRequest(
            subjects.job(job.tenant, job.job_id, "health"),
            RunFailed(
                at=clock(),
                job_id=job.job_id,
                tenant=job.tenant,
                run_id=job.run_id,  # type: ignore[arg-type]
                reason=reason,
                message=message,
                node_id=node_id,  # type: ignore[arg-type]
            ),
            f"{job.run_id}:failed",
            job.last_seq,
        )
        for job in jobs
    ]
    failed, refused = 0, []
    for job, result in zip(jobs, await bus.publish_many(requests), strict=True):
        if isinstance(result, WrongLastSequence):
            refused.append(job.job_id)
        elif isinstance(result, Exception):
            raise result
        elif not result.duplicate:
            failed += 1
            log.info(
                "run failed",
                extra=kv(
                    decision="failed",
                    job_id=job.job_id,
                    run_id=job.run_id,
                    tenant=job.tenant,
                    node=node_id,
                    reason=reason,
                ),
            )
    return failed, refused


async def fail_runs_fenced(
    bus: Bus, store: Store, clock: Callable[[], float], node_id: str, reason: str, message: str, gpu: int | None = None
) -> int:
    """Fail the current active run of every job on the node (or on one GPU of it); returns how many were failed."""
    await jobs_caught_up(bus, store)
    job_ids = await views.jobs_on_node(store, node_id)
    failed = 0
    for _ in range(ATTEMPTS):
        jobs = _targets(await views.get_jobs(store, job_ids, ("run_id", "placement")), node_id, gpu)
        if not jobs:
            return failed
        done, refused = await publish_failures(bus, clock, jobs, node_id, reason, message)
        failed += done
        if not refused:
            return failed
        # The job moved on meanwhile: read it again once the projection shows why.
        job_ids = refused
        await jobs_caught_up(bus, store)
    raise ProjectionBehind(f"jobs {job_ids} kept moving while failing their runs on {node_id}")
