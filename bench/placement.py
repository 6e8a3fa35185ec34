"""Placement benchmark: gang and topology-aware placement on a 4,096-node cluster.

Cluster: 4 zones x 8 blocks x 8 racks x 16 nodes x 8 GPUs (32,768 GPUs; a rack
holds 128 GPUs, a block 1,024).  A seeded stream of gangs of 1..512 GPUs
arrives and finishes at about 90% occupancy; after every arrival or finish the
pending queue is offered to the placement cycle in arrival order, with EASY
backfill on.

Prints: latency per gang (one gang's placement attempt inside a cycle, with the
cycle's tree kept between events as a service would; the thread's CPU time, or
wall time with --wall), the cost of a
whole ``place()`` call from a fresh snapshot, the share of multi-node gangs
placed inside one rack / one block against how many could have been, and the
fragmentation figure over time.

Then, on a fragmented 512-node cluster (one zone, 8 spines (blocks) x 8 leaves
(racks) x 8 nodes x 8 GPUs, fragmented afresh for every trial by seeded random
runs of busy and free nodes), one gang of each size is placed and undone: the
share placed on the fewest possible spines, and on the fewest possible leaves
within that many spines, per gang size.  The optimum comes from the free
replica slots per leaf alone, independently of the placement code.

    PYTHONPATH=libs .venv/bin/python bench/placement.py [--jobs 8000] [--seed 1] [--wall] [--trials 400]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import statistics
import time

from trainyard.core.placement import ClusterSnapshot, NodeView, PlacementRequest, RunningAlloc, fragmentation, place
from trainyard.core.placement.cycle import Cycle
from trainyard.core.placement.gang import demands_of, fit_gang, fitting, undo
from trainyard.core.placement.topology import Level, Topology
from trainyard.domain.job import JobSpec, Role
from trainyard.domain.node import NodeInfo

ZONES, BLOCKS, RACKS, NODES, GPUS = 4, 8, 8, 16, 8
SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
WEIGHTS = [16, 8, 8, 18, 14, 12, 10, 7, 4, 3]
MEAN_RUNTIME_S = 3600.0
CPU_TIME = True  # latency as this thread's CPU time: wall time on a shared machine includes other processes


def cluster() -> list[NodeInfo]:
    out = []
    for z in range(ZONES):
        for b in range(BLOCKS):
            for r in range(RACKS):
                for n in range(NODES):
                    out.append(
                        NodeInfo(
                            f"z{z}-b{b}-r{r}-n{n:02d}", "bench", "H100", GPUS, zone=f"z{z}", block=f"b{b}", rack=f"r{r}"
                        )
                    )
    return out


def spec_of(gpus: int, runtime: float, rng: random.Random) -> JobSpec:
    role = (
        Role("worker", replicas=1, gpus_per_replica=gpus)
        if gpus < GPUS
        else Role("worker", replicas=gpus // GPUS, gpus_per_replica=GPUS)
    )
    limit = int(runtime * rng.uniform(1.0, 2.0)) + 60
    return JobSpec(tenant="t", queue="q", roles=[role], max_runtime_s=limit, simulated_duration_s=runtime)


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def snapshot_of(infos: list[NodeInfo], topo: Topology, running: dict[str, RunningAlloc]) -> ClusterSnapshot:
    views = [NodeView(i, tuple(topo.nodes[i.node_id].free_gpus)) for i in infos]
    return ClusterSnapshot(nodes=views, running=list(running.values()))


def run(jobs: int, seed: int) -> None:
    rng = random.Random(seed)
    infos = cluster()
    topo = Topology.build((i, range(i.gpus), True) for i in infos)
    total_gpus = len(infos) * GPUS
    mean_gpus = sum(s * w for s, w in zip(SIZES, WEIGHTS, strict=True)) / sum(WEIGHTS)
    rate = 0.93 * total_gpus / (mean_gpus * MEAN_RUNTIME_S)  # arrivals per second
    events: list[tuple[float, int, str, str]] = []  # (time, seq, kind, job id)
    t = 0.0
    specs: dict[str, JobSpec] = {}
    for j in range(jobs):
        t += rng.expovariate(rate)
        gpus = rng.choices(SIZES, WEIGHTS)[0]
        runtime = min(rng.expovariate(1 / MEAN_RUNTIME_S) + 60, 6 * MEAN_RUNTIME_S)
        specs[f"j{j:05d}"] = spec_of(gpus, runtime, rng)
        heapq.heappush(events, (t, j, "arrive", f"j{j:05d}"))
    pending: dict[str, int] = {}  # job id -> order
    running: dict[str, RunningAlloc] = {}
    latency_placed: dict[int, list[float]] = {}
    latency_waiting: dict[int, list[float]] = {}
    rack_could = rack_did = block_could = block_did = multi = in_one_rack = 0
    frag_series: list[tuple[float, dict[str, float], float]] = []
    occupancy: list[float] = []
    seq = jobs
    step = 0
    warmup = jobs // 10
    arrived = 0
    while events:
        now, _, kind, job_id = heapq.heappop(events)
        if kind == "arrive":
            pending[job_id] = int(job_id[1:])
            arrived += 1
        else:
            alloc = running.pop(job_id)
            for r in alloc.replicas:
                topo.give(topo.nodes[r.node_id], r.gpus)
        # One cycle over the pending queue, in arrival order.
        snap = ClusterSnapshot(nodes=[], running=list(running.values()))
        cycle = Cycle(snap, now, topology=topo)
        for jid in sorted(pending, key=pending.get):
            spec = specs[jid]
            req = PlacementRequest(jid, jid + "-r1", spec, pending[jid])
            demands = demands_of(spec)
            multi_node = spec.total_gpus > GPUS
            cycle.backfill.mask_for(now + spec.max_runtime_s)  # "could" keeps off reservations, as the gang must
            could_rack = multi_node and next(fitting(topo.trees["H100"].root, Level.RACK, demands), None) is not None
            could_block = multi_node and next(fitting(topo.trees["H100"].root, Level.BLOCK, demands), None) is not None
            cycle.backfill.unmask()  # place_one masks again inside the timed call
            t0, c0 = time.perf_counter(), time.thread_time()
            out = cycle.place_one(req)
            dt = (time.thread_time() - c0) * 1000 if CPU_TIME else (time.perf_counter() - t0) * 1000
            measured = arrived > warmup
            if hasattr(out, "replicas"):
                if measured:
                    latency_placed.setdefault(spec.total_gpus, []).append(dt)
                del pending[jid]
                running[jid] = RunningAlloc(jid, req.run_id, out.replicas, now, spec.max_runtime_s)
                seq += 1
                heapq.heappush(events, (now + spec.simulated_duration_s, seq, "finish", jid))
                if multi_node and measured:
                    multi += 1
                    racks = {topo.nodes[r.node_id].path[:3] for r in out.replicas}
                    blocks = {p[:2] for p in racks}
                    in_one_rack += len(racks) == 1
                    rack_could += could_rack
                    rack_did += could_rack and len(racks) == 1
                    block_could += could_block
                    block_did += could_block and len(blocks) == 1
            elif measured:
                latency_waiting.setdefault(spec.total_gpus, []).append(dt)
        cycle.result()
        step += 1
        used = total_gpus - topo.trees["H100"].root.free
        if arrived > warmup and arrived < jobs:
            occupancy.append(used / total_gpus)
        if step % 400 == 0 and arrived < jobs:
            frag_series.append((now, fragmentation(snapshot_of(infos, topo, running)), used / total_gpus))
    # Building the tree from a 4,096-node snapshot, and whole place() calls, as the service makes them.
    clock_ms = (lambda: time.thread_time() * 1000) if CPU_TIME else (lambda: time.perf_counter() * 1000)
    build_ms = []
    for _ in range(5):
        t0 = clock_ms()
        Topology.build((i, range(i.gpus), True) for i in infos)
        build_ms.append(clock_ms() - t0)
    full_ms = []
    snap = snapshot_of(infos, Topology.build((i, range(i.gpus), True) for i in infos), {})
    reqs = [PlacementRequest(j, j, specs[j], n) for n, j in enumerate(sorted(specs)[:200])]
    for _ in range(5):
        t0 = clock_ms()
        place(snap, reqs, 0.0)
        full_ms.append(clock_ms() - t0)

    print(f"cluster: {len(infos)} nodes x {GPUS} GPUs, {ZONES} zones x {BLOCKS} blocks x {RACKS} racks x {NODES} nodes")
    print(f"jobs: {jobs}, seed {seed}, mean occupancy {statistics.mean(occupancy):.1%} (after warm-up)")
    clock = "thread CPU time" if CPU_TIME else "wall time"
    print(f"\nlatency per gang attempt, ms of {clock} (placed | left waiting, incl. reservation search)")
    print(f"{'gpus':>6} {'n':>6} {'p50':>7} {'p99':>7} | {'n':>6} {'p50':>7} {'p99':>7}")
    all_placed: list[float] = []
    all_waiting: list[float] = []
    for size in SIZES:
        a, b = latency_placed.get(size, []), latency_waiting.get(size, [])
        all_placed += a
        all_waiting += b
        print(
            f"{size:>6} {len(a):>6} {pct(a, 50):>7.3f} {pct(a, 99):>7.3f} | "
            f"{len(b):>6} {pct(b, 50):>7.3f} {pct(b, 99):>7.3f}"
        )
    print(
        f"{'all':>6} {len(all_placed):>6} {pct(all_placed, 50):>7.3f} {pct(all_placed, 99):>7.3f} | "
        f"{len(all_waiting):>6} {pct(all_waiting, 50):>7.3f} {pct(all_waiting, 99):>7.3f}"
    )
    print(f"\nmulti-node gangs placed: {multi} (in one rack: {in_one_rack}, {in_one_rack / max(multi, 1):.1%})")
    print(
        f"  could fit in one rack: {rack_could}, placed in one rack: {rack_did} "
        f"({rack_did / max(rack_could, 1):.1%} of best possible)"
    )
    print(
        f"  could fit in one block: {block_could}, placed in one block: {block_did} "
        f"({block_did / max(block_could, 1):.1%} of best possible)"
    )
    print("\nfragmentation over time (share of free GPUs unusable by an 8-GPU / 64-GPU gang)")
    print(f"{'t (h)':>7} {'occupancy':>9} {'free':>6} {'by 8':>6} {'by 64':>6} {'whole racks':>11}")
    for now, f, occ in frag_series:
        print(
            f"{now / 3600:>7.1f} {occ:>9.1%} {int(f['free_gpus']):>6} {f['unusable_by_8']:>6.1%} "
            f"{f['unusable_by_64']:>6.1%} {int(f['whole_free_racks']):>11}"
        )
    steady = [f for now, f, occ in frag_series if 0.85 <= occ <= 0.95]
    if steady:
        print(
            f"median over {len(steady)} samples at 85-95% occupancy: unusable by 8 "
            f"{statistics.median(f['unusable_by_8'] for f in steady):.1%}, by 64 "
            f"{statistics.median(f['unusable_by_64'] for f in steady):.1%}, whole free racks "
            f"{statistics.median(f['whole_free_racks'] for f in steady):.0f}"
        )
    print(f"\nbuilding the tree from a 4,096-node snapshot: median {statistics.median(build_ms):.1f} ms")
    print(
        f"whole place() call, fresh 4,096-node snapshot, 200 requests: "
        f"min {min(full_ms):.1f} ms, median {statistics.median(full_ms):.1f} ms"
    )


SPINES, LEAVES, LEAF_NODES = 8, 8, 8  # the fragmented 512-node cluster
NODE_GANGS = [2, 4, 8, 16]  # whole-node gangs, in nodes


def fragmented(rng: random.Random) -> list[tuple[NodeInfo, list[int]]]:
    """512 nodes in leaf order, busy and free in random runs that cross leaf and spine edges;
    a busy node is sometimes only partly busy."""
    occupancy = rng.uniform(0.5, 0.9)
    out: list[tuple[NodeInfo, list[int]]] = []
    busy_run = False
    left = 0
    for s in range(SPINES):
        for leaf in range(LEAVES):
            for n in range(LEAF_NODES):
                if left == 0:
                    busy_run = rng.random() < occupancy
                    left = rng.randint(1, 8)
                left -= 1
                used = (GPUS if rng.random() < 0.75 else rng.randint(1, GPUS - 1)) if busy_run else 0
                info = NodeInfo(f"s{s}-l{leaf}-n{n}", "frag", "H100", GPUS, zone="z0", block=f"s{s}", rack=f"l{leaf}")
                out.append((info, list(range(used, GPUS))))
    return out


def optimum(views: list[tuple[NodeInfo, list[int]]], gpus: int, replicas: int) -> tuple[int, int] | None:
    """The fewest spines, and the fewest leaves within that many spines, that hold the gang."""
    slots: dict[tuple[str, str], int] = {}
    for info, free in views:
        key = (info.block, info.rack)
        slots[key] = slots.get(key, 0) + len(free) // gpus
    by_spine: dict[str, list[int]] = {}
    for (spine, _), n in slots.items():
        if n:
            by_spine.setdefault(spine, []).append(n)
    totals = sorted((sum(v) for v in by_spine.values()), reverse=True)
    spines = next((k for k in range(1, len(totals) + 1) if sum(totals[:k]) >= replicas), None)
    if spines is None:
        return None
    best = None
    for chosen in itertools.combinations(sorted(by_spine), spines):
        leaves = sorted((n for s in chosen for n in by_spine[s]), reverse=True)
        got = 0
        for count, n in enumerate(leaves, 1):
            got += n
            if got >= replicas:
                best = count if best is None else min(best, count)
                break
    return spines, best  # type: ignore[return-value]


def two_level(trials: int, seed: int) -> None:
    rng = random.Random(seed)
    rows: dict[str, list[int]] = {}  # label -> [placed, on fewest spines, on fewest leaves too, extra leaves]
    latency: dict[str, list[float]] = {}
    labels = [f"{n} nodes" for n in NODE_GANGS] + ["mixed"]
    for _ in range(trials):
        views = fragmented(rng)
        topo = Topology.build((i, free, True) for i, free in views)
        mixed = rng.choices(SIZES, WEIGHTS, k=4)
        gangs = [(f"{n} nodes", n * GPUS) for n in NODE_GANGS] + [("mixed", g) for g in mixed]
        for label, total in gangs:
            spec = spec_of(total, 3600.0, rng)
            role = spec.roles[0]
            best = optimum(views, role.gpus_per_replica, role.replicas)
            c0 = time.thread_time()
            placed = fit_gang(topo, spec)
            dt = (time.thread_time() - c0) * 1000
            assert (placed is None) == (best is None), "the placement and the optimum disagree on fitting"
            if placed is None or best is None:
                continue
            latency.setdefault(label, []).append(dt)
            leaves = {topo.nodes[r.node_id].path[:3] for r in placed}
            spines = {p[:2] for p in leaves}
            row = rows.setdefault(label, [0, 0, 0, 0])
            row[0] += 1
            row[1] += len(spines) == best[0]
            row[2] += len(spines) == best[0] and len(leaves) == best[1]
            row[3] += len(leaves) - best[1]
            undo(topo, [(0, "", topo.nodes[r.node_id], r.gpus) for r in placed])
    print(
        f"\ntwo-level optimality: {SPINES * LEAVES * LEAF_NODES} nodes, {SPINES} spines x {LEAVES} leaves x "
        f"{LEAF_NODES} nodes, fragmented by seeded random runs; {trials} trials, seed {seed}"
    )
    print(
        f"{'gang':>9} {'placed':>7} {'fewest spines':>14} {'fewest leaves':>14} {'extra leaves':>13} "
        f"{'p50 ms':>7} {'p99 ms':>7}"
    )
    total = [0, 0, 0, 0]
    for label in labels:
        row = rows.get(label, [0, 0, 0, 0])
        total = [a + b for a, b in zip(total, row, strict=True)]
        n = max(row[0], 1)
        lat = latency.get(label, [])
        print(
            f"{label:>9} {row[0]:>7} {row[1] / n:>14.1%} {row[2] / n:>14.1%} {row[3] / n:>13.2f} "
            f"{pct(lat, 50):>7.3f} {pct(lat, 99):>7.3f}"
        )
    node_rows = [rows.get(f"{n} nodes", [0, 0, 0, 0]) for n in NODE_GANGS]
    placed_2_16 = sum(r[0] for r in node_rows)
    print(
        f"{'2-16':>9} {placed_2_16:>7} {sum(r[1] for r in node_rows) / max(placed_2_16, 1):>14.1%} "
        f"{sum(r[2] for r in node_rows) / max(placed_2_16, 1):>14.1%} "
        f"{sum(r[3] for r in node_rows) / max(placed_2_16, 1):>13.2f}"
    )
    print(
        "(fewest leaves: on the fewest spines and on the fewest leaves those spines allow; "
        "extra leaves: mean leaves beyond that optimum)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--wall", action="store_true", help="measure wall time instead of CPU time")
    parser.add_argument("--trials", type=int, default=400, help="fragmented 512-node clusters for the two-level figure")
    args = parser.parse_args()
    CPU_TIME = not args.wall
    run(args.jobs, args.seed)
    two_level(args.trials, args.seed)
