"""The front door alone: accepted submissions per second through REST and
gRPC, and their latency, with a verified token on every call.

Starts NATS, Redis and the gateway process (the locked local stack, with no
other service, so only the front door is measured), then runs ``--clients``
concurrent clients, each submitting jobs one after another for ``--seconds``.
Prints accepted submissions/s and p50/p99 latency per protocol, and the CPU
each process spent per accepted submission (the gateway, nats-server,
redis-server and this client), so a slow client is not mistaken for a slow
server on a shared machine.

The REST client is plain HTTP/1.1 with keep-alive over asyncio streams, one
connection per client: a full HTTP client library would spend more CPU per
request than the gateway does and compete with it for the cores.

    .venv/bin/python bench/gateway.py                        # 16 clients, 10 s, REST then gRPC
    .venv/bin/python bench/gateway.py --clients 4 --seconds 20 --protocols rest
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable
from urllib.parse import urlsplit

import grpc

from trainyard._pb.trainyard.v1 import jobs_pb2 as pb
from trainyard._pb.trainyard.v1 import jobs_pb2_grpc
from trainyard.local import LocalStack, StackConfig

TICK = os.sysconf("SC_CLK_TCK")
Result = tuple[int, int, list[float]]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def body(i: int, tag: str) -> bytes:
    return json.dumps(
        {
            "job_id": f"{tag}-{i:07d}",
            "tenant": "acme",
            "queue": "default",
            "roles": [{"name": "trainer", "gpus_per_replica": 1}],
            "simulated_duration_s": 1.0,
        }
    ).encode()


def cpu_seconds(pid: int) -> float:
    """User and system CPU of process ``pid`` so far (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def read_response(reader: asyncio.StreamReader) -> int:
    """One HTTP/1.1 response (Content-Length framed); its status."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = next((int(v) for k, _, v in (ln.partition(b":") for ln in lines[1:]) if k.lower() == b"content-length"), 0)
    await reader.readexactly(length)
    return status


async def rest(api_url: str, token: str, clients: int, seconds: float) -> Result:
    latencies: list[float] = []
    errors = 0
    end = time.monotonic() + seconds
    url = urlsplit(api_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    head = (
        f"POST /v1/jobs HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\nContent-Length: "
    ).encode()

    async def client(c: int) -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(host, port)
        try:
            i = 0
            while time.monotonic() < end:
                data = body(i, f"rest-{c}")
                t0 = time.perf_counter()
                writer.write(head + str(len(data)).encode() + b"\r\n\r\n" + data)
                status = await read_response(reader)
                if status == 202:
                    latencies.append(time.perf_counter() - t0)
                else:
                    errors += 1
                i += 1
        finally:
            writer.close()

    await asyncio.gather(*(client(c) for c in range(clients)))
    return len(latencies), errors, latencies


async def grpc_submit(target: str, token: str, clients: int, seconds: float) -> Result:
    latencies: list[float] = []
    errors = 0
    end = time.monotonic() + seconds
    metadata = (("authorization", f"Bearer {token}"),)
    async with grpc.aio.insecure_channel(target) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)

        async def client(c: int) -> None:
            nonlocal errors
            i = 0
            while time.monotonic() < end:
                spec = pb.JobSpec(
                    tenant="acme",
                    queue="default",
                    roles=[pb.Role(name="trainer", gpus_per_replica=1)],
                    simulated_duration_s=1.0,
                )
                t0 = time.perf_counter()
                try:
                    await stub.SubmitJob(
                        pb.SubmitJobRequest(spec=spec, job_id=f"grpc-{c}-{i:07d}"), metadata=metadata, timeout=30
                    )
                    latencies.append(time.perf_counter() - t0)
                except grpc.aio.AioRpcError:
                    errors += 1
                i += 1

        await asyncio.gather(*(client(c) for c in range(clients)))
    return len(latencies), errors, latencies


async def measured(pids: dict[str, int], run: Awaitable[Result]) -> tuple[Result, dict[str, float]]:
    """``run``'s result and the CPU seconds each process spent while it ran
    (a coroutine starts only when awaited)."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    result = await run
    return result, {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}


async def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="trainyard-gateway-bench-") as tmp:
        stack = LocalStack(StackConfig(data_dir=tmp, nodes=1, log_level="WARNING"))
        await asyncio.to_thread(stack.start, ["gateway"])
        token = stack.admin_token
        assert token and stack.nats and stack.redis
        pids = {
            "gateway": stack.procs["gateway"].pid,
            "nats": stack.nats.proc.pid,
            "redis": stack.redis.proc.pid,
            "client": os.getpid(),
        }
        try:
            print(
                f"{'protocol':>8}  {'clients':>7}  {'accepted/s':>10}  {'p50 ms':>7}  {'p99 ms':>7}  {'errors':>6}  "
                "CPU-ms per accepted submission"
            )
            for protocol in args.protocols.split(","):
                run = (
                    functools.partial(rest, stack.api_url)
                    if protocol == "rest"
                    else functools.partial(grpc_submit, f"127.0.0.1:{stack.grpc_port}")
                )
                (ok, errors, lat), cpu = await measured(pids, run(token, args.clients, args.seconds))
                split = "  ".join(f"{name} {cpu[name] * 1000 / max(ok, 1):.2f}" for name in pids)
                print(
                    f"{protocol:>8}  {args.clients:>7}  {ok / args.seconds:>10.0f}  "
                    f"{percentile(lat, 0.5) * 1000:>7.1f}  {percentile(lat, 0.99) * 1000:>7.1f}  {errors:>6}  "
                    f"{split}",
                    flush=True,
                )
        finally:
            await asyncio.to_thread(stack.stop)
    return 0


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--protocols", default="rest,grpc")
    return p.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
