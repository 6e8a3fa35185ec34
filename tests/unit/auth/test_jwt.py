"""Bearer JWTs from an OIDC issuer, verified against its JWKS: a good token
is a principal with the role and tenant from its claims; anything else is
refused with what is wrong."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from trainyard.auth import JwtVerifier, Role, Unauthenticated, jwt_config
from trainyard.settings import ConfigurationError, Settings

ISSUER = "https://login.example.com/realms/ml"
AUDIENCE = "trainyard"


def keypair() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def key() -> rsa.RSAPrivateKey:
    return keypair()


@pytest.fixture
def jwks_file(tmp_path: Path, key: rsa.RSAPrivateKey) -> Path:
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [{**public, "kid": "k1", "use": "sig", "alg": "RS256"}]}))
    return path


@pytest.fixture
def verifier(jwks_file: Path) -> JwtVerifier:
    config = jwt_config(Settings(auth_jwt_issuer=ISSUER, auth_jwt_audience=AUDIENCE, auth_jwks_file=str(jwks_file)))
    assert config is not None
    return JwtVerifier(config)


def token(key: Any, kid: str = "k1", algorithm: str = "RS256", **claims: Any) -> str:
    now = time.time()
    body = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "alice",
        "exp": now + 600,
        "iat": now,
        "trainyard_role": "researcher",
        "trainyard_tenant": "acme",
        **claims,
    }
    body = {k: v for k, v in body.items() if v is not None}
    return jwt.encode(body, key, algorithm=algorithm, headers={"kid": kid})


async def test_a_good_token_is_the_principal_its_claims_name(verifier: JwtVerifier, key: rsa.RSAPrivateKey) -> None:
    who = await verifier.verify(token(key))

    assert (who.subject, who.role, who.tenant, who.actor) == ("alice", Role.RESEARCHER, "acme", "jwt:alice")


async def test_an_unbound_role_carries_no_tenant_and_a_list_of_one_role_is_accepted(
    verifier: JwtVerifier, key: rsa.RSAPrivateKey
) -> None:
    who = await verifier.verify(token(key, trainyard_role=["operator"], trainyard_tenant=None))

    assert (who.role, who.tenant) == (Role.OPERATOR, None)


@pytest.mark.parametrize(
    ("claims", "says"),
    [
        pytest.param({"iss": "https://evil.example.com"}, "trusts only", id="another issuer"),
        pytest.param({"aud": "someone-else"}, "audience must include", id="another audience"),
        pytest.param({"exp": time.time() - 3600}, "expired", id="an expired token"),
        pytest.param({"exp": None}, "'exp'", id="no expiry"),
        pytest.param({"trainyard_role": None}, "no 'trainyard_role' claim", id="no role"),
        pytest.param({"trainyard_role": "root"}, "naming a Trainyard role", id="an unknown role"),
        pytest.param({"trainyard_role": ["admin", "finance"]}, "several roles", id="two roles"),
        pytest.param({"trainyard_tenant": None}, "bound to a tenant", id="a researcher without a tenant"),
        pytest.param({"trainyard_tenant": "acme.prod"}, "do not fit", id="a tenant that is not a name"),
    ],
)
async def test_a_token_that_does_not_hold_up_is_refused_saying_why(
    verifier: JwtVerifier, key: rsa.RSAPrivateKey, claims: dict[str, Any], says: str
) -> None:
    with pytest.raises(Unauthenticated) as raised:
        await verifier.verify(token(key, **claims))

    assert says in str(raised.value)


async def test_a_token_signed_by_another_key_or_a_shared_secret_is_refused(verifier: JwtVerifier) -> None:
    with pytest.raises(Unauthenticated, match="does not verify"):
        await verifier.verify(token(keypair()))
    with pytest.raises(Unauthenticated, match="'HS256'"):
        await verifier.verify(token("a shared secret that would let anyone mint tokens", algorithm="HS256"))
    with pytest.raises(Unauthenticated, match="not in the issuer's JWKS"):
        await verifier.verify(token(keypair(), kid="k9"))
    with pytest.raises(Unauthenticated, match="neither an API token nor a JWT"):
        await verifier.verify("not-a-jwt")


async def test_a_rotated_key_file_is_read_again(verifier: JwtVerifier, jwks_file: Path, key: rsa.RSAPrivateKey) -> None:
    assert (await verifier.verify(token(key))).subject == "alice"
    new_key = keypair()
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(new_key.public_key()))
    jwks_file.write_text(json.dumps({"keys": [{**public, "kid": "k2", "use": "sig", "alg": "RS256"}]}))
    later = time.time() + 5
    os.utime(jwks_file, (later, later))  # a new modification time, as a rotation writes

    assert (await verifier.verify(token(new_key, kid="k2"))).subject == "alice"
    with pytest.raises(Unauthenticated):
        await verifier.verify(token(key))


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        pytest.param({"auth_jwt_issuer": ISSUER}, "AUDIENCE", id="an issuer without an audience"),
        pytest.param({"auth_jwt_issuer": ISSUER, "auth_jwt_audience": AUDIENCE}, "exactly one", id="no keys"),
        pytest.param(
            {
                "auth_jwt_issuer": ISSUER,
                "auth_jwt_audience": AUDIENCE,
                "auth_jwks_url": "https://x/jwks",
                "auth_jwt_algorithms": "HS256",
            },
            "asymmetric",
            id="a symmetric algorithm",
        ),
        pytest.param(
            {"auth_jwt_issuer": ISSUER, "auth_jwt_audience": AUDIENCE, "auth_jwks_file": "/nonexistent/jwks.json"},
            "not a readable JWKS",
            id="a key file that is not there",
        ),
    ],
)
def test_bad_jwt_settings_stop_the_gateway_naming_the_variable(settings: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        jwt_config(Settings(**settings))


def test_no_issuer_means_jwts_are_not_accepted() -> None:
    assert jwt_config(Settings()) is None


async def test_a_token_whose_header_names_an_algorithm_its_key_cannot_use_is_refused_not_a_crash(
    verifier: JwtVerifier,
) -> None:
    """ES256 in the header while the issuer's key is RSA: the library raises a
    TypeError, which is the caller's fault (401), not the gateway's."""
    forged = token(ec.generate_private_key(ec.SECP256R1()), algorithm="ES256")

    with pytest.raises(Unauthenticated, match="'ES256' does not fit its signing key"):
        await verifier.verify(forged)
