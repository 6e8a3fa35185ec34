"""API tokens in the NATS KV bucket: stored hashed, verified, expired and
revoked; a revocation on one gateway reaches every other one that follows
the bucket."""

from __future__ import annotations

import asyncio

import pytest

from trainyard.auth import BadTokenRequest, Role, TokenStore, Unauthenticated
from trainyard.auth.tokens import parse_token
from trainyard.bus import Bus
from trainyard.testing.waiting import eventually


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_a_token_is_stored_hashed_and_verifies_to_its_role_and_tenant(bus: Bus) -> None:
    store = await TokenStore.open(bus.js)

    record, token = await store.create("alice", Role.RESEARCHER, "acme", created_by="test")
    who = await store.verify(token)

    assert (who.role, who.tenant, who.actor) == (Role.RESEARCHER, "acme", f"token:{record.id}:alice")
    raw = (await store.kv.get(f"token.{record.id}")).value
    _, secret = parse_token(token)  # the secret may itself contain "_"
    assert secret.encode() not in raw and record.secret_sha256.encode() in raw


async def test_a_wrong_secret_an_expired_token_and_a_revoked_one_are_refused(bus: Bus) -> None:
    clock = Clock()
    store = await TokenStore.open(bus.js, clock=clock)
    record, token = await store.create("ci", Role.OPERATOR, None, created_by="test", expires_in_s=3600)
    _, other = await store.create("other", Role.ADMIN, None, created_by="test")

    with pytest.raises(Unauthenticated, match="wrong secret"):
        await store.verify(token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB"))
    clock.now += 3601
    with pytest.raises(Unauthenticated, match="expired"):
        await store.verify(token)
    revoked = await store.revoke(record.id, revoked_by="test")
    assert revoked.revoked and (await store.revoke(record.id, revoked_by="someone else")).revoked_by == "test"
    assert (await store.verify(other)).role is Role.ADMIN


@pytest.mark.parametrize(
    ("name", "role", "tenant", "expires", "field"),
    [
        pytest.param("bob", "wizard", None, None, "role", id="an unknown role"),
        pytest.param("bob", Role.RESEARCHER, None, None, "tenant", id="a researcher without a tenant"),
        pytest.param("bob", Role.OPERATOR, "acme", None, "tenant", id="an operator bound to a tenant"),
        pytest.param("bob smith", Role.ADMIN, None, None, "name", id="a name with a space"),
        pytest.param("bob", Role.ADMIN, None, -5.0, "expires_in_s", id="a lifetime below zero"),
    ],
)
async def test_a_bad_token_request_names_the_field_and_stores_nothing(
    bus: Bus, name: str, role: str, tenant: str | None, expires: float | None, field: str
) -> None:
    store = await TokenStore.open(bus.js)

    with pytest.raises(BadTokenRequest) as raised:
        await store.create(name, role, tenant, created_by="test", expires_in_s=expires)

    assert raised.value.field == field
    assert await store.list() == []


async def test_a_revocation_reaches_another_gateway_following_the_bucket(bus: Bus) -> None:
    here, there = await TokenStore.open(bus.js), await TokenStore.open(bus.js)
    stop = asyncio.Event()
    following = asyncio.create_task(there.follow(stop))
    try:
        record, token = await here.create("portal", Role.RESEARCHER, "acme", created_by="test")
        await there.ready.wait()
        assert (await there.verify(token)).tenant == "acme"

        await here.revoke(record.id, revoked_by="test")

        async def refused_there() -> bool:
            try:
                await there.verify(token)
            except Unauthenticated:
                return True
            return False

        await eventually(refused_there, timeout=10, what="the other gateway to refuse the revoked token")
    finally:
        stop.set()
        await following
