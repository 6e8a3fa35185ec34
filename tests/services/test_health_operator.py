"""Operators and repair against real NATS and Redis: the REST routes publish
commands, health carries them out; checks are asked of the node's agent
(here the emulator); a lost node that reports again goes through repair."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import nats.errors
import pytest
from health_fixtures import CLUSTER, fleet, harness
from test_health_service import consume, eventually

from trainyard.agent.control import ControlRequest, decode_reply, emulator_control_subject, encode
from trainyard.core.health import HealthPolicy
from trainyard.emulator import EmulatedCluster
from trainyard.events import NodeLost, NodeRegistered, RunFailed, subjects
from trainyard.settings import Settings
from trainyard.testing.auth import Callers
from trainyard.testing.streams import read_raw
from trainyard_gateway import nodes_api
from trainyard_gateway.jobs import JobOperations
from trainyard_gateway.rest import create_app


def api(h, callers: Callers, caller: str = "operator") -> httpx.AsyncClient:  # type: ignore[no-untyped-def]
    """The gateway's app with the node routes, called as ``caller``."""
    routers = [nodes_api.build_router(h.bus, h.store, Settings())]
    app = create_app(JobOperations(h.bus, h.store), h.store, callers.authenticator, routers=routers)
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test", headers=callers.headers(caller)
    )


@pytest.mark.parametrize(
    "steps, final",
    [
        pytest.param([("cordon", 202, "cordoned")], "cordoned", id="cordon takes a healthy node out of service"),
        pytest.param(
            [("cordon", 202, "cordoned"), ("uncordon", 202, "healthy")],
            "healthy",
            id="uncordon returns a cordoned node",
        ),
        pytest.param([("uncordon", 409, None)], "healthy", id="uncordon of a healthy node is refused with the reason"),
        pytest.param([("drain", 202, "draining")], "repair", id="drain preempts the runs and the node goes to repair"),
    ],
)
async def test_operator_commands_through_rest(bus, store, callers, steps, final) -> None:
    async with harness(bus, store) as h:
        stop = asyncio.Event()
        tasks = await consume(h, stop)
        try:
            await h.run_job("j", ["n6"])
            async with api(h, callers) as http:
                for op, status, expected in steps:
                    r = await http.post(
                        f"/v1/nodes/n6/{op}", json={"reason": "maintenance"}, headers={"X-Trainyard-Operator": "ann"}
                    )  # a claim that is ignored
                    assert r.status_code == status, r.text
                    if status == 202:
                        assert r.json()["expected_state"] == expected
                        assert await eventually(lambda: _history_has(h, "n6", expected)), f"n6 never became {expected}"  # noqa: B023 - awaited in this iteration
                assert await eventually(lambda: _is(h, "n6", final))
                history = (await http.get("/v1/nodes/n6/history")).json()
            if any(status == 202 for _, status, _ in steps):
                assert history["history"][0]["cause"] in ("Cordon", "Drain")
                assert history["history"][0]["detail"] == "maintenance"
            failed = [(e.job_id, e.reason) for e in await h.job_events() if isinstance(e, RunFailed)]
            assert failed == ([("j", "preempted")] if steps[0][0] == "drain" else [])
            audits = [json.loads(d) for _, _, d in await read_raw(h.bus, "AUDIT")]
            assert {a["actor"] for a in audits if a["action"] == f"node.{steps[0][0]}"} <= {callers.actor("operator")}
        finally:
            stop.set()
            await asyncio.gather(*tasks)


async def _is(h, node: str, state: str) -> bool:  # type: ignore[no-untyped-def]
    return await h.state(node) == state


async def _history_has(h, node: str, state: str) -> bool:  # type: ignore[no-untyped-def]
    """The node passed through ``state`` (the test's node starts with no history)."""
    return any(e.to_state.value == state for e in (await h.monitor.records.load(node)).history)


@pytest.mark.parametrize(
    "method, path, caller, body, status",
    [
        pytest.param("POST", "/v1/nodes/nope/cordon", "operator", {"reason": "x"}, 404, id="an unknown node is 404"),
        pytest.param("POST", "/v1/nodes/n1/cordon", "operator", {"reason": ""}, 422, id="an empty reason is refused"),
        pytest.param(
            "POST", "/v1/nodes/n1/cordon", "operator", {"why": "x"}, 422, id="a body without a reason is refused"
        ),
        pytest.param("POST", "/v1/nodes/n1/cordon", "acme", {"reason": "x"}, 403, id="a researcher may not cordon"),
        pytest.param("POST", "/v1/nodes/n1/drain", "finance", {"reason": "x"}, 403, id="finance may not drain"),
        pytest.param("GET", "/v1/nodes/nope/history", "operator", None, 404, id="history of an unknown node is 404"),
    ],
)
async def test_bad_node_requests_get_a_clear_answer_and_change_nothing(
    bus, store, callers, method, path, caller, body, status
) -> None:
    async with harness(bus, store) as h:
        before = (await bus.js.stream_info("NODES")).state.last_seq
        async with api(h, callers, caller) as http:
            r = await http.request(method, path, json=body)
        assert r.status_code == status
        assert r.json()["message"]
        assert (await bus.js.stream_info("NODES")).state.last_seq == before


async def test_an_emulated_node_answers_checks_and_injected_faults_reach_health(bus, store) -> None:
    async with harness(bus, store, HealthPolicy(blast_radius_max_share=0.5)) as h:
        stop = asyncio.Event()
        tasks = await consume(h, stop)
        emulator = EmulatedCluster(bus, store, fleet(8), telemetry_interval_s=0.5)
        emu = asyncio.create_task(emulator.run(stop))
        try:

            async def ask(**kw) -> tuple[bool, str]:  # type: ignore[no-untyped-def]
                msg = await bus.nc.request(emulator_control_subject(CLUSTER), encode(ControlRequest(**kw)), timeout=5)
                reply = decode_reply(msg.data)
                return reply.ok, reply.message

            async def unknown_node_refused() -> bool:  # the emulator answers once it has subscribed
                try:
                    return (await ask(op="xid", node_id="n99", xid=79))[0] is False
                except nats.errors.NoRespondersError:
                    return False

            assert await eventually(unknown_node_refused, what="the emulator answers its control subject")
            assert (await ask(op="xid", node_id="n1", gpu=9, xid=79))[0] is False
            # Overheating: suspect, checks fail while hot -> cordoned.
            assert (await ask(op="overheat", node_id="n3", gpu=1, temperature_c=96.0))[0]
            assert await eventually(lambda: _is(h, "n3", "cordoned"))
            # An XID is published at once, with an acknowledgement.
            ok, message = await ask(op="xid", node_id="n5", gpu=2, xid=79)
            assert ok and "XID 79" in message
            assert await eventually(lambda: _is(h, "n5", "repair"))
            n5 = await read_raw(bus, "TELEMETRY", subjects.telemetry(CLUSTER, "n5"))
            xids = [d for _, _, d in n5 if b"XidObserved" in d]
            assert len(xids) == 1
            # A burst of corrected ECC errors: suspect, then back once checks pass.
            assert (await ask(op="ecc", node_id="n6", count=5000))[0]
            history = await eventually(lambda: _history_reaches(h, "n6", ["suspect", "healthy"]))
            assert history
        finally:
            stop.set()
            await asyncio.gather(emu, *tasks)


async def _history_reaches(h, node: str, states: list[str]) -> bool:  # type: ignore[no-untyped-def]
    record = await h.monitor.records.load(node)
    return [e.to_state.value for e in record.history] == states


async def _history_begins(h, node: str, states: list[str]) -> bool:  # type: ignore[no-untyped-def]
    """Whether the node's history starts with ``states``, whatever it has moved on to since."""
    record = await h.monitor.records.load(node)
    return [e.to_state.value for e in record.history][: len(states)] == states


async def test_a_lost_node_that_reports_again_goes_through_repair_and_checks(bus, store) -> None:
    async with harness(bus, store) as h:
        stop = asyncio.Event()
        tasks = await consume(h, stop)
        emulator = EmulatedCluster(bus, store, fleet(8), telemetry_interval_s=0.5)
        emu = asyncio.create_task(emulator.run(stop))
        try:

            async def registered() -> bool:
                return await store.redis.hget(store.key("node", "n2"), "boot_id") == emulator.boot_id

            assert await eventually(registered)
            await h.run_job("j", ["n2"])
            lost = NodeLost(
                at=time.time(), node_id="n2", cluster=CLUSTER, boot_id=emulator.boot_id, last_heartbeat_at=0.0
            )
            await bus.publish(subjects.node(CLUSTER, "n2"), lost, msg_id="lost:n2")
            # The emulator goes on heartbeating n2, so the node may already be in repair (or healthy again) by
            # the time the loss is read back: wait for the loss, not for the loss to be the last state.
            assert await eventually(lambda: _history_begins(h, "n2", ["lost"]))

            async def failed_runs() -> list[tuple[str, str]]:
                return [(e.job_id, e.reason) for e in await h.job_events() if isinstance(e, RunFailed)]

            assert await eventually(failed_runs) == [("j", "node_failure")]  # published after the record is saved
            again = NodeRegistered(at=time.time(), node=fleet(8)[2], boot_id="b2")
            await bus.publish(subjects.node(CLUSTER, "n2"), again, msg_id="reg:n2:b2")
            assert await eventually(lambda: _history_reaches(h, "n2", ["lost", "repair", "healthy"]))
            assert await h.state("n2") == "healthy"
        finally:
            stop.set()
            await asyncio.gather(emu, *tasks)
