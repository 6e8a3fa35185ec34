"""What every process of a placed run runs, and with which environment: the
torch.distributed contract, decided once (see docs/execution.md).

:func:`plan` turns a ``JobPlaced`` (the gang's replicas, in rank order) into
one ``StartRun`` per node: each process's argv, GPUs, working directory and
whole environment.  Two launch modes, per role:

- ``per_gpu``: one process per GPU.  ``RANK`` is the global GPU index in
  replica-rank order, ``LOCAL_RANK`` its index among the run's processes on
  its node, ``LOCAL_WORLD_SIZE`` how many there are, ``NODE_RANK`` the node's
  index among the run's nodes ordered by their lowest rank, ``NNODES`` the
  run's nodes.
- ``per_replica``: one launcher per replica with all the replica's GPUs
  (``torchrun --nnodes $NNODES --node-rank $NODE_RANK --nproc-per-node
  $LOCAL_WORLD_SIZE``): ``RANK`` = ``NODE_RANK`` = the replica's rank,
  ``NNODES`` the gang's replicas, ``LOCAL_WORLD_SIZE`` the replica's GPUs.

In both, ``WORLD_SIZE`` is the gang's GPUs, ``MASTER_ADDR`` the address of the
node holding rank 0 and ``MASTER_PORT`` the run's port (:func:`choose_port`).

Pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence

from trainyard.domain.job import JobSpec, Role
from trainyard.domain.node import NodeInfo
from trainyard.events.jobs import ReplicaPlacement
from trainyard.events.work import ProcessLaunch, StartRun

#: MASTER_PORT of a run is chosen in [PORT_FIRST, PORT_LAST]: from torch's
#: default 29500 up to just below Linux's ephemeral ports (32768-60999), so a
#: port chosen here is never one the kernel hands out to a client socket.
PORT_FIRST = 29500
PORT_LAST = 32767


def choose_port(run_id: str, taken: Collection[int] = ()) -> int:
    """The run's MASTER_PORT: a port derived from its run id (the same every
    time it is asked), moved up past ``taken`` (the ports of other runs active
    on the rank-0 node).  With every port of the range taken, the derived one."""
    size = PORT_LAST - PORT_FIRST + 1
    digest = hashlib.blake2b(run_id.encode(), digest_size=8).digest()
    start = int.from_bytes(digest, "big") % size
    for step in range(size):
        port = PORT_FIRST + (start + step) % size
        if port not in taken:
            return port
    return PORT_FIRST + start


def _gpu_list(gpus: Sequence[int]) -> str:
    return ",".join(str(g) for g in gpus)


def simulated_env(spec: JobSpec) -> dict[str, str]:
    """The agent's built-in workload (argv empty): how long it runs and how often it checkpoints."""
    env = {"TRAINYARD_SIMULATED_DURATION_S": f"{spec.simulated_duration_s or 0.0:g}"}
    if spec.simulated_checkpoint_interval_s:
        env["TRAINYARD_SIMULATED_CHECKPOINT_S"] = f"{spec.simulated_checkpoint_interval_s:g}"
    return env


def _argv(spec: JobSpec, role: Role) -> tuple[list[str], dict[str, str]]:
    """The role's command (else the job's), and the simulated workload's env when there is none."""
    argv = list(role.command or spec.command)
    if not argv and spec.simulated_duration_s is not None:
        return [], simulated_env(spec)
    return argv, {}


def plan(
    spec: JobSpec,
    job_id: str,
    tenant: str,
    run_id: str,
    attempt: int,
    cluster: str,
    replicas: Sequence[ReplicaPlacement],
    nodes: Mapping[str, NodeInfo],
    master_port: int,
    resume_from_step: int | None,
    at: float,
) -> dict[str, StartRun]:
    """One ``StartRun`` per node of the run, keyed by node id (see the module docstring)."""
    roles = {r.name: r for r in spec.roles}
    ordered = sorted(replicas, key=lambda r: r.rank)
    world = sum(len(r.gpus) for r in ordered)
    # 1. Global ranks: per_gpu processes take consecutive GPU indices in replica-rank order.
    first_gpu: dict[int, int] = {}
    offset = 0
    for r in ordered:
        first_gpu[r.rank] = offset
        offset += len(r.gpus)
    # 2. The run's nodes, by their lowest rank; rank 0's node is the master.
    node_order: list[str] = []
    for r in ordered:
        if r.node_id not in node_order:
            node_order.append(r.node_id)
    master = ordered[0].node_id if ordered else ""
    master_info = nodes.get(master)
    master_addr = (master_info.address if master_info is not None else None) or master
    # 3. Each replica's processes, as (node, rank, gpus, replica, role).
    launches: list[tuple[str, int, list[int], ReplicaPlacement, Role]] = []
    for r in ordered:
        role = roles[r.role]
        if role.launch == "per_replica":
            launches.append((r.node_id, r.rank, list(r.gpus), r, role))
        else:
            launches.extend((r.node_id, first_gpu[r.rank] + i, [g], r, role) for i, g in enumerate(r.gpus))
    per_node: dict[str, int] = {}
    for node_id, *_ in launches:
        per_node[node_id] = per_node.get(node_id, 0) + 1
    # 4. The environment of each process.
    common = {
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TRAINYARD_JOB_ID": job_id,
        "TRAINYARD_RUN_ID": run_id,
        "TRAINYARD_ATTEMPT": str(attempt),
        "TRAINYARD_TENANT": tenant,
        "TRAINYARD_STOP_SIGNAL": spec.stop_signal,
    }
    if resume_from_step is not None:
        common["TRAINYARD_RESUME_STEP"] = str(resume_from_step)
    if spec.checkpoint_dir is not None:
        common["TRAINYARD_CHECKPOINT_DIR"] = spec.checkpoint_dir
    processes: dict[str, list[ProcessLaunch]] = {n: [] for n in node_order}
    for node_id, rank, gpus, r, role in launches:
        local = len(processes[node_id])
        if role.launch == "per_replica":
            topology = {"NODE_RANK": r.rank, "NNODES": len(ordered), "LOCAL_WORLD_SIZE": len(r.gpus)}
        else:
            topology = {
                "NODE_RANK": node_order.index(node_id),
                "NNODES": len(node_order),
                "LOCAL_WORLD_SIZE": per_node[node_id],
            }
        argv, simulated = _argv(spec, role)
        env = {
            **role.env,  # validation keeps the contract's names out of it; the contract wins regardless
            **simulated,
            **common,
            **{k: str(v) for k, v in topology.items()},
            "RANK": str(rank),
            "LOCAL_RANK": str(local),
            "CUDA_VISIBLE_DEVICES": _gpu_list(gpus),
            "NVIDIA_VISIBLE_DEVICES": _gpu_list(gpus),
            "TRAINYARD_ROLE": role.name,
            "TRAINYARD_REPLICA": str(r.replica),
        }
        processes[node_id].append(
            ProcessLaunch(
                rank=rank,
                role=role.name,
                replica=r.replica,
                gpus=gpus,
                argv=argv,
                env=env,
                working_dir=role.working_dir,
            )
        )
    # 5. One order per node.
    return {
        node_id: StartRun(
            at=at,
            job_id=job_id,
            tenant=tenant,
            run_id=run_id,
            node_id=node_id,
            attempt=attempt,
            cluster=cluster,
            processes=launched,
            image=spec.image,
            stop_signal=spec.stop_signal,
            stop_grace_s=spec.stop_grace_s,
            checkpoint_dir=spec.checkpoint_dir,
            resume_from_step=resume_from_step,
            max_runtime_s=float(spec.max_runtime_s),
        )
        for node_id, launched in processes.items()
    }
