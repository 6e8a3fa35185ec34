"""Redis locked with the installation's ACL users keeps every fold across
restarts: its append-only file replays whole (no transaction refused on
replay), and the service users run the folds but cannot administer scripts.
A projection that does not hold what its marker claims (a partial replay)
is noticed when a projector joins it, and rebuilt."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import redis.exceptions
from redis.asyncio import Redis
from test_projection import lifecycle, project
from test_projection_loss import snapshot

from trainyard.bus import Bus
from trainyard.domain import NodeInfo
from trainyard.events import NodeRegistered, RunSucceeded, subjects
from trainyard.local.credentials import ADMIN, Credentials, new_credentials, write_server_files
from trainyard.local.servers import Server, start_redis
from trainyard.local.supervisor import restart_server
from trainyard.store import Projector, Store, views
from trainyard.store.projection_check import jobs_missing
from trainyard.testing.publish import publish_event


@pytest.fixture
def credentials() -> Credentials:
    return new_credentials()


@pytest.fixture
def locked_redis(tmp_path: Path, credentials: Credentials) -> Iterator[Server]:
    (tmp_path / "bus").mkdir()
    _, acl = write_server_files(tmp_path / "bus", credentials)
    admin = credentials.redis_user(ADMIN)
    server = start_redis(tmp_path / "redis", acl_file=acl, admin=(admin.name, admin.password))
    yield server
    server.stop()


def store_as(server: Server, credentials: Credentials, name: str) -> Store:
    user = credentials.redis_user(name)
    return Store.from_url(server.url, "ty:", username=user.name, password=user.password)


async def jobs_in_every_state(bus: Bus) -> None:
    """24 jobs: running, succeeded, and accepted only."""
    node = NodeInfo(node_id="n1", cluster="c1", gpu_type="H100", gpus=8)
    await bus.publish(subjects.node("c1", "n1"), NodeRegistered(at=0.0, node=node, boot_id="b1"), msg_id="reg-n1")
    for i in range(24):
        await lifecycle(bus, f"j{i}", f"j{i}-r1", "n1", [i % 8])
        if i % 3 == 0:
            done = RunSucceeded(at=9.0, job_id=f"j{i}", tenant="acme", run_id=f"j{i}-r1")
            await publish_event(bus, done, msg_id=f"j{i}:done")


@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_three_redis_restarts_keep_every_job_and_replay_without_a_critical_line(
    bus: Bus, locked_redis: Server, credentials: Credentials, how: str
) -> None:
    await jobs_in_every_state(bus)
    store = store_as(locked_redis, credentials, "admission")
    try:
        await project(bus, store, "NODES")
        await project(bus, store, "JOBS")
        before, marker = await snapshot(store), await store.projection_state("jobs")
        states = {job.job_id: job for job in await views.list_jobs(store, limit=1000)}
        assert len(states) == 24 and {j.status for j in states.values()} == {"running", "succeeded"}
    finally:
        await store.close()

    for restart in range(3):
        getattr(locked_redis, how)()
        restart_server(locked_redis)
        store = store_as(locked_redis, credentials, "gateway")
        try:
            assert await snapshot(store) == before, f"restart {restart + 1} changed the projection"
            after = {job.job_id: job for job in await views.list_jobs(store, limit=1000)}
            assert after == states
            assert await store.projection_state("jobs") == marker
        finally:
            await store.close()
    log = locked_redis.log_path.read_text()
    assert "CRITICAL" not in log and "NOPERM" not in log


@pytest.mark.parametrize("service", ["admission", "placement", "health", "gateway", "emulator"])
async def test_a_service_user_runs_the_folds_but_cannot_administer_scripts(
    bus: Bus, locked_redis: Server, credentials: Credentials, service: str
) -> None:
    await jobs_in_every_state(bus)
    store = store_as(locked_redis, credentials, service)
    try:
        await project(bus, store, "JOBS")  # EVALSHA, and SCRIPT LOAD on a Redis without the script
        job = await views.get_job(store, "j1")
        assert job is not None and job.status == "running"
        assert await store.redis.eval("return redis.call('GET', KEYS[1])", 1, "ty:nothing") is None
        for command in (
            ("SCRIPT", "FLUSH"),
            ("SCRIPT", "KILL"),
            ("FUNCTION", "FLUSH"),
            ("FUNCTION", "LOAD", "#!lua name=squat\nredis.register_function('f', function() return 1 end)"),
            ("FCALL", "f", "0"),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                await store.redis.execute_command(*command)
        assert await store.redis.script_exists(store._apply_job.sha) == [True]
    finally:
        await store.close()


async def test_no_client_can_log_in_as_the_default_user(locked_redis: Server) -> None:
    for password in ("", "nopass", "default"):
        client = Redis.from_url(locked_redis.url, username="default", password=password or None)
        try:
            with pytest.raises((redis.exceptions.AuthenticationError, redis.exceptions.ResponseError)):
                await asyncio.wait_for(client.get("ty:x"), 10)
        finally:
            await client.aclose()


async def joined(bus: Bus, store: Store) -> Projector:
    """A JOBS projector that has joined the projection in Redis and caught up (a process starting)."""
    projector = Projector(bus, store, "JOBS")
    stop = asyncio.Event()
    task = asyncio.create_task(projector.run(stop))
    await projector.caught_up(timeout=60)
    stop.set()
    await task
    return projector


async def test_a_projection_that_holds_what_its_marker_claims_is_adopted_as_it_is(bus: Bus, store: Store) -> None:
    await jobs_in_every_state(bus)
    first = await joined(bus, store)
    before = await snapshot(store)
    again = await joined(bus, store)
    assert again.epoch == first.epoch and again.lost_count == 0
    assert await snapshot(store) == before


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda s: s.redis.delete(s.key("job", "j23")), id="the newest job's hash is gone"),
        pytest.param(
            lambda s: s.redis.hset(s.key("job", "j23"), "last_seq", 1), id="the newest job is older than its last event"
        ),
        pytest.param(lambda s: s.redis.zrem(s.key("jobs"), "j0"), id="an old job is missing from the jobs index"),
    ],
)
async def test_a_projection_that_does_not_hold_what_its_marker_claims_is_rebuilt_on_start(
    bus: Bus, store: Store, damage: Callable[[Store], Awaitable[object]]
) -> None:
    await jobs_in_every_state(bus)
    first = await joined(bus, store)
    whole = await snapshot(store)
    await damage(store)  # what a partial replay of Redis's log leaves: the marker, not all the state
    assert await jobs_missing(bus, store, (await store.projection_state("jobs"))[1]) is not None

    rebuilt = await joined(bus, store)
    assert rebuilt.lost_count == 1 and rebuilt.epoch != first.epoch
    assert await snapshot(store) == whole


async def test_newest_events_the_fold_did_not_apply_to_their_job_do_not_make_a_whole_projection_rebuild(
    bus: Bus, store: Store
) -> None:
    await jobs_in_every_state(bus)
    # The newest events: a success forged on admission's subject (the fold only moves the
    # sequence past it), and an event for a job that never existed.
    forged = RunSucceeded(at=9.5, job_id="j1", tenant="acme", run_id="j1-r1")
    await publish_event(bus, forged, msg_id="forged", writer="admission")
    await publish_event(bus, RunSucceeded(at=9.5, job_id="nobody", tenant="acme", run_id="x"), msg_id="nobody")
    first = await joined(bus, store)
    assert (await views.get_job(store, "j1")).status == "running"  # type: ignore[union-attr]
    again = await joined(bus, store)
    assert again.epoch == first.epoch and again.lost_count == 0
