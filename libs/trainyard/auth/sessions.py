"""Console sessions the server can end.

Logging in to the web console with an API token or a JWT starts a session:
a record in the ``trainyard-auth`` KV bucket (key ``session.<id>``, beside
the tokens, so every gateway sees it and it outlives Redis) holding whom it
stands for, the token it was started with, when it ends (12 hours after
login, or the JWT's expiry if sooner) and the SHA-256 of its secret.  The
browser's cookie holds ``tys_<id>_<secret>``, never the API token itself.

Every console request reads the record again, so logging out (which marks
it ended), the lifetime running out, or the token it was started with being
revoked or expiring ends it on every gateway at once.  A cookie whose secret
does not match the record this gateway last read is refused without a
look-up, and ids this gateway never saw are looked up only as often as
:class:`~trainyard.auth.lookups.Lookups` allows.
"""

from __future__ import annotations

import hmac
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable

import jwt
import msgspec
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from trainyard.auth.lookups import Lookups
from trainyard.auth.principal import Principal, Role, Unauthenticated
from trainyard.auth.tokens import PREFIX as TOKEN_PREFIX
from trainyard.auth.tokens import TokenStore, hash_secret, parse_token, when

PREFIX = "tys_"
LIFETIME_S = 12 * 3600.0
_COOKIE = re.compile(r"tys_([0-9a-f]{32})_([A-Za-z0-9_-]{43})")
_CACHED = 10_000  # session records kept by one gateway (their secrets' hashes and who they are)


class SessionRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    secret_sha256: str  # hex SHA-256 of the cookie's secret part
    subject: str  # the principal it stands for, as the credential verified
    role: Role
    tenant: str | None = None
    method: str  # "token" or "jwt"
    token_id: str | None = None  # the API token it was started with; its revocation ends the session
    created_at: float
    expires_at: float  # Unix time; the server refuses it from then on
    ended_at: float | None = None  # logged out

    @property
    def principal(self) -> Principal:
        return Principal(subject=self.subject, role=self.role, tenant=self.tenant, method=self.method)


def _key(session_id: str) -> str:
    return f"session.{session_id}"


class SessionStore:
    def __init__(
        self,
        kv: KeyValue,
        tokens: TokenStore | None,
        clock: Callable[[], float] = time.time,
        lifetime_s: float = LIFETIME_S,
    ) -> None:
        self.kv = kv
        self.tokens = tokens  # whose records say whether a session's token still holds
        self.clock = clock
        self.lifetime_s = lifetime_s
        self.lookups = Lookups()
        self._seen: OrderedDict[str, str] = OrderedDict()  # session id -> its secret's hash, as last read

    async def start(self, who: Principal, credential: str) -> tuple[SessionRecord, str]:
        """A new session for ``who``, who has just verified with ``credential``;
        returns the record and the cookie value (shown once, never stored)."""
        now = self.clock()
        expires_at, token_id = now + self.lifetime_s, None
        if credential.startswith(TOKEN_PREFIX):
            token_id = parse_token(credential)[0]
        else:  # a JWT, verified a moment ago: the session ends when it does, if sooner
            exp = jwt.decode(credential, options={"verify_signature": False}).get("exp")
            if isinstance(exp, int | float) and not isinstance(exp, bool):
                expires_at = min(expires_at, float(exp))
        while True:
            session_id, secret = secrets.token_hex(16), secrets.token_urlsafe(32)
            record = SessionRecord(
                id=session_id,
                secret_sha256=hash_secret(secret),
                subject=who.subject,
                role=who.role,
                tenant=who.tenant,
                method=who.method,
                token_id=token_id,
                created_at=now,
                expires_at=expires_at,
            )
            try:
                await self.kv.create(_key(session_id), msgspec.json.encode(record))
            except KeyWrongLastSequenceError:
                continue  # an id in use (2**-128): draw another
            self._remember(record)
            return record, f"{PREFIX}{session_id}_{secret}"

    async def verify(self, cookie: str) -> Principal:
        """The principal of a live session; :class:`Unauthenticated` saying why not."""
        found = _COOKIE.fullmatch(cookie)
        if not found:
            raise Unauthenticated("not a console session; log in again")
        session_id, secret = found.groups()
        known = self._seen.get(session_id)
        if known is not None and not hmac.compare_digest(hash_secret(secret), known):
            raise Unauthenticated("unknown console session; log in again")
        if known is None and not self.lookups.allow(session_id):
            raise Unauthenticated("unknown console session; log in again")
        record = await self._get(session_id)  # read again each time: a logout on any gateway ends it
        if record is None:
            self.lookups.missing(session_id)
            raise Unauthenticated("unknown console session; log in again")
        if not hmac.compare_digest(hash_secret(secret), record.secret_sha256):
            raise Unauthenticated("unknown console session; log in again")
        self._remember(record)
        if record.ended_at is not None:
            raise Unauthenticated(f"this console session was ended (logged out) at {when(record.ended_at)}")
        if self.clock() >= record.expires_at:
            raise Unauthenticated(f"this console session expired at {when(record.expires_at)}; log in again")
        await self._check_token(record)
        return record.principal

    async def end(self, cookie: str) -> bool:
        """Log out: mark the session ended, for every gateway; False if the cookie names none."""
        found = _COOKIE.fullmatch(cookie)
        if not found:
            return False
        session_id, secret = found.groups()
        while True:
            try:
                entry = await self.kv.get(_key(session_id))
            except KeyNotFoundError:
                return False
            if not entry.value:
                return False
            record = msgspec.json.decode(entry.value, type=SessionRecord)
            if not hmac.compare_digest(hash_secret(secret), record.secret_sha256):
                return False
            if record.ended_at is not None:
                return True
            ended = msgspec.structs.replace(record, ended_at=self.clock())
            try:
                await self.kv.update(_key(session_id), msgspec.json.encode(ended), last=entry.revision)
            except KeyWrongLastSequenceError:
                continue  # changed meanwhile: read it again
            return True

    async def sweep(self, keep_s: float = 86_400.0) -> int:
        """Purge the records of sessions that ended or expired more than
        ``keep_s`` ago (a logout, a lifetime run out), so the bucket holds
        about a day of them; returns how many were purged.  Any gateway may
        run it, several at once."""
        cutoff = self.clock() - keep_s
        watcher = await self.kv.watch("session.*", ignore_deletes=True)
        stale = []
        try:
            while (entry := await watcher.updates(timeout=10.0)) is not None:
                if not entry.value:
                    continue
                record = msgspec.json.decode(entry.value, type=SessionRecord)
                if min(record.expires_at, record.ended_at or record.expires_at) < cutoff:
                    stale.append(entry.key)
        finally:
            await watcher.stop()
        for key in stale:
            await self.kv.purge(key)
        return len(stale)

    async def _check_token(self, record: SessionRecord) -> None:
        """A session lasts no longer than the API token it was started with."""
        if record.token_id is None or self.tokens is None:
            return
        token = self.tokens.known(record.token_id) or await self.tokens.get(record.token_id)
        if token is None or token.revoked:
            raise Unauthenticated("the API token this console session was started with was revoked; log in again")
        if token.expires_at is not None and self.clock() >= token.expires_at:
            raise Unauthenticated("the API token this console session was started with has expired; log in again")

    async def _get(self, session_id: str) -> SessionRecord | None:
        try:
            entry = await self.kv.get(_key(session_id))
        except KeyNotFoundError:
            return None
        return msgspec.json.decode(entry.value, type=SessionRecord) if entry.value else None

    def _remember(self, record: SessionRecord) -> None:
        self._seen[record.id] = record.secret_sha256
        self._seen.move_to_end(record.id)
        while len(self._seen) > _CACHED:
            self._seen.popitem(last=False)
