"""Verified callers for tests and benchmarks: one API token per role (and
tenant), created in the real token store on a NATS server."""

from __future__ import annotations

from trainyard.auth import Authenticator, Role, TokenStore
from trainyard.bus import Bus

#: caller name -> (role, tenant)
CALLERS: dict[str, tuple[Role, str | None]] = {
    "admin": (Role.ADMIN, None),
    "operator": (Role.OPERATOR, None),
    "finance": (Role.FINANCE, None),
    "acme": (Role.RESEARCHER, "acme"),
    "acme-admin": (Role.TENANT_ADMIN, "acme"),
    "globex": (Role.RESEARCHER, "globex"),
}


class Callers:
    """Tokens by caller name, and the headers that present them."""

    def __init__(self, store: TokenStore, tokens: dict[str, str], ids: dict[str, str]) -> None:
        self.store = store
        self.tokens = tokens
        self.ids = ids  # caller name -> token id

    def headers(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[name]}"}

    def metadata(self, name: str) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.tokens[name]}"),)

    def actor(self, name: str) -> str:
        return f"token:{self.ids[name]}:{name}"

    @property
    def authenticator(self) -> Authenticator:
        return Authenticator(self.store)


async def issue(bus: Bus) -> Callers:
    """A token for each of :data:`CALLERS`."""
    store = await TokenStore.open(bus.js)
    tokens, ids = {}, {}
    for name, (role, tenant) in CALLERS.items():
        record, token = await store.create(name, role, tenant, created_by="test")
        tokens[name], ids[name] = token, record.id
    return Callers(store, tokens, ids)


async def issue_at(nats_url: str) -> Callers:
    """:func:`issue` on the NATS at ``nats_url`` (a running stack's); the
    tokens and headers stay usable, the returned store does not."""
    bus = await Bus.connect(nats_url, name="trainyard-test-auth")
    try:
        return await issue(bus)
    finally:
        await bus.close()
