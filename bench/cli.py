"""How fast the ``trainyard`` command answers: ``trainyard --help`` and
``trainyard jobs`` against a gateway whose projections hold 10,000 jobs.

Seeds a real JetStream with the jobs of bench/console.py (8/10 finished, 1/10
running, 1/10 pending, over 8 tenants and 64 nodes), projects them into a real
Redis, serves the gateway's REST app over HTTP on loopback, then runs each
command as a user does (a new process each time, output piped) and prints
p50, p90 and max wall-clock time per command, with a bare ``python -c pass``
for the interpreter's own start and the same ``GET /v1/jobs`` sent from the
benchmark's process (the gateway's share of ``trainyard jobs``).

    python bench/cli.py [--jobs 10000] [--runs 15] [--baseline OLD/libs]

``--baseline`` times the same two commands from another copy of ``libs/``
(``git archive <commit> libs | tar -x -C /tmp/old``), before the others.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvicorn
from console import fleet, free_port, job_events, publish_all  # bench/console.py, beside this file

from trainyard.bus import Bus, PublishRequest, ensure_streams
from trainyard.events import NodeRegistered, subjects
from trainyard.local.servers import start_nats, start_redis
from trainyard.store import Projector, Store
from trainyard.testing.auth import issue
from trainyard_gateway.jobs import JobOperations
from trainyard_gateway.rest import create_app


def trainyard_argv() -> list[str]:
    """The installed ``trainyard`` script beside this interpreter, as a user runs it."""
    script = Path(sys.executable).with_name("trainyard")
    return [str(script)] if script.exists() else [sys.executable, "-m", "trainyard.cli.main"]


def timed(argv: list[str], env: dict[str, str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, env=env, check=False)
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    return times


def fetched(port: int, token: str, path: str, runs: int) -> list[float]:
    """The gateway alone: ``GET path`` from this process, a new connection each time."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        connection.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        answer = connection.getresponse()
        answer.read()
        connection.close()
        times.append(time.perf_counter() - start)
        if answer.status != 200:
            raise SystemExit(f"GET {path}: {answer.status}")
    return times


def row(what: str, times: list[float]) -> str:
    ms = sorted(t * 1000 for t in times)
    p90 = ms[min(len(ms) - 1, round(0.9 * (len(ms) - 1)))]
    return f"{what:<40} {statistics.median(ms):>7.0f} {p90:>7.0f} {ms[-1]:>7.0f}"


async def main(n_jobs: int, runs: int, baseline: str | None) -> None:
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-") as tmp:
        nats, redis = start_nats(Path(tmp) / "nats"), start_redis(Path(tmp) / "redis")
        bus = await Bus.connect(nats.url, "bench")
        await ensure_streams(bus.js)
        store = Store.from_url(redis.url)
        try:
            t0 = time.perf_counter()
            nodes = fleet(64)
            registered = [
                PublishRequest(
                    subjects.node("bench", n.node_id), NodeRegistered(at=0.0, node=n, boot_id="b"), n.node_id
                )
                for n in nodes
            ]
            await publish_all(bus, registered)
            await publish_all(bus, job_events(n_jobs, nodes, time.time()))
            stop = asyncio.Event()
            projectors = [Projector(bus, store, "JOBS"), Projector(bus, store, "NODES")]
            tasks = [asyncio.create_task(p.run(stop)) for p in projectors]
            for p in projectors:
                await p.caught_up(timeout=600)
            print(f"seeded and projected {n_jobs:,} jobs on {len(nodes)} nodes in {time.perf_counter() - t0:.1f}s")

            callers = await issue(bus)
            app = create_app(JobOperations(bus, store), store, callers.authenticator)
            port = free_port()
            server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
            serving = asyncio.create_task(server.serve())
            while not server.started:
                await asyncio.sleep(0.05)

            env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
            env |= {"TRAINYARD_API_URL": f"http://127.0.0.1:{port}", "TRAINYARD_TOKEN": callers.tokens["admin"]}
            cli = trainyard_argv()
            load = os.getloadavg()[0]
            print(
                f"{runs} runs each, a new process per run, output piped; {os.cpu_count()} CPUs, "
                f"load average {load:.1f} at the start; command: {' '.join(cli)}"
            )
            print(f"\n{'command':<40} {'p50 ms':>7} {'p90 ms':>7} {'max ms':>7}")
            cases = [
                ("python -c pass (interpreter only)", [sys.executable, "-c", "pass"]),
                ("trainyard --help", [*cli, "--help"]),
                ("trainyard jobs (newest 50)", [*cli, "jobs"]),
                ("trainyard jobs --limit 1000", [*cli, "jobs", "--limit", "1000"]),
                ("trainyard jobs -o json", [*cli, "jobs", "-o", "json"]),
            ]
            if baseline:  # the same commands from another checkout's libs/, e.g. an earlier commit
                old = [sys.executable, "-m", "trainyard.cli.main"]
                old_env = {**env, "PYTHONPATH": str(Path(baseline).resolve())}
                for what, argv in cases[1:3]:
                    times = await asyncio.to_thread(timed, [*old, *argv[len(cli) :]], old_env, runs)
                    print(row(f"{what} [baseline]", times), flush=True)
            for what, argv in cases:
                times = await asyncio.to_thread(timed, argv, env, runs)
                print(row(what, times), flush=True)
            for limit in (50, 1000):
                times = await asyncio.to_thread(fetched, port, callers.tokens["admin"], f"/v1/jobs?limit={limit}", runs)
                print(row(f"GET /v1/jobs?limit={limit} (gateway alone)", times), flush=True)
            server.should_exit = True
            await serving
            stop.set()
            await asyncio.gather(*tasks)
        finally:
            await bus.close()
            await store.close()
            nats.stop()
            redis.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--baseline", help="also time --help and jobs from this libs/ folder (an earlier commit's)")
    args = parser.parse_args()
    asyncio.run(main(args.jobs, args.runs, args.baseline))
