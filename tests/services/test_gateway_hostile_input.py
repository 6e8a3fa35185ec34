"""Input that used to be a 500 or gRPC UNKNOWN is a 4xx naming the field, or
INVALID_ARGUMENT, and changes nothing: a JWT whose header names an algorithm
its key cannot use, console YAML with keys that are not text or nested
without end, digits that are not ASCII, ``as_of=nan``, an enum value the
proto does not define, and bytes that are not a protobuf message."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from gateway_fixtures import client, csrf_of, gateway_app, log_in
from starlette.types import ASGIApp

from trainyard._pb.trainyard.v1 import jobs_pb2 as pb
from trainyard.auth import Authenticator, JwtVerifier, jwt_config
from trainyard.bus import Bus
from trainyard.local.servers import free_port
from trainyard.settings import Settings
from trainyard.store import Store
from trainyard.testing.auth import Callers
from trainyard_gateway.grpc_server import _METHODS, start_grpc
from trainyard_gateway.jobs import JobOperations

ISSUER, AUDIENCE = "https://login.example.com", "trainyard"


@pytest.fixture
def auth(callers: Callers, tmp_path: Path) -> Authenticator:
    """API tokens and JWTs from an issuer whose key is RSA."""
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(rsa.generate_private_key(65537, 2048).public_key()))
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{**public, "kid": "k1", "use": "sig", "alg": "RS256"}]}))
    config = jwt_config(Settings(auth_jwt_issuer=ISSUER, auth_jwt_audience=AUDIENCE, auth_jwks_file=str(jwks)))
    assert config is not None
    return Authenticator(callers.store, JwtVerifier(config))


@pytest.fixture
def app(bus: Bus, store: Store, auth: Authenticator, tmp_path: Path) -> ASGIApp:
    return gateway_app(bus, store, auth, Settings(ledger_url=f"sqlite:///{tmp_path}/ledger.db"))


@pytest.fixture
async def http(app: ASGIApp) -> AsyncIterator[httpx.AsyncClient]:
    async with client(app) as c:
        yield c


def es256_token() -> str:
    """Signed ES256 for the RSA key's kid: PyJWT raises TypeError preparing the key."""
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "mallory", "exp": time.time() + 600}
    return jwt.encode(claims, ec.generate_private_key(ec.SECP256R1()), algorithm="ES256", headers={"kid": "k1"})


async def intake(bus: Bus) -> int:
    return (await bus.js.stream_info("INTAKE")).state.messages


async def test_a_jwt_naming_an_algorithm_its_key_cannot_use_is_401_on_the_api_and_the_login_page(
    http: httpx.AsyncClient,
) -> None:
    token = es256_token()

    api = await http.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"})
    page = await http.get("/login")
    login = await http.post("/login", data={"token": token, "csrf": csrf_of(page.text)})

    assert api.status_code == 401 and "'ES256' does not fit its signing key" in api.json()["message"]
    assert login.status_code == 401 and "does not fit its signing key" in login.text


@pytest.mark.parametrize(
    ("yaml", "says"),
    [
        pytest.param("~: 1\ntenant: acme\n", "every key must be text", id="a null key"),
        pytest.param("yes: 1\ntenant: acme\n", "every key must be text", id="a boolean key"),
        pytest.param("tenant: acme\nlabels: {~: x}\n", "in labels is not", id="a null key inside labels"),
        pytest.param("tenant: acme\nlabels: " + "[" * 999 + "]" * 999 + "\n", "nested", id="999 nested brackets"),
    ],
)
async def test_console_yaml_that_cannot_be_a_json_spec_is_422_naming_the_yaml_field(
    http: httpx.AsyncClient, callers: Callers, bus: Bus, yaml: str, says: str
) -> None:
    await log_in(http, callers.tokens["acme"])
    csrf = csrf_of((await http.get("/jobs/new")).text)
    before = await intake(bus)

    answer = await http.post("/jobs/new", data={"mode": "yaml", "yaml": yaml, "csrf": csrf})

    assert answer.status_code == 422 and says in answer.text
    assert await intake(bus) == before


@pytest.mark.parametrize("field", ["replicas", "gpus_per_replica"])
async def test_console_digits_that_are_not_ascii_are_422_naming_the_field(
    http: httpx.AsyncClient, callers: Callers, bus: Bus, field: str
) -> None:
    await log_in(http, callers.tokens["acme"])
    csrf = csrf_of((await http.get("/jobs/new")).text)
    form = {"mode": "form", "tenant": "acme", "queue": "default", "replicas": "1", "gpus_per_replica": "1"}
    before = await intake(bus)

    answer = await http.post("/jobs/new", data=form | {field: "²", "csrf": csrf})

    assert answer.status_code == 422 and field in answer.text
    assert await intake(bus) == before


@pytest.mark.parametrize("as_of", ["nan", "inf", "-inf", "1e300", "-5"])
@pytest.mark.parametrize(
    "path", ["/v1/exports/chargeback?period=2026-11", "/v1/reports/capacity?from=2026-11-01&to=2026-11-02"]
)
async def test_an_as_of_that_is_no_unix_time_is_422_naming_it(
    http: httpx.AsyncClient, callers: Callers, path: str, as_of: str
) -> None:
    answer = await http.get(f"{path}&as_of={as_of}", headers=callers.headers("finance"))

    assert answer.status_code == 422, answer.text
    assert [e["field"] for e in answer.json()["errors"]] == ["as_of"]


@pytest.fixture
async def channel(bus: Bus, store: Store, auth: Authenticator) -> AsyncIterator[grpc.aio.Channel]:
    port = free_port()
    server = await start_grpc(JobOperations(bus, store), auth, "127.0.0.1", port)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as c:
        yield c
    await server.stop(0)


async def call(channel: grpc.aio.Channel, method: str, payload: bytes, metadata: Any) -> grpc.aio.AioRpcError:
    raw = channel.unary_unary(f"/trainyard.v1.JobService/{method}")  # bytes in, bytes out
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await raw(payload, metadata=metadata, timeout=10)
    return raised.value


async def test_an_enum_value_the_proto_does_not_define_is_invalid_argument_naming_the_field(
    channel: grpc.aio.Channel, callers: Callers, bus: Bus
) -> None:
    role = pb.Role(name="trainer", replicas=1, gpus_per_replica=1, topology=pb.TopologyConstraint(level=99))
    spec = pb.JobSpec(tenant="acme", queue="default", roles=[role], topology=pb.TopologyConstraint(level=7))
    before = await intake(bus)

    err = await call(channel, "SubmitJob", pb.SubmitJobRequest(spec=spec).SerializeToString(), callers.metadata("acme"))

    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "topology.level" in (err.details() or "")
    assert await intake(bus) == before


@pytest.mark.parametrize("method", sorted(_METHODS))
@pytest.mark.parametrize("payload", [b"\xff\xff\xff", b"\x0a\x05ab"], ids=["a varint that never ends", "cut short"])
async def test_bytes_that_are_not_the_request_message_are_invalid_argument(
    channel: grpc.aio.Channel, callers: Callers, method: str, payload: bytes
) -> None:
    err = await call(channel, method, payload, callers.metadata("admin"))

    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "not a valid trainyard.v1." in (err.details() or "")
