"""Checks against the tenancy: of a submitted spec at intake, and of what runs (invariants).

``JobSpec.tenant`` names a team and ``JobSpec.queue`` one of that team's
queues.  A spec that fails here is rejected with every problem listed; one that
passes can still wait, but never for a reason that no change in the cluster
could remove.
"""

from __future__ import annotations

from trainyard.core.admission.quota import quota_violations
from trainyard.core.admission.snapshot import RunningJob
from trainyard.core.admission.tree import Tenancy, TreeIndex
from trainyard.domain.job import JobSpec, ValidationError


def _listing(names: list[str], limit: int = 10) -> str:
    shown = ", ".join(sorted(names)[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "") if names else "none"


def validate_against_tenancy(spec: JobSpec, tenancy: Tenancy) -> list[ValidationError]:
    """Every reason ``spec`` could never run under ``tenancy``; empty when it could."""
    errors: list[ValidationError] = []
    index = TreeIndex(tenancy)
    tenants: dict[str, list[str]] = {}
    for q in tenancy.queues:
        tenants.setdefault(q.tenant, []).append(q.name)
    # 1. Tenant and queue.
    node = None
    if spec.tenant not in tenants:
        errors.append(
            ValidationError("tenant", f"unknown tenant {spec.tenant!r}; tenants are teams: {_listing(list(tenants))}")
        )
    elif spec.queue not in tenants[spec.tenant]:
        errors.append(
            ValidationError(
                "queue",
                f"team {spec.tenant!r} has no queue {spec.queue!r}; its queues: {_listing(tenants[spec.tenant])}",
            )
        )
    else:
        node = index.queue_of[f"{spec.tenant}/{spec.queue}"]
    # 2. Priority class: known, and granted to the queue.
    classes = [p.name for p in tenancy.priority_classes]
    if classes and spec.priority_class not in classes:
        errors.append(
            ValidationError(
                "priority_class", f"unknown priority class {spec.priority_class!r}; classes: {_listing(classes)}"
            )
        )
    elif classes and node is not None:
        allowed = tenancy.queues[node - index.queue_nodes[0]].priority_classes
        if allowed is not None and spec.priority_class not in allowed:
            errors.append(
                ValidationError(
                    "priority_class",
                    f"queue {spec.tenant}/{spec.queue} may not use priority class {spec.priority_class!r}; "
                    f"it may use: {_listing(list(allowed))}",
                )
            )
    # 3. GPU types offered, and gangs no quota could ever hold.
    offered = list(tenancy.flavors) or list(index.flavors)
    demand: dict[str, int] = {}
    first_role: dict[str, int] = {}
    for i, role in enumerate(spec.roles):
        if role.gpu_type not in offered:
            errors.append(
                ValidationError(
                    f"roles[{i}].gpu_type", f"GPU type {role.gpu_type!r} is not offered; offered: {_listing(offered)}"
                )
            )
            continue
        demand[role.gpu_type] = demand.get(role.gpu_type, 0) + role.gpus
        first_role.setdefault(role.gpu_type, i)
    cls = next((c for c in tenancy.priority_classes if c.name == spec.priority_class), None)
    ceilings = index.ceiling_borrow_only if cls is not None and cls.may_only_borrow else index.ceiling
    if node is not None:
        for gpu_type, gpus in demand.items():
            f = index.fidx.get(gpu_type)
            ceiling = ceilings[node][f] if f is not None else 0
            where = f"roles[{first_role[gpu_type]}].gpu_type"
            if f is None or ceiling <= 0:
                errors.append(
                    ValidationError(
                        where,
                        f"queue {spec.tenant}/{spec.queue} has no {gpu_type} quota and cannot borrow any; "
                        "choose another GPU type or queue",
                    )
                )
            elif gpus > ceiling:
                nominal = index.nominal[node][f]
                errors.append(
                    ValidationError(
                        "roles",
                        f"the gang needs {gpus} {gpu_type} GPUs but queue {spec.tenant}/{spec.queue} can get at "
                        f"most {ceiling} (nominal {nominal} plus what it may borrow); make the gang smaller",
                    )
                )
    return errors


def check_quota(tenancy: Tenancy, running: list[RunningJob]) -> list[str]:
    """Invariant: the jobs holding GPUs break no quota, borrowing or lending limit and run inside the tree."""
    index = TreeIndex(tenancy)
    holders = []
    problems = []
    for r in running:
        q = index.queue_of.get(f"{r.tenant}/{r.queue}")
        wanted = [(index.fidx.get(t), n) for t, n in r.gpus_by_type.items() if n > 0]
        demand = [(i, n) for i, n in wanted if i is not None]
        if q is None or len(demand) < len(wanted):
            problems.append(f"{r.job_id} holds GPUs outside the quota tree ({r.tenant}/{r.queue}, {r.gpus_by_type})")
            continue
        holders.append((q, demand, r.may_only_borrow))
    return problems + quota_violations(index, holders)
