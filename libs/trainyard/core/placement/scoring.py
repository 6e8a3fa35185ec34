"""How candidate domains are ranked, and how fragmented the free GPUs are.

A gang too large for one leaf (rack) is ranked first by the two-level rule
(leaves.py): the fewest spines (blocks), then the fewest leaves within them.
Best fit decides everything else, and breaks ties between placements equal on
both counts: among the domains that hold a demand, prefer the one left with
the fewest free GPUs.  Small jobs therefore land on partly used nodes, racks
and blocks, and whole free racks and blocks stay whole for the large gangs
that need them.
"""

from __future__ import annotations

from collections.abc import Iterable

from trainyard.core.placement.snapshot import ClusterSnapshot
from trainyard.core.placement.topology import Domain, Level, domain_key

#: Gang sizes the fragmentation figure reports on by default.
DEFAULT_PROBE_SIZES: tuple[int, ...] = (8, 64)


#: Best-fit sort key of a domain: (free GPUs left over, whole free nodes, key).
FitKey = tuple[int, int, str]


def best_fit_key(domain: Domain, need_gpus: int) -> FitKey:
    """Sort key for a domain that holds a demand of ``need_gpus``: smaller is better.

    1. fewest free GPUs left over (best fit, keeps emptier domains empty);
    2. fewest whole free nodes, so a tie goes to the domain with more broken nodes;
    3. the key, so ties break the same way every time.
    """
    return (domain.free - need_gpus, domain.whole, domain.key)


def spill_key(domain: Domain, gpus_per_replica: int) -> tuple[int, int, str]:
    """Sort key when no child holds the rest of a demand: take the biggest piece first,
    so the gang spans as few children as possible."""
    return (-domain.slots(gpus_per_replica), domain.free, domain.key)


def fragmentation(snapshot: ClusterSnapshot, probe_sizes: Iterable[int] = DEFAULT_PROBE_SIZES) -> dict[str, float]:
    """How much of the free capacity large jobs cannot use.

    For each probe size ``s`` the figure ``unusable_by_<s>`` is the share of
    free GPUs that an ``s``-GPU gang of whole-node (or single-node) replicas
    could not use without crossing a rack:

    * ``s`` at most a node's GPUs: free GPUs on nodes with fewer than ``s`` free;
    * larger ``s``: free GPUs not on whole free nodes of a rack whose whole free
      nodes hold at least ``s`` GPUs.
    """
    free_total = 0
    whole_nodes = 0
    per_node: list[tuple[int, int, str]] = []  # (free, gpus, rack key with type)
    rack_whole: dict[str, int] = {}
    rack_free: dict[str, int] = {}
    rack_capacity: dict[str, int] = {}
    for view in snapshot.nodes:
        info = view.info
        if not view.schedulable or info.gpus <= 0:
            continue
        free = len({g for g in view.free_gpus if 0 <= g < info.gpus})
        rack = f"{info.gpu_type}:{domain_key(info, Level.RACK)}"
        per_node.append((free, info.gpus, rack))
        free_total += free
        rack_free[rack] = rack_free.get(rack, 0) + free
        rack_capacity[rack] = rack_capacity.get(rack, 0) + info.gpus
        if free == info.gpus:
            whole_nodes += 1
            rack_whole[rack] = rack_whole.get(rack, 0) + free
    out: dict[str, float] = {
        "free_gpus": float(free_total),
        "whole_free_nodes": float(whole_nodes),
        "whole_free_racks": float(sum(1 for r, c in rack_capacity.items() if rack_free[r] == c)),
    }
    for size in probe_sizes:
        usable = 0
        for free, gpus, rack in per_node:
            if size <= gpus:
                usable += free if free >= size else 0
            elif free == gpus and rack_whole.get(rack, 0) >= size:
                usable += free
        out[f"unusable_by_{size}"] = (free_total - usable) / free_total if free_total else 0.0
    return out
