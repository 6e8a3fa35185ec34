"""A property-based fuzz of the front door, against real NATS and Redis:
every REST route with made-up path parameters, query strings, bodies and
credentials; the console's forms; and every gRPC method with made-up
messages and bytes.  Whatever comes in, no answer is a 5xx and no gRPC call
ends UNKNOWN or INTERNAL (bad input is a 4xx or INVALID_ARGUMENT).

The routes and forms are served from one app and one gRPC server, started
once per test on an event loop of their own (each example is one call to
them), so a few hundred examples take seconds.  The console's live streams
(``.../stream``) are left out: they answer for minutes by design.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import grpc
import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from gateway_fixtures import client, csrf_of, gateway_app, log_in
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard._pb.trainyard.v1 import jobs_pb2 as pb
from trainyard.bus import Bus, ensure_streams
from trainyard.local.servers import Server, free_port
from trainyard.settings import Settings
from trainyard.store import Store
from trainyard.testing.auth import Callers, issue
from trainyard_gateway.grpc_server import start_grpc
from trainyard_gateway.jobs import JobOperations

T = TypeVar("T")
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


class Front:
    """The gateway's app and gRPC server on a loop in a thread of their own."""

    def __init__(self, nats: Server, redis: Server, data: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.nats, self.redis, self.data = nats, redis, data

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout=60)

    async def start(self) -> None:
        self.bus = await Bus.connect(self.nats.url, name="trainyard-fuzz")
        await ensure_streams(self.bus.js)
        self.store = Store.from_url(self.redis.url, "fuzz:")
        self.callers: Callers = await issue(self.bus)
        auth = self.callers.authenticator
        settings = Settings(ledger_url=f"sqlite:///{self.data}/ledger.db")
        self.app = gateway_app(self.bus, self.store, auth, settings)
        self.http = client(self.app)
        self.browser = client(self.app)
        await log_in(self.browser, self.callers.tokens["admin"])
        self.csrf = csrf_of((await self.browser.get("/jobs/new")).text)
        port = free_port()
        self.grpc = await start_grpc(JobOperations(self.bus, self.store), auth, "127.0.0.1", port)
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")

    async def stop(self) -> None:
        await self.channel.close()
        await self.grpc.stop(0)
        await self.http.aclose()
        await self.browser.aclose()
        await self.store.flush()
        await self.store.close()
        await self.bus.close()


@pytest.fixture
def front(nats_server: Server, redis_server: Server, tmp_path: Path) -> Iterator[Front]:
    f = Front(nats_server, redis_server, tmp_path)
    f.run(f.start())
    try:
        yield f
    finally:
        f.run(f.stop())
        f.loop.call_soon_threadsafe(f.loop.stop)
        f.thread.join(10)


def es256_jwt() -> str:
    claims = {"iss": "x", "aud": "trainyard", "sub": "m", "exp": time.time() + 60}
    return jwt.encode(claims, ec.generate_private_key(ec.SECP256R1()), algorithm="ES256", headers={"kid": "k1"})


#: Words a hostile caller likes: numbers that are not, ids that are not, text that is not ASCII.
ODD = st.sampled_from(
    ["nan", "inf", "-inf", "-1", "0", "1e308", "9" * 40, "²", "٣", "", " ", "../..", "%00", "a" * 300, "acme", "null"]
)
TEXT = st.one_of(ODD, ODD, st.text(max_size=40))  # the odd words two times in three
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


def operations(front: Front) -> list[tuple[str, str, list[str], list[str]]]:
    """Every REST operation the OpenAPI document describes, as
    ``(method, path template, path parameters, query parameters)``."""
    found = []
    for path, methods in front.app.openapi()["paths"].items():  # type: ignore[attr-defined]
        for method, operation in methods.items():
            params = operation.get("parameters", [])
            named = [[p["name"] for p in params if p["in"] == where] for where in ("path", "query")]
            found.append((method.upper(), path, *named))
    return sorted(found)


def authorization(front: Front, who: str) -> dict[str, str]:
    if who == "nobody":
        return {}
    if who == "forged":
        return {"Authorization": f"Bearer ty_{'0' * 16}_{'x' * 43}"}
    if who == "jwt":
        return {"Authorization": f"Bearer {es256_jwt()}"}
    return front.callers.headers(who)


@settings(FUZZ, max_examples=160)
@given(data=st.data())
def test_no_rest_route_answers_5xx_whatever_it_is_sent(front: Front, data: st.DataObject) -> None:
    method, path, in_path, in_query = data.draw(st.sampled_from(operations(front)), label="operation")
    for name in in_path:
        path = path.replace("{" + name + "}", quote(data.draw(TEXT, label=name), safe="") or "x")
    query = {n: data.draw(TEXT, label=n) for n in [*in_query, "extra"] if data.draw(st.booleans(), label=f"send {n}")}
    body = data.draw(st.one_of(st.none(), JSONISH.map(lambda v: json.dumps(v).encode()), st.binary(max_size=64)))
    callers = ["admin", "finance", "admin", "finance", "acme", "operator", "nobody", "forged", "jwt"]  # mostly allowed
    who = data.draw(st.sampled_from(callers), label="who")

    async def call() -> httpx.Response:
        return await front.http.request(
            method, path, params=query, content=body, headers=authorization(front, who) | {"X-Trainyard-Fuzz": "1"}
        )

    answer = front.run(call())

    assert answer.status_code < 500, (method, path, query, body, who, answer.text[:500])


FORM_FIELDS = ["mode", "tenant", "queue", "name", "replicas", "gpus_per_replica", "gpu_type", "priority_class"]
FORM_FIELDS += ["duration", "image", "job_id", "yaml", "reason", "token"]
YAML = st.one_of(
    TEXT,
    st.sampled_from(
        ["~: 1", "yes: 1", "labels: {~: x}", "[" * 999 + "]" * 999, "a: &a [*a]", "- 1\n- 2", "tenant: [1"]
    ),
    JSONISH.map(json.dumps),
)


#: The console's pages and the query parameters they read.
PAGES = {
    "/jobs": ["status", "tenant"],
    "/jobs/{id}": ["submitted"],
    "/jobs/new": [],
    "/cluster": ["colour"],
    "/nodes": ["state"],
    "/nodes/{id}": ["done", "error"],
    "/usage": ["start", "end", "group", "bucket"],
    "/finance/chargeback": ["period", "format", "tenant"],
    "/finance/capacity": ["start", "end"],
    "/admin/tenancy": [],
    "/login": ["expired"],
}


@settings(FUZZ, max_examples=60)
@given(data=st.data())
def test_no_console_page_answers_5xx_whatever_it_is_asked(front: Front, data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(sorted(PAGES)), label="page")
    query = {n: data.draw(TEXT, label=n) for n in [*PAGES[path], "extra"] if data.draw(st.booleans())}
    path = path.replace("{id}", quote(data.draw(TEXT, label="id"), safe="") or "x")

    answer = front.run(front.browser.get(path, params=query))

    assert answer.status_code < 500, (path, query, answer.text[:500])


@settings(FUZZ, max_examples=60)
@given(data=st.data())
def test_no_console_form_answers_5xx_whatever_it_is_sent(front: Front, data: st.DataObject) -> None:
    path = data.draw(
        st.sampled_from(["/jobs/new", "/jobs/{id}/cancel", "/nodes/{id}/cordon", "/nodes/{id}/{id}", "/login"])
    )
    path = path.replace("{id}", quote(data.draw(TEXT, label="id"), safe="") or "x")
    form = {f: data.draw(YAML if f == "yaml" else TEXT, label=f) for f in FORM_FIELDS if data.draw(st.booleans())}
    if data.draw(st.booleans(), label="with the CSRF token"):
        form["csrf"] = front.csrf

    answer = front.run(front.browser.post(path, data=form))

    assert answer.status_code < 500, (path, form, answer.text[:500])


INT32 = st.integers(-(2**31), 2**31 - 1)
OPTIONAL_INT = st.one_of(st.none(), INT32)
ROLE = st.builds(
    pb.Role,
    name=TEXT,
    replicas=OPTIONAL_INT,
    gpus_per_replica=OPTIONAL_INT,
    gpu_type=st.one_of(st.none(), TEXT),
    topology=st.one_of(st.none(), st.builds(pb.TopologyConstraint, level=st.integers(-3, 300), required=st.booleans())),
)
SPEC = st.builds(
    pb.JobSpec,
    tenant=TEXT,
    queue=TEXT,
    roles=st.lists(ROLE, max_size=3),
    labels=st.dictionaries(TEXT, TEXT, max_size=3),
    max_runtime_s=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
    simulated_duration_s=st.one_of(st.none(), st.floats()),
    topology=st.one_of(st.none(), st.builds(pb.TopologyConstraint, level=st.integers(-3, 300))),
)
REQUESTS = {
    "SubmitJob": st.builds(pb.SubmitJobRequest, spec=SPEC, job_id=TEXT),
    "GetJob": st.builds(pb.GetJobRequest, job_id=TEXT),
    "ListJobs": st.builds(pb.ListJobsRequest, tenant=TEXT, status=TEXT, limit=INT32),
    "CancelJob": st.builds(pb.CancelJobRequest, job_id=TEXT, reason=TEXT),
}


@settings(FUZZ, max_examples=120)
@given(data=st.data())
def test_no_grpc_call_ends_unknown_or_internal_whatever_it_is_sent(front: Front, data: st.DataObject) -> None:
    method = data.draw(st.sampled_from(sorted(REQUESTS)), label="method")
    payload = data.draw(
        st.one_of(REQUESTS[method].map(lambda m: m.SerializeToString()), st.binary(max_size=64)), label="payload"
    )
    who = data.draw(st.sampled_from(["admin", "acme", "nobody", "forged", "jwt"]), label="who")
    metadata = tuple((k.lower(), v) for k, v in authorization(front, who).items())

    async def call() -> grpc.StatusCode:
        raw = front.channel.unary_unary(f"/trainyard.v1.JobService/{method}")
        try:
            await raw(payload, metadata=metadata, timeout=30)
        except grpc.aio.AioRpcError as err:
            return err.code()
        return grpc.StatusCode.OK

    code = front.run(call())

    assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), (method, payload, who)
