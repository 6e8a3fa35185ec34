"""The execution planner: the torch.distributed environment contract of every process of a run."""

from __future__ import annotations

import pytest

from trainyard.core.execution import PORT_FIRST, PORT_LAST, choose_port, plan
from trainyard.domain import JobSpec, NodeInfo, Role
from trainyard.events import ReplicaPlacement
from trainyard.events.work import StartRun


def spec(*roles: Role, **fields) -> JobSpec:
    return JobSpec(
        tenant="acme",
        queue="q",
        roles=list(roles) or [Role(name="trainer")],
        command=fields.pop("command", ["python", "train.py"]),
        **fields,
    )


def node(node_id: str, address: str | None = None, gpus: int = 8) -> NodeInfo:
    return NodeInfo(node_id=node_id, cluster="c1", gpu_type="H100", gpus=gpus, address=address, executes=True)


NODES = {n.node_id: n for n in [node("n01", "10.0.0.1"), node("n02", "10.0.0.2"), node("n03")]}


def replica(rank: int, node_id: str, gpus: list[int], role: str = "trainer", index: int | None = None):
    return ReplicaPlacement(role=role, replica=rank if index is None else index, rank=rank, node_id=node_id, gpus=gpus)


def run(job: JobSpec, replicas: list[ReplicaPlacement], port: int = 29600, resume: int | None = None, **kw):
    return plan(job, "j1", "acme", "j1-r2", 2, "c1", replicas, NODES, port, resume, 1000.0, **kw)


def envs(orders: dict[str, StartRun]) -> list[dict[str, str]]:
    """Every process's env, by global rank."""
    return sorted((p.env for o in orders.values() for p in o.processes), key=lambda e: int(e["RANK"]))


def pick(env: dict[str, str], *keys: str) -> tuple[str, ...]:
    return tuple(env[k] for k in keys)


KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "NNODES", "CUDA_VISIBLE_DEVICES")


@pytest.mark.parametrize(
    ("job", "replicas", "expected"),
    [
        pytest.param(
            spec(Role(name="trainer", replicas=3)),
            [replica(0, "n02", [5]), replica(1, "n01", [0]), replica(2, "n03", [7])],
            [
                ("0", "0", "3", "1", "0", "3", "5"),
                ("1", "0", "3", "1", "1", "3", "0"),
                ("2", "0", "3", "1", "2", "3", "7"),
            ],
            id="a 3-replica gang over 3 nodes: one process each, node ranks by lowest rank",
        ),
        pytest.param(
            spec(Role(name="trainer", replicas=2, gpus_per_replica=2)),
            [replica(0, "n01", [2, 3]), replica(1, "n02", [0, 1])],
            [
                ("0", "0", "4", "2", "0", "2", "2"),
                ("1", "1", "4", "2", "0", "2", "3"),
                ("2", "0", "4", "2", "1", "2", "0"),
                ("3", "1", "4", "2", "1", "2", "1"),
            ],
            id="per GPU: global ranks in replica-rank order, local ranks per node",
        ),
        pytest.param(
            spec(Role(name="trainer", replicas=2, gpus_per_replica=2)),
            [replica(0, "n01", [0, 1]), replica(1, "n01", [4, 5])],
            [
                ("0", "0", "4", "4", "0", "1", "0"),
                ("1", "1", "4", "4", "0", "1", "1"),
                ("2", "2", "4", "4", "0", "1", "4"),
                ("3", "3", "4", "4", "0", "1", "5"),
            ],
            id="two replicas on one node are one node of four local processes",
        ),
        pytest.param(
            spec(Role(name="trainer", replicas=2, gpus_per_replica=4, launch="per_replica")),
            [replica(0, "n01", [0, 1, 2, 3]), replica(1, "n02", [4, 5, 6, 7])],
            [("0", "0", "8", "4", "0", "2", "0,1,2,3"), ("1", "0", "8", "4", "1", "2", "4,5,6,7")],
            id="per replica: one torchrun launcher per replica with all its GPUs",
        ),
    ],
)
def test_the_contract_of_each_process(job: JobSpec, replicas: list[ReplicaPlacement], expected: list[tuple]) -> None:
    orders = run(job, replicas)
    assert [pick(e, *KEYS) for e in envs(orders)] == expected
    for e in envs(orders):
        assert e["NVIDIA_VISIBLE_DEVICES"] == e["CUDA_VISIBLE_DEVICES"]
        assert pick(e, "MASTER_ADDR", "MASTER_PORT") == pick(envs(orders)[0], "MASTER_ADDR", "MASTER_PORT")


@pytest.mark.parametrize(
    ("first", "master"),
    [
        pytest.param("n02", "10.0.0.2", id="rank 0's node address is MASTER_ADDR"),
        pytest.param("n03", "n03", id="a node with no address is reached by its node id"),
    ],
)
def test_master_is_the_node_holding_rank_0(first: str, master: str) -> None:
    orders = run(spec(Role(name="t", replicas=2)), [replica(1, "n01", [0], "t"), replica(0, first, [0], "t")])
    assert {e["MASTER_ADDR"] for e in envs(orders)} == {master}
    assert {e["MASTER_PORT"] for e in envs(orders)} == {"29600"}


def test_two_roles_share_one_world_and_keep_their_own_commands_and_env() -> None:
    job = spec(
        Role(name="trainer", replicas=1, gpus_per_replica=2, env={"NCCL_DEBUG": "INFO"}, working_dir="/work"),
        Role(name="rollout", replicas=2, command=["python", "rollout.py"]),
    )
    replicas = [
        replica(0, "n01", [0, 1], "trainer", 0),
        replica(1, "n01", [2], "rollout", 0),
        replica(2, "n02", [0], "rollout", 1),
    ]
    orders = run(job, replicas)
    procs = sorted((p for o in orders.values() for p in o.processes), key=lambda p: p.rank)
    assert [(p.rank, p.role, p.replica, p.gpus) for p in procs] == [
        (0, "trainer", 0, [0]),
        (1, "trainer", 0, [1]),
        (2, "rollout", 0, [2]),
        (3, "rollout", 1, [0]),
    ]
    assert [p.argv for p in procs] == [["python", "train.py"]] * 2 + [["python", "rollout.py"]] * 2
    assert [p.working_dir for p in procs] == ["/work", "/work", None, None]
    assert procs[0].env["NCCL_DEBUG"] == "INFO" and "NCCL_DEBUG" not in procs[2].env
    assert {p.env["WORLD_SIZE"] for p in procs} == {"4"}
    assert [pick(p.env, "TRAINYARD_ROLE", "TRAINYARD_REPLICA", "LOCAL_RANK", "LOCAL_WORLD_SIZE") for p in procs] == [
        ("trainer", "0", "0", "3"),
        ("trainer", "0", "1", "3"),
        ("rollout", "0", "2", "3"),
        ("rollout", "1", "0", "1"),
    ]


def test_two_jobs_sharing_a_node_see_disjoint_gpus() -> None:
    a = run(spec(Role(name="t", gpus_per_replica=3)), [replica(0, "n01", [0, 1, 2], "t")])
    b = plan(
        spec(Role(name="t", gpus_per_replica=4, launch="per_replica")),
        "j2",
        "acme",
        "j2-r1",
        1,
        "c1",
        [replica(0, "n01", [3, 4, 5, 6], "t")],
        NODES,
        29601,
        None,
        1000.0,
    )
    seen_a = {g for p in a["n01"].processes for g in p.env["CUDA_VISIBLE_DEVICES"].split(",")}
    seen_b = {g for p in b["n01"].processes for g in p.env["CUDA_VISIBLE_DEVICES"].split(",")}
    assert seen_a == {"0", "1", "2"} and seen_b == {"3", "4", "5", "6"}


def test_the_order_carries_the_run_and_how_to_stop_and_resume_it() -> None:
    job = spec(stop_signal="SIGUSR1", stop_grace_s=45.0, checkpoint_dir="/shared/ck", image="reg/x:1")
    order = run(job, [replica(0, "n01", [0])], resume=1200)["n01"]
    assert (order.job_id, order.run_id, order.attempt, order.cluster, order.node_id) == ("j1", "j1-r2", 2, "c1", "n01")
    assert (order.stop_signal, order.stop_grace_s, order.checkpoint_dir, order.image) == (
        "SIGUSR1",
        45.0,
        "/shared/ck",
        "reg/x:1",
    )
    assert order.resume_from_step == 1200 and order.max_runtime_s == 86400.0
    env = order.processes[0].env
    assert pick(env, "TRAINYARD_JOB_ID", "TRAINYARD_RUN_ID", "TRAINYARD_ATTEMPT", "TRAINYARD_TENANT") == (
        "j1",
        "j1-r2",
        "2",
        "acme",
    )
    assert pick(env, "TRAINYARD_STOP_SIGNAL", "TRAINYARD_RESUME_STEP", "TRAINYARD_CHECKPOINT_DIR") == (
        "SIGUSR1",
        "1200",
        "/shared/ck",
    )
    fresh = run(spec(), [replica(0, "n01", [0])])["n01"].processes[0].env
    assert "TRAINYARD_RESUME_STEP" not in fresh and "TRAINYARD_CHECKPOINT_DIR" not in fresh


def test_a_job_with_only_a_simulated_duration_runs_the_agents_workload() -> None:
    job = spec(command=[], simulated_duration_s=12.0, simulated_checkpoint_interval_s=3.0)
    [proc] = run(job, [replica(0, "n01", [0])])["n01"].processes
    assert proc.argv == []
    assert pick(proc.env, "TRAINYARD_SIMULATED_DURATION_S", "TRAINYARD_SIMULATED_CHECKPOINT_S") == ("12", "3")


def test_the_contract_overrides_anything_a_role_env_holds() -> None:
    job = spec(Role(name="t", env={"RANK": "9", "TRAINYARD_JOB_ID": "x"}))  # refused by validation anyway
    env = run(job, [replica(0, "n01", [0], "t")])["n01"].processes[0].env
    assert pick(env, "RANK", "TRAINYARD_JOB_ID") == ("0", "j1")


@pytest.mark.parametrize(
    ("taken", "moved"),
    [
        pytest.param(set(), False, id="a free node gets the run's own port"),
        pytest.param("own", True, id="a port another run on the rank-0 node holds is skipped"),
    ],
)
def test_the_port_is_per_run_in_range_and_avoids_the_taken(taken, moved: bool) -> None:
    own = choose_port("j1-r2")
    assert PORT_FIRST <= own <= PORT_LAST and choose_port("j1-r2") == own
    chosen = choose_port("j1-r2", {own} if taken == "own" else taken)
    assert (chosen != own) is moved and PORT_FIRST <= chosen <= PORT_LAST


def test_ports_wrap_around_the_range() -> None:
    everything_but_first = set(range(PORT_FIRST + 1, PORT_LAST + 1))
    assert choose_port("j1-r2", everything_but_first) == PORT_FIRST
    assert PORT_FIRST <= choose_port("j1-r2", set(range(PORT_FIRST, PORT_LAST + 1))) <= PORT_LAST
