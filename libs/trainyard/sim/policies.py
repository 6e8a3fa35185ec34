"""Scheduling policies the simulator compares, all driven through the same ``admit`` and ``place``.

- ``trainyard``: the default: quota tree with borrowing and fair share
  across queues; inside a queue, least attained service (GPU-hours of a job's
  earlier runs, in levels) with aging; EASY backfill on the users' run-time
  limits in admission and placement; preemption for priority and to reclaim
  lent quota, victims checkpointing during their notice.
- ``fifo``: submission order within each tenant's queue, strictly (the first
  job that does not fit holds up the rest), no preemption.
- ``sjf``: shortest job first with the true run times known in advance (an
  oracle no real scheduler has), strictly in order, no preemption;
  ``sjf-backfill``: the same oracle order with EASY backfill.
- ``slurm``: Slurm-like multifactor priority (age, fair share, job size),
  scored when a job is queued and recomputed once per ``priority_calc_s`` (Slurm's
  PriorityCalcPeriod, 5 minutes by default), with EASY backfill and no preemption.
- ``tiresias``: Tiresias-like discretised least attained service,
  work-conserving (whatever fits starts), no reservations, no aging.

Every policy keeps the same quota tree, so tenants keep their nominal quotas;
only the order and the extras differ.  A policy orders a queue by
``(-priority, order)``, exactly the key the admission core sorts by.
"""

from __future__ import annotations

import math

import msgspec

from trainyard.core.admission.tree import Scheduling
from trainyard.core.placement import PlacementPolicy


class Policy(msgspec.Struct, frozen=True):
    name: str
    preemption: bool = False  # admission may preempt (reclaim, priority)
    fair_share_preemption: bool = True  # with preemption: also for fair share
    min_runtime_s: float = 1800.0  # fair-share victims have run at least this long
    service_preemption: bool = (
        False  # with preemption: least attained service preempts (PreemptionSettings.attained_service)
    )
    service_min_runtime_s: float = 4 * 3600.0  # such victims' current runs have lasted at least this long
    placement: PlacementPolicy = PlacementPolicy(backfill=False, max_reservations=0)
    order_by: str = "submit"  # "submit", "duration" (oracle) or "multifactor"
    age_weight: float = 1000.0  # multifactor: full weight after age_cap_s waiting
    age_cap_s: float = 7 * 86400.0
    fairshare_weight: float = 1000.0  # multifactor: 2^(-usage / entitlement) of the tenant
    size_weight: float = 100.0  # multifactor: larger gangs a little ahead (Slurm's default favours them)
    priority_calc_s: float = 300.0  # multifactor: priorities recomputed this often (Slurm's PriorityCalcPeriod)
    scheduling: Scheduling = Scheduling(backfill=False, order="fifo")  # admission order and backfill


BACKFILL = PlacementPolicy(backfill=True, max_reservations=1)

POLICIES: dict[str, Policy] = {
    # the default: least attained service with aging, backfill on run-time limits in admission and placement
    # with a reservation for a job once it has waited 6 hours, preemption for priority and to reclaim lent quota
    # by that job only (victims checkpoint during their notice)
    "trainyard": Policy(
        "trainyard",
        preemption=True,
        fair_share_preemption=False,
        service_preemption=True,
        scheduling=Scheduling(),
        placement=BACKFILL,
    ),
    "fifo": Policy("fifo"),
    # oracles: shortest true run time first, strictly in order / with EASY backfill
    "sjf": Policy("sjf", order_by="duration"),
    "sjf-backfill": Policy(
        "sjf-backfill",
        order_by="duration",
        scheduling=Scheduling(order="fifo", reserve_after_s=0.0),
        placement=BACKFILL,
    ),
    # Slurm-like: multifactor priority, EASY backfill reserving for the top blocked job at once
    "slurm": Policy(
        "slurm", order_by="multifactor", scheduling=Scheduling(order="fifo", reserve_after_s=0.0), placement=BACKFILL
    ),
    # Tiresias-like: discretised least attained service, work-conserving (whatever fits starts), no reservations
    "tiresias": Policy("tiresias", scheduling=Scheduling(reserve=False, starvation_s=float("inf"))),
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
