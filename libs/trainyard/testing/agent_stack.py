"""A local stack whose nodes are real agents (``trainyard up --agents N``,
no emulated nodes), for the benchmarks that run real processes:
``bench/launch.py`` and ``bench/chaos.py --real``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from trainyard.local import LocalStack, StackConfig
from trainyard.local.agents import agent_process
from trainyard.store import Store, views

TERMINAL = ("succeeded", "failed", "cancelled", "rejected")


def agent_stack(data_dir: str, agents: int, gpus: int, heartbeat_timeout_s: float = 30.0) -> LocalStack:
    """A stack of ``agents`` agents with ``gpus`` fake GPUs each.  A generous
    heartbeat timeout: on a loaded 2-core machine a late heartbeat must not
    declare a node lost (and move its runs) while its processes still run."""
    config = StackConfig(
        data_dir=data_dir,
        nodes=0,
        agents=agents,
        agent_gpus=gpus,
        racks=2,
        log_level="WARNING",
        heartbeat_timeout_s=heartbeat_timeout_s,
    )
    return LocalStack(config)


def agent_pids(stack: LocalStack) -> dict[str, int]:
    """Node -> the pid of its agent process now."""
    return {node: stack.procs[agent_process(node)].pid for node in stack.agent_nodes}


def agents_dir(stack: LocalStack) -> str:
    """Where the agents keep their state: ``<agents_dir>/<node>/runs/...``."""
    return str(Path(stack.data_dir) / "agents")


async def healthy_nodes(stack: LocalStack) -> int:
    async with httpx.AsyncClient(base_url=stack.api_url, headers=stack.admin_headers(), timeout=10) as client:
        response = await client.get("/v1/nodes")
        if response.status_code != 200:
            return 0
        return sum(1 for n in response.json()["nodes"] if n["state"] == "healthy" and n["info"]["executes"])


async def wait_for_nodes(stack: LocalStack, count: int, timeout_s: float) -> int:
    """Wait until ``count`` agents' nodes are healthy (or the timeout); returns how many are."""
    deadline = time.monotonic() + timeout_s
    found = 0
    while time.monotonic() < deadline:
        try:
            found = await healthy_nodes(stack)
        except httpx.HTTPError:
            found = 0
        if found >= count:
            break
        await asyncio.sleep(0.5)
    return found


async def wait_terminal(store: Store, count: int, timeout_s: float) -> float:
    """Wait until ``count`` jobs are terminal in the projection (or the
    timeout); returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            counts = await views.status_counts(store)
        except Exception:  # noqa: BLE001 - Redis may be restarting
            counts = {}
        if sum(counts.get(s, 0) for s in TERMINAL) >= count:
            break
        await asyncio.sleep(0.5)
    return time.monotonic() - t0
