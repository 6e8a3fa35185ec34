"""The console's node pages without a browser, against real NATS and Redis:
only the commands a node's state allows are offered; a command goes through
its confirmation page and is published only once confirmed with the CSRF
token; one the state refuses goes back saying why; the nodes list filters by
state and links nodes only for roles that may open them; a node's page names
the people who acted on it, with their ids on hover."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest
from gateway_fixtures import client, csrf_of, gateway_app, log_in

from trainyard.bus import Bus
from trainyard.core.health import Cordon, NodeHealthRecord, Uncordon, transition
from trainyard.domain import NodeInfo
from trainyard.events import NodeRegistered, subjects
from trainyard.settings import Settings
from trainyard.store import Store
from trainyard.testing.auth import Callers
from trainyard.testing.streams import project


@pytest.fixture
async def app(bus: Bus, store: Store, callers: Callers, tmp_path: Any) -> AsyncIterator[Any]:
    for node_id in ("n1", "n2"):
        node = NodeInfo(node_id=node_id, cluster="c1", gpu_type="H100", gpus=8)
        event = NodeRegistered(at=0.0, node=node, boot_id="b1")
        await bus.publish(subjects.node("c1", node_id), event, msg_id=f"reg-{node_id}")
    await project(bus, store, "NODES", "JOBS")
    yield gateway_app(bus, store, callers.authenticator, Settings(ledger_url=f"sqlite:///{tmp_path}/ledger.db"))


@contextlib.asynccontextmanager
async def browser_as(app: Any, callers: Callers, caller: str) -> AsyncIterator[httpx.AsyncClient]:
    async with client(app) as browser:
        await log_in(browser, callers.tokens[caller])
        yield browser


async def nodes_stream_last(bus: Bus) -> int:
    return (await bus.js.stream_info("NODES")).state.last_seq


async def test_a_cordon_is_published_only_once_confirmed_with_the_csrf_token(
    app: Any, bus: Bus, callers: Callers
) -> None:
    async with browser_as(app, callers, "operator") as browser:
        node_page = await browser.get("/nodes/n1")
        csrf = csrf_of(node_page.text)
        before = await nodes_stream_last(bus)

        asked = await browser.post("/nodes/n1/cordon", data={"reason": "fan noise", "csrf": csrf})
        unsigned = await browser.post("/nodes/n1/cordon", data={"reason": "fan noise", "confirm": "yes"})
        assert await nodes_stream_last(bus) == before, "neither the question nor an unsigned answer sends it"

        confirmed = await browser.post(
            "/nodes/n1/cordon", data={"reason": "fan noise", "confirm": "yes", "csrf": csrf_of(asked.text)}
        )

    assert 'value="cordon"' in node_page.text and 'value="drain"' in node_page.text
    assert 'value="uncordon"' not in node_page.text, "a healthy node is not offered an uncordon"
    assert asked.status_code == 200 and "Cordon node <code>n1</code>?" in asked.text
    assert 'name="confirm" value="yes"' in asked.text and "fan noise" in asked.text
    assert unsigned.status_code == 403
    assert confirmed.status_code == 303 and "cordon+accepted" in confirmed.headers["location"]
    assert await nodes_stream_last(bus) == before + 1


async def test_a_command_the_state_refuses_goes_back_saying_why_and_sends_nothing(
    app: Any, bus: Bus, callers: Callers
) -> None:
    async with browser_as(app, callers, "operator") as browser:
        csrf = csrf_of((await browser.get("/nodes/n1")).text)
        before = await nodes_stream_last(bus)

        answer = await browser.post("/nodes/n1/uncordon", data={"reason": "back", "csrf": csrf})
        shown = await browser.get(answer.headers["location"])

    assert answer.status_code == 303
    assert "cannot uncordon n1 (healthy): node is already healthy" in shown.text
    assert await nodes_stream_last(bus) == before


@pytest.mark.parametrize(("caller", "links"), [("acme", False), ("finance", False), ("operator", True)])
async def test_the_nodes_list_links_nodes_only_for_roles_that_may_open_them(
    app: Any, callers: Callers, caller: str, links: bool
) -> None:
    async with browser_as(app, callers, caller) as browser:
        every = await browser.get("/nodes")
        cordoned = await browser.get("/nodes", params={"state": "cordoned"})
        healthy = await browser.get("/nodes", params={"state": "healthy"})
        bogus = await browser.get("/nodes", params={"state": "asleep"})
        cluster = await browser.get("/cluster")

    assert every.status_code == 200 and every.text.count('<tr data-node="') == 2
    assert ('href="/nodes/n1"' in every.text) is links and ('href="/nodes/n1"' in cluster.text) is links
    schedulable = "<strong>16</strong>&nbsp;schedulable"
    assert schedulable in every.text and schedulable in cluster.text
    assert cordoned.text.count('<tr data-node="') == 0 and "No node is cordoned." in cordoned.text
    assert healthy.text.count('<tr data-node="') == 2
    assert bogus.status_code == 422 and "&#39;asleep&#39; is not a node state; use one of: healthy" in bogus.text


async def test_a_node_page_names_the_people_who_acted_on_it_with_their_ids_on_hover(
    app: Any, store: Store, callers: Callers
) -> None:
    cordoner, uncordoner = f"operator:{callers.actor('operator')}", f"operator:{callers.actor('admin')}"
    record = NodeHealthRecord(node_id="n1")
    for at, command in enumerate(
        (
            Cordon(node_id="n1", by=cordoner, reason="fan noise"),
            Uncordon(node_id="n1", by=uncordoner, reason="fan fixed"),
            Cordon(node_id="n1", by=cordoner, reason="fan noise again"),
        ),
        start=1,
    ):
        record, _ = transition(record, command, float(at))
    # as the health service keeps it
    await store.redis.hset(store.key("health", "rec"), "n1", msgspec.json.encode(record))

    async with browser_as(app, callers, "operator") as browser:
        shown = (await browser.get("/nodes/n1")).text

    assert record.cordoned_by == cordoner
    assert f'<dt>Cordoned by</dt><dd><span class="actor" title="{cordoner}">operator</span></dd>' in shown
    assert f'uncordoned by <span class="actor" title="{uncordoner}">admin</span>: fan fixed' in shown
    assert f">{cordoner}<" not in shown and f">{uncordoner}" not in shown, "no raw id is shown as text"
