"""Jobs that can never fit the registered fleet, refused at intake.

A replica runs on one node, so a replica needing more GPUs of its type than
the largest registered node of that type has can never be placed; a gang runs
all at once, so a gang needing more GPUs of a type than the whole registered
fleet has can never be placed either.  Such a job would wait for ever; it is
rejected at once with the size of the largest node or of the fleet.

Only GPU types with registered nodes are judged: with no node of a type
registered yet (or no nodes at all) nothing is known, and the job may wait for
nodes to arrive.  Every registered node counts, whatever its state, since a
cordoned or lost node can come back.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from trainyard.domain.job import JobSpec, ValidationError


class FleetSummary(msgspec.Struct, frozen=True):
    """What is known of the registered fleet, per GPU type."""

    largest_node: dict[str, int] = {}  # GPUs on the largest registered node of the type
    total: dict[str, int] = {}  # GPUs on all registered nodes of the type
    nodes: dict[str, int] = {}  # registered nodes of the type

    @classmethod
    def of(cls, nodes: Iterable[tuple[str, int]]) -> FleetSummary:
        """From ``(gpu_type, gpus)`` of each registered node."""
        largest: dict[str, int] = {}
        total: dict[str, int] = {}
        count: dict[str, int] = {}
        for gpu_type, gpus in nodes:
            largest[gpu_type] = max(largest.get(gpu_type, 0), gpus)
            total[gpu_type] = total.get(gpu_type, 0) + gpus
            count[gpu_type] = count.get(gpu_type, 0) + 1
        return cls(largest, total, count)


def never_fits(spec: JobSpec, fleet: FleetSummary) -> list[ValidationError]:
    """Every reason ``spec`` could not be placed on ``fleet`` even with every
    GPU free; empty when it could (or when the fleet says nothing about it)."""
    errors: list[ValidationError] = []
    demand: dict[str, int] = {}
    for i, role in enumerate(spec.roles):
        demand[role.gpu_type] = demand.get(role.gpu_type, 0) + role.gpus
        largest = fleet.largest_node.get(role.gpu_type)
        if largest is not None and role.gpus_per_replica > largest:
            errors.append(
                ValidationError(
                    f"roles[{i}].gpus_per_replica",
                    f"each replica needs {role.gpus_per_replica} {role.gpu_type} GPUs but the largest "
                    f"{role.gpu_type} node has {largest}; use at most {largest} GPUs per replica "
                    "(and more replicas)",
                )
            )
    for gpu_type, gpus in demand.items():
        total = fleet.total.get(gpu_type)
        if total is not None and gpus > total:
            errors.append(
                ValidationError(
                    "roles",
                    f"the gang needs {gpus} {gpu_type} GPUs at once but the whole fleet has {total} "
                    f"({fleet.nodes.get(gpu_type, 0)} nodes); make the gang smaller",
                )
            )
    return errors
