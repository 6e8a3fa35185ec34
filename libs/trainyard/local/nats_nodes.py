"""The NATS of a local stack: one server, or a cluster (three nodes, or
five) whose streams and KV buckets keep three replicas; and the JetStream
``sync_interval`` it runs with (docs/reliability.md, "Durability").

A single server is the only copy of the log, so by default it fsyncs before
acknowledging (``always``): an acknowledged event is on disk.  In a cluster
an acknowledged event is held by a quorum (two of three nodes), so by default
each node keeps nats-server's own 2-minute interval; ``--nats-sync`` chooses
otherwise.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trainyard.local.servers import (
    SYNC_ALWAYS,
    SYNC_DEFAULT,
    Server,
    check_sync_interval,
    start_nats,
    start_nats_cluster,
)

#: How many NATS nodes a local stack may run.
CLUSTER_SIZES = (1, 3, 5)
#: Replicas of every stream and bucket on a cluster.
CLUSTER_REPLICAS = 3


def check_nats(size: int, sync: str) -> None:
    """Raise ValueError saying what to fix in a stack's NATS options."""
    if size not in CLUSTER_SIZES:
        raise ValueError(f"--nats-cluster {size}: use 1 (one server) or 3 or 5 (a cluster)")
    if sync:
        check_sync_interval(sync)


def replicas_for(size: int) -> int:
    return 1 if size == 1 else CLUSTER_REPLICAS


def sync_for(size: int, asked: str = "") -> str:
    """The sync interval: ``asked``, else ``always`` on one server and the
    server's default in a cluster."""
    return asked or (SYNC_ALWAYS if size == 1 else SYNC_DEFAULT)


def port_names(size: int) -> list[str]:
    """The ports a stack's NATS needs besides ``nats`` (node 1's client port):
    the other nodes' client ports and every node's cluster port."""
    if size == 1:
        return []
    return [f"nats-{i}" for i in range(2, size + 1)] + [f"nats-cluster-{i}" for i in range(1, size + 1)]


def start_stack_nats(
    data_dir: Path,
    size: int,
    ports: dict[str, int],
    sync: str,
    config_file: Path | None = None,
    admin: tuple[str, str] | None = None,
) -> list[Server]:
    """Start the stack's NATS nodes: ``data_dir/nats`` for one server,
    ``data_dir/nats-cluster/nats-<i>`` for a cluster (a log of its own: a
    stack moved from one to the other starts with empty streams)."""
    if size == 1:
        return [start_nats(data_dir / "nats", ports["nats"], config_file=config_file, admin=admin, sync_interval=sync)]
    cluster = start_nats_cluster(
        data_dir / "nats-cluster",
        size,
        ports=[ports["nats"], *(ports[f"nats-{i}"] for i in range(2, size + 1))],
        cluster_ports=[ports[f"nats-cluster-{i}"] for i in range(1, size + 1)],
        config_file=config_file,
        admin=admin,
        sync_interval=sync,
    )
    return cluster.nodes


def declare_streams(admin_url: str, replicas: int = 1) -> None:
    """Create the streams and the configuration bucket, or bring the streams'
    settings up to date, as admin (on a locked bus no service may update a
    stream).  In a thread of its own, so a caller inside an event loop may
    start a stack too."""
    from trainyard.bus import Bus, ensure_streams
    from trainyard.config.store import ConfigStore

    async def declare() -> None:
        bus = await Bus.connect(admin_url, "trainyard-up")
        try:
            await ensure_streams(bus.js, replicas=replicas)
            await ConfigStore.open(bus, replicas=replicas)
        finally:
            await bus.close()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, declare()).result()
