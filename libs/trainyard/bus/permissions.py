"""Who may publish and subscribe to what on the bus: one NATS user per
service, per submission portal (one tenant each) and one admin, each allowed
only the subjects its role produces and the JetStream API calls it makes;
and one per node agent (``agent-<node_id>``), allowed only its own node's subjects.

:func:`permissions_for` is the whole table, as data; :func:`nats_config`
writes it as the ``authorization`` block of a nats-server configuration file.
The table follows what each process does (see docs/security.md):

- job events are written only by their writer (the last token of
  ``trainyard.jobs.<tenant>.<job_id>.<writer>``, see
  :mod:`trainyard.events.subjects`);
- a portal publishes only on ``trainyard.intake.<its tenant>``;
- only admin writes the configuration bucket; a decider writes only its own
  lease keys; only the gateway (and admin) writes the API-token bucket;
- a consumer may pull from, and ack on, only its own durable consumers, and
  create ephemeral (ordered) consumers on the streams it reads;
- streams and buckets may be created by the services that use them (a first
  start), but updated, purged or deleted only by admin;
- replies come back on an inbox of the user's own (``_INBOX.<user>.>``), so no
  one reads another user's replies or pulled messages.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import msgspec

from trainyard.events import subjects

#: The streams every service declares at start (trainyard.bus.streams.STREAMS).
STREAMS = ("INTAKE", "JOBS", "NODES", "TELEMETRY", "WORK", "AUDIT", "DEADLETTER")
LEASES_BUCKET = "trainyard-leases"  # trainyard.bus.lease.BUCKET
CONFIG_BUCKET = "trainyard-config"  # trainyard.config.store.BUCKET
AUTH_BUCKET = "trainyard-auth"  # trainyard.auth.tokens.BUCKET: API tokens, hashed

SERVICES = ("admission", "placement", "health", "accounting", "gateway", "emulator")
ROLES = (*SERVICES, "portal", "admin")
#: A node agent's role: one user per node (``agent-<node_id>``), see :func:`permissions_for`.
AGENT = "agent"

_J = subjects.PREFIX


class Permissions(msgspec.Struct, frozen=True):
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    #: May answer requests sent to it (once, on the request's reply subject).
    allow_responses: bool = False
    #: Refused even where ``publish`` allows: creating another role's durable consumers.
    deny_publish: tuple[str, ...] = ()


class BusUser(msgspec.Struct, frozen=True):
    """One NATS user: its name, password and role (a portal names its tenant, a node agent its node)."""

    name: str
    password: str
    role: str
    tenant: str | None = None
    node: str | None = None

    @property
    def pair(self) -> tuple[str, str]:
        """(name, password), as a client connects with them."""
        return self.name, self.password


def user_name(role: str, tenant: str | None = None, node: str | None = None) -> str:
    """``portal-<tenant>`` for a portal, ``agent-<node>`` for a node agent, else the role itself."""
    _check(role, tenant, node)
    if role == AGENT:
        return f"agent-{node}"
    return f"portal-{tenant}" if role == "portal" else role


def inbox_prefix(user: str) -> str:
    """The inbox prefix a user's client must connect with (nats-py
    ``inbox_prefix``, nats.go ``CustomInboxPrefix``): its replies and pulled
    messages arrive under it, and only it may subscribe there."""
    return f"_INBOX.{subjects.token(user)}"


def _check(role: str, tenant: str | None, node: str | None = None) -> None:
    if role not in ROLES and role != AGENT:
        raise ValueError(f"unknown bus role {role!r}; roles are {', '.join(ROLES)} and {AGENT}")
    if (role == "portal") != (tenant is not None):
        raise ValueError("a portal names exactly one tenant, and only a portal does")
    if (role == AGENT) != (node is not None):
        raise ValueError("a node agent names exactly one node, and only a node agent does")
    if tenant is not None:
        subjects.token(tenant)
    if node is not None:
        subjects.token(node)


def _reads(stream: str, durables: Iterable[str] = (), ordered: bool = False) -> list[str]:
    """The JetStream API a reader of ``stream`` uses: stream info and single
    messages, its own durable consumers (create, info, pull, ack) and, where
    it follows the stream (projectors, watchers), ordered consumers with their
    flow control.  An ordered consumer is created on a subject that names it
    (``CONSUMER.CREATE.<stream>.<name>``: trainyard.bus.client names every
    consumer the client would create on the bare ``CONSUMER.CREATE.<stream>``,
    which carries the name in the body and so could rewrite any consumer of
    the stream); :func:`_others_durables` keeps those names off the durables
    of other roles (see docs/security.md)."""
    api = "$JS.API"
    allowed = [
        f"{api}.STREAM.INFO.{stream}",
        f"{api}.STREAM.MSG.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}.>",
        f"{api}.CONSUMER.INFO.{stream}.*",
    ]
    if ordered:
        allowed += [f"{api}.CONSUMER.CREATE.{stream}.*", f"$JS.FC.{stream}.>"]
    for durable in durables:
        allowed += [
            f"{api}.CONSUMER.CREATE.{stream}.{durable}",
            f"{api}.CONSUMER.CREATE.{stream}.{durable}.>",
            f"{api}.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
            f"{api}.CONSUMER.MSG.NEXT.{stream}.{durable}",
            f"$JS.ACK.{stream}.{durable}.>",
        ]
    return allowed


def _declares(streams: Iterable[str]) -> list[str]:
    """Creating streams or buckets that do not exist yet (an existing one with
    the same settings is left as it is); updating them is admin's."""
    return [f"$JS.API.STREAM.CREATE.{s}" for s in streams] + [f"$JS.API.STREAM.INFO.{s}" for s in streams]


def _kv(bucket: str) -> str:
    return f"KV_{bucket}"


def _service(role: str, cluster: str) -> tuple[list[str], list[str], bool]:
    """(publish, subscribe beyond the inbox, allow_responses) of a service."""
    jobs = f"{_J}.jobs.*.*"
    leases, config = _kv(LEASES_BUCKET), _kv(CONFIG_BUCKET)
    if role == "admission":
        publish = [
            f"{jobs}.admission",
            subjects.deadletter("INTAKE"),
            f"$KV.{LEASES_BUCKET}.admission.>",
            *_reads("INTAKE", ["admission-intake"]),
            *_reads("JOBS", ordered=True),
            *_reads("NODES", ordered=True),
            *_reads(leases),
            *_reads(config, ordered=True),
            *_declares([leases, config]),
        ]
        return publish, [], False
    if role == "placement":
        # The run dispatcher: orders to node agents, their reports read through its own durables.
        publish = [
            f"{jobs}.placement",
            f"$KV.{LEASES_BUCKET}.placement.>",
            f"{_J}.work.{cluster}.*.orders",
            subjects.deadletter("JOBS"),
            subjects.deadletter("WORK"),
            *_reads("JOBS", [f"dispatcher-{cluster}"], ordered=True),
            *_reads("WORK", [f"dispatcher-reports-{cluster}"]),
            *_reads("NODES", ordered=True),
            *_reads(leases),
            *_declares([leases]),
        ]
        return publish, [], False
    if role == "health":
        publish = [
            f"{jobs}.health",
            subjects.NODES_ALL,
            subjects.audit("node"),
            subjects.audit("health"),
            subjects.deadletter("TELEMETRY"),
            subjects.deadletter("NODES"),
            f"{_J}.agent.*.*.control",
            *_reads("TELEMETRY", ["health-heartbeats"]),
            *_reads("NODES", ["health-nodes"], ordered=True),
            *_reads("JOBS"),
        ]
        return publish, [], False
    if role == "accounting":
        return [subjects.deadletter("JOBS"), *_reads("JOBS", ["accounting"])], [], False
    if role == "gateway":
        # API tokens: created and revoked through the gateway, followed with a watch.
        auth = _kv(AUTH_BUCKET)
        # Dead letters: read, and replayed on intake and node subjects (trainyard.bus.deadletters),
        # checked against the original message, looked up in its stream by sequence; or discarded.
        publish = [
            f"{_J}.intake.*",
            "$JS.API.STREAM.MSG.GET.INTAKE",
            "$JS.API.STREAM.MSG.DELETE.DEADLETTER",
            f"{_J}.agent.*.*.logs",  # a job's output, asked of the agent that ran it (logs requests only)
            subjects.NODES_ALL,
            subjects.AUDIT_ALL,
            *_reads("JOBS"),
            *_reads("DEADLETTER"),
            *_reads("NODES", ordered=True),
            f"$KV.{AUTH_BUCKET}.>",
            *_reads(auth, ordered=True),
            *_reads(_kv(CONFIG_BUCKET), ordered=True),  # the console's tenancy page: read only
            *_declares([auth]),
        ]
        return publish, [], False
    # emulator: the node agents of one cluster (or of every cluster with "*")
    publish = [
        f"{jobs}.agent",
        f"{_J}.nodes.{cluster}.*",
        f"{_J}.telemetry.{cluster}.*",
        subjects.deadletter("JOBS"),
        *_reads("JOBS", [f"emulator-{cluster}"]),
        *_reads("NODES"),
    ]
    subscribe = [f"{_J}.emulator.{cluster}.control", f"{_J}.agent.{cluster}.*.control"]
    return publish, subscribe, True


def _agent(node: str, cluster: str) -> tuple[list[str], list[str], bool]:
    """A node agent: only its own node's registration, telemetry and reports; its own
    orders through its own durable, whose create names its own orders as the filter
    (the forms that carry the filter in the body are not allowed); its own control."""
    orders = f"{_J}.work.{cluster}.{node}.orders"
    durable = f"agent-{node}"
    api = "$JS.API"
    publish = [
        f"{_J}.nodes.{cluster}.{node}",
        f"{_J}.telemetry.{cluster}.{node}",
        f"{_J}.work.{cluster}.{node}.reports",
        f"{api}.STREAM.INFO.WORK",
        f"{api}.CONSUMER.INFO.WORK.{durable}",
        f"{api}.CONSUMER.CREATE.WORK.{durable}.{orders}",
        f"{api}.CONSUMER.MSG.NEXT.WORK.{durable}",
        f"$JS.ACK.WORK.{durable}.>",
    ]
    return publish, [f"{_J}.agent.{cluster}.{node}.control", f"{_J}.agent.{cluster}.{node}.logs"], True


def permissions_for(role: str, tenant: str | None = None, cluster: str = "*", node: str | None = None) -> Permissions:
    """What the user of ``role`` (a portal: of ``tenant``; a node agent: of
    ``node``) may publish and subscribe to.  ``cluster`` scopes the node
    subjects of the emulator and the agents, and the dispatcher's ("*": any)."""
    _check(role, tenant, node)
    if role == "admin":
        return Permissions(publish=(">",), subscribe=(">",))
    inbox = f"{inbox_prefix(user_name(role, tenant, node))}.>"
    if role == "portal":
        return Permissions(publish=(subjects.intake(tenant or ""),), subscribe=(inbox,))
    if cluster != "*":
        subjects.token(cluster)
    if role == AGENT:
        publish, subscribe, responses = _agent(node or "", cluster)
        return Permissions(publish=tuple(publish), subscribe=(inbox, *subscribe), allow_responses=responses)
    publish, subscribe, responses = _service(role, cluster)
    # Every service declares the streams at start (creating any that is missing).
    publish = [*publish, *_declares(STREAMS)]
    return Permissions(
        publish=tuple(dict.fromkeys(publish)),
        subscribe=(inbox, *subscribe),
        allow_responses=responses,
        deny_publish=_others_durables(role, publish, cluster),
    )


_DURABLE_CREATE = "$JS.API.CONSUMER.DURABLE.CREATE."


def _others_durables(role: str, publish: list[str], cluster: str) -> tuple[str, ...]:
    """Creates that ``role`` may not make although ``publish`` allows them: of
    the durable consumers of the other services on every stream where
    ``role`` may create named ordered consumers (``CONSUMER.CREATE.<stream>.*``).
    A create names an existing consumer to update it, so without this the
    placement user could give accounting's durable another filter."""
    ordered = {p.split(".")[4] for p in publish if p.startswith("$JS.API.CONSUMER.CREATE.") and p.endswith(".*")}
    theirs = {
        tuple(p.removeprefix(_DURABLE_CREATE).split(".", 1))
        for other in SERVICES
        if other != role
        for p in _service(other, cluster)[0]
        if p.startswith(_DURABLE_CREATE)
    }
    mine = {tuple(p.removeprefix(_DURABLE_CREATE).split(".", 1)) for p in publish if p.startswith(_DURABLE_CREATE)}
    api = "$JS.API.CONSUMER.CREATE"
    return tuple(
        f"{api}.{stream}.{durable}{tail}"
        for stream, durable in sorted(theirs - mine)
        if stream in ordered
        for tail in ("", ".>")
    )


def nats_config(users: Iterable[BusUser], cluster: str = "*") -> str:
    """The ``authorization`` block of a nats-server configuration file for
    ``users``; include it with ``-c`` next to the usual command-line flags.
    Strings are written as JSON strings, which the configuration format reads
    as they are (a ``$`` in a quoted string is not a variable)."""
    entries = []
    for user in users:
        perms = permissions_for(user.role, user.tenant, cluster, user.node)
        entry: dict[str, object] = {
            "user": user.name,
            "password": user.password,
            "permissions": {
                "publish": {
                    "allow": list(perms.publish),
                    **({"deny": list(perms.deny_publish)} if perms.deny_publish else {}),
                },
                "subscribe": {"allow": list(perms.subscribe)},
                **({"allow_responses": True} if perms.allow_responses else {}),
            },
        }
        entries.append("    " + json.dumps(entry))
    lines = [
        "# Generated by Trainyard (trainyard.bus.permissions); regenerate rather than edit.",
        "# One user per service, per submission portal, per node agent and an admin; see docs/security.md.",
        "authorization {",
        "  users = [",
        ",\n".join(entries),
        "  ]",
        "}",
        "",
    ]
    return "\n".join(lines)
