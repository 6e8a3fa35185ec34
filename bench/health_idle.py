"""Health service CPU on an idle fleet (issue #14).

Starts real NATS and Redis (``trainyard.local.servers``), registers N idle
nodes, runs the health service as its own process (``python -m
trainyard_health``), and publishes what N node agents publish when idle: one
``NodeHeartbeat`` per node per heartbeat period (``NodeAgent.heartbeat``:
plain core-NATS publish on ``telemetry.<cluster>.<node>``).  After a warm-up
it reads the CPU seconds (user + system, from /proc) of the health process,
nats-server and redis-server over the measured window and prints CPU-s/s.

    python bench/health_idle.py [--nodes 512] [--warmup 10] [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainyard.bus import Bus, PublishRequest, ensure_streams
from trainyard.domain import NodeInfo
from trainyard.events import NodeHeartbeat, NodeRegistered, encode, subjects
from trainyard.local.servers import start_nats, start_redis

CLUSTER = "bench"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def heartbeats(
    bus: Bus, nodes: list[NodeInfo], boots: dict[str, str], period_s: float, stop: asyncio.Event
) -> None:
    """Every node's heartbeat once per period, spread evenly over it (as independent agents are)."""
    gap = period_s / len(nodes)
    start = time.monotonic()
    i = 0
    while not stop.is_set():
        n = nodes[i % len(nodes)]
        beat = NodeHeartbeat(at=time.time(), node_id=n.node_id, cluster=CLUSTER, boot_id=boots[n.node_id])
        await bus.nc.publish(subjects.telemetry(CLUSTER, n.node_id), encode(beat))
        i += 1
        delay = start + i * gap - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


async def main(count: int, warmup_s: float, seconds: float, period_s: float) -> None:
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-") as tmp:
        nats, redis = start_nats(Path(tmp) / "nats"), start_redis(Path(tmp) / "redis")
        health = None
        try:
            bus = await Bus.connect(nats.url, "bench")
            await ensure_streams(bus.js)
            nodes = [NodeInfo(node_id=f"n{i:04d}", cluster=CLUSTER, gpu_type="H100", gpus=8) for i in range(count)]
            boots = {n.node_id: f"boot{i}" for i, n in enumerate(nodes)}
            regs = [
                PublishRequest(
                    subjects.node(CLUSTER, n.node_id),
                    NodeRegistered(at=time.time(), node=n, boot_id=boots[n.node_id]),
                    f"register:{n.node_id}:{boots[n.node_id]}",
                )
                for n in nodes
            ]
            for r in await bus.publish_many(regs):
                if isinstance(r, Exception):
                    raise r
            env = {
                **os.environ,
                "TRAINYARD_NATS_URL": nats.url,
                "TRAINYARD_REDIS_URL": redis.url,
                "TRAINYARD_CLUSTER": CLUSTER,
                "TRAINYARD_DATA_DIR": tmp,
                "TRAINYARD_LOG_LEVEL": "WARNING",
                "TRAINYARD_HEARTBEAT_INTERVAL_S": str(period_s),
                "TRAINYARD_HEARTBEAT_TIMEOUT_S": str(period_s * 5),
            }
            log = open(Path(tmp) / "health.log", "wb")  # noqa: SIM115 - closed with the directory
            health = subprocess.Popen([sys.executable, "-m", "trainyard_health"], env=env, stdout=log, stderr=log)
            stop = asyncio.Event()
            sender = asyncio.create_task(heartbeats(bus, nodes, boots, period_s, stop))
            await asyncio.sleep(warmup_s)
            pids = {"health": health.pid, "nats-server": nats.proc.pid, "redis-server": redis.proc.pid}
            before = {k: cpu_seconds(p) for k, p in pids.items()}
            t0 = time.monotonic()
            await asyncio.sleep(seconds)
            elapsed = time.monotonic() - t0
            after = {k: cpu_seconds(p) for k, p in pids.items()}
            stop.set()
            await sender
            if health.poll() is not None:
                raise SystemExit(f"health exited with {health.returncode}: see {tmp}/health.log")
            print(
                f"health_idle: {count} idle nodes, {period_s:g} s heartbeats, {warmup_s:g} s warm-up, "
                f"{elapsed:.1f} s measured"
            )
            for k in pids:
                used = after[k] - before[k]
                print(f"  {k:13s} {used:6.2f} CPU-s = {used / elapsed:.3f} CPU-s/s")
            await bus.close()
        finally:
            if health is not None and health.poll() is None:
                health.terminate()
                health.wait(10)
            nats.stop()
            redis.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=512)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--period", type=float, default=1.0, help="heartbeat period (the agents' default: 1 s)")
    a = parser.parse_args()
    asyncio.run(main(a.nodes, a.warmup, a.seconds, a.period))
