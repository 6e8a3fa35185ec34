"""The run dispatcher with real NATS (locked: every party uses its own
credential) and Redis: orders to each node's agent, and the agents' reports
turned into one RunStarted, one RunFailed naming the failed rank, RunSucceeded,
the start timeout and a preemption that waits for every rank's exit."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from dispatch_fixtures import NODES, Cluster, dispatching, spec
from nats.js.errors import NotFoundError

from trainyard.core.execution import choose_port
from trainyard.events import CheckpointSaved, JobCancelled, PreemptionNotice, RunFailed, RunStarted, RunSucceeded
from trainyard.events.work import CheckpointWritten, SignalRun, StartRun, StopRun
from trainyard.store import Store, views
from trainyard.testing.publish import publish_event
from trainyard.testing.waiting import eventually


@pytest.fixture
async def cluster(tmp_path: Path, store: Store) -> AsyncIterator[Cluster]:
    async with dispatching(tmp_path, store) as c:
        yield c


async def started_run(cluster: Cluster, job_id: str = "j1", **fields: object) -> tuple[str, dict[str, StartRun]]:
    """A 3-replica run placed over n01..n03, every node's processes reported up and the run running."""
    run_id = await cluster.place(job_id, spec(**fields))
    orders = await cluster.start_orders(run_id)
    for node in NODES:
        await cluster.agents[node].started(orders[node])
    await eventually(lambda: _is(cluster, job_id, "running"), what="the run running")
    return run_id, orders


async def _is(cluster: Cluster, job_id: str, status: str) -> bool:
    return await cluster.status(job_id) == status


async def test_a_gang_over_three_nodes_starts_once_every_node_is_up_and_succeeds_once_every_rank_exits_0(
    cluster: Cluster,
) -> None:
    await cluster.start()
    run_id = await cluster.place("j1", spec())
    orders = await cluster.start_orders(run_id)
    # One process per node, ranks 0..2, one master they all agree on.
    procs = {n: o.processes for n, o in orders.items()}
    assert {n: [p.rank for p in ps] for n, ps in procs.items()} == {"n01": [0], "n02": [1], "n03": [2]}
    envs = [ps[0].env for ps in procs.values()]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"], e["WORLD_SIZE"]) for e in envs} == {
        ("10.0.0.1", envs[0]["MASTER_PORT"], "3")
    }
    assert all(o.attempt == 1 and o.processes[0].argv == ["python", "train.py"] for o in orders.values())
    # Two nodes up: not started yet.
    for node in ("n01", "n02"):
        await cluster.agents[node].started(orders[node])
    book = cluster.dispatcher.book

    async def two_up() -> bool:
        state = await book.get(run_id)
        return state is not None and len(state.started) == 2

    await eventually(two_up, what="two nodes' starts recorded")
    assert await cluster.of("j1", RunStarted) == []
    # The third: exactly one RunStarted, by placement.
    await cluster.agents["n03"].started(orders["n03"])
    await cluster.agents["n03"].started(orders["n03"])  # a report sent twice changes nothing
    await eventually(lambda: _is(cluster, "j1", "running"), what="the run running")
    assert [(w, type(e)) for w, e in await cluster.events("j1") if isinstance(e, RunStarted)] == [
        ("placement", RunStarted)
    ]
    # Every rank exits 0: one RunSucceeded, and no StopRun to anyone.
    for rank, node in enumerate(NODES):
        await cluster.agents[node].exited(orders[node], rank, exit_code=0)
    await eventually(lambda: _is(cluster, "j1", "succeeded"), what="the run succeeded")
    assert len(await cluster.of("j1", RunSucceeded)) == 1
    assert all(not a.of(StopRun) for a in cluster.agents.values())


async def test_a_failing_rank_fails_the_run_once_naming_it_and_stops_the_other_nodes(cluster: Cluster) -> None:
    await cluster.start()
    run_id, orders = await started_run(cluster, max_retries=0)
    ended = time.time() - 0.25  # when the rank ended, by its node's clock: the run's failure is stamped so
    await cluster.agents["n02"].exited(
        orders["n02"], 1, exit_code=3, log_tail="step 40\nTraceback: CUDA error\n", exited_at=ended
    )
    await eventually(lambda: _is(cluster, "j1", "failed"), what="the job failed")
    [failed] = await cluster.of("j1", RunFailed)
    assert failed.reason == "workload_error" and failed.node_id == "n02" and failed.at == ended
    assert failed.message.startswith("rank 1 on n02 exited with code 3") and "CUDA error" in failed.message

    async def peers_stopped() -> bool:
        return all(cluster.agents[n].of(StopRun) for n in ("n01", "n03"))

    await eventually(peers_stopped, what="StopRun to n01 and n03")
    for node in ("n01", "n03"):
        [stop] = cluster.agents[node].of(StopRun)
        assert (stop.run_id, stop.reason) == (run_id, "peer_failed")
    assert cluster.agents["n02"].of(StopRun) == []  # its only rank is gone
    # A second rank failing on its own, and the stopped ones: still one RunFailed.
    await cluster.agents["n03"].exited(orders["n03"], 2, exit_code=1)
    await cluster.agents["n01"].exited(orders["n01"], 0, signal="SIGTERM", stopped="peer_failed")

    async def all_exited() -> bool:
        state = await cluster.dispatcher.book.get(run_id)
        return state is not None and state.all_exited

    await eventually(all_exited, what="every exit recorded")
    assert len(await cluster.of("j1", RunFailed)) == 1
    assert await cluster.of("j1", RunSucceeded) == []


async def test_the_failure_names_the_rank_that_ended_first_even_when_a_peers_report_comes_first(
    cluster: Cluster,
) -> None:
    """Rank 1 exits 3; rank 2, which lost its connection to it, exits 1 a little later, but its node
    reports first (the agents poll on their own clocks): the run's one RunFailed names rank 1."""
    await cluster.start()
    run_id, orders = await started_run(cluster, max_retries=0)
    t = time.time()
    await cluster.agents["n03"].exited(orders["n03"], 2, exit_code=1, exited_at=t - 0.02, log_tail="reset by peer")
    await cluster.agents["n02"].exited(orders["n02"], 1, exit_code=3, exited_at=t - 0.05, log_tail="nan at step 7")
    await eventually(lambda: _is(cluster, "j1", "failed"), what="the job failed")
    [failed] = await cluster.of("j1", RunFailed)
    assert failed.message.startswith("rank 1 on n02 exited with code 3") and failed.node_id == "n02"
    [stop] = cluster.agents["n01"].of(StopRun)
    assert (stop.run_id, stop.reason) == (run_id, "peer_failed")


async def test_a_rank_that_cannot_start_fails_the_run_with_the_reason(cluster: Cluster) -> None:
    await cluster.start()
    run_id = await cluster.place("j1", spec(max_retries=0))
    orders = await cluster.start_orders(run_id)
    await cluster.agents["n01"].exited(orders["n01"], 0, start_error="python: no such file or directory")
    await eventually(lambda: _is(cluster, "j1", "failed"), what="the job failed")
    [failed] = await cluster.of("j1", RunFailed)
    assert failed.message == "rank 0 on n01 could not start: python: no such file or directory"


async def test_a_run_not_started_in_time_is_failed_as_lost_requeued_and_stopped(cluster: Cluster) -> None:
    await cluster.start(start_timeout_s=0.5)
    run_id = await cluster.place("j1", spec())
    orders = await cluster.start_orders(run_id)
    await cluster.agents["n01"].started(orders["n01"])

    async def requeued() -> bool:
        return await cluster.status("j1") == "pending"

    await eventually(requeued, what="the job pending again")
    [failed] = await cluster.of("j1", RunFailed)
    assert failed.reason == "lost"
    assert failed.message == "not started within 0.5 s on n02, n03"
    job = await views.get_job(cluster.store, "j1")
    assert job is not None and job.placement == () and job.requeues == 1  # its GPUs freed

    async def all_stopped() -> bool:
        return all(a.of(StopRun) for a in cluster.agents.values())

    await eventually(all_stopped, what="StopRun to every node")
    assert {a.of(StopRun)[0].reason for a in cluster.agents.values()} == {"start_timeout"}
    assert await cluster.of("j1", RunStarted) == []


async def test_preemption_signals_every_node_and_fails_the_run_only_once_every_rank_exited(cluster: Cluster) -> None:
    await cluster.start()
    run_id, orders = await started_run(cluster, stop_signal="SIGUSR1")
    notice = PreemptionNotice(
        at=time.time(), job_id="j1", tenant="acme", run_id=run_id, preemptor="j9", reason="priority", grace_period_s=30
    )
    await publish_event(cluster.admission, notice, f"{run_id}:notice")

    async def signalled() -> bool:
        return all(a.of(SignalRun) for a in cluster.agents.values())

    await eventually(signalled, what="SignalRun to every node")
    for agent in cluster.agents.values():
        [signal] = agent.of(SignalRun)
        assert (signal.run_id, signal.signal, signal.grace_period_s) == (run_id, "SIGUSR1", 30.0)
    # The victim checkpoints; two ranks exit, one of them killed by the signal: still running.
    await cluster.agents["n01"].report(
        CheckpointWritten(at=time.time(), job_id="j1", tenant="acme", run_id=run_id, node_id="n01", step=1200), "ckpt"
    )
    await cluster.agents["n01"].exited(orders["n01"], 0, exit_code=0)
    await cluster.agents["n02"].exited(orders["n02"], 1, signal="SIGUSR1")

    async def two_exited() -> bool:
        state = await cluster.dispatcher.book.get(run_id)
        return state is not None and len(state.exits) == 2

    await eventually(two_exited, what="two exits recorded")
    assert await cluster.of("j1", RunFailed) == []
    assert await cluster.status("j1") == "running"
    # The last rank exits: one RunFailed(preempted), the job requeued; the checkpoint kept.
    await cluster.agents["n03"].exited(orders["n03"], 2, exit_code=0)
    await eventually(lambda: _is(cluster, "j1", "pending"), what="the victim requeued")
    [failed] = await cluster.of("j1", RunFailed)
    assert failed.reason == "preempted"
    assert [c.step for c in await cluster.of("j1", CheckpointSaved)] == [1200]


async def test_a_cancel_stops_every_node_still_holding_a_rank(cluster: Cluster) -> None:
    await cluster.start()
    run_id, orders = await started_run(cluster)
    await cluster.agents["n03"].exited(orders["n03"], 2, exit_code=0)

    async def one_exited() -> bool:
        state = await cluster.dispatcher.book.get(run_id)
        return state is not None and len(state.exits) == 1

    await eventually(one_exited, what="n03's exit recorded")
    await publish_event(cluster.admission, JobCancelled(at=time.time(), job_id="j1", tenant="acme"), "j1:cancel")

    async def stopped() -> bool:
        return all(cluster.agents[n].of(StopRun) for n in ("n01", "n02"))

    await eventually(stopped, what="StopRun to n01 and n02")
    assert {cluster.agents[n].of(StopRun)[0].reason for n in ("n01", "n02")} == {"cancelled"}
    assert cluster.agents["n03"].of(StopRun) == []


@pytest.mark.parametrize("emulated", [pytest.param(NODES, id="a run on the emulator's nodes gets no orders")])
async def test_runs_on_nodes_that_do_not_execute_are_left_to_the_emulator(
    cluster: Cluster, emulated: tuple[str, ...]
) -> None:
    await cluster.start(emulated=emulated)
    await cluster.place("j1", spec())
    await cluster.place("j2", spec())
    # The dispatcher has handled both placements once its JOBS consumer has acknowledged them.
    info = await eventually(lambda: _acked(cluster), what="the dispatcher's JOBS consumer caught up")
    assert info
    assert all(a.orders == [] for a in cluster.agents.values())


async def _acked(cluster: Cluster) -> bool:
    info = await cluster.admin.js.consumer_info("JOBS", "dispatcher-local")
    last = (await cluster.admin.js.stream_info("JOBS")).state.last_seq
    return info.ack_floor.stream_seq >= last


class Switch:
    """A lease a test holds or gives up."""

    def __init__(self) -> None:
        self.held = False


async def test_only_the_lease_holder_dispatches(cluster: Cluster) -> None:
    lease = Switch()
    await cluster.start(lease=lease)
    run_id = await cluster.place("j1", spec())
    # Placed and projected, but this process does not lead: its dispatcher consumers do not run.
    await eventually(lambda: _is(cluster, "j1", "placed"), what="the run placed")
    assert (await cluster.admin.js.stream_info("WORK")).state.messages == 0
    with pytest.raises(NotFoundError):  # its consumers are made only once it leads
        await cluster.admin.js.consumer_info("JOBS", "dispatcher-local")
    lease.held = True
    orders = await cluster.start_orders(run_id)
    assert set(orders) == set(NODES)


async def test_a_new_dispatcher_carries_on_from_the_state_the_last_one_left(cluster: Cluster) -> None:
    await cluster.start()
    run_id = await cluster.place("j1", spec())
    orders = await cluster.start_orders(run_id)
    for node in ("n01", "n02"):
        await cluster.agents[node].started(orders[node])

    async def two_up() -> bool:
        state = await cluster.dispatcher.book.get(run_id)
        return state is not None and len(state.started) == 2

    await eventually(two_up, what="two nodes' starts recorded")
    await cluster.restart_dispatcher()
    await cluster.agents["n03"].started(orders["n03"])
    await eventually(lambda: _is(cluster, "j1", "running"), what="the run running")
    for rank, node in enumerate(NODES):
        await cluster.agents[node].exited(orders[node], rank, exit_code=0)
    await eventually(lambda: _is(cluster, "j1", "succeeded"), what="the run succeeded")
    assert len(await cluster.of("j1", RunStarted)) == 1 and len(await cluster.of("j1", RunSucceeded)) == 1
    assert all(len(a.of(StartRun)) == 1 for a in cluster.agents.values())  # the placement was not ordered twice


async def test_runs_sharing_a_node_get_their_own_gpus_and_master_ports(cluster: Cluster) -> None:
    await cluster.start()
    # A second job whose run id derives the same port as j1's: it is moved past it.
    other = next(f"k{i}" for i in range(100_000) if choose_port(f"k{i}-r1") == choose_port("j1-r1"))
    a = await cluster.place("j1", spec(), first_gpu=0)
    b = await cluster.place(other, spec(), first_gpu=4)
    first, second = await cluster.start_orders(a), await cluster.start_orders(b)
    for node in NODES:
        gpus_a = first[node].processes[0].env["CUDA_VISIBLE_DEVICES"]
        gpus_b = second[node].processes[0].env["CUDA_VISIBLE_DEVICES"]
        assert set(gpus_a.split(",")).isdisjoint(gpus_b.split(","))
    port_a = first["n01"].processes[0].env["MASTER_PORT"]
    port_b = second["n01"].processes[0].env["MASTER_PORT"]
    assert port_a != port_b and all(29500 <= int(p) <= 32767 for p in (port_a, port_b))
    # Once j1 is over its port is free again on n01.
    await publish_event(cluster.admission, JobCancelled(at=time.time(), job_id="j1", tenant="acme"), "j1:cancel")
    for rank, node in enumerate(NODES):
        await cluster.agents[node].exited(first[node], rank, signal="SIGTERM", stopped="cancelled")

    async def port_freed() -> bool:
        ports = await cluster.store.redis.hgetall(cluster.store.key("dispatch", "ports", "n01"))
        return ports == {b: port_b}

    await eventually(port_freed, what="j1's port given back")


async def test_a_run_is_stamped_with_its_processes_times_not_with_when_late_reports_arrive(cluster: Cluster) -> None:
    # Reports held up (an agent restarting, say) arrive long after the processes started and
    # ended: the run's start and end, which the ledger meters, are the processes' own times.
    await cluster.start()
    run_id = await cluster.place("j1", spec())
    orders = await cluster.start_orders(run_id)
    now = time.time()
    for i, node in enumerate(NODES):
        await cluster.agents[node].started(orders[node], at=now - 30 + i)
    await eventually(lambda: _is(cluster, "j1", "running"), what="the run running")
    for rank, node in enumerate(NODES):
        await cluster.agents[node].exited(orders[node], rank, exit_code=0, exited_at=now - 10 + rank)
    await eventually(lambda: _is(cluster, "j1", "succeeded"), what="the run succeeded")
    [started] = await cluster.of("j1", RunStarted)
    [done] = await cluster.of("j1", RunSucceeded)
    assert (started.at, done.at) == (now - 28, now - 8)
