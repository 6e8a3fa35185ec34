"""Chaos with real processes: a local stack of node agents on fake GPUs runs
short real jobs while agents are SIGKILLed (and restarted by the stack's
supervisor), jobs are cancelled and higher-priority work preempts lower.

The jobs: plain commands (``sleep``, ``true``), multi-replica gangs (some
across nodes), gangs where rank 1 exits 3, long jobs cancelled a few seconds
after submission, and preemptible simulated workloads (the agent's own
``workload.py``, which checkpoints on its stop signal) in a queue of their
own, which ``high`` jobs in the same queue preempt.  While they run,
:mod:`trainyard.testing.real_checks` samples /proc; afterwards the JOBS log,
the agents' state directories and the ledger are read back.  The report
counts: jobs lost (accepted, never terminal), stuck in ``placed``, jobs with
live processes of two runs at once, GPUs held by live processes of two runs,
GPU double allocations on the log, runs whose ledger interval differs
from the measured one by more than 1 s, and, at the end, filtered lists that
disagree with the jobs' own reads (:mod:`trainyard.testing.chaos_lists`).

Used by ``bench/chaos.py --real`` and its quick run in the e2e suite.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable

import httpx
import msgspec

from trainyard.bus import Bus
from trainyard.config.store import ConfigStore
from trainyard.core.invariants import check_job_log
from trainyard.domain import JobSpec, Role
from trainyard.events import JobAccepted, JobRejected, PreemptionNotice, RunFailed, RunStarted
from trainyard.local import LocalStack
from trainyard.local.agents import agent_process
from trainyard.local.supervisor import Backoff, Supervisor
from trainyard.store import Store
from trainyard.testing.agent_stack import TERMINAL, agents_dir, wait_terminal
from trainyard.testing.chaos import submit_event
from trainyard.testing.chaos_lists import check_run, mismatches
from trainyard.testing.procs import boot_epoch
from trainyard.testing.real_checks import LedgerCheck, LiveChecks, check_ledger, near_kills, watch
from trainyard.testing.streams import read_job_events

FAIL_RANK_1 = 'if [ "$RANK" = 1 ]; then sleep 0.3; exit 3; fi; exec sleep 10'
KINDS = {"plain": 40, "gang": 25, "rank_fails": 10, "cancel": 10, "preempt_low": 6, "preempt_high": 6}


class RealChaosPlan(msgspec.Struct, frozen=True):
    agents: int = 8
    gpus: int = 8  # fake GPUs per agent
    jobs: int = 500
    rate: float = 10.0  # jobs offered per second
    kills: int = 8  # SIGKILLs of agents, spread over the offering; each restarted by the supervisor
    seed: int = 1
    grace_s: float = 2.0  # the preemption notice's grace period
    drain_timeout_s: float = 300.0
    sample_s: float = 0.2  # how often /proc is read


class RealChaosReport(msgspec.Struct):
    plan: RealChaosPlan
    kinds: dict[str, int]  # jobs offered, by kind
    faults: dict[str, int]  # agent kills, by agent
    restarts: dict[str, int]  # restarts by the supervisor
    statuses: dict[str, int]
    lost: int  # submitted and never decided, or accepted and not terminal at the end
    stuck_placed: int  # of those, placed and never started nor ended
    accepted: int
    runs_started: int
    preemption_notices: int
    failed_runs: dict[str, int]  # RunFailed by reason
    twice_at_once: dict[str, list[str]]  # job -> runs seen live together in /proc
    gpu_shared: dict[str, list[str]]  # node/gpu -> runs seen holding it together in /proc
    log_double_allocations: int  # GPU given to two runs at once, on the log
    live: LiveChecks
    ledger: LedgerCheck
    ledger_over_near_kill: int  # of the runs over 1 s, those on a node whose agent was killed while they ran
    violations: list[str]
    offered_s: float
    drained_s: float
    lists: dict[str, int] = {}  # filtered lists against per-job reads at the end (trainyard.testing.chaos_lists)

    @property
    def clean(self) -> bool:
        return not (
            self.lost
            or mismatches(self.lists)
            or self.stuck_placed
            or self.twice_at_once
            or self.gpu_shared
            or self.log_double_allocations
            or self.ledger.over
        )


def tenancy(plan: RealChaosPlan) -> str:
    """``acme`` for the general mix; ``batch``, a quarter of the GPUs at most,
    where ``high`` jobs preempt ``low`` ones."""
    total = plan.agents * plan.gpus
    batch = max(plan.gpus, total // 4)
    return f"""
flavors: [{{name: H100, node_pool: agents, gpus_per_node: {plan.gpus}}}]
priority_classes:
  - {{name: high, priority: 1000, preemptible: false}}
  - {{name: standard, priority: 500}}
  - {{name: low, priority: 100}}
default_priority_class: standard
preemption: {{grace_period_s: {plan.grace_s}, min_runtime_s: 0, attained_service: false, fair_share: false}}
organisations:
  - name: lab
    quota: {{H100: {{nominal: {total}}}}}
    teams:
      - name: acme
        quota: {{H100: {{nominal: {total - batch}}}}}
        queues: [{{name: default, quota: {{H100: {{nominal: {total - batch}}}}}}}]
      - name: batch
        quota: {{H100: {{nominal: {batch}, borrowing_limit: 0}}}}
        queues:
          - {{name: default, priority_classes: [high, low], default_priority_class: low,
              quota: {{H100: {{nominal: {batch}, borrowing_limit: 0}}}}}}
"""


def workload(plan: RealChaosPlan) -> list[tuple[str, str, JobSpec]]:
    """(job id, kind, spec) for every job, in offering order."""
    rng = random.Random(plan.seed)
    names, weights = list(KINDS), list(KINDS.values())
    out = []
    for i in range(plan.jobs):
        kind = rng.choices(names, weights)[0]
        out.append((f"real-{plan.seed}-{i:05d}", kind, _spec(kind, i, rng, plan.gpus)))
    return out


def _spec(kind: str, i: int, rng: random.Random, gpus: int) -> JobSpec:
    common = {"queue": "default", "name": f"{kind}-{i}", "stop_grace_s": 2.0, "max_runtime_s": 120}
    sleep = f"{rng.uniform(0.3, 2.0):.2f}"
    if kind == "plain":
        command = ["true"] if rng.random() < 0.2 else ["sleep", sleep]
        role = Role(name="main", gpus_per_replica=rng.choice([1, 1, 2, 4]))
        return JobSpec(tenant="acme", roles=[role], command=command, **common)
    if kind == "gang":
        replicas, each = rng.choice([(2, 1), (3, 2), (4, 1), (2, gpus)])  # (2, gpus): one replica per node
        return JobSpec(
            tenant="acme",
            roles=[Role(name="w", replicas=replicas, gpus_per_replica=each)],
            command=["sleep", sleep],
            **common,
        )
    if kind == "rank_fails":
        role = Role(name="w", replicas=rng.choice([2, 3]), gpus_per_replica=1)
        retries = rng.choice([0, 1])
        return JobSpec(tenant="acme", roles=[role], command=["sh", "-c", FAIL_RANK_1], max_retries=retries, **common)
    if kind == "cancel":
        return JobSpec(tenant="acme", roles=[Role(name="main", gpus_per_replica=1)], command=["sleep", "60"], **common)
    if kind == "preempt_low":  # the agent's simulated workload: it checkpoints on its stop signal and resumes
        role = Role(name="main", gpus_per_replica=max(1, gpus // 2))
        return JobSpec(tenant="batch", roles=[role], priority_class="low", simulated_duration_s=10.0, **common)
    role = Role(name="main", gpus_per_replica=gpus)  # preempt_high
    return JobSpec(tenant="batch", roles=[role], priority_class="high", command=["sleep", sleep], **common)


class RealChaos:
    def __init__(
        self, stack: LocalStack, plan: RealChaosPlan, bus: Bus, store: Store, progress: Callable[[str], None]
    ) -> None:
        self.stack, self.plan, self.bus, self.store, self.progress = stack, plan, bus, store, progress
        self.rng = random.Random(plan.seed + 1)
        self.faults: Counter[str] = Counter()
        self.supervisor = Supervisor(stack, say=progress, backoff=lambda: Backoff(first_s=0.3, max_s=2.0))
        self.live = LiveChecks()
        self.killed: list[tuple[str, float]] = []  # (node, when its agent was SIGKILLed)
        self.lists: Counter[str] = Counter()  # filtered lists against per-job reads, at the end

    async def supervise(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.to_thread(self.supervisor.check)
            try:
                await asyncio.wait_for(stop.wait(), 0.2)
            except TimeoutError:
                pass

    async def kill_agents(self, window_s: float) -> None:
        """SIGKILL ``kills`` agents at random times over the window; the supervisor restarts them."""
        started = time.monotonic()
        times = sorted(self.rng.uniform(0.05, 0.95) * window_s for _ in range(self.plan.kills))
        for at in times:
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            node = self.rng.choice(self.stack.agent_nodes)
            name = agent_process(node)
            if self.stack.procs[name].poll() is None:
                await asyncio.to_thread(self.stack.kill, name)
                self.faults[name] += 1
                self.killed.append((node, time.time()))
                self.progress(f"{time.monotonic() - started:6.1f}s SIGKILL {name}")

    async def cancel_later(self, client: httpx.AsyncClient, job_id: str) -> None:
        await asyncio.sleep(self.rng.uniform(0.5, 4.0))
        for _ in range(50):
            try:
                response = await client.delete(f"/v1/jobs/{job_id}", params={"reason": "chaos"})
                if response.status_code in (202, 409):
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)

    async def offer(self, jobs: list[tuple[str, str, JobSpec]]) -> None:
        headers = self.stack.admin_headers()
        async with httpx.AsyncClient(base_url=self.stack.api_url, headers=headers, timeout=10) as client:
            started = time.monotonic()
            cancels = []
            for i, (job_id, kind, spec) in enumerate(jobs):
                await asyncio.sleep(max(0.0, started + i / self.plan.rate - time.monotonic()))
                await submit_event(self.bus, job_id, spec)
                if kind == "cancel":
                    cancels.append(asyncio.create_task(self.cancel_later(client, job_id)))
            await asyncio.gather(*cancels)

    async def run(self) -> RealChaosReport:
        await (await ConfigStore.open(self.bus)).apply(tenancy(self.plan), actor="bench:chaos", reason="real chaos")
        jobs = workload(self.plan)
        window = self.plan.jobs / self.plan.rate
        stop_supervising, stop_watching = asyncio.Event(), asyncio.Event()
        supervisor = asyncio.create_task(self.supervise(stop_supervising))
        watcher = asyncio.create_task(watch(agents_dir(self.stack), self.live, stop_watching, self.plan.sample_s))
        t0 = time.monotonic()
        try:
            await asyncio.gather(self.offer(jobs), self.kill_agents(window))
            offered = time.monotonic() - t0
            self.progress(f"offered {len(jobs)} jobs with {sum(self.faults.values())} agent kills in {offered:.0f}s")
            drained = await wait_terminal(self.store, len(jobs), self.plan.drain_timeout_s)
        finally:
            stop_supervising.set()
            await supervisor
            stop_watching.set()
            await watcher
        return await self.count(jobs, offered, drained)

    async def count(self, jobs: list[tuple[str, str, JobSpec]], offered: float, drained: float) -> RealChaosReport:
        events = await read_job_events(self.bus)
        fold = check_job_log(events)
        ids = {job_id for job_id, _, _ in jobs}
        accepted = {e.job_id for e in events if isinstance(e, JobAccepted) and e.job_id in ids}
        decided = accepted | {e.job_id for e in events if isinstance(e, JobRejected) and e.job_id in ids}
        status = {j: fold.jobs[j].status for j in accepted if j in fold.jobs}
        ledger = await self.ledger_check()
        await check_run(self, sorted(ids))
        return RealChaosReport(
            plan=self.plan,
            kinds=dict(Counter(kind for _, kind, _ in jobs)),
            faults=dict(sorted(self.faults.items())),
            restarts=dict(self.supervisor.restarts),
            statuses=dict(Counter(status.values())),
            lost=len(ids - decided) + sum(1 for j in accepted if status.get(j) not in TERMINAL),
            stuck_placed=sum(1 for j in accepted if status.get(j) == "placed"),
            accepted=len(accepted),
            runs_started=len({e.run_id for e in events if isinstance(e, RunStarted) and e.job_id in ids}),
            preemption_notices=sum(1 for e in events if isinstance(e, PreemptionNotice) and e.job_id in ids),
            failed_runs=dict(Counter(e.reason for e in events if isinstance(e, RunFailed) and e.job_id in ids)),
            twice_at_once=self.live.twice_at_once,
            gpu_shared=self.live.gpu_shared,
            log_double_allocations=sum(1 for v in fold.violations if "while held by" in v),
            live=self.live,
            ledger=ledger,
            ledger_over_near_kill=len(near_kills(agents_dir(self.stack), set(ledger.over), self.killed)),
            violations=fold.violations[:20],
            offered_s=offered,
            drained_s=drained,
            lists=dict(self.lists),
        )

    async def ledger_check(self, timeout_s: float = 60.0) -> LedgerCheck:
        """Once accounting has caught up (its runs stop changing), the ledger against the measured intervals."""
        deadline = time.monotonic() + timeout_s
        last, booted = None, boot_epoch()
        while True:
            url, where = self.stack.ledger_url, agents_dir(self.stack)
            check = await asyncio.to_thread(check_ledger, url, where, 1.0, booted)
            if check == last or time.monotonic() > deadline:
                return check
            last = check
            await asyncio.sleep(2.0)
