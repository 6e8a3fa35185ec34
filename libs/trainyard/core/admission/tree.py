"""The quota tree admission works over, and its per-cycle index.

A :class:`Tenancy` is a tree of cohorts (organisations, teams) with queues as
leaves.  Every node holds, per GPU type, a *nominal* quota, a *borrowing limit*
(how far beyond nominal its subtree may go by borrowing from siblings) and a
*lending limit* (how much of its unused nominal quota its siblings may borrow;
the rest is kept back for it).  A node cannot use a GPU type its quota does
not list; list it with nominal 0 to let the node borrow it.  A child's nominal
quota is carved out of its parent's; the parent's remainder is a pool its
children share.  The implicit root holds the sum of the top-level nominal
quotas.

:class:`TreeIndex` flattens the tree into integer-indexed lists once per cycle
so that every quota check walks a short, precomputed path.
"""

from __future__ import annotations

import msgspec

UNLIMITED = 1 << 60  # stands in for "no borrowing limit"


class FlavorQuota(msgspec.Struct, frozen=True):
    nominal: int = 0
    borrowing_limit: int | None = None  # GPUs beyond nominal the subtree may borrow; None: no limit
    lending_limit: int | None = None  # unused nominal GPUs siblings may borrow; None: all of them


class Cohort(msgspec.Struct, frozen=True):
    """An inner node: an organisation or a team."""

    name: str  # unique among cohorts
    parent: str | None = None  # None: a child of the root
    quota: dict[str, FlavorQuota] = {}
    weight: float = 1.0  # fair-share weight among its siblings


class QueueQuota(msgspec.Struct, frozen=True):
    """A leaf: one queue of one tenant."""

    tenant: str
    name: str
    cohort: str | None = None
    quota: dict[str, FlavorQuota] = {}
    weight: float = 1.0
    priority_classes: tuple[str, ...] | None = None  # classes its jobs may use; None: every class


class PriorityClass(msgspec.Struct, frozen=True):
    name: str
    priority: int = 0
    preemptible: bool = True
    may_only_borrow: bool = False  # best effort: runs only on lent capacity


class PreemptionSettings(msgspec.Struct, frozen=True):
    within_queue: bool = True  # higher priority may preempt lower priority in the same queue
    reclaim: bool = True  # a queue within its nominal quota may take back what others borrowed
    fair_share: bool = True  # a tenant below its fair share may preempt one above it
    min_runtime_s: float = 0.0  # fair-share victims must have run at least this long
    grace_period_s: float = 0.0  # notice given to a victim before it is stopped
    fair_share_limit: int = 10  # fair-share preemptions allowed per window
    fair_share_window_s: float = 600.0
    restart_cost_s: float = 300.0  # per GPU: what a stopped run spends getting back (added to its lost work)
    # least attained service (with ``Scheduling.order == "las"``): a waiting job may stop a run of its own queue
    # (or, inside its nominal quota, a borrower's) that has received more service levels, once that run has run
    # ``attained_service_min_runtime_s``; no waiting for a reservation
    attained_service: bool = False
    attained_service_min_runtime_s: float = 4 * 3600.0


class Scheduling(msgspec.Struct, frozen=True):
    """How admission orders and fills: the policy the services and the simulator share.

    - ``backfill``: EASY backfill on the users' run-time limits (backfill.py):
      a job that cannot start holds a reservation, later jobs start around it;
      off: the first job that does not fit blocks its queue and every queue
      behind it in fair-share order (strict order).  ``reserve`` off makes
      backfill greedy: whatever fits starts, nobody holds a reservation (large
      gangs can starve; a baseline, not a production setting).
    - ``order``: inside a queue, after priority: ``"las"`` least attained
      service first (the GPU-seconds a job's earlier runs received, in levels
      of ``service_levels_gpu_h``; new jobs are in the first level), then
      submission; ``"fifo"``: submission order only.
    - ``starvation_s``: a job waiting longer than this goes ahead of the
      service levels (aging), so nothing waits for ever behind new work.
    """

    backfill: bool = True
    reserve: bool = True  # with backfill: the first blocked job of a type holds a reservation (EASY); off: greedy
    reserve_after_s: float = 6 * 3600.0  # only a job that has waited this long may hold a reservation (0: any)
    order: str = "las"  # "las" or "fifo"
    service_levels_gpu_h: tuple[float, ...] = (1.0, 64.0, 1024.0)  # attained GPU-hours at which a job moves down
    starvation_s: float = 3 * 24 * 3600.0


class Tenancy(msgspec.Struct, frozen=True):
    queues: list[QueueQuota]
    cohorts: list[Cohort] = []
    flavors: list[str] = []  # GPU types offered; empty: every type named in a quota
    priority_classes: list[PriorityClass] = []
    half_life_s: float = 7 * 24 * 3600.0  # of the decayed usage behind fair share
    preemption: PreemptionSettings = PreemptionSettings()
    scheduling: Scheduling = Scheduling()


class TreeIndex:
    """The tree as flat lists indexed by node number (0 is the root)."""

    __slots__ = (
        "flavors",
        "fidx",
        "names",
        "parent",
        "paths",
        "nominal",
        "limit",
        "guard",
        "min_claim",
        "ceiling",
        "ceiling_borrow_only",
        "entitlement",
        "queue_of",
        "queue_nodes",
        "queue_by_pair",
    )

    def __init__(self, tenancy: Tenancy, extra_flavors: list[str] | tuple[str, ...] = ()) -> None:
        flavors: list[str] = []
        seen: set[str] = set()
        named = [*tenancy.flavors, *extra_flavors]
        members: list[Cohort | QueueQuota] = [*tenancy.cohorts, *tenancy.queues]  # node n is members[n - 1]
        for member in members:
            named.extend(member.quota)
        for f in named:
            if f not in seen:
                seen.add(f)
                flavors.append(f)
        self.flavors = flavors  # GPU type names; position is the type's number
        self.fidx = {f: i for i, f in enumerate(flavors)}
        nf = len(flavors)
        cohort_no = {c.name: i + 1 for i, c in enumerate(tenancy.cohorts)}
        count = 1 + len(tenancy.cohorts) + len(tenancy.queues)
        self.names = ["<root>"] + [c.name for c in tenancy.cohorts]
        self.names += [f"{q.tenant}/{q.name}" for q in tenancy.queues]
        self.parent = [-1] + [cohort_no.get(c.parent, 0) if c.parent else 0 for c in tenancy.cohorts]
        self.parent += [cohort_no.get(q.cohort, 0) if q.cohort else 0 for q in tenancy.queues]
        self.nominal = [[0] * nf for _ in range(count)]  # nominal quota per node and type
        self.limit = [[0] * nf for _ in range(count)]  # nominal + borrowing limit; 0 for types not listed
        self.guard = [[0] * nf for _ in range(count)]  # nominal quota kept back from siblings
        weight = [1.0] * count
        for n in range(1, count):
            node = members[n - 1]
            weight[n] = node.weight if node.weight > 0 else 1e-9
            for f, q in node.quota.items():
                i = self.fidx[f]
                nominal = max(q.nominal, 0)
                self.nominal[n][i] = nominal
                borrow = UNLIMITED if q.borrowing_limit is None else max(q.borrowing_limit, 0)
                self.limit[n][i] = nominal + borrow
                if q.lending_limit is not None:
                    self.guard[n][i] = max(nominal - max(q.lending_limit, 0), 0)
        # The root holds what the top level holds, and cannot borrow.
        for n in range(1, count):
            if self.parent[n] == 0:
                for i in range(nf):
                    self.nominal[0][i] += self.nominal[n][i]
        self.limit[0] = list(self.nominal[0])
        # Paths from each node up to the root; a cycle of cohorts ends at the root.
        self.paths: list[tuple[int, ...]] = []
        for n in range(count):
            walk = [n]
            while walk[-1] != 0 and len(walk) <= count:
                walk.append(self.parent[walk[-1]])
            if walk[-1] != 0:
                walk.append(0)
            self.paths.append(tuple(walk))
        children: list[list[int]] = [[] for _ in range(count)]
        for n in range(1, count):
            children[self.parent[n]].append(n)
        # Smallest claim of each node on its parent: what it keeps back even when idle.
        self.min_claim = [[0] * nf for _ in range(count)]
        for n in sorted(range(count), key=lambda n: -len(self.paths[n])):
            kids = [self.min_claim[c] for c in children[n]]
            for i in range(nf):
                inner = sum(k[i] for k in kids)
                self.min_claim[n][i] = max(inner, self.guard[n][i])
        # Entitlement: the node's fraction of the cluster by weights down the tree.
        self.entitlement = [1.0] * count
        for n in sorted(range(count), key=lambda n: len(self.paths[n])):
            total = sum(weight[c] for c in children[n])
            for c in children[n]:
                self.entitlement[c] = self.entitlement[n] * weight[c] / total
        # Largest gang each node could ever get with every other node idle.
        child_claims = [[0] * nf for _ in range(count)]
        for n in range(1, count):
            row, mine = child_claims[self.parent[n]], self.min_claim[n]
            for i in range(nf):
                row[i] += mine[i]
        self.ceiling = [[0] * nf for _ in range(count)]
        self.ceiling_borrow_only = [[0] * nf for _ in range(count)]  # the same for best-effort gangs
        for n in range(1, count):
            path = self.paths[n]
            for i in range(nf):
                room = self.nominal[0][i]
                for k in range(len(path) - 1, 0, -1):
                    above, child = path[k], path[k - 1]
                    room -= child_claims[above][i] - self.min_claim[child][i]
                most = min(self.limit[m][i] for m in path[:-1])
                self.ceiling[n][i] = max(min(room, most), 0)
                # A borrow-only gang sits on top of the node's own kept-back quota.
                self.ceiling_borrow_only[n][i] = max(min(room - self.guard[n][i], most), 0)
        base = 1 + len(tenancy.cohorts)
        self.queue_nodes = list(range(base, count))  # node numbers of the queues
        self.queue_of = {self.names[n]: n for n in self.queue_nodes}  # "tenant/queue" -> node
        self.queue_by_pair = {(q.tenant, q.name): base + k for k, q in enumerate(tenancy.queues)}
