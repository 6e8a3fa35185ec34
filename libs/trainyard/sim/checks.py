"""Invariants of a simulator state, checked every N cycles.

- quota: what admitted and running jobs hold breaks no quota, borrowing or
  lending limit (the admission core's own ``check_quota``);
- allocation: no GPU is held by two runs, and the live tree's used GPUs are
  exactly those the runs hold; the order in which placement expects their
  GPUs back is the runs' by latest end, in the order they started;
- gangs are whole: every placed run has every replica of every role, each on
  the GPUs its role asks for;
- the GPUs counted in use are exactly those admitted jobs hold;
- the lifecycle fold over the emitted events (the live projection's rules)
  puts every job in the state the simulator has it in, and saw no GPU given
  to two runs;
- the pending jobs handed to admission are, queue by queue, in the order the
  core would sort them into (admission takes them as given).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainyard.core.admission import AdmissionSnapshot, check_quota
from trainyard.core.admission.ordering import group_in_order, group_pending, service_order
from trainyard.core.admission.tree import Scheduling

if TYPE_CHECKING:
    from trainyard.sim.engine import Simulator


def check_state(sim: Simulator) -> list[str]:
    at = f"t={sim.now:.0f}"
    problems = [f"{at}: {p}" for p in check_quota(sim.tenancy, list(sim.admitted_running.values()))]
    held: dict[tuple[str, int], str] = {}
    for i, alloc in sim.allocs.items():
        job = sim.jobs[i].job
        want = sorted((name, g) for name, r, g in job.roles for _ in range(r))
        got = sorted((rp.role, len(rp.gpus)) for rp in alloc.replicas)
        if want != got:
            problems.append(f"{at}: {alloc.run_id} is not whole: wants {want}, holds {got}")
        for rp in alloc.replicas:
            for g in rp.gpus:
                other = held.get((rp.node_id, g))
                if other is not None:
                    problems.append(f"{at}: GPU {rp.node_id}/{g} held by {other} and {alloc.run_id}")
                held[(rp.node_id, g)] = alloc.run_id
    by_end = sorted(((a.expected_end, id(a.replicas)) for a in sim.allocs.values()), key=lambda r: r[0])
    if [(end, id(replicas)) for end, replicas in sim.releases.items] != by_end:
        problems.append(f"{at}: placement's release order is not the runs' by end, in the order they started")
    live = {(n, g) for n, gpus in sim.cluster.held_gpus().items() for g in gpus}
    ours = {k for k in held if k[0] not in sim.cluster.down}
    if live != ours:
        problems.append(f"{at}: tree and runs disagree on {len(live ^ ours)} GPUs")
    admitted = dict.fromkeys(sim.in_use, 0)
    for i in sim.admitted_running:
        admitted[sim.jobs[i].job.gpu_type] += sim.jobs[i].job.gpus
    if admitted != sim.in_use:
        problems.append(f"{at}: {sim.in_use} GPUs counted in use but admitted jobs hold {admitted}")
    folded = sim.table.jobs
    for st in sim.jobs:
        if st.status == "future":
            continue
        record = folded.get(st.job.job_id)
        status = record.status if record is not None else None
        if FOLDED_AS.get(st.status) != status:
            problems.append(f"{at}: {st.job.job_id} is {st.status} in the simulator but {status} in the lifecycle fold")
    problems += [f"{at}: {v}" for v in sim.table.holders.violations]
    return problems


#: The simulator's job states and the fold's: a placed run starts at once in the simulator.
FOLDED_AS = {
    "pending": "pending",
    "admitted": "admitted",
    "running": "running",
    "done": "succeeded",
    "failed": "failed",
    "rejected": "rejected",
}


def check_order(snapshot: AdmissionSnapshot, scheduling: Scheduling, now: float) -> list[str]:
    """Queues whose pending jobs, as handed to admission, are not in the order the core would sort them."""
    if not snapshot.pending_in_order:
        return []
    given = group_in_order(snapshot.pending)
    core = group_pending(snapshot.pending, service_order(scheduling, now))
    return [
        f"t={now:.0f}: queue {tenant}/{queue}'s pending jobs are not in admission order"
        for (tenant, queue), jobs in given.items()
        if [j.job_id for j in jobs] != [j.job_id for j in core[(tenant, queue)]]
    ]
