"""Placed -> every rank started, through the whole local stack with real
node agents (fake GPUs) running real processes; and what an agent costs.

Starts ``trainyard up``'s stack with N agents and no emulated nodes on
127.0.0.1, offers short real jobs (``sleep 1`` by default) on the intake subject
at a fixed rate for a fixed time, waits for every job to end, then reads JOBS
and WORK back and prints, from the ``at`` of each event (one clock):

- JobPlaced -> the dispatcher's StartRun, per node;
- JobPlaced -> the agent's ProcessesStarted, per node;
- JobPlaced -> RunStarted (every rank of the gang up), per run;

then each agent's CPU seconds per launch on its node (/proc utime+stime of
the agent itself, and of the shims and commands it reaped) and its resident
memory; and then, with nothing running, each agent's CPU-s/s over
``--idle-s`` seconds (the goal: < 0.01 CPU-s/s).

    .venv/bin/python bench/launch.py                      # 16 agents, 100 runs/s for 10 s, 30 s idle
    .venv/bin/python bench/launch.py --replicas 2 --gpus-per-replica 8   # 2-node gangs
    .venv/bin/python bench/launch.py --quick              # 2 agents, 10 runs/s for 2 s, 3 s idle (a smoke test)

Exits 1 when a run placed did not start.  ``--json`` prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import sys
import tempfile
import time

import msgspec

from trainyard.bus import Bus
from trainyard.domain import JobSpec, Role
from trainyard.store import Store
from trainyard.testing.agent_stack import agent_pids, agent_stack, wait_for_nodes, wait_terminal
from trainyard.testing.chaos import submit_event
from trainyard.testing.launches import read_latencies, summary
from trainyard.testing.procs import CpuSample, cpu, rss_mib


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=16)
    p.add_argument("--gpus", type=int, default=8, help="fake GPUs per agent")
    p.add_argument("--rate", type=float, default=100.0, help="runs offered per second")
    p.add_argument("--seconds", type=float, default=10.0, help="how long runs are offered")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--gpus-per-replica", type=int, default=1)
    p.add_argument("--command", default="sleep 1", help="what every rank runs (1 s: the runs spread over the agents)")
    p.add_argument("--idle-s", type=float, default=30.0, help="how long idle agents are measured")
    p.add_argument("--drain-timeout-s", type=float, default=180.0)
    p.add_argument("--quick", action="store_true", help="2 agents, 10 runs/s for 2 s, 3 s idle")
    p.add_argument("--keep", metavar="DIR", help="run the stack in DIR and keep it afterwards")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.agents, args.rate, args.seconds, args.idle_s = 2, 10.0, 2.0, 3.0
    return args


def spec(args: argparse.Namespace, i: int) -> JobSpec:
    return JobSpec(
        tenant="acme",
        queue="default",
        name=f"launch-{i}",
        command=shlex.split(args.command),
        roles=[Role(name="worker", replicas=args.replicas, gpus_per_replica=args.gpus_per_replica)],
        stop_grace_s=2.0,
    )


async def offer(bus: Bus, args: argparse.Namespace, prefix: str) -> list[str]:
    n = int(args.rate * args.seconds)
    ids = [f"{prefix}-{i:06d}" for i in range(n)]
    started = time.monotonic()
    sem = asyncio.Semaphore(64)

    async def one(i: int, job_id: str) -> None:
        await asyncio.sleep(max(0.0, started + i / args.rate - time.monotonic()))
        async with sem:
            await submit_event(bus, job_id, spec(args, i))

    await asyncio.gather(*(one(i, j) for i, j in enumerate(ids)))
    return ids


def cpu_of(pids: dict[str, int]) -> dict[str, CpuSample]:
    out = {}
    for name, pid in pids.items():
        with contextlib.suppress(OSError):
            out[name] = cpu(pid)
    return out


async def idle_cpu(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """Each process's own CPU-s/s over ``seconds``."""
    before, t0 = cpu_of(pids), time.monotonic()
    await asyncio.sleep(seconds)
    after, wall = cpu_of(pids), time.monotonic() - t0
    return {n: (after[n].own_s - before[n].own_s) / wall for n in after if n in before}


async def measure(args: argparse.Namespace, tmp: str) -> dict:
    load_before = os.getloadavg()
    stack = agent_stack(tmp, args.agents, args.gpus)
    t0 = time.monotonic()
    await asyncio.to_thread(stack.start)
    up_s = time.monotonic() - t0
    assert stack.redis is not None
    bus = await Bus.connect(stack.nats_admin_url, "bench-launch")
    store = Store.from_url(stack.redis.admin_url)
    try:
        healthy = await wait_for_nodes(stack, args.agents, timeout_s=120)
        exited = stack.exited()
        pids = {n: p for n, p in agent_pids(stack).items() if f"agent-{n}" not in exited}
        print(f"stack up in {up_s:.0f}s; {healthy} of {args.agents} agents' nodes healthy", file=sys.stderr)
        services = {name: proc.pid for name, proc in stack.procs.items() if not name.startswith("agent-")}
        services |= {f"{server.name}-server": server.proc.pid for server in (stack.nats, stack.redis) if server}
        before, t_offer = cpu_of({**pids, **services}), time.monotonic()
        ids = await offer(bus, args, "launch")
        offered_s = time.monotonic() - t_offer
        drained_s = await wait_terminal(store, len(ids), args.drain_timeout_s)
        after = cpu_of({**pids, **services})
        figures = await read_latencies(bus, set(ids))
        await asyncio.sleep(2.0)  # the last reports and heartbeats settle
        idle = await idle_cpu(pids, args.idle_s)
        rss = {n: rss_mib(pid) or 0.0 for n, pid in pids.items()}
    finally:
        await bus.close()
        await store.close()
        await asyncio.to_thread(stack.stop)
    per_launch = {
        n: {
            "launches": figures.launches_by_node.get(n, 0),
            "own_ms": 1000 * (after[n].own_s - before[n].own_s) / max(1, figures.launches_by_node.get(n, 0)),
            "children_ms": 1000
            * (after[n].children_s - before[n].children_s)
            / max(1, figures.launches_by_node.get(n, 0)),
        }
        for n in pids
        if n in after and n in before
    }
    return {
        "settings": {
            "agents": args.agents,
            "gpus_per_agent": args.gpus,
            "rate": args.rate,
            "seconds": args.seconds,
            "replicas": args.replicas,
            "gpus_per_replica": args.gpus_per_replica,
            "command": args.command,
            "idle_s": args.idle_s,
            "cpus": os.cpu_count(),
            "load_before": load_before,
        },
        "agents_healthy": healthy,
        "jobs_offered": len(ids),
        "offered_s": offered_s,
        "drained_s": drained_s,
        "runs_placed": figures.placed,
        "runs_started": figures.started,
        "placed_to_order": summary(figures.to_order),
        "placed_to_node_started": summary(figures.to_node_started),
        "placed_to_run_started": summary(figures.to_run_started),
        "agent_cpu_per_launch": per_launch,
        "service_cpu_ms_per_run": {
            n: 1000 * (after[n].own_s - before[n].own_s) / max(1, figures.placed)
            for n in services
            if n in after and n in before
        },
        "agent_rss_mib": rss,
        "idle_agent_cpu_s_per_s": idle,
        "load_after": os.getloadavg(),
    }


def show(r: dict) -> None:
    s = r["settings"]
    print(
        f"settings: {s['agents']} agents x {s['gpus_per_agent']} fake GPUs, {s['rate']:g} runs/s for {s['seconds']:g} s,"
        f" {s['replicas']} x {s['gpus_per_replica']} GPU(s) per run running {s['command']!r}; {s['cpus']} CPUs;"
        f" load before {s['load_before'][0]:.2f}, after {r['load_after'][0]:.2f}"
    )
    print(f"agents healthy: {r['agents_healthy']} of {s['agents']}")
    print(
        f"runs: {r['jobs_offered']} offered in {r['offered_s']:.1f} s, {r['runs_placed']} placed,"
        f" {r['runs_started']} started; all ended {r['drained_s']:.1f} s after the offering"
    )
    for key, label in (
        ("placed_to_order", "placed -> StartRun (per node)"),
        ("placed_to_node_started", "placed -> ProcessesStarted (per node)"),
        ("placed_to_run_started", "placed -> RunStarted (gang)"),
    ):
        v = r[key]
        print(f"{label:>40}: p50 {v['p50_ms']:.0f} ms  p99 {v['p99_ms']:.0f} ms  max {v['max_ms']:.0f} ms")
    launches = r["agent_cpu_per_launch"].values()
    own = [v["own_ms"] for v in launches if v["launches"]]
    kids = [v["children_ms"] for v in launches if v["launches"]]
    if own:
        print(
            f"agent CPU per launch ({len(own)} agents launched): itself {min(own):.1f}-{max(own):.1f} ms (mean {sum(own) / len(own):.1f}),"
            f" its shims and commands {min(kids):.1f}-{max(kids):.1f} ms (mean {sum(kids) / len(kids):.1f})"
        )
    services = ", ".join(f"{n} {ms:.2f}" for n, ms in sorted(r["service_cpu_ms_per_run"].items()))
    print(f"service CPU per run placed (ms): {services}")
    rss = list(r["agent_rss_mib"].values())
    idle = list(r["idle_agent_cpu_s_per_s"].values())
    if rss and idle:
        print(f"agent RSS: {min(rss):.1f}-{max(rss):.1f} MiB")
        print(
            f"idle agent over {s['idle_s']:g} s: {sum(idle) / len(idle):.4f} CPU-s/s mean, {max(idle):.4f} max"
            " (goal < 0.01)"
        )


async def main(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as cleanup:
        tmp = args.keep or cleanup.enter_context(tempfile.TemporaryDirectory(prefix="trainyard-launch-"))
        report = await measure(args, tmp)
    if args.json:
        print(msgspec.json.format(msgspec.json.encode(report)).decode())
    else:
        show(report)
    return 0 if report["runs_started"] == report["runs_placed"] == report["jobs_offered"] else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
