"""The console's token and dead-letter pages, in the gateway's app against
real NATS and Redis: only the roles the policy allows see them (and the links
to them), a new token's secret is shown once, revoking and replaying need a
confirmation, and both are audited as the REST API audits them."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx
import msgspec
import pytest
from gateway_fixtures import client, csrf_of, gateway_app, log_in

from trainyard.bus import Bus
from trainyard.bus.audit import AuditRecord
from trainyard.domain import JobSpec, Role
from trainyard.events import SubmitJob, subjects
from trainyard.settings import Settings
from trainyard.store import Store
from trainyard.testing.auth import Callers
from trainyard.testing.deadletters import give_up_on

Browser = Callable[[str], AbstractAsyncContextManager[httpx.AsyncClient]]
SPEC = JobSpec(tenant="acme", queue="default", roles=[Role(name="t", gpus_per_replica=8)], simulated_duration_s=1.0)


@pytest.fixture
def browser_as(bus: Bus, store: Store, callers: Callers, tmp_path: Any) -> Browser:
    app = gateway_app(bus, store, callers.authenticator, Settings(ledger_url=f"sqlite:///{tmp_path}/ledger.db"))

    @asynccontextmanager
    async def logged_in(name: str) -> AsyncIterator[httpx.AsyncClient]:
        async with client(app) as browser:
            await log_in(browser, callers.tokens[name])
            yield browser

    return logged_in


async def audit_records(bus: Bus, action: str) -> list[AuditRecord]:
    info = await bus.js.stream_info("AUDIT")
    records = [
        msgspec.json.decode((await bus.js.get_msg("AUDIT", s)).data, type=AuditRecord)
        for s in range(max(info.state.first_seq, 1), info.state.last_seq + 1)
    ]
    return [r for r in records if r.action == action]


@pytest.mark.parametrize(
    ("caller", "tokens", "deadletters"),
    [("admin", 200, 200), ("acme-admin", 200, 403), ("operator", 403, 200), ("finance", 403, 403), ("acme", 403, 403)],
)
async def test_each_role_sees_the_pages_and_links_the_policy_allows(
    browser_as: Browser, caller: str, tokens: int, deadletters: int
) -> None:
    async with browser_as(caller) as browser:
        for path, expected in (("/admin/tokens", tokens), ("/admin/deadletters", deadletters)):
            answer = await browser.get(path)
            assert answer.status_code == expected, (path, answer.text)
            nav = re.search(r"<nav>.*?</nav>", answer.text, re.S)
            assert nav and (f'href="{path}"' in nav.group(0)) == (expected == 200), nav.group(0)


async def test_a_token_is_created_with_its_secret_shown_once_and_revoked_after_a_confirmation(
    browser_as: Browser, bus: Bus, callers: Callers
) -> None:
    async with browser_as("admin") as browser:
        page = (await browser.get("/admin/tokens")).text
        assert "acme-admin" in page and 'title="token:' in page  # creators by name, the raw id on hover
        fields = {"csrf": csrf_of(page), "name": "alice", "role": "researcher", "tenant": "acme", "lifetime": "30 days"}
        created = await browser.post("/admin/tokens", data=fields)
        assert created.status_code == 201
        secret = re.search(r'id="token-secret" value="(ty_[0-9a-f]{16}_[A-Za-z0-9_-]{43})"', created.text)
        assert secret, created.text
        token_id = secret.group(1)[3:19]
        assert secret.group(1) not in (await browser.get("/admin/tokens")).text, "the secret is shown once"
        [record] = await audit_records(bus, "token.create")
        assert record.target == token_id and record.actor == callers.actor("admin")

        refused = await browser.post("/admin/tokens", data=fields | {"name": "no spaces please"})
        assert refused.status_code == 422 and "No token was created" in refused.text and "name" in refused.text

        confirm = await browser.get(f"/admin/tokens/{token_id}/revoke")
        assert confirm.status_code == 200 and "Revoke token alice?" in confirm.text
        unconfirmed = await browser.post(f"/admin/tokens/{token_id}/revoke", data={"csrf": fields["csrf"]})
        assert unconfirmed.status_code == 200 and not (await callers.store.get(token_id)).revoked
        done = await browser.post(
            f"/admin/tokens/{token_id}/revoke", data={"csrf": fields["csrf"], "confirm": token_id}
        )
        assert done.status_code == 303 and (await callers.store.get(token_id)).revoked
        listed = (await browser.get("/admin/tokens")).text
        assert re.search(rf'id="token-{token_id}" data-state="revoked"', listed)
        assert len(await audit_records(bus, "token.revoke")) == 1


async def test_a_tenant_admin_manages_its_own_tenants_researchers_only(browser_as: Browser, callers: Callers) -> None:
    async with browser_as("acme-admin") as browser:
        page = (await browser.get("/admin/tokens")).text
        assert "globex" not in page and "<option>admin</option>" not in page
        assert f"/admin/tokens/{callers.ids['admin']}/revoke" not in page
        assert (await browser.get(f"/admin/tokens/{callers.ids['globex']}/revoke")).status_code == 404
        fields = {"csrf": csrf_of(page), "name": "boss", "role": "admin", "tenant": "", "lifetime": "1 day"}
        refused = await browser.post("/admin/tokens", data=fields)
        assert refused.status_code == 403 and "may create only" in refused.text


async def test_a_dead_letter_is_listed_inspected_and_replayed_after_a_confirmation(
    browser_as: Browser, bus: Bus, callers: Callers
) -> None:
    ack = await bus.publish(subjects.intake("acme"), SubmitJob(at=1.0, spec=SPEC, job_id="lost-1"), msg_id="s1")
    await give_up_on(bus, "INTAKE", ack.seq, "cannot be handled: Redis is not answering")
    async with browser_as("operator") as browser:
        listed = (await browser.get("/admin/deadletters")).text
        assert 'id="dl-1"' in listed and "Redis is not answering" in listed and "/admin/deadletters/1/replay" in listed
        assert 'id="dl-1"' not in (await browser.get("/admin/deadletters?stream=NODES")).text
        shown = (await browser.get("/admin/deadletters/1")).text
        assert "lost-1" in shown and "trainyard.intake.acme" in shown

        confirm = (await browser.get("/admin/deadletters/1/replay")).text
        assert "Replay dead letter 1?" in confirm
        before = (await bus.js.stream_info("INTAKE")).state.last_seq
        await browser.post("/admin/deadletters/1/replay", data={"csrf": csrf_of(confirm)})
        assert (await bus.js.stream_info("INTAKE")).state.last_seq == before, "nothing replayed unconfirmed"
        done = await browser.post(
            "/admin/deadletters/1/replay", data={"csrf": csrf_of(confirm), "confirm": "1", "reason": "Redis is back"}
        )
        assert done.status_code == 303 and (await bus.js.stream_info("INTAKE")).state.last_seq == before + 1
        assert "was replayed" in (await browser.get(done.headers["location"])).text
        [record] = await audit_records(bus, "deadletter.replay")
        assert record.actor == callers.actor("operator") and record.reason == "Redis is back"


async def test_a_dead_letter_is_discarded_after_a_confirmation_from_the_console_or_the_api(
    browser_as: Browser, bus: Bus, callers: Callers, store: Store
) -> None:
    for n in (1, 2):
        ack = await bus.publish(subjects.intake("acme"), SubmitJob(at=1.0, spec=SPEC, job_id=f"j{n}"), msg_id=f"s{n}")
        await give_up_on(bus, "INTAKE", ack.seq, "cannot be decoded: nonsense")
    async with browser_as("operator") as browser:
        confirm = await browser.get("/admin/deadletters/1/discard")
        assert confirm.status_code == 200 and "Discard dead letter 1?" in confirm.text
        await browser.post("/admin/deadletters/1/discard", data={"csrf": csrf_of(confirm.text)})
        assert (await bus.js.stream_info("DEADLETTER")).state.messages == 2, "nothing discarded unconfirmed"
        done = await browser.post(
            "/admin/deadletters/1/discard", data={"csrf": csrf_of(confirm.text), "confirm": "1", "reason": "handled"}
        )
        assert done.status_code == 303 and (await bus.js.stream_info("DEADLETTER")).state.messages == 1
        assert 'id="dl-1"' not in (await browser.get(done.headers["location"])).text
    api = client(gateway_app(bus, store, callers.authenticator, Settings()))
    async with api:
        refused = await api.request("DELETE", "/v1/deadletters/2", headers=callers.headers("finance"))
        assert refused.status_code == 403
        gone = await api.request(
            "DELETE", "/v1/deadletters/2", json={"reason": "seen"}, headers=callers.headers("admin")
        )
        assert gone.status_code == 200 and gone.json()["seq"] == 2
        again = await api.request("DELETE", "/v1/deadletters/2", headers=callers.headers("admin"))
        assert again.status_code == 404
    records = await audit_records(bus, "deadletter.discard")
    assert [(r.target, r.actor, r.reason) for r in records] == [
        ("1", callers.actor("operator"), "handled"),
        ("2", callers.actor("admin"), "seen"),
    ]
