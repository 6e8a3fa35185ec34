"""Three restarts of the whole stack (``trainyard up``'s LocalStack on its
locked bus, the same data directory each time) leave every job where it was:
every finished job in the same state, every other job still there, Redis's
append-only file replayed whole (no CRITICAL line in its log)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from conftest import denials

from trainyard.domain import JobSpec, Role
from trainyard.local import LocalStack, StackConfig
from trainyard.testing.chaos import submit_rest

pytestmark = pytest.mark.e2e

TERMINAL = {"succeeded", "failed", "cancelled", "rejected"}
SHORT, LONG = 24, 8  # jobs that finish at once, jobs that run for the whole test


def spec(i: int) -> JobSpec:
    return JobSpec(
        tenant="acme",
        queue="default",
        name=f"restart-{i}",
        simulated_duration_s=0.5 if i < SHORT else 3600.0,
        roles=[Role(name="trainer", replicas=1, gpus_per_replica=8 if i >= SHORT else 1)],
    )


async def states(stack: LocalStack, job_ids: list[str]) -> dict[str, str]:
    """Every job's status as the gateway answers it: a rebuilding projection's 503 is waited out."""
    out: dict[str, str] = {}
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30, headers=stack.admin_headers()) as client:
        for job_id in job_ids:
            for _ in range(600):
                response = await client.get(f"/v1/jobs/{job_id}")
                if response.status_code != 503:
                    break
                await asyncio.sleep(float(response.headers.get("Retry-After", "1")) / 10)
            assert response.status_code == 200, f"{job_id}: {response.status_code} {response.text}"
            out[job_id] = response.json()["status"]
    return out


async def settled(stack: LocalStack, job_ids: list[str], timeout: float = 180) -> dict[str, str]:
    """The jobs' states once every short job has finished and every long one runs."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        now = await states(stack, job_ids)
        if all((now[j] in TERMINAL) if i < SHORT else now[j] == "running" for i, j in enumerate(job_ids)):
            return now
        assert loop.time() < deadline, now
        await asyncio.sleep(0.5)


def start(data_dir: Path) -> LocalStack:
    stack = LocalStack(
        StackConfig(data_dir=str(data_dir), nodes=LONG + 2, heartbeat_timeout_s=15.0, log_level="WARNING")
    )
    stack.start()
    return stack


async def test_three_restarts_of_the_stack_leave_every_job_where_it_was(tmp_path: Path) -> None:
    data_dir = tmp_path / "stack"
    job_ids = [f"restart-{i}" for i in range(SHORT + LONG)]
    stack = start(data_dir)
    try:
        async with httpx.AsyncClient(base_url=stack.api_url, timeout=30, headers=stack.admin_headers()) as client:
            for i, job_id in enumerate(job_ids):
                await submit_rest(client, job_id, spec(i))
        before = await settled(stack, job_ids)
        assert denials(stack) == []
    finally:
        stack.stop()
    assert stack.redis is not None
    redis_log = stack.redis.log_path

    for restart in range(3):
        stack = start(data_dir)
        try:
            after = await states(stack, job_ids)
            assert denials(stack) == []
        finally:
            stack.stop()
        finished = {j: s for j, s in before.items() if s in TERMINAL}
        assert {j: after[j] for j in finished} == finished, f"restart {restart + 1}"
        assert set(after) == set(before)
        log = redis_log.read_text(errors="replace")
        assert "CRITICAL" not in log and "NOPERM" not in log, f"restart {restart + 1}"
