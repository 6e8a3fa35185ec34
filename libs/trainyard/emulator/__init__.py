"""Emulated GPU nodes for ``trainyard up`` and tests."""

from trainyard.emulator.cluster import EmulatedCluster, default_topology

__all__ = ["EmulatedCluster", "default_topology"]
