"""Bearer JWTs from an OpenID Connect issuer (or any issuer with a JWKS).

The issuer, the audience and where its public keys are (a JWKS URL, as an
OIDC discovery document names it in ``jwks_uri``, or a local JWKS file) come
from settings, with the names of the claims that carry the Trainyard role and
tenant.  Only asymmetric algorithms are accepted, so no shared secret exists
that could mint tokens.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import jwt
import msgspec

from trainyard.auth.principal import ROLE_NAMES, TENANT_BOUND, Principal, Role, Unauthenticated, principal
from trainyard.settings import ConfigurationError, Settings

ASYMMETRIC = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"})


class KeysUnavailable(Exception):
    """The issuer's keys cannot be fetched: not the caller's fault, retry."""


class JwtConfig(msgspec.Struct, frozen=True):
    issuer: str  # must equal the token's "iss"
    audience: str  # must be in the token's "aud"
    jwks_url: str = ""  # the issuer's JWKS (OIDC: the discovery document's jwks_uri)
    jwks_file: str = ""  # or a local JWKS file
    role_claim: str = "trainyard_role"  # a role name, or a list holding one; dots reach into objects
    tenant_claim: str = "trainyard_tenant"  # read for tenant-bound roles only
    algorithms: tuple[str, ...] = ("RS256", "ES256")
    leeway_s: float = 30.0  # clock skew allowed on exp, nbf and iat


def jwt_config(settings: Settings) -> JwtConfig | None:
    """The JWT settings, or None when no issuer is set (JWTs refused).
    :class:`ConfigurationError` names the variable to fix."""
    if not settings.auth_jwt_issuer:
        return None
    if not settings.auth_jwt_audience:
        raise ConfigurationError("TRAINYARD_AUTH_JWT_AUDIENCE must be set with TRAINYARD_AUTH_JWT_ISSUER")
    if bool(settings.auth_jwks_url) == bool(settings.auth_jwks_file):
        raise ConfigurationError("set exactly one of TRAINYARD_AUTH_JWKS_URL and TRAINYARD_AUTH_JWKS_FILE")
    algorithms = tuple(a.strip() for a in settings.auth_jwt_algorithms.split(",") if a.strip())
    bad = [a for a in algorithms if a not in ASYMMETRIC]
    if bad or not algorithms:
        raise ConfigurationError(
            f"TRAINYARD_AUTH_JWT_ALGORITHMS: {', '.join(bad) or 'none given'} not accepted; "
            f"use asymmetric ones: {', '.join(sorted(ASYMMETRIC))}"
        )
    config = JwtConfig(
        issuer=settings.auth_jwt_issuer,
        audience=settings.auth_jwt_audience,
        jwks_url=settings.auth_jwks_url,
        jwks_file=settings.auth_jwks_file,
        role_claim=settings.auth_jwt_role_claim,
        tenant_claim=settings.auth_jwt_tenant_claim,
        algorithms=algorithms,
        leeway_s=settings.auth_jwt_leeway_s,
    )
    if config.jwks_file:
        _read_jwks(config.jwks_file)  # a missing or broken file stops the gateway at start
    return config


def _read_jwks(path: str) -> jwt.PyJWKSet:
    try:
        return jwt.PyJWKSet.from_dict(json.loads(Path(path).read_text()))
    except (OSError, ValueError, jwt.PyJWKSetError) as err:
        raise ConfigurationError(f"TRAINYARD_AUTH_JWKS_FILE {path}: not a readable JWKS ({err})") from err


def _claim(claims: dict[str, Any], path: str) -> Any:
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def role_from_claim(value: Any, claim: str) -> Role:
    names = value if isinstance(value, list) else [value]
    roles = {Role(v) for v in names if isinstance(v, str) and v in Role._value2member_map_}
    if not roles:
        shown = "" if value is None else f" (it holds {value!r})"
        raise Unauthenticated(f"the JWT has no {claim!r} claim naming a Trainyard role{shown}; use one of {ROLE_NAMES}")
    if len(roles) > 1:
        raise Unauthenticated(f"the JWT's {claim!r} claim names several roles ({', '.join(sorted(roles))}); give one")
    return roles.pop()


class JwtVerifier:
    def __init__(self, config: JwtConfig) -> None:
        self.config = config
        self._client = jwt.PyJWKClient(config.jwks_url, cache_keys=True, lifespan=300) if config.jwks_url else None
        self._file_keys: jwt.PyJWKSet | None = None
        self._file_mtime = 0.0

    async def verify(self, token: str) -> Principal:
        """The principal a JWT stands for; :class:`Unauthenticated` saying what is wrong."""
        c = self.config
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as err:
            raise Unauthenticated(f"the bearer token is neither an API token nor a JWT ({err})") from None
        if header.get("alg") not in c.algorithms:
            raise Unauthenticated(f"the JWT is signed with {header.get('alg')!r}; accepted: {', '.join(c.algorithms)}")
        key = await self._key(token, header.get("kid"))
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=list(c.algorithms),
                audience=c.audience,
                issuer=c.issuer,
                leeway=c.leeway_s,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("the JWT has expired; get a fresh one from the identity provider") from None
        except jwt.InvalidIssuerError:
            issuer = jwt.decode(token, options={"verify_signature": False}).get("iss")
            raise Unauthenticated(f"the JWT's issuer is {issuer!r}; this gateway trusts only {c.issuer!r}") from None
        except jwt.InvalidAudienceError:
            raise Unauthenticated(
                f"the JWT is not meant for this gateway: its audience must include {c.audience!r}"
            ) from None
        except jwt.InvalidSignatureError:
            raise Unauthenticated("the JWT's signature does not verify with the issuer's keys") from None
        except jwt.MissingRequiredClaimError as err:
            raise Unauthenticated(f"the JWT has no {err.claim!r} claim") from None
        except jwt.ImmatureSignatureError:
            raise Unauthenticated("the JWT is not valid yet (nbf or iat is in the future)") from None
        except jwt.PyJWTError as err:
            raise Unauthenticated(f"the JWT is not valid: {err}") from None
        except (TypeError, ValueError) as err:  # e.g. a header naming ES256 for an RSA key
            raise Unauthenticated(
                f"the JWT's algorithm {header.get('alg')!r} does not fit its signing key (kid {header.get('kid')!r}): {err}"
            ) from None
        role = role_from_claim(_claim(claims, c.role_claim), c.role_claim)
        tenant = _claim(claims, c.tenant_claim) if role in TENANT_BOUND else None
        if role in TENANT_BOUND and not isinstance(tenant, str):
            raise Unauthenticated(
                f"the JWT's role {role.value} is bound to a tenant, but it has no {c.tenant_claim!r} claim"
            )
        try:
            return principal(str(claims["sub"]), role, tenant, "jwt")
        except ValueError as err:
            raise Unauthenticated(f"the JWT's claims do not fit: {err}") from None

    async def _key(self, token: str, kid: str | None) -> Any:
        if self._client is not None:
            try:
                return (await asyncio.to_thread(self._client.get_signing_key_from_jwt, token)).key
            except jwt.PyJWKClientConnectionError as err:
                raise KeysUnavailable(f"cannot fetch the issuer's keys from {self.config.jwks_url}: {err}") from err
            except jwt.PyJWKClientError as err:
                raise Unauthenticated(
                    f"the JWT's signing key (kid {kid!r}) is not among the issuer's keys: {err}"
                ) from None
        return self._file_key(kid)

    def _file_key(self, kid: str | None) -> Any:
        path = self.config.jwks_file
        try:
            mtime = os.stat(path).st_mtime
        except OSError as err:
            raise KeysUnavailable(f"cannot read the JWKS file {path}: {err}") from err
        if self._file_keys is None or mtime != self._file_mtime:  # keys rotated: read again
            try:
                self._file_keys, self._file_mtime = _read_jwks(path), mtime
            except ConfigurationError as err:
                raise KeysUnavailable(str(err)) from err
        keys = self._file_keys.keys
        if kid is None and len(keys) == 1:
            return keys[0].key
        for k in keys:
            if k.key_id == kid:
                return k.key
        raise Unauthenticated(f"the JWT's signing key (kid {kid!r}) is not in the issuer's JWKS")
