"""A gateway served over HTTP on loopback, on real NATS and Redis, holding a
few jobs and nodes, for tests that run the ``trainyard`` command against it
as a user would."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import uvicorn
from gateway_fixtures import gateway_app

from trainyard.bus import Bus, PublishRequest
from trainyard.domain import JobSpec, NodeInfo, Role
from trainyard.domain.job import ValidationError
from trainyard.events import (
    JobAccepted,
    JobAdmitted,
    JobPlaced,
    JobRejected,
    NodeRegistered,
    RunStarted,
    RunSucceeded,
    job_subject,
    subjects,
)
from trainyard.events.jobs import ReplicaPlacement
from trainyard.local.servers import free_port
from trainyard.settings import Settings
from trainyard.store import Projector, Store
from trainyard.testing.auth import Callers
from trainyard.testing.waiting import eventually


def user_env(home: Path) -> dict[str, str]:
    """This process's environment without TRAINYARD_* settings, with its own home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env["HOME"] = str(home)
    env["COLUMNS"] = "80"  # what a narrow terminal reports: a pipe must not be cut to it
    return env


async def trainyard(*args: str, home: Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``trainyard ARGS`` in a process of its own, its output piped (not a terminal)."""
    argv = [sys.executable, "-m", "trainyard.cli.main", *args]
    return await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, env=user_env(home), cwd=cwd, timeout=120
    )


LONG_NAME = "pretrain-" + "x" * 110  # far wider than an 80-column terminal
NODES = [f"gpu-node-{i:03d}" for i in range(5)]


def _spec(tenant: str, name: str, replicas: int = 1) -> JobSpec:
    return JobSpec(
        tenant=tenant, queue="research", name=name, roles=[Role(name="t", gpus_per_replica=8, replicas=replicas)]
    )


def seed_events(now: float) -> list[PublishRequest]:
    """Two running jobs (one on 5 nodes with a long name), one succeeded, one pending, one rejected."""
    out: list[PublishRequest] = []

    def add(event, key: str, writer: str | None = None) -> None:  # type: ignore[no-untyped-def]
        out.append(PublishRequest(job_subject(event, writer), event, f"{event.job_id}:{key}"))

    def run(job_id: str, spec: JobSpec, nodes: list[str], started: float, finished: float | None) -> None:
        tenant, run_id = spec.tenant, f"{job_id}-r1"
        add(JobAccepted(at=started - 10, job_id=job_id, spec=spec, submitted_at=started - 10), "accepted")
        add(JobAdmitted(at=started - 5, job_id=job_id, tenant=tenant, run_id=run_id, attempt=1), "admitted")
        replicas = [
            ReplicaPlacement(role="t", replica=i, rank=i, node_id=n, gpus=list(range(8))) for i, n in enumerate(nodes)
        ]
        add(
            JobPlaced(at=started - 2, job_id=job_id, tenant=tenant, run_id=run_id, cluster="c", replicas=replicas),
            "placed",
        )
        add(RunStarted(at=started, job_id=job_id, tenant=tenant, run_id=run_id), "started", "agent")
        if finished is not None:
            add(RunSucceeded(at=finished, job_id=job_id, tenant=tenant, run_id=run_id), "succeeded", "agent")

    run("cli-long", _spec("acme", LONG_NAME, replicas=5), NODES, now - 3725, None)  # running 1:02:05
    run("cli-short", _spec("globex", "short"), NODES[:1], now - 30, None)
    run("cli-done", _spec("acme", "finished"), NODES[1:2], now - 7200, now - 7200 + 95)  # ran 1:35
    add(JobAccepted(at=now - 1, job_id="cli-wait", spec=_spec("acme", "waiting"), submitted_at=now - 1), "accepted")
    errors = [ValidationError("tenant", "unknown tenant 'nobody'")]
    add(JobRejected(at=now, job_id="cli-bad", tenant="nobody", errors=errors), "rejected")
    for node_id in NODES:
        node = NodeInfo(node_id=node_id, cluster="c", gpu_type="H100", gpus=8, rack="rack-01")
        out.append(PublishRequest(subjects.node("c", node_id), NodeRegistered(at=now, node=node, boot_id="b"), node_id))
    return out


@contextlib.asynccontextmanager
async def served(bus: Bus, store: Store, callers: Callers, folder: Path) -> AsyncIterator[str]:
    """The gateway holding :func:`seed_events` (and an empty ledger in ``folder``), served on a free
    loopback port; yields its URL."""
    for result in await bus.publish_many(seed_events(time.time())):
        if isinstance(result, Exception):
            raise result
    stop = asyncio.Event()
    projectors = [Projector(bus, store, "JOBS"), Projector(bus, store, "NODES")]
    tasks = [asyncio.create_task(p.run(stop)) for p in projectors]
    for p in projectors:
        await p.caught_up(timeout=60)
    app = gateway_app(bus, store, callers.authenticator, Settings(ledger_url=f"sqlite:///{folder / 'ledger.db'}"))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    await eventually(lambda: asyncio.sleep(0, server.started), what="the API serves")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await serving
        stop.set()
        await asyncio.gather(*tasks)
