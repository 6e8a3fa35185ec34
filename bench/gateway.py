"""The front door alone: accepted submissions per second through REST and
gRPC, and their latency, with a verified token on every call.

Starts NATS, Redis and the gateway process (the locked local stack, with no
other service, so only the front door is measured), then runs ``--clients``
concurrent clients, each submitting jobs one after another for ``--seconds``.
Prints accepted submissions/s and p50/p99 latency per protocol.

    .venv/bin/python bench/gateway.py                        # 16 clients, 10 s, REST then gRPC
    .venv/bin/python bench/gateway.py --clients 4 --seconds 20 --protocols rest
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time

import grpc
import httpx

from trainyard._pb.trainyard.v1 import jobs_pb2 as pb
from trainyard._pb.trainyard.v1 import jobs_pb2_grpc
from trainyard.local import LocalStack, StackConfig


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def body(i: int, tag: str) -> dict[str, object]:
    return {"job_id": f"{tag}-{i:07d}", "tenant": "acme", "queue": "default",
            "roles": [{"name": "trainer", "gpus_per_replica": 1}], "simulated_duration_s": 1.0}


async def rest(api_url: str, token: str, clients: int, seconds: float) -> tuple[int, int, list[float]]:
    latencies: list[float] = []
    errors = 0
    end = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=api_url, headers={"Authorization": f"Bearer {token}"}, limits=limits,
                                 timeout=30) as http:

        async def client(c: int) -> None:
            nonlocal errors
            i = 0
            while time.monotonic() < end:
                t0 = time.perf_counter()
                response = await http.post("/v1/jobs", json=body(i, f"rest-{c}"))
                if response.status_code == 202:
                    latencies.append(time.perf_counter() - t0)
                else:
                    errors += 1
                i += 1

        await asyncio.gather(*(client(c) for c in range(clients)))
    return len(latencies), errors, latencies


async def grpc_submit(target: str, token: str, clients: int, seconds: float) -> tuple[int, int, list[float]]:
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
                spec = pb.JobSpec(tenant="acme", queue="default", roles=[pb.Role(name="trainer", gpus_per_replica=1)],
                                  simulated_duration_s=1.0)
                t0 = time.perf_counter()
                try:
                    await stub.SubmitJob(pb.SubmitJobRequest(spec=spec, job_id=f"grpc-{c}-{i:07d}"),
                                         metadata=metadata, timeout=30)
                    latencies.append(time.perf_counter() - t0)
                except grpc.aio.AioRpcError:
                    errors += 1
                i += 1

        await asyncio.gather(*(client(c) for c in range(clients)))
    return len(latencies), errors, latencies


async def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="trainyard-gateway-bench-") as tmp:
        stack = LocalStack(StackConfig(data_dir=tmp, nodes=1, log_level="WARNING"))
        await asyncio.to_thread(stack.start, ["gateway"])
        token = stack.admin_token
        assert token
        try:
            print(f"{'protocol':>8}  {'clients':>7}  {'accepted/s':>10}  {'p50 ms':>7}  {'p99 ms':>7}  {'errors':>6}")
            for protocol in args.protocols.split(","):
                if protocol == "rest":
                    ok, errors, lat = await rest(stack.api_url, token, args.clients, args.seconds)
                else:
                    ok, errors, lat = await grpc_submit(f"127.0.0.1:{stack.grpc_port}", token, args.clients,
                                                        args.seconds)
                print(f"{protocol:>8}  {args.clients:>7}  {ok / args.seconds:>10.0f}  "
                      f"{percentile(lat, 0.5) * 1000:>7.1f}  {percentile(lat, 0.99) * 1000:>7.1f}  {errors:>6}")
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
