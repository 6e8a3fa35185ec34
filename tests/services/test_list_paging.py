"""The small lists take the same paging contract as jobs, on real NATS and
Redis: ``limit`` and ``cursor`` in, ``next_cursor`` out (null at the end) for
nodes, API tokens and dead letters; a cursor of one list is refused by another
with a 400 that says what to send."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_fixtures import client, gateway_app

from trainyard import paging
from trainyard.bus import Bus, PublishRequest
from trainyard.domain import NodeInfo
from trainyard.events import NodeRegistered, subjects
from trainyard.settings import Settings
from trainyard.store import Store
from trainyard.testing.auth import CALLERS, Callers
from trainyard.testing.streams import project


@pytest.fixture
async def api(bus: Bus, store: Store, callers: Callers, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}")
    async with client(gateway_app(bus, store, callers.authenticator, settings)) as gateway:
        yield gateway


async def walk(api: httpx.AsyncClient, path: str, key: str, headers: dict[str, str], **params: Any) -> list[Any]:
    """Every item of the list at ``path``, page after page; asserts each page but the last has a next_cursor."""
    items: list[Any] = []
    cursor = None
    while True:
        answer = await api.get(path, params={**params, "cursor": cursor}, headers=headers)
        assert answer.status_code == 200, answer.text
        items += answer.json()[key]
        cursor = answer.json()["next_cursor"]
        if cursor is None:
            return items


async def test_nodes_page_by_node_id(api: httpx.AsyncClient, bus: Bus, store: Store, callers: Callers) -> None:
    names = [f"gpu-{i:02d}" for i in range(7)]
    registered = [
        NodeRegistered(at=1.0, node=NodeInfo(node_id=n, cluster="c", gpu_type="H100", gpus=8), boot_id="b")
        for n in reversed(names)
    ]
    await bus.publish_many([PublishRequest(subjects.node("c", e.node.node_id), e, e.node.node_id) for e in registered])
    await project(bus, store, "NODES")

    nodes = await walk(api, "/v1/nodes", "nodes", callers.headers("admin"), limit=3)
    whole = (await api.get("/v1/nodes", headers=callers.headers("admin"))).json()

    assert [n["node_id"] for n in nodes] == names
    assert len(whole["nodes"]) == 7 and whole["next_cursor"] is None  # without limit: every node, as before


async def test_tokens_page_and_a_tenant_admin_sees_only_its_tenant_s_on_every_page(
    api: httpx.AsyncClient, callers: Callers
) -> None:
    every = await walk(api, "/v1/auth/tokens", "tokens", callers.headers("admin"), limit=2)
    acme = await walk(api, "/v1/auth/tokens", "tokens", callers.headers("acme-admin"), limit=1)

    assert sorted(t["name"] for t in every) == sorted(CALLERS)
    assert len({t["id"] for t in every}) == len(CALLERS)
    assert sorted(t["name"] for t in acme) == ["acme", "acme-admin"]


async def test_dead_letters_page_newest_first_and_a_jobs_cursor_is_refused(
    api: httpx.AsyncClient, bus: Bus, callers: Callers
) -> None:
    for n in range(5):
        headers = {"Trainyard-Reason": f"gave up {n}", "Trainyard-Subject": subjects.intake("acme")}
        await bus.publish_raw(subjects.deadletter("INTAKE"), b"{}", {**headers, "Nats-Msg-Id": f"dl-{n}"})
    operator = callers.headers("operator")

    letters = await walk(api, "/v1/deadletters", "deadletters", operator, limit=2)
    only_jobs = await api.get("/v1/deadletters", params={"stream": "jobs"}, headers=operator)
    jobs_cursor = paging.encode("jobs", {"tenant": None}, [7.0, "j-7"])
    refused = await api.get("/v1/deadletters", params={"cursor": jobs_cursor}, headers=operator)

    assert [d["reason"] for d in letters] == [f"gave up {n}" for n in reversed(range(5))]
    assert only_jobs.json() == {"deadletters": [], "next_cursor": None}
    assert refused.status_code == 400 and refused.json()["errors"][0]["field"] == "cursor"
    assert refused.json()["errors"][0]["message"].startswith("the cursor pages jobs, not deadletters")


async def test_a_cursor_of_one_list_is_refused_by_another(api: httpx.AsyncClient, callers: Callers) -> None:
    first = (await api.get("/v1/auth/tokens", params={"limit": 1}, headers=callers.headers("admin"))).json()
    # a tokens cursor as the gateway writes it, after the first token listed
    # (made here: a list that shows one token so far has no next page)
    tokens_cursor = paging.encode("tokens", {}, [first["tokens"][0]["id"]])

    refused = await api.get("/v1/nodes", params={"cursor": tokens_cursor}, headers=callers.headers("admin"))

    assert refused.status_code == 400
    assert refused.json()["errors"][0]["message"].startswith("the cursor pages tokens, not nodes")
