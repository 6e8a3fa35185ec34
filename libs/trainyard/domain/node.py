"""GPU nodes as the control plane sees them."""

from __future__ import annotations

import enum

import msgspec


class NodeState(str, enum.Enum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"
    CORDONED = "cordoned"
    DRAINING = "draining"
    REPAIR = "repair"
    LOST = "lost"


#: States in which a node may take new work.
SCHEDULABLE_STATES = frozenset({NodeState.HEALTHY})


class NodeInfo(msgspec.Struct, frozen=True):
    """A GPU node and where it sits in the network.

    Topology runs zone -> block (spine) -> rack (leaf) -> NVLink domain -> node.
    """

    node_id: str
    cluster: str
    gpu_type: str
    gpus: int
    cpu: float = 96.0
    memory_gib: float = 1024.0
    fabric: str = "infiniband"
    zone: str = "z1"
    block: str = "b1"
    rack: str = "r1"
    nvlink_domain: str | None = None
    labels: dict[str, str] = {}
    # Where the node's processes are reached (MASTER_ADDR when it holds rank 0).
    address: str | None = None
    # True when a node agent runs the processes of runs placed here (the run
    # dispatcher sends it orders); False for the emulator's nodes.
    executes: bool = False

    @property
    def nvlink(self) -> str:
        """The NVLink domain; a node without NVSwitch fabric is its own domain."""
        return self.nvlink_domain or self.node_id
