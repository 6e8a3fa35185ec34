"""Chaos as a benchmark: jobs through REST and intake while every process is
SIGKILLed, Redis is wiped and processes stall; then count from the streams
what was lost, duplicated, stuck or double-allocated, and how far the ledger
is from the log.

    .venv/bin/python bench/chaos.py                      # 10,000 jobs, 100 kills, 10 wipes, 10 stalls of 10 s
    .venv/bin/python bench/chaos.py --jobs 2000 --kills 20 --flushes 2 --stalls 2 --seed 2
    .venv/bin/python bench/chaos.py --real               # real processes: 8 agents x 8 fake GPUs, 500 jobs, 8 agent kills
    .venv/bin/python bench/chaos.py --real --quick       # 2 agents x 4 GPUs, 40 jobs, 1 agent kill (a smoke test)

``--real`` runs short real jobs on node agents (plain commands, gangs, a
failing rank, cancels, preemptions by higher priority) while agents are
SIGKILLed and restarted, samples /proc for job processes, and counts jobs
lost, stuck in placed, run twice at once, GPUs held by two live runs, and
runs whose ledger interval is more than 1 s off the measured one
(``trainyard.testing.chaos_real``); ``--jobs``, ``--rate``, ``--kills``,
``--seed`` and ``--drain-timeout-s`` apply when given.

After each wipe and at the end, ``GET /v1/jobs?status=<s>`` (all tenants and
each tenant) is checked against every job's own read: a job its read puts in
``s`` that the list leaves out, or a job listed under ``s`` that reads as
another status, is a filtered-list mismatch (``trainyard.testing.chaos_lists``).

Exits 1 if anything was lost, accepted twice, run twice, stuck or
double-allocated, a filtered list disagrees with the jobs' own reads, or the
ledger differs from the log.  ``--json`` prints the
report as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time

import msgspec

from trainyard.bus import Bus
from trainyard.local import LocalStack, StackConfig
from trainyard.store import Store
from trainyard.testing.agent_stack import agent_stack, wait_for_nodes
from trainyard.testing.chaos import Chaos, ChaosPlan, ChaosReport
from trainyard.testing.chaos_lists import mismatches
from trainyard.testing.chaos_real import RealChaos, RealChaosPlan, RealChaosReport


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = ChaosPlan()
    p.add_argument("--jobs", type=int, default=defaults.jobs)
    p.add_argument("--rate", type=float, default=defaults.rate, help="jobs offered per second")
    p.add_argument("--kills", type=int, default=defaults.kills)
    p.add_argument("--flushes", type=int, default=defaults.flushes)
    p.add_argument("--stalls", type=int, default=defaults.stalls)
    p.add_argument("--stall-s", type=float, default=defaults.stall_s)
    p.add_argument(
        "--restart-pairs",
        type=int,
        default=3,
        help="the emulator stalled, nats-server killed --pair-gap-s later, then the emulator killed",
    )
    p.add_argument("--pair-gap-s", type=float, default=defaults.pair_gap_s)
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--nodes", type=int, default=32)
    p.add_argument("--nats-cluster", type=int, default=1, help="NATS nodes (3: a cluster with R3 streams)")
    p.add_argument("--drain-timeout-s", type=float, default=defaults.drain_timeout_s)
    p.add_argument("--keep", metavar="DIR", help="run the stack in DIR and keep it (logs, ledger) afterwards")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--real",
        action="store_true",
        help="real processes on node agents (fake GPUs): 500 short jobs, agent kills, cancels, preemptions",
    )
    p.add_argument("--agents", type=int, default=RealChaosPlan().agents, help="with --real: node agents")
    p.add_argument("--agent-gpus", type=int, default=RealChaosPlan().gpus, help="with --real: fake GPUs per agent")
    p.add_argument("--quick", action="store_true", help="with --real: 2 agents x 4 GPUs, 40 jobs, 1 agent kill")
    return p.parse_args()


def show(report: ChaosReport) -> None:
    rows = [
        ("jobs", report.jobs),
        ("faults", sum(report.faults.values())),
        ("lost", report.lost),
        ("accepted twice", report.accepted_twice),
        ("run twice to success", report.run_twice),
        ("stuck", report.stuck),
        ("GPU double allocations", report.double_allocations),
        ("dead letters", report.dead_letters),
        ("nodes declared lost", report.nodes_lost),
        ("runs failed by node loss", report.failed_runs.get("node_failure", 0)),
        ("missing reads (404)", report.reads.get("missing", 0)),
        ("stale reads", report.reads.get("stale", 0)),
        ("filtered-list mismatches", mismatches(report.lists)),
        ("ledger - stream GPU-s", f"{report.ledger_minus_stream_gpu_s:.3f}"),
        ("offered in", f"{report.offered_s:.0f} s"),
        ("drained in", f"{report.drained_s:.0f} s"),
    ]
    for name, value in rows:
        print(f"{name:>24}  {value}")
    print(f"{'statuses':>24}  {report.statuses}")
    print(f"{'failed runs by reason':>24}  {report.failed_runs}")
    print(f"{'exited by themselves':>24}  {report.unplanned_exits}")
    print(f"{'faults by kind':>24}  {report.faults}")
    print(f"{'reads during rebuilds':>24}  {report.reads}")
    print(f"{'lists against reads':>24}  {report.lists}")
    if report.dead_letter_reasons:
        print(f"{'dead-letter reasons':>24}  {report.dead_letter_reasons}")
    for v in report.violations:
        print(f"{'violation':>24}  {v}")


def real_plan(args: argparse.Namespace) -> RealChaosPlan:
    """--real's plan: RealChaosPlan's defaults, but for what the command line gives explicitly."""
    given = {arg.split("=")[0] for arg in sys.argv[1:] if arg.startswith("--")}
    plan = RealChaosPlan(agents=args.agents, gpus=args.agent_gpus)
    if args.quick:
        plan = msgspec.structs.replace(plan, agents=2, gpus=4, jobs=40, rate=5.0, kills=1, drain_timeout_s=120.0)
    mapped = {"--jobs": "jobs", "--rate": "rate", "--kills": "kills", "--seed": "seed"}
    changes = {field: getattr(args, field) for flag, field in mapped.items() if flag in given}
    if "--drain-timeout-s" in given:
        changes["drain_timeout_s"] = args.drain_timeout_s
    return msgspec.structs.replace(plan, **changes)


def show_real(report: RealChaosReport) -> None:
    p = report.plan
    print(
        f"settings: {p.agents} agents x {p.gpus} fake GPUs, {p.jobs} jobs at {p.rate:g}/s, {p.kills} agent kills,"
        f" preemption grace {p.grace_s:g} s, seed {p.seed}; /proc sampled every {p.sample_s:g} s"
    )
    rows = [
        ("jobs by kind", report.kinds),
        ("accepted", report.accepted),
        ("statuses", report.statuses),
        ("runs started", report.runs_started),
        ("failed runs by reason", report.failed_runs),
        ("preemption notices", report.preemption_notices),
        ("agent kills", report.faults),
        ("supervisor restarts", report.restarts),
        ("lost", report.lost),
        ("filtered-list mismatches", mismatches(report.lists)),
        ("stuck in placed", report.stuck_placed),
        ("run twice at once", len(report.twice_at_once)),
        ("GPU held by two runs", len(report.gpu_shared)),
        ("GPU double alloc (log)", report.log_double_allocations),
        ("/proc samples", f"{report.live.samples} (at most {report.live.max_live} live job processes)"),
        ("ledger runs compared", report.ledger.compared),
        (
            "ledger over 1 s",
            f"{len(report.ledger.over)} ({report.ledger_over_near_kill} ran while their agent was killed)",
        ),
        ("ledger - measured", f"max |d| {report.ledger.max_abs_s:.3f} s, mean {report.ledger.mean_s:+.3f} s"),
        ("offered in", f"{report.offered_s:.0f} s"),
        ("drained in", f"{report.drained_s:.0f} s"),
    ]
    for name, value in rows:
        print(f"{name:>24}  {value}")
    for job, runs in list(report.twice_at_once.items())[:10]:
        print(f"{'run twice at once':>24}  {job}: {runs}")
    for gpu, runs in list(report.gpu_shared.items())[:10]:
        print(f"{'GPU held by two runs':>24}  {gpu}: {runs}")
    for run, d in list(report.ledger.over.items())[:10]:
        print(f"{'ledger over 1 s':>24}  {run}: {d:+.3f} s")
    for v in report.violations:
        print(f"{'violation':>24}  {v}")


async def real_main(args: argparse.Namespace) -> int:
    plan = real_plan(args)
    with contextlib.ExitStack() as cleanup:
        tmp = args.keep or cleanup.enter_context(tempfile.TemporaryDirectory(prefix="trainyard-chaos-real-"))
        stack = agent_stack(tmp, plan.agents, plan.gpus)
        t0 = time.monotonic()
        await asyncio.to_thread(stack.start)
        assert stack.redis is not None
        bus = await Bus.connect(stack.nats_admin_url, "chaos-real")
        store = Store.from_url(stack.redis.admin_url)
        try:
            healthy = await wait_for_nodes(stack, plan.agents, timeout_s=120)
            print(f"stack up in {time.monotonic() - t0:.0f}s ({healthy} agents healthy)", file=sys.stderr)
            report = await RealChaos(stack, plan, bus, store, lambda line: print(line, file=sys.stderr)).run()
        finally:
            await bus.close()
            await store.close()
            await asyncio.to_thread(stack.stop)
    if args.json:
        print(msgspec.json.format(msgspec.json.encode(report)).decode())
    else:
        show_real(report)
    return 0 if report.clean else 1


async def main(args: argparse.Namespace) -> int:
    if args.real:
        return await real_main(args)
    plan = ChaosPlan(
        jobs=args.jobs,
        rate=args.rate,
        kills=args.kills,
        flushes=args.flushes,
        stalls=args.stalls,
        stall_s=args.stall_s,
        restart_pairs=args.restart_pairs,
        pair_gap_s=args.pair_gap_s,
        seed=args.seed,
        drain_timeout_s=args.drain_timeout_s,
    )
    with contextlib.ExitStack() as cleanup:
        tmp = args.keep or cleanup.enter_context(tempfile.TemporaryDirectory(prefix="trainyard-chaos-"))
        stack = LocalStack(
            StackConfig(data_dir=tmp, nodes=args.nodes, racks=4, log_level="WARNING", nats_cluster=args.nats_cluster)
        )
        t0 = time.monotonic()
        await asyncio.to_thread(stack.start)
        print(f"stack up in {time.monotonic() - t0:.0f}s ({args.nodes} nodes); seed {args.seed}", file=sys.stderr)
        bus = await Bus.connect(stack.nats_admin_url, "chaos")
        store = Store.from_url(stack.redis.admin_url)
        try:
            report = await Chaos(stack, plan, bus, store, lambda line: print(line, file=sys.stderr)).run()
        finally:
            await bus.close()
            await store.close()
            await asyncio.to_thread(stack.stop)
    if args.json:
        print(msgspec.json.format(msgspec.json.encode(report)).decode())
    else:
        show(report)
    return 0 if report.clean else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
