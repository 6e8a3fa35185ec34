"""Dead letters through the gateway and the CLI, against real NATS and Redis:
operators list and read them with the reason and where they came from, and
replay a message that was kept whole on its original subject, audited under
the verified caller; a copy cut short, or a JOBS event, is refused saying why."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import msgspec
import pytest
import uvicorn
from typer.testing import CliRunner

from trainyard.bus import Bus, ConsumerSpec, Outcome, Subscription, run_consumer
from trainyard.bus.audit import AuditRecord
from trainyard.bus.consumer import DEAD_LETTER_KEEP_BYTES
from trainyard.cli.main import app as cli
from trainyard.domain import JobSpec, Role
from trainyard.events import SubmitJob, subjects
from trainyard.local.servers import free_port
from trainyard.settings import Settings
from trainyard.store import Projector, Store, views
from trainyard.store.projections import RedisProjections
from trainyard.testing.auth import Callers
from trainyard.testing.fakes import Scripted
from trainyard.testing.waiting import eventually
from trainyard_admission.handlers import IntakeHandler
from trainyard_gateway import dlq_api
from trainyard_gateway.jobs import JobOperations
from trainyard_gateway.rest import create_app

SPEC = JobSpec(tenant="acme", queue="q", roles=[Role(name="t", gpus_per_replica=8)], simulated_duration_s=1.0)
INTAKE = ConsumerSpec(stream="INTAKE", durable="admission-intake", filter_subject=subjects.INTAKE_ALL, max_deliver=1)


def redis_down() -> Scripted:
    """A handler that fails every message as if Redis were down."""
    return Scripted(lambda _: Outcome.failed(ConnectionError("Redis is not answering")))


@pytest.fixture
async def gateway(bus: Bus, store: Store, callers: Callers) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(
        JobOperations(bus, store), store, callers.authenticator, routers=[dlq_api.build_router(bus, store, Settings())]
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        yield c


async def dead_count(bus: Bus) -> int:
    return (await bus.js.stream_info("DEADLETTER")).state.messages


async def consume(
    bus: Bus, spec: ConsumerSpec, handler: Subscription[Any], until: Callable[[], Awaitable[bool]]
) -> None:
    """Run one consumer until ``until()`` holds."""
    stop = asyncio.Event()
    task = asyncio.create_task(run_consumer(bus, spec, handler, stop))
    try:
        await eventually(until, what="the consumer got there")
    finally:
        stop.set()
        await task


async def kill_all(bus: Bus, stream: str, filter_subject: str, reason: str, expect: int) -> None:
    """Dead-letter everything on ``filter_subject`` as poison with ``reason``."""

    poison = Scripted(lambda _: Outcome.poison(reason))
    spec = ConsumerSpec(stream=stream, durable=f"poison-{stream.lower()}", filter_subject=filter_subject)

    async def done() -> bool:
        return await dead_count(bus) >= expect

    await consume(bus, spec, poison, done)


async def audit_records(bus: Bus) -> list[AuditRecord]:
    info = await bus.js.stream_info("AUDIT")
    return [
        msgspec.json.decode((await bus.js.get_msg("AUDIT", s)).data, type=AuditRecord)
        for s in range(max(info.state.first_seq, 1), info.state.last_seq + 1)
    ]


async def test_a_submission_given_up_on_is_listed_shown_and_replayed_into_an_accepted_job(
    gateway: httpx.AsyncClient, bus: Bus, store: Store, callers: Callers
) -> None:
    ack = await bus.publish(subjects.intake("acme"), SubmitJob(at=1.0, spec=SPEC, job_id="lost-1"), msg_id="s1")

    async def one_dead() -> bool:
        return await dead_count(bus) == 1

    await consume(bus, INTAKE, redis_down(), one_dead)  # the last delivery gives up

    listed = (await gateway.get("/v1/deadletters", headers=callers.headers("operator"))).json()["deadletters"]
    [letter] = listed
    assert letter["stream"] == "INTAKE" and letter["subject"] == "trainyard.intake.acme"
    assert letter["stream_seq"] == ack.seq and letter["replayable"] and not letter["truncated"]
    assert "gave up after 1 deliveries" in letter["reason"] and "Redis is not answering" in letter["reason"]
    assert letter["size"] == letter["kept"] > 0 and abs(letter["at"] - time.time()) < 60 and letter["data"] == ""

    shown = (await gateway.get(f"/v1/deadletters/{letter['seq']}", headers=callers.headers("admin"))).json()
    assert msgspec.json.decode(shown["data"].encode())["job_id"] == "lost-1"

    replayed = await gateway.post(
        f"/v1/deadletters/{letter['seq']}/replay", json={"reason": "Redis is back"}, headers=callers.headers("operator")
    )
    assert replayed.status_code == 202, replayed.text
    answer = replayed.json()
    again = await bus.js.get_msg("INTAKE", answer["replayed_seq"])
    assert again.subject == "trainyard.intake.acme" and again.data == (await bus.js.get_msg("INTAKE", ack.seq)).data
    assert again.headers["Nats-Msg-Id"] == answer["msg_id"] != "s1"
    assert again.headers["Trainyard-Replay-Of"] == f"DEADLETTER:{letter['seq']}"
    [record] = [r for r in await audit_records(bus) if r.action == "deadletter.replay"]
    assert record.actor == callers.actor("operator") and record.target == str(letter["seq"])
    assert record.reason == "Redis is back" and record.details["replayed_seq"] == str(answer["replayed_seq"])

    # Admission, working again, accepts the replayed submission (the original stays dead).
    async def accepted() -> bool:
        job = await views.get_job(store, "lost-1")
        return job is not None

    projector = Projector(bus, store, "JOBS")
    stop = asyncio.Event()
    follow = asyncio.create_task(projector.run(stop))
    try:
        await consume(bus, INTAKE, IntakeHandler(RedisProjections(bus, store), time.time), accepted)
    finally:
        stop.set()
        await follow
    assert (await views.get_job(store, "lost-1")).status == "pending"
    assert await dead_count(bus) == 1


async def test_a_truncated_copy_and_a_jobs_event_are_not_replayed_and_say_why(
    gateway: httpx.AsyncClient, bus: Bus, callers: Callers
) -> None:
    big = b'{"type": "SubmitJob", "pad": "' + b"x" * (DEAD_LETTER_KEEP_BYTES + 100) + b'"}'
    await bus.publish_raw(subjects.intake("acme"), big, {"Nats-Msg-Id": "big"})
    await kill_all(bus, "INTAKE", subjects.INTAKE_ALL, "too big to handle", expect=1)
    await bus.publish_raw("trainyard.jobs.acme.j1.admission", b'{"type": "Nonsense"}', {"Nats-Msg-Id": "j"})
    await kill_all(bus, "JOBS", subjects.JOBS_ALL, "not a job event", expect=2)
    operator = callers.headers("operator")

    jobs, intake = (await gateway.get("/v1/deadletters", headers=operator)).json()["deadletters"]
    assert intake["truncated"] and intake["kept"] == DEAD_LETTER_KEEP_BYTES and intake["size"] == len(big)
    assert jobs["stream"] == "JOBS" and not jobs["truncated"] and not jobs["replayable"]
    only_jobs = (await gateway.get("/v1/deadletters?stream=jobs", headers=operator)).json()["deadletters"]
    assert [d["seq"] for d in only_jobs] == [jobs["seq"]]
    paged = (await gateway.get(f"/v1/deadletters?before={jobs['seq']}", headers=operator)).json()["deadletters"]
    assert [d["seq"] for d in paged] == [intake["seq"]]

    cut = await gateway.post(f"/v1/deadletters/{intake['seq']}/replay", headers=operator)
    assert cut.status_code == 409 and "cannot be replayed" in cut.json()["message"]
    assert f"kept only the first {DEAD_LETTER_KEEP_BYTES}" in cut.json()["message"]
    fact = await gateway.post(f"/v1/deadletters/{jobs['seq']}/replay", headers=operator)
    assert fact.status_code == 409 and "record it twice" in fact.json()["message"]
    assert (await bus.js.stream_info("INTAKE")).state.messages == 1  # nothing was published
    assert not [r for r in await audit_records(bus) if r.action == "deadletter.replay"]


@pytest.mark.parametrize(
    ("method", "path", "caller", "status"),
    [
        pytest.param("GET", "/v1/deadletters", "acme", 403, id="a researcher may not list dead letters"),
        pytest.param("GET", "/v1/deadletters/1", "finance", 403, id="finance may not read one"),
        pytest.param("POST", "/v1/deadletters/1/replay", "acme-admin", 403, id="a tenant-admin may not replay"),
        pytest.param("GET", "/v1/deadletters/99", "operator", 404, id="an unknown sequence is not found"),
        pytest.param("POST", "/v1/deadletters/99/replay", "admin", 404, id="nor can it be replayed"),
        pytest.param(
            "GET", "/v1/deadletters/999999999999999999999", "operator", 404, id="a sequence past any stream's"
        ),
        pytest.param("POST", f"/v1/deadletters/{2**64}/replay", "admin", 404, id="nor replayed"),
        pytest.param("DELETE", "/v1/deadletters/1", "acme-admin", 403, id="a tenant-admin may not discard"),
        pytest.param("DELETE", "/v1/deadletters/99", "operator", 404, id="nor can an unknown one be discarded"),
        pytest.param("DELETE", f"/v1/deadletters/{2**64}", "admin", 404, id="nor one past any sequence"),
        pytest.param("GET", "/v1/deadletters?stream=QUEUE", "operator", 422, id="an unknown stream is named"),
        pytest.param("GET", "/v1/deadletters?limit=0", "operator", 422, id="a limit below 1"),
    ],
)
async def test_who_may_read_and_replay_dead_letters(
    gateway: httpx.AsyncClient, callers: Callers, method: str, path: str, caller: str, status: int
) -> None:
    response = await gateway.request(method, path, headers=callers.headers(caller))
    assert response.status_code == status, response.text


async def test_the_cli_lists_shows_replays_and_discards_dead_letters(bus: Bus, store: Store, callers: Callers) -> None:
    await bus.publish(subjects.intake("acme"), SubmitJob(at=1.0, spec=SPEC, job_id="cli-1"), msg_id="c1")

    async def one_dead() -> bool:
        return await dead_count(bus) == 1

    await consume(bus, INTAKE, redis_down(), one_dead)
    app = create_app(
        JobOperations(bus, store), store, callers.authenticator, routers=[dlq_api.build_router(bus, store, Settings())]
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    await eventually(lambda: asyncio.sleep(0, server.started), what="the API serves")
    runner = CliRunner()
    base = ["--api-url", f"http://127.0.0.1:{port}"]

    async def run(*args: str, caller: str = "operator") -> tuple[int, str]:
        argv = ["--token", callers.tokens[caller], "dlq", *args, *base]
        result = await asyncio.to_thread(runner.invoke, cli, argv, catch_exceptions=False, env={"COLUMNS": "250"})
        return result.exit_code, result.output

    try:
        code, out = await run("list")
        assert code == 0 and "INTAKE" in out and "gave up after 1" in out and "trainyard.intake.acme" in out
        code, out = await run("show", "1")
        assert code == 0 and '"job_id":"cli-1"' in out.replace(" ", "") and "replayable" in out
        code, out = await run("replay", "1", "--reason", "retry after the outage")
        assert code == 0 and "replayed dead letter 1 on trainyard.intake.acme as INTAKE seq 2" in out
        code, out = await run("replay", "1", caller="acme")
        assert code == 1 and "403" in out and "operator, admin" in out
        code, out = await run("discard", "1", caller="acme")
        assert code == 1 and "403" in out
        code, out = await run("discard", "1", "--reason", "replayed")
        assert code == 0 and "discarded dead letter 1 (INTAKE, trainyard.intake.acme)" in out
        code, out = await run("show", "1")
        assert code == 1 and "404" in out
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await serving
    assert (await bus.js.stream_info("INTAKE")).state.messages == 2
