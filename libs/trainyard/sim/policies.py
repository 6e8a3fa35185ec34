"""Scheduling policies the simulator compares, all driven through the same ``admit`` and ``place``.

- ``trainyard``: the default: quota tree with borrowing, fair share and
  preemption (priority, reclaim, and fair share of jobs that ran 4 hours) in
  admission; topology-aware placement with a reservation for the first
  blocked gang and backfill behind it.  ``trainyard-30m`` lets fair share
  preempt after 30 minutes.
- ``fifo``: submission order within each tenant's queue, no preemption, no
  backfill reservations.
- ``sjf``: shortest job first with the true run times known in advance (an
  oracle no real scheduler has), no preemption, no reservations.
- ``slurm``: Slurm-like multifactor priority (age, fair share, job size),
  recomputed every cycle, with EASY backfill and no preemption.

Every policy keeps the same quota tree, so tenants keep their nominal quotas;
only the order and the extras differ.  A policy orders a queue by
``(-priority, order)``, exactly the key the admission core sorts by.
"""

from __future__ import annotations

import math

import msgspec

from trainyard.core.admission.tree import Scheduling
from trainyard.core.placement import PlacementPolicy

REQUEUE_BASE = -(10**15)  # orders of requeued jobs: ahead of every first attempt, in requeue order


class Policy(msgspec.Struct, frozen=True):
    name: str
    preemption: bool = False  # admission may preempt (reclaim, priority)
    fair_share_preemption: bool = True  # with preemption: also for fair share
    min_runtime_s: float = 1800.0  # fair-share victims have run at least this long
    placement: PlacementPolicy = PlacementPolicy(backfill=False, max_reservations=0)
    order_by: str = "submit"  # "submit", "duration" (oracle) or "multifactor"
    age_weight: float = 1000.0  # multifactor: full weight after age_cap_s waiting
    age_cap_s: float = 7 * 86400.0
    fairshare_weight: float = 1000.0  # multifactor: 2^(-usage / entitlement) of the tenant
    size_weight: float = 100.0  # multifactor: larger gangs a little ahead (Slurm's default favours them)
    scheduling: Scheduling = Scheduling(backfill=False, order="fifo")  # admission order and backfill


POLICIES: dict[str, Policy] = {
    "trainyard": Policy("trainyard", preemption=True, min_runtime_s=4 * 3600.0,
                        placement=PlacementPolicy(backfill=True, max_reservations=1)),
    # the same with fair-share victims after only 30 minutes: shows how preemption can thrash
    "trainyard-30m": Policy("trainyard-30m", preemption=True, min_runtime_s=1800.0,
                            placement=PlacementPolicy(backfill=True, max_reservations=1)),
    "fifo": Policy("fifo"),
    "sjf": Policy("sjf", order_by="duration"),
    "slurm": Policy("slurm", order_by="multifactor", placement=PlacementPolicy(backfill=True, max_reservations=1)),
}


def policy_named(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; policies: {', '.join(POLICIES)}") from None


def first_order(policy: Policy, index: int, duration: float) -> int:
    """Order of a job's first attempt inside its queue (lower goes first)."""
    if policy.order_by == "duration":
        return int(duration * 1000) * 10_000_000 + index  # ties: submission order
    return index


def multifactor(policy: Policy, waited_s: float, tenant_share: float, gpus: int, cluster_gpus: int) -> int:
    """Slurm-like priority: age, fair share (``tenant_share`` is usage over entitlement) and size."""
    age = min(max(waited_s, 0.0) / policy.age_cap_s, 1.0)
    fair = math.pow(2.0, -max(tenant_share, 0.0))
    size = min(gpus / max(cluster_gpus, 1), 1.0)
    return int(policy.age_weight * age + policy.fairshare_weight * fair + policy.size_weight * size)
