"""Which running jobs to stop so that a waiting job can start.

Four ways to make room, tried in this order for each waiting job that
blocked its queue (in the order the cycle met them; with least attained
service on, every job short of GPUs may try the second way):

1. **priority** — preemptible jobs of lower priority in the same queue;
2. **service** (least attained service, when on) — preemptible runs that have
   received more service levels (GPU-hours, earlier runs and this one) than
   the waiting job: of its own queue at the same or lower priority, or, for a
   gang inside its queue's nominal quota, of queues that borrow; each victim's
   current run has lasted at least ``attained_service_min_runtime_s`` (so a
   long job is not stopped again as soon as it restarts), the most served
   first;
3. **reclaim** — when the waiting gang fits its queue's own nominal quota:
   best-effort jobs anywhere, then preemptible jobs of other queues that hold
   more than their nominal quota (they borrowed);
4. **fair share** — preemptible jobs that ran at least the minimum runtime, in
   queues that borrow and whose share stays above the waiting queue's share
   after it starts; the most over-served queues first, and no more than the
   rate limit allows.  Nominal quota is a guarantee: a job inside its queue's
   nominal quota is only ever preempted within its own queue (for priority or
   service).

Among the candidates of one way, the cheapest go first: a victim costs the
GPU time lost since its last checkpoint plus its restart cost
(``restart_cost_s`` per GPU); once the gang fits, victims that turn out not
to be needed are handed back, the costliest first.  Jobs already told to stop
are counted as gone, so a job waiting for them does not preempt again.

**Where the GPUs are.**  Given the cluster (a placement ``ClusterSnapshot``)
and the waiting job's spec, a way's candidates go to placement's
``select_victims``, which picks whole jobs (a gang is stopped as a unit) that
free one domain -- node, NVLink domain, rack, block -- the gang can then be
placed in, the cheapest domain first.  The job preempts only if such a set
exists and the gang then fits the quota tree (more candidates of the same way
may be stopped for quota alone).  Room already coming from jobs told to stop
counts only if the gang can be placed on it.  Each commitment is written into
one topology for the whole pass, so two waiting jobs never count on the same
GPUs.  A waiting job whose spec is not given does not preempt.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from trainyard.core.admission.candidates import (
    Blocked,
    Candidate,
    Holder,
    HolderGroups,
    choose,
    fits,
    over_nominal,
    reclaimable,
    release,
    take,
)
from trainyard.core.admission.fairshare import FairShare
from trainyard.core.admission.ordering import WITHIN_NOMINAL, service_level
from trainyard.core.admission.quota import Demand, QuotaState
from trainyard.core.admission.snapshot import AdmissionSnapshot, Preemption
from trainyard.core.admission.tree import PreemptionSettings
from trainyard.core.admission.victims import VictimSearch
from trainyard.core.placement.snapshot import ClusterSnapshot
from trainyard.core.placement.topology import Topology
from trainyard.core.reasons import PreemptionReason
from trainyard.domain.job import JobSpec
from trainyard.events.jobs import ReplicaPlacement

# the cluster and the pending jobs' specs, built only when asked for (see ``preempt_or_screen``)
LazyCluster = Callable[[], tuple[ClusterSnapshot, Mapping[str, JobSpec]]]


def preempt(
    settings: PreemptionSettings,
    state: QuotaState,
    shares: FairShare,
    free: list[int],
    groups: HolderGroups,
    blocked: list[Blocked],
    recent: list[float],
    now: float,
    cluster: ClusterSnapshot | None = None,
    specs: Mapping[str, JobSpec] | None = None,
    levels: Sequence[float] | None = None,
    topology: Topology | None = None,
    first_only: bool = False,
) -> tuple[list[Preemption], list[int]]:
    """Victims for the blocked jobs, and the waiting-list entries now waiting on them.

    With ``cluster``, victims must free one domain the waiting gang (its spec
    from ``specs``) can be placed in; without it, GPU counts decide.
    ``levels`` (attained GPU-seconds at which a job moves down a service
    level) turns on preemption by least attained service.  ``topology``: the
    tree of ``cluster``'s schedulable nodes, kept by the caller, which the
    pass then changes instead of building its own (``admit`` restores it).
    ``first_only``: stop at the first job that preempts (whether any would).
    """
    where = VictimSearch(cluster, specs or {}, now, settings.restart_cost_s, topology) if cluster is not None else None
    # 1. Jobs already told to stop are as good as gone; the others are candidates, by queue, made when needed.
    grouped, lowest, lenders = groups.grouped, groups.lowest, groups.lenders
    for h in groups.noticed:
        release(state, shares, free, h, -1)
        if where is not None:
            where.stop(h.job.job_id)
    built: dict[int, list[Candidate]] = {}
    restart_cost_s = settings.restart_cost_s

    type_sets: dict[int, set[int]] = {}  # id of a demand -> its types (demands are shared: DemandCache)

    def types_of(demand: Demand) -> set[int]:
        found = type_sets.get(id(demand))
        if found is None:
            found = type_sets[id(demand)] = {t for t, _ in demand}
        return found

    made: dict[int, Candidate] = {}  # id of a holder -> its candidate (one per holder: ``taken`` is shared)

    def candidate(h: Holder) -> Candidate:
        c = made.get(id(h))
        if c is None:
            c = made[id(h)] = Candidate(h, now, restart_cost_s, levels, types_of(h.demand))
        return c

    def pool_of(q: int) -> list[Candidate]:
        """Queue ``q``'s candidates, cheapest first."""
        cs = built.get(q)
        if cs is None:
            cs = [candidate(h) for h in grouped.get(q, ())]
            cs.sort(key=_cheapest)
            built[q] = cs
        return cs

    least = settings.attained_service_min_runtime_s
    served: dict[tuple[int, int | None, bool], list[Candidate]] = {}

    def served_of(q: int, level: int, top: int | None = None, best_effort: bool = False) -> list[Candidate]:
        """Queue ``q``'s candidates above service ``level`` whose run lasted the minimum run time, of priority
        at most ``top`` (if given), best-effort ones only if ``best_effort``; in no particular order.  Those
        that ran long enough are found once per pass (the holders are filtered before their candidates are
        made: most are not wanted)."""
        key = (q, top, best_effort)
        cs = served.get(key)
        if cs is None:
            cs = served[key] = [
                candidate(h)
                for h in grouped.get(q, ())
                if now - h.job.started_at >= least
                and (top is None or h.job.priority <= top)
                and (not best_effort or h.job.may_only_borrow)
            ]
        return [c for c in cs if c.level > level]

    # least attained service: the candidates of (queue, level, priority, inside nominal), the most served first
    service_pools: dict[tuple[int, int, int, bool], list[Candidate]] = {}
    budget = settings.fair_share_limit - sum(1 for t in recent if now - t < settings.fair_share_window_s)
    preemptions: list[Preemption] = []
    preemptors: list[int] = []
    # 2. Each blocked job in turn: room already coming, or victims by the first way that works.
    for b in blocked:
        borrow_only = b.job.may_only_borrow
        spec = where.specs.get(b.job.job_id) if where is not None else None
        if fits(state, free, b, borrow_only) and (spec is None or (where is not None and where.place(spec))):
            take(state, shares, free, b, borrow_only)
            preemptors.append(b.at)
            continue
        if where is not None and spec is None:
            continue  # its shape is unknown: no victims could be shown to make room for it
        victims: list[Candidate] | None = None
        plan: list[ReplicaPlacement] | None = None  # where the gang goes once its victims stop
        reason = PreemptionReason.PRIORITY
        if settings.within_queue and lowest.get(b.queue, b.job.priority) < b.job.priority:
            pool = [c for c in pool_of(b.queue) if c.holder.job.priority < b.job.priority]
            victims, plan = _pick(where, state, shares, free, b, spec, pool, lambda c: True)
        if victims is None and levels is not None:
            reason = PreemptionReason.SERVICE
            level = service_level(levels, b.job.attained_gpu_s)
            key = (b.queue, level, b.job.priority, b.cls == WITHIN_NOMINAL)
            cached = service_pools.get(key)  # (victims already taken are skipped by _pick)
            if cached is not None:
                pool = cached
            else:
                pool = served_of(b.queue, level, top=b.job.priority)
                if b.cls == WITHIN_NOMINAL:
                    for q in grouped:
                        if q != b.queue and (q in lenders or over_nominal(state, q)):
                            pool += served_of(q, level, best_effort=not over_nominal(state, q))
                pool.sort(key=lambda c: (-c.level, c.lost_per_gpu, c.holder.job.job_id))
                service_pools[key] = pool
            if any(not c.taken for c in pool):
                victims, plan = _pick(
                    where,
                    state,
                    shares,
                    free,
                    b,
                    spec,
                    pool,
                    lambda c: c.holder.queue == b.queue or reclaimable(state, c, b.demand),  # noqa: B023 - called within _pick
                )
        if victims is None and settings.reclaim and b.cls == WITHIN_NOMINAL and b.may_reclaim:
            reason = PreemptionReason.RECLAIM
            pool = [c for q in grouped if q != b.queue and over_nominal(state, q) for c in pool_of(q)]
            pool += [
                c
                for q in lenders
                if q != b.queue and not over_nominal(state, q)
                for c in pool_of(q)
                if c.holder.job.may_only_borrow
            ]
            pool.sort(
                key=lambda c: (
                    not c.holder.job.may_only_borrow,
                    c.lost_per_gpu,
                    c.holder.job.priority,
                    c.holder.job.job_id,
                )
            )
            victims, plan = _pick(where, state, shares, free, b, spec, pool, lambda c: reclaimable(state, c, b.demand))  # noqa: B023 - called within _pick
        if victims is None and settings.fair_share and budget > 0 and not borrow_only and b.may_reclaim:
            reason = PreemptionReason.FAIR_SHARE
            mine = shares.share_with(b.queue, b.demand)
            over = sorted(
                (q for q in grouped if q != b.queue and shares.share[q] > mine), key=lambda q: (-shares.share[q], q)
            )
            pool = [c for q in over for c in pool_of(q) if c.ran >= settings.min_runtime_s]
            victims, plan = _pick(
                where,
                state,
                shares,
                free,
                b,
                spec,
                pool,
                lambda c: shares.share[c.holder.queue] > mine and reclaimable(state, c, b.demand),  # noqa: B023 - called within _pick
            )
            if victims is not None and len(victims) > budget:
                for c in victims:
                    release(state, shares, free, c.holder, +1)
                victims = None
            elif victims is not None:
                budget -= len(victims)
        if victims is None:
            continue
        # 3. Commit: the victims go, the gang's room is held for it.
        take(state, shares, free, b, borrow_only)
        if where is not None:
            where.commit(victims, plan)
        preemptors.append(b.at)
        for c in victims:
            c.taken = True
            preemptions.append(Preemption(c.holder.job.job_id, b.job.job_id, reason, settings.grace_period_s, c.lost))
        if first_only:
            break
    return preemptions, preemptors


def preempt_or_screen(
    snapshot: AdmissionSnapshot,
    now: float,
    blocked: list[Blocked],
    groups: HolderGroups,
    books: tuple[PreemptionSettings, QuotaState, FairShare, list[int]],
    levels: Sequence[float] | None,
    topology: Topology | None,
    lazy_cluster: LazyCluster | None,
) -> tuple[list[Preemption], list[int]]:
    """:func:`preempt` on ``snapshot``'s cluster, whose tree ``topology`` is (changed, then restored).

    Without a cluster in the snapshot but with ``lazy_cluster``, victims are first chosen by GPU counts, on
    copies of the state; only if that would stop a run is the cluster asked for and the pass run on it.
    ``books``: the preemption settings and the cycle's quota state, shares and free GPUs, changed by the pass."""
    settings, state, shares, free = books
    recent = snapshot.recent_preemptions
    cluster: ClusterSnapshot | None = snapshot.cluster
    specs: Mapping[str, JobSpec] = snapshot.specs
    if cluster is None and lazy_cluster is not None:
        trial_state = state.copy()
        trial_shares = shares.copy(trial_state.usage)
        trial = preempt(
            settings,
            trial_state,
            trial_shares,
            list(free),
            groups,
            blocked,
            recent,
            now,
            levels=levels,
            first_only=True,
        )
        if not trial[0]:
            return trial  # it ran to the end: the decision by counts
        cluster, specs = lazy_cluster()
    tree = topology if cluster is not None else None
    if tree is not None:
        tree.record()  # the pass writes its commitments into the caller's tree: undone below
    try:
        return preempt(settings, state, shares, free, groups, blocked, recent, now, cluster, specs, levels, tree)
    finally:
        if tree is not None:
            tree.restore()


def _cheapest(c: Candidate) -> tuple[float, int, str]:
    """A queue's candidates in order: least work lost, then lowest priority, then job id."""
    job = c.holder.job
    return (c.lost_per_gpu, job.priority, job.job_id)


def _pick(
    where: VictimSearch | None,
    state: QuotaState,
    shares: FairShare,
    free: list[int],
    b: Blocked,
    spec: JobSpec | None,
    pool: list[Candidate],
    still_valid: Callable[[Candidate], bool],
) -> tuple[list[Candidate] | None, list[ReplicaPlacement] | None]:
    """Victims from ``pool``: by GPU counts, or freeing one domain when the cluster is known."""
    if where is None or spec is None:
        return choose(state, shares, free, b, pool, still_valid), None
    return where.choose(state, shares, free, b, spec, pool, still_valid)
