"""From an ``Authorization`` header (REST) or ``authorization`` metadata
(gRPC) to a verified :class:`Principal`: a Trainyard API token (``ty_...``)
is checked against the token store, anything else as a JWT."""

from __future__ import annotations

from trainyard.auth.oidc import JwtVerifier
from trainyard.auth.principal import Principal, Unauthenticated
from trainyard.auth.sessions import SessionStore
from trainyard.auth.tokens import PREFIX, TokenStore

REALM = "trainyard"


class Authenticator:
    def __init__(self, tokens: TokenStore | None = None, jwt: JwtVerifier | None = None) -> None:
        self.tokens = tokens  # None: API tokens are refused
        self.jwt = jwt  # None: JWTs are refused
        # console sessions live beside the tokens, in the same bucket; None: no console logins
        self.sessions = SessionStore(tokens.kv, tokens) if tokens is not None else None

    async def authenticate(self, authorization: str | None) -> Principal:
        """The caller behind ``Bearer <credential>``; :class:`Unauthenticated`
        saying what is missing or wrong."""
        credential = bearer_credential(authorization)
        if credential.startswith(PREFIX):
            if self.tokens is None:
                raise Unauthenticated("this gateway accepts no API tokens")
            return await self.tokens.verify(credential)
        if self.jwt is None:
            raise Unauthenticated(
                "not a Trainyard API token (those start with 'ty_'), and this gateway has no JWT issuer configured"
            )
        return await self.jwt.verify(credential)

    async def session(self, cookie: str | None) -> Principal:
        """The caller behind a console session cookie; :class:`Unauthenticated` when there is none that holds."""
        if not cookie:
            raise Unauthenticated("no console session; log in")
        if self.sessions is None:
            raise Unauthenticated("this gateway keeps no console sessions")
        return await self.sessions.verify(cookie)


def bearer_credential(authorization: str | None) -> str:
    if not authorization or not authorization.strip():
        raise Unauthenticated("no credentials: send the header 'Authorization: Bearer <API token or JWT>'")
    scheme, _, credential = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise Unauthenticated(f"the {scheme!r} scheme is not accepted: send 'Authorization: Bearer <API token or JWT>'")
    credential = credential.strip()
    if not credential:
        raise Unauthenticated("the Bearer credential is empty: send 'Authorization: Bearer <API token or JWT>'")
    return credential


def challenge(error: str | None = None) -> str:
    """The ``WWW-Authenticate`` value of a 401 (RFC 6750): no error code when
    no credentials came, ``invalid_token`` when they did not verify."""
    if error is None:
        return f'Bearer realm="{REALM}"'
    return f'Bearer realm="{REALM}", error="invalid_token", error_description="{_quoted(error)}"'


def _quoted(text: str) -> str:
    """Printable ASCII without quotes or backslashes, as a header value allows."""
    return "".join(c if 0x20 <= ord(c) < 0x7F and c not in '"\\' else "'" if c == '"' else "?" for c in text)[:300]
