"""Three restarts of the whole stack (``trainyard up``'s LocalStack on its
locked bus, the same data directory each time) with jobs in every state leave
every job where it was: over 200 jobs succeeded, failed (past their run-time
limit), cancelled, rejected (an unknown tenant), pending (a queue held by its
quota) and running (an hour long).  After each restart every job that cannot
change by itself reads the same state, and every running job runs the same
run at the same attempt; Redis's append-only file is replayed whole (no
CRITICAL line in its log)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import denials

from trainyard.bus import Bus
from trainyard.config.store import ConfigStore
from trainyard.domain import JobSpec, Role
from trainyard.events import SubmitJob, subjects
from trainyard.local import LocalStack, StackConfig
from trainyard.testing.chaos import submit_rest

pytestmark = pytest.mark.e2e

NODES = 12  # 96 GPUs: 64 for the long jobs of 'default', 8 for 'held', the rest for the short ones
SUCCEED, FAIL, RUN, HOLD, CANCEL, REJECT = 130, 10, 8, 41, 20, 20  # HOLD: one runs, CANCEL of the rest cancelled
TENANCY = """
flavors: [{name: H100, node_pool: emulated, gpus_per_node: 8}]
priority_classes: [{name: standard, priority: 500}]
default_priority_class: standard
organisations:
  - name: lab
    quota: {H100: {nominal: 96}}
    teams:
      - name: acme
        quota: {H100: {nominal: 96, borrowing_limit: 0}}
        queues:
          - {name: default, quota: {H100: {nominal: 88, borrowing_limit: 0}}}
          - {name: held, quota: {H100: {nominal: 8, borrowing_limit: 0}}}
"""


def spec(kind: str, i: int) -> JobSpec:
    """A job of ``kind``: succeed (0.2 s), fail (5 s of work past a 1 s limit),
    run (an hour, 8 GPUs), hold (an hour, 8 GPUs, in the 8-GPU queue), reject."""
    long = kind in ("run", "hold")
    return JobSpec(
        tenant="globex" if kind == "reject" else "acme",
        queue="held" if kind == "hold" else "default",
        name=f"{kind}-{i}",
        roles=[Role(name="trainer", replicas=1, gpus_per_replica=8 if long else 1)],
        simulated_duration_s=None if kind == "fail" else (3600.0 if long else 0.2),
        image="example/train:1" if kind == "fail" else None,
        max_runtime_s=1 if kind == "fail" else 24 * 3600,
    )


JOBS = [
    (f"{kind}-{i}", kind)
    for kind, n in (("succeed", SUCCEED), ("fail", FAIL), ("run", RUN), ("hold", HOLD), ("reject", REJECT))
    for i in range(n)
]


async def read_all(stack: LocalStack) -> dict[str, dict[str, Any]]:
    """Every job as the gateway answers it: a rebuilding projection's 503 is waited out."""
    out: dict[str, dict[str, Any]] = {}
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30, headers=stack.admin_headers()) as client:
        for job_id, _ in JOBS:
            for _ in range(600):
                response = await client.get(f"/v1/jobs/{job_id}")
                if response.status_code != 503:
                    break
                await asyncio.sleep(float(response.headers.get("Retry-After", "1")) / 10)
            assert response.status_code == 200, f"{job_id}: {response.status_code} {response.text}"
            out[job_id] = response.json()
    return out


def by_status(jobs: dict[str, dict[str, Any]], kind: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for job_id, k in JOBS:
        if k == kind:
            counts[jobs[job_id]["status"]] = counts.get(jobs[job_id]["status"], 0) + 1
    return counts


async def settle(stack: LocalStack, want: dict[str, dict[str, int]], timeout: float = 120) -> dict[str, dict[str, Any]]:
    """The jobs once each kind's statuses are ``want[kind]``."""
    deadline = time.monotonic() + timeout
    while True:
        jobs = await read_all(stack)
        got = {kind: by_status(jobs, kind) for kind in want}
        if got == want:
            return jobs
        assert time.monotonic() < deadline, got
        await asyncio.sleep(0.5)


def start(data_dir: Path) -> LocalStack:
    stack = LocalStack(StackConfig(data_dir=str(data_dir), nodes=NODES, heartbeat_timeout_s=15.0, log_level="WARNING"))
    stack.start()
    return stack


async def submit_everything(stack: LocalStack) -> None:
    bus = await Bus.connect(stack.nats_admin_url, "e2e-restarts")
    try:
        await (await ConfigStore.open(bus)).apply(TENANCY, actor="test:e2e")
        async with httpx.AsyncClient(base_url=stack.api_url, timeout=30, headers=stack.admin_headers()) as client:
            for job_id, kind in JOBS:
                if kind == "reject":  # a tenant the tenancy does not know: admission rejects it
                    command = SubmitJob(at=time.time(), spec=spec(kind, 0), job_id=job_id)
                    await bus.publish(subjects.intake("globex"), command, msg_id=job_id)
                else:
                    await submit_rest(client, job_id, spec(kind, 0))
    finally:
        await bus.close()


async def cancel_waiting(stack: LocalStack, jobs: dict[str, dict[str, Any]]) -> None:
    waiting = [j for j, kind in JOBS if kind == "hold" and jobs[j]["status"] == "pending"][:CANCEL]
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30, headers=stack.admin_headers()) as client:
        for job_id in waiting:
            answer = await client.delete(f"/v1/jobs/{job_id}")
            assert answer.status_code in (200, 202), f"{job_id}: {answer.status_code} {answer.text}"


def where(job: dict[str, Any]) -> tuple[Any, ...]:
    """What may not change across a restart: the state of a job that cannot
    move by itself; of a running one, its run and attempt too."""
    if job["status"] == "running":
        return ("running", job["run_id"], job["attempt"])
    return (job["status"], job["attempt"], job["reason"] if job["status"] == "pending" else None)


async def test_three_restarts_of_the_stack_leave_every_job_in_every_state_where_it_was(tmp_path: Path) -> None:
    data_dir = tmp_path / "stack"
    stack = start(data_dir)
    try:
        await submit_everything(stack)
        common = {"succeed": {"succeeded": SUCCEED}, "fail": {"failed": FAIL}, "run": {"running": RUN}}
        common["reject"] = {"rejected": REJECT}
        jobs = await settle(stack, {**common, "hold": {"running": 1, "pending": HOLD - 1}})
        await cancel_waiting(stack, jobs)
        held = {"running": 1, "pending": HOLD - 1 - CANCEL, "cancelled": CANCEL}
        before = await settle(stack, {**common, "hold": held})
        assert denials(stack) == []
    finally:
        stack.stop()
    assert len(JOBS) >= 200
    assert {j["status"] for j in before.values()} == {
        "succeeded",
        "failed",
        "cancelled",
        "rejected",
        "pending",
        "running",
    }
    assert all(j["reason"] for j in before.values() if j["status"] == "pending")  # held by the queue's quota
    assert stack.redis is not None
    redis_log = stack.redis.log_path

    for restart in range(3):
        stack = start(data_dir)
        try:
            after = await read_all(stack)
            assert denials(stack) == []
        finally:
            stack.stop()
        moved = {j: (where(before[j]), where(after[j])) for j in before if where(before[j]) != where(after[j])}
        assert moved == {}, f"restart {restart + 1}: {moved}"
        log = redis_log.read_text(errors="replace")
        assert "CRITICAL" not in log and "NOPERM" not in log, f"restart {restart + 1}"
