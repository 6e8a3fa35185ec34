"""The simulated cluster: nodes in zones, blocks and racks, and its live free-GPU tree.

The placement core builds a topology tree from a :class:`ClusterSnapshot`
every cycle, which costs O(nodes).  The simulator instead keeps one tree
alive for the whole run and hands it to the placement cycle (``Cycle`` accepts
a prebuilt topology): a run that ends gives its GPUs back, a failed node has
its GPUs taken out until it is repaired.  :meth:`SimCluster.snapshot` still
builds the plain snapshot, so a test can check that a direct ``place`` call on
it makes the same decisions.
"""

from __future__ import annotations

from trainyard.core.placement import ClusterSnapshot, NodeView, PlacementPolicy, RunningAlloc
from trainyard.core.placement.topology import Topology
from trainyard.domain.node import NodeInfo
from trainyard.events.jobs import ReplicaPlacement
from trainyard.sim.workloads import GPU_TYPE


def build_nodes(
    nodes: int,
    gpus_per_node: int = 8,
    nodes_per_rack: int = 32,
    racks_per_block: int = 16,
    blocks_per_zone: int = 8,
    nvlink_nodes: int = 0,
    gpu_type: str = GPU_TYPE,
    cluster: str = "sim",
    prefix: str = "n",
) -> list[NodeInfo]:
    """``nodes`` nodes filled rack by rack; ``nvlink_nodes`` > 1 groups that many nodes per NVLink domain."""
    out = []
    for i in range(nodes):
        rack_no = i // nodes_per_rack
        block_no = rack_no // racks_per_block
        zone_no = block_no // blocks_per_zone
        nv = f"nv{i // nvlink_nodes}" if nvlink_nodes > 1 else None
        out.append(
            NodeInfo(
                node_id=f"{prefix}{i:05d}",
                cluster=cluster,
                gpu_type=gpu_type,
                gpus=gpus_per_node,
                zone=f"z{zone_no}",
                block=f"b{block_no}",
                rack=f"r{rack_no}",
                nvlink_domain=nv,
            )
        )
    return out


class SimCluster:
    """Nodes, which are down, and the live topology tree of free GPUs."""

    def __init__(self, nodes: list[NodeInfo]) -> None:
        ids = [n.node_id for n in nodes]
        if len(set(ids)) != len(ids):
            raise ValueError("node ids must be unique")
        self.nodes = {n.node_id: n for n in nodes}
        self.order = sorted(self.nodes)  # node ids, for deterministic iteration
        self.down: set[str] = set()  # failed nodes, out of service until repaired
        self.topo = Topology.build((n, range(n.gpus), True) for n in nodes)
        self.capacity = sum(n.gpus for n in nodes)  # GPUs of all nodes, up or down
        self.capacity_by_type: dict[str, int] = {}  # the same per GPU type
        for n in nodes:
            self.capacity_by_type[n.gpu_type] = self.capacity_by_type.get(n.gpu_type, 0) + n.gpus
        self.down_by_type: dict[str, int] = dict.fromkeys(self.capacity_by_type, 0)  # GPUs of failed nodes

    @property
    def up_gpus(self) -> int:
        return self.capacity - sum(self.down_by_type.values())

    def up_by_type(self) -> dict[str, int]:
        """GPUs of nodes in service, per type."""
        return {t: c - self.down_by_type[t] for t, c in self.capacity_by_type.items()}

    def release(self, replicas: list[ReplicaPlacement]) -> None:
        """A run ended: its GPUs are free again (unless their node is down)."""
        topo, down = self.topo, self.down
        for r in replicas:
            if r.node_id not in down:
                topo.give(topo.nodes[r.node_id], r.gpus)

    def fail(self, node_id: str) -> None:
        """Take a node out of service: none of its GPUs can be given out."""
        if node_id in self.down:
            return
        self.down.add(node_id)
        info = self.nodes[node_id]
        self.down_by_type[info.gpu_type] += info.gpus
        node = self.topo.nodes[node_id]
        self.topo.take(node, list(node.free_gpus))

    def repair(self, node_id: str) -> None:
        """Put a node back in service with every GPU free (its runs were failed)."""
        if node_id not in self.down:
            return
        self.down.discard(node_id)
        info = self.nodes[node_id]
        self.down_by_type[info.gpu_type] -= info.gpus
        node = self.topo.nodes[node_id]
        self.topo.give(node, range(node.gpus))

    def free_gpus(self) -> int:
        return sum(tree.root.free for tree in self.topo.trees.values())

    def snapshot(self, running: list[RunningAlloc], policy: PlacementPolicy) -> ClusterSnapshot:
        """The plain snapshot the placement service would build for the same state."""
        views = []
        for node_id in self.order:
            info = self.nodes[node_id]
            up = node_id not in self.down
            free = tuple(self.topo.nodes[node_id].free_gpus) if up else ()
            views.append(NodeView(info=info, free_gpus=free, schedulable=up))
        return ClusterSnapshot(nodes=views, running=running, policy=policy)

    def held_gpus(self) -> dict[str, set[int]]:
        """GPUs not free on nodes in service, by node (for the allocation invariant)."""
        out = {}
        for node_id in self.order:
            if node_id in self.down:
                continue
            node = self.topo.nodes[node_id]
            held = set(range(node.gpus)) - set(node.free_gpus)
            if held:
                out[node_id] = held
        return out
