"""Who may create which consumer, from the permission table alone: a create
names an existing consumer to update it, so no role may send one that names
another role's durable, in any form the server takes; and the client sends an
unnamed create (an ordered consumer, a watch) under a name of its own."""

from __future__ import annotations

import json

import pytest
from test_permission_table import matches

from trainyard.bus.client import named_create
from trainyard.bus.permissions import SERVICES, permissions_for

STREAMS = ("INTAKE", "JOBS", "NODES", "TELEMETRY", "WORK", "KV_trainyard-config")
CLUSTER = "local"


def may_publish(role: str, subject: str) -> bool:
    perms = permissions_for(role, cluster=CLUSTER)
    allowed = any(matches(p, subject) for p in perms.publish)
    return allowed and not any(matches(p, subject) for p in perms.deny_publish)


def durables() -> dict[tuple[str, str], str]:
    """(stream, durable) -> the role that owns it, from the durable creates each role may send."""
    prefix = "$JS.API.CONSUMER.DURABLE.CREATE."
    owners: dict[tuple[str, str], str] = {}
    for role in SERVICES:
        for p in permissions_for(role, cluster=CLUSTER).publish:
            if p.startswith(prefix):
                stream, durable = p.removeprefix(prefix).split(".", 1)
                owners[stream, durable] = role
    return owners


def creates(stream: str, durable: str) -> list[str]:
    api = "$JS.API.CONSUMER"
    return [
        f"{api}.CREATE.{stream}.{durable}",
        f"{api}.CREATE.{stream}.{durable}.trainyard.jobs.nobody.>",
        f"{api}.DURABLE.CREATE.{stream}.{durable}",
    ]


def test_the_table_has_durables_of_several_roles() -> None:
    assert {("JOBS", "accounting"), ("NODES", "health-nodes")} <= set(durables())


@pytest.mark.parametrize("role", SERVICES)
def test_no_role_may_create_a_consumer_named_like_another_roles_durable(role: str) -> None:
    forbidden = [
        subject
        for (stream, durable), owner in durables().items()
        if owner != role
        for subject in creates(stream, durable)
        if may_publish(role, subject)
    ]
    assert forbidden == []


@pytest.mark.parametrize("role", SERVICES)
def test_no_role_may_send_the_create_that_carries_the_name_in_the_body(role: str) -> None:
    assert [s for s in STREAMS if may_publish(role, f"$JS.API.CONSUMER.CREATE.{s}")] == []


def test_a_role_still_creates_its_own_durables_and_named_ordered_consumers() -> None:
    assert all(may_publish(owner, creates(s, d)[2]) for (s, d), owner in durables().items())
    assert may_publish("placement", "$JS.API.CONSUMER.CREATE.JOBS.eph0a1b2c3")
    assert may_publish("gateway", "$JS.API.CONSUMER.CREATE.KV_trainyard-auth.eph0a1b2c3")


def body(**config: object) -> bytes:
    return json.dumps({"stream_name": "JOBS", "config": config}).encode()


@pytest.mark.parametrize(
    ("subject", "payload", "renamed"),
    [
        pytest.param("$JS.API.CONSUMER.CREATE.JOBS", body(filter_subject=">"), True, id="an ordered consumer is named"),
        pytest.param("$JS.API.CONSUMER.CREATE.JOBS", body(name="mine"), False, id="a name given is kept"),
        pytest.param(
            "$JS.API.CONSUMER.CREATE.JOBS", body(durable_name="d"), False, id="a durable is left for the server"
        ),
        pytest.param("$JS.API.CONSUMER.CREATE.JOBS.x", body(name="x"), False, id="a named create is left as it is"),
        pytest.param("$JS.API.CONSUMER.CREATE.JOBS", b"not json", False, id="a body that is not JSON is left"),
        pytest.param("$JS.API.STREAM.INFO.JOBS", b"", False, id="another API call is left"),
    ],
)
def test_the_client_names_an_unnamed_create(subject: str, payload: bytes, renamed: bool) -> None:
    sent_to, sent = named_create(subject, payload, "eph1")
    if renamed:
        assert sent_to == f"{subject}.eph1" and json.loads(sent)["config"]["name"] == "eph1"
        assert json.loads(sent)["config"]["filter_subject"] == ">"
    else:
        assert (sent_to, sent) == (subject, payload)
