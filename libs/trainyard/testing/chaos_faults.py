"""Two faults of the chaos run that need more than a signal, and what they count.

- **A restart pair**: the nodes' host (the emulator) stalls (SIGSTOP), nats-server
  is SIGKILLed ``pair_gap_s`` later and restarted, and the emulator is SIGKILLed
  (and restarted) 0.6 x ``pair_gap_s`` after that: silent for longer than a 5 s
  heartbeat timeout while the bus restarts too.  Health must declare no node
  lost for it: no node really dies in a chaos run, so every ``NodeLost`` on the
  NODES stream is a false loss (:func:`nodes_lost`).
- **Reads during a rebuild**: right after each FLUSHALL, every job the
  projection showed finished just before is read through REST until the
  rebuilt projection answers for all of them.  Each answer must be the same
  finished state or a 503 (rebuilding): a 404 is a missing read, another
  state a stale one.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from typing import Protocol

import httpx

from trainyard.bus import Bus
from trainyard.events import NodeLost, decode_node_event
from trainyard.local import LocalStack
from trainyard.local.supervisor import restart_server, servers
from trainyard.store import Store, views
from trainyard.testing.streams import read_raw

FINISHED = ("succeeded", "failed", "cancelled", "rejected")
EMULATOR = "emulator"


class _Run(Protocol):
    stack: LocalStack
    store: Store
    reads: Counter[str]  # answers of the reads during rebuilds: ok, rebuilding, missing, stale
    stalled: set[str]  # processes stopped by a fault now: no other fault picks them
    _procs_lock: asyncio.Lock

    def kill(self, name: str) -> None: ...


async def restart_pair(run: _Run, gap_s: float) -> None:
    """Stall the emulator, kill nats-server ``gap_s`` later, then the emulator."""
    if EMULATOR not in run.stack.procs or EMULATOR in run.stalled:
        return
    run.stalled.add(EMULATOR)
    try:
        try:
            os.kill(run.stack.procs[EMULATOR].pid, signal.SIGSTOP)
        except ProcessLookupError:
            return
        await asyncio.sleep(gap_s)
        nats = [name for name in servers(run.stack) if name.startswith("nats")]
        async with run._procs_lock:
            if nats:
                await asyncio.to_thread(restart_server, servers(run.stack)[nats[0]])
        await asyncio.sleep(0.6 * gap_s)
        async with run._procs_lock:
            await asyncio.to_thread(run.kill, EMULATOR)  # SIGKILL (a stopped process dies too) and start again
    finally:
        run.stalled.discard(EMULATOR)


async def finished_jobs(store: Store, limit: int = 100_000) -> dict[str, str]:
    """Every finished job and its state, as the projection holds it now."""
    out: dict[str, str] = {}
    for status in FINISHED:
        for job in await views.list_jobs(store, status=status, limit=limit):
            out[job.job_id] = job.status
    return out


async def read_back(run: _Run, expected: dict[str, str], timeout_s: float = 120.0) -> None:
    """Read every job of ``expected`` through REST until each has answered
    200; count every answer in ``run.reads``."""
    token = run.stack.admin_token
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    todo = dict(expected)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with httpx.AsyncClient(base_url=run.stack.api_url, timeout=10, headers=headers) as client:
        sem = asyncio.Semaphore(32)

        async def one(job_id: str, status: str) -> None:
            async with sem:
                try:
                    response = await client.get(f"/v1/jobs/{job_id}")
                except httpx.HTTPError:
                    return  # the gateway restarting: asked again
            if response.status_code == 503 or response.status_code >= 500:
                run.reads["rebuilding" if response.status_code == 503 else "unavailable"] += 1
                return
            todo.pop(job_id, None)
            if response.status_code == 404:
                run.reads["missing"] += 1
            elif response.status_code != 200 or response.json().get("status") != status:
                run.reads["stale"] += 1
            else:
                run.reads["ok"] += 1

        while todo and loop.time() < deadline:
            await asyncio.gather(*(one(j, s) for j, s in list(todo.items())))
            if todo:
                await asyncio.sleep(0.2)


async def nodes_lost(bus: Bus) -> int:
    """How many times a node was declared lost (``NodeLost`` on the NODES stream)."""
    count = 0
    for _, _, data in await read_raw(bus, "NODES"):
        try:
            count += isinstance(decode_node_event(data), NodeLost)
        except ValueError:
            continue
    return count
