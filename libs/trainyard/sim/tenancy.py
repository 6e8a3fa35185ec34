"""The quota tree a simulated workload runs under, and the priority classes its jobs name."""

from __future__ import annotations

from trainyard.core.admission import Cohort, FlavorQuota, PreemptionSettings, PriorityClass, QueueQuota, Tenancy
from trainyard.sim.workloads import GPU_TYPE, QUEUE, split

PRIORITY_CLASSES = [
    PriorityClass("production", 1000, preemptible=False),
    PriorityClass("standard", 500),
    PriorityClass("best-effort", 0, may_only_borrow=True),  # runs only on quota others lend
]


def tenancy_for(
    quotas: dict[str, int],
    borrowing: bool = True,
    preemption: bool = True,
    half_life_s: float = 7 * 86400.0,
    fair_share_preemption: bool = True,
    min_runtime_s: float = 1800.0,
    capacity: dict[str, int] | None = None,
    queues: dict[str, list[str]] | None = None,
    service_preemption: bool = False,
    service_min_runtime_s: float = 4 * 3600.0,
) -> Tenancy:
    """The quota tree: organisation ``org`` -> tenants -> queues, ``quotas[tenant]`` nominal GPUs each.

    ``capacity`` (GPUs per type on the cluster; default: one type, ``GPU_TYPE``)
    splits each tenant's nominal quota across the types in proportion to the
    capacity of each.  ``queues`` (tenant -> queue names; default: one queue,
    ``default``) gives a tenant several queues: the tenant becomes a team
    cohort holding its quota, split evenly across its queues, which may borrow
    from each other inside the team.  Without ``borrowing`` every tenant is held
    to its nominal quota (Philly's virtual clusters were dedicated partitions).
    """
    types = dict(capacity) if capacity else {GPU_TYPE: 0}
    limit = None if borrowing else 0
    per_type = {
        t: split(n, {f: float(c) for f, c in types.items()}) if capacity else {GPU_TYPE: n} for t, n in quotas.items()
    }
    leaves: list[QueueQuota] = []
    teams: list[Cohort] = []
    for t, n in sorted(quotas.items()):
        names = sorted(set((queues or {}).get(t) or [QUEUE]))
        weight = max(float(n), 1.0)
        if len(names) == 1:
            leaves.append(
                QueueQuota(
                    tenant=t,
                    name=names[0],
                    cohort="org",
                    weight=weight,
                    quota={f: FlavorQuota(nominal=g, borrowing_limit=limit) for f, g in per_type[t].items()},
                )
            )
            continue
        team = f"team:{t}"
        teams.append(
            Cohort(
                name=team,
                parent="org",
                weight=weight,
                quota={f: FlavorQuota(nominal=g, borrowing_limit=limit) for f, g in per_type[t].items()},
            )
        )
        shares = {f: split(g, dict.fromkeys(names, 1.0)) for f, g in per_type[t].items()}
        for q in names:
            leaves.append(
                QueueQuota(
                    tenant=t,
                    name=q,
                    cohort=team,
                    weight=1.0,
                    quota={f: FlavorQuota(nominal=shares[f][q]) for f in per_type[t]},
                )
            )
    totals = {f: sum(per_type[t][f] for t in quotas) for f in types}
    settings = PreemptionSettings(
        within_queue=preemption,
        reclaim=preemption,
        fair_share=preemption and fair_share_preemption,
        min_runtime_s=min_runtime_s,
        attained_service=preemption and service_preemption,
        attained_service_min_runtime_s=service_min_runtime_s,
    )
    return Tenancy(
        queues=leaves,
        cohorts=[Cohort(name="org", quota={f: FlavorQuota(nominal=g) for f, g in totals.items()}), *teams],
        flavors=list(types),
        half_life_s=half_life_s,
        preemption=settings,
        priority_classes=list(PRIORITY_CLASSES),
    )
