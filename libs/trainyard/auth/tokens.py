"""API tokens for portals, the CLI and services, kept in the NATS KV bucket
``trainyard-auth`` so every gateway shares them and they survive the loss of
Redis (which holds only throw-away projections).

A token reads ``ty_<id>_<secret>``: ``id`` is 16 hex digits (the KV key
``token.<id>``), ``secret`` 256 random bits in URL-safe base64.  Only the
SHA-256 of the secret is stored.  A fast hash is enough here: the secret is
uniformly random and as long as the hash, so there is nothing to guess faster
than 2**256 tries, and a slow password hash would only slow every request.
Hashes are compared in constant time.

A gateway keeps a copy of every record, followed by a watch on the bucket, so
a revocation made through any gateway applies everywhere within about a second.
An id the copy lacks is asked of the bucket only as often as
:class:`~trainyard.auth.lookups.Lookups` allows, so random ids cost no NATS
round trip each.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Callable

import msgspec
from nats.js.api import StorageType
from nats.js.errors import BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from trainyard.auth.lookups import Lookups
from trainyard.auth.principal import Principal, Role, Unauthenticated, check_name, parse_role, principal

log = logging.getLogger(__name__)

BUCKET = "trainyard-auth"
PREFIX = "ty_"
MAX_LIFETIME_S = 3650 * 86_400.0
_ID = re.compile(r"[0-9a-f]{16}")
_SECRET = re.compile(r"[A-Za-z0-9_-]{43}")
_NO_MATCH = hashlib.sha256(b"no such token").hexdigest()  # compared against when the id is unknown


class TokenRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the bucket holds for one token: never the secret itself."""

    id: str
    name: str
    role: Role
    tenant: str | None = None  # set exactly for tenant-bound roles
    secret_sha256: str  # hex SHA-256 of the secret part
    created_at: float
    created_by: str  # the actor who created it
    expires_at: float | None = None  # Unix time; None: until revoked
    revoked: bool = False
    revoked_at: float | None = None
    revoked_by: str | None = None


class TokenNotFound(Exception):
    pass


class BadTokenRequest(ValueError):
    """A token that cannot be created as asked; the message says what to fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field  # the request field to fix


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_token(presented: str) -> tuple[str, str]:
    """``(id, secret)`` of ``ty_<id>_<secret>``; :class:`Unauthenticated` when it is not one."""
    if not presented.startswith(PREFIX):
        raise Unauthenticated("not a Trainyard API token (those start with 'ty_')")
    token_id, _, secret = presented[len(PREFIX) :].partition("_")
    if not _ID.fullmatch(token_id) or not _SECRET.fullmatch(secret):
        raise Unauthenticated("malformed API token: expected ty_<16 hex digits>_<43 characters>; copy it whole")
    return token_id, secret


def is_token_id(value: str) -> bool:
    return bool(_ID.fullmatch(value))


def when(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _key(token_id: str) -> str:
    return f"token.{token_id}"


class TokenStore:
    def __init__(self, kv: KeyValue, clock: Callable[[], float] = time.time, resync_s: float = 60.0) -> None:
        self.kv = kv
        self.clock = clock
        self.resync_s = resync_s  # the watch is restarted this often, so nothing missed lingers
        self._records: dict[str, TokenRecord] = {}  # id -> record, as the watch last saw it
        self.ready = asyncio.Event()  # set once the watch has loaded every record
        self.lookups = Lookups()  # how often an id this copy lacks is asked of the bucket

    @classmethod
    async def open(cls, js, replicas: int = 1, **kwargs) -> TokenStore:  # type: ignore[no-untyped-def]
        """The store on JetStream context ``js``; creates the bucket if it is missing."""
        try:
            kv = await js.key_value(BUCKET)
        except (NotFoundError, BadRequestError):
            kv = await js.create_key_value(
                bucket=BUCKET,
                history=5,
                storage=StorageType.FILE,
                replicas=replicas,
                description="Trainyard API tokens (hashed)",
            )
        return cls(kv, **kwargs)

    # --- administration ---

    async def create(
        self, name: str, role: Role | str, tenant: str | None, created_by: str, expires_in_s: float | None = None
    ) -> tuple[TokenRecord, str]:
        """Store a new token; returns its record and the token string, which
        is shown once and never stored.  :class:`BadTokenRequest` says what to fix."""
        try:
            role = parse_role(role)
        except ValueError as err:
            raise BadTokenRequest("role", str(err)) from None
        try:
            principal("new", role, tenant, "token")  # the role's tenant binding
        except ValueError as err:
            raise BadTokenRequest("tenant", str(err)) from None
        problem = check_name("name", name)
        if problem:
            raise BadTokenRequest("name", problem)
        if expires_in_s is not None and not 0 < expires_in_s <= MAX_LIFETIME_S:
            raise BadTokenRequest("expires_in_s", f"give 1 to {MAX_LIFETIME_S:.0f} seconds (3650 days)")
        now = self.clock()
        while True:
            token_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
            record = TokenRecord(
                id=token_id,
                name=name,
                role=role,
                tenant=tenant,
                secret_sha256=hash_secret(secret),
                created_at=now,
                created_by=created_by,
                expires_at=None if expires_in_s is None else now + expires_in_s,
            )
            try:
                await self.kv.create(_key(token_id), msgspec.json.encode(record))
            except KeyWrongLastSequenceError:
                continue  # an id already in use (2**-64): draw another
            self._records[token_id] = record
            return record, f"{PREFIX}{token_id}_{secret}"

    async def revoke(self, token_id: str, revoked_by: str) -> TokenRecord:
        """Mark a token revoked (kept, for the record); revoking twice is one revocation."""
        while True:
            record, revision = await self._get(token_id)
            if record is None:
                raise TokenNotFound(token_id)
            if record.revoked:
                return record
            revoked = msgspec.structs.replace(record, revoked=True, revoked_at=self.clock(), revoked_by=revoked_by)
            try:
                await self.kv.update(_key(token_id), msgspec.json.encode(revoked), last=revision)
            except KeyWrongLastSequenceError:
                continue  # changed meanwhile: look again
            self._records[token_id] = revoked
            return revoked

    def known(self, token_id: str) -> TokenRecord | None:
        """The record as this gateway's copy holds it (no look-up)."""
        return self._records.get(token_id)

    async def get(self, token_id: str) -> TokenRecord | None:
        return (await self._get(token_id))[0]

    async def list(self) -> list[TokenRecord]:
        """Every token, oldest first, read from the bucket."""
        return sorted((await self._read_all()).values(), key=lambda r: (r.created_at, r.id))

    # --- verification ---

    async def verify(self, presented: str) -> Principal:
        """The principal a token stands for; :class:`Unauthenticated` saying
        why not (unknown or wrong, revoked, expired)."""
        token_id, secret = parse_token(presented)
        record = self._records.get(token_id)
        if record is None and self.lookups.allow(token_id):  # never one NATS look-up per random id
            record = await self.get(token_id)  # created a moment ago, not yet seen by the watch
            if record is None:
                self.lookups.missing(token_id)
        matches = hmac.compare_digest(hash_secret(secret), record.secret_sha256 if record else _NO_MATCH)
        if record is None or not matches:
            raise Unauthenticated("unknown API token or wrong secret; check it, or ask an admin for a new one")
        if record.revoked:
            at = when(record.revoked_at) if record.revoked_at else "some time"
            raise Unauthenticated(f"API token {record.id} ({record.name}) was revoked at {at}; ask for a new one")
        if record.expires_at is not None and self.clock() >= record.expires_at:
            raise Unauthenticated(
                f"API token {record.id} ({record.name}) expired at {when(record.expires_at)}; ask for a new one"
            )
        return Principal(subject=f"{record.id}:{record.name}", role=record.role, tenant=record.tenant, method="token")

    async def follow(self, stop: asyncio.Event) -> None:
        """Keep the local copy of every record up to date until ``stop``."""
        while not stop.is_set():
            try:
                await self._watch_once(stop)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - NATS away: keep the last copy, try again
                log.warning("token watch interrupted (%r); restarting", err)
                try:
                    await asyncio.wait_for(stop.wait(), 1.0)
                except TimeoutError:
                    pass

    async def _watch_once(self, stop: asyncio.Event) -> None:
        watcher = await self.kv.watch("token.*")
        loaded: dict[str, TokenRecord] | None = {}  # filled until the end of the current values
        restart_at = time.monotonic() + self.resync_s
        try:
            while not stop.is_set() and time.monotonic() < restart_at:
                try:
                    entry = await watcher.updates(timeout=1.0)
                except TimeoutError:
                    continue
                if entry is None:  # every current value delivered
                    if loaded is not None:
                        self._records, loaded = loaded, None
                        self.ready.set()
                    continue
                token_id = entry.key.removeprefix("token.")
                target = loaded if loaded is not None else self._records
                if entry.operation in (KV_DEL, KV_PURGE) or not entry.value:
                    target.pop(token_id, None)
                    continue
                try:
                    target[token_id] = msgspec.json.decode(entry.value, type=TokenRecord)
                except msgspec.ValidationError as err:
                    log.error("token record %s ignored: %s", entry.key, err)
        finally:
            await watcher.stop()

    async def _get(self, token_id: str) -> tuple[TokenRecord | None, int]:
        if not _ID.fullmatch(token_id):
            return None, 0
        try:
            entry = await self.kv.get(_key(token_id))
        except KeyNotFoundError:
            return None, 0
        if not entry.value:
            return None, 0
        return msgspec.json.decode(entry.value, type=TokenRecord), entry.revision or 0

    async def _read_all(self) -> dict[str, TokenRecord]:
        watcher = await self.kv.watch("token.*", ignore_deletes=True)
        records: dict[str, TokenRecord] = {}
        try:
            while (entry := await watcher.updates(timeout=10.0)) is not None:
                if entry.value:
                    records[entry.key.removeprefix("token.")] = msgspec.json.decode(entry.value, type=TokenRecord)
        finally:
            await watcher.stop()
        return records
