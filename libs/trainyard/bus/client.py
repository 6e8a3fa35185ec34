"""The NATS client under the bus: it never stays disconnected because of one
bad message, and it refuses a message the server would not take.

The stock client closes the connection for good when the server sends an
error other than a permissions violation or a stale connection (for instance
``Maximum Payload Violation`` after one over-size publish, or ``Authorization
Violation``): every subscription is dropped and every later publish fails.
:class:`ResilientClient` treats those errors like a lost connection instead:
it reconnects (with ``max_reconnect_attempts=-1``, for as long as it takes)
and replays its subscriptions, so consumers carry on.

The server counts headers and data together against ``max_payload``; the
client itself checks only the data.  :func:`check_publishable` measures both
and raises :class:`PayloadTooLarge` before anything is sent.

A publish the user's permissions do not allow is dropped by the server, which
answers with an asynchronous ``Permissions Violation`` error and keeps the
connection.  The stock client then lets a request (a JetStream publish or API
call) wait for its whole timeout; :class:`ResilientClient` fails it at once
with :class:`PublishDenied`, and the error is logged through ``error_cb``.

A consumer created without a name (an ordered consumer, a key-value watch)
goes, in the stock client, to ``$JS.API.CONSUMER.CREATE.<stream>`` with any
name in the body, and a name there that is a durable's rewrites that durable:
a user allowed that subject could change any consumer of the stream.
:func:`named_create` gives such a create a fresh name and sends it to
``$JS.API.CONSUMER.CREATE.<stream>.<name>``, the only form the bus
permissions allow for it (trainyard.bus.permissions keeps those names off
other roles' durables).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

from nats import errors
from nats.aio.client import NO_RESPONDERS_STATUS, Client
from nats.aio.msg import Msg
from nats.js.api import Header
from nats.protocol.parser import AUTHORIZATION_VIOLATION, PERMISSIONS_ERR, STALE_CONNECTION

log = logging.getLogger(__name__)

_HEADER_LINE = len(b"NATS/1.0\r\n")
_DENIED_PUBLISH = re.compile(r'permissions violation for publish to "([^"]+)"', re.IGNORECASE)


class PublishDenied(Exception):
    """This connection's user may not publish on ``subject``: the server
    dropped the message.  (A configuration error, not a lost connection.)"""

    def __init__(self, subject: str) -> None:
        super().__init__(f"the bus user of this process may not publish on {subject} (see docs/security.md)")
        self.subject = subject


class PayloadTooLarge(Exception):
    """The message (data plus headers) is larger than the server's
    ``max_payload``; it was not sent, and the connection is untouched."""

    def __init__(self, subject: str, size: int, limit: int) -> None:
        super().__init__(
            f"a message of {size} bytes (data and headers) for {subject} is larger than the server's "
            f"max_payload of {limit} bytes; it was not sent"
        )
        self.subject = subject
        self.size = size
        self.limit = limit


def message_size(data: bytes, headers: dict[str, str] | None) -> int:
    """The bytes the server counts against ``max_payload``: the header block
    (as the client writes it) plus the data."""
    if not headers:
        return len(data)
    block = _HEADER_LINE + 2  # the status line and the blank line that ends the block
    for key, value in headers.items():
        block += len(key.encode()) + 2 + len(value.encode()) + 2
    return block + len(data)


def check_publishable(nc: Client, subject: str, data: bytes, headers: dict[str, str] | None) -> None:
    """Raise before sending what the server would refuse by closing the connection."""
    for key, value in (headers or {}).items():
        if "\n" in key or "\r" in key or "\n" in value or "\r" in value:
            raise ValueError(f"header {key!r} holds a line break; header values are one line")
    size = message_size(data, headers)
    if size > nc.max_payload:
        raise PayloadTooLarge(subject, size, nc.max_payload)


def header_value(text: str, limit: int = 1000) -> str:
    """``text`` made safe as one header value: one line, at most ``limit`` characters."""
    flat = "".join(c if c.isprintable() else " " for c in text)
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


_UNNAMED_CREATE = "$JS.API.CONSUMER.CREATE."


def named_create(subject: str, payload: bytes, name: str) -> tuple[str, bytes]:
    """A create of an unnamed consumer (``$JS.API.CONSUMER.CREATE.<stream>``,
    no name or durable name in the body) as the same create under ``name``
    on ``$JS.API.CONSUMER.CREATE.<stream>.<name>``; anything else as it is."""
    if not subject.startswith(_UNNAMED_CREATE) or subject.count(".") != 4:
        return subject, payload
    try:
        request = json.loads(payload)
    except ValueError:
        return subject, payload
    config = request.get("config") if isinstance(request, dict) else None
    if not isinstance(config, dict) or config.get("name") or config.get("durable_name"):
        return subject, payload  # the server refuses a durable here, and a name is the caller's to choose
    config["name"] = name
    return f"{subject}.{name}", json.dumps(request).encode()


def _expire(future: asyncio.Future[Msg]) -> None:
    """A request's reply did not come in time: its waiter gets the client's timeout error."""
    if not future.done():
        future.set_exception(errors.TimeoutError())


class ResilientClient(Client):
    """A NATS client that reconnects after a fatal server error instead of
    closing for good, and fails a denied request at once (see the module's
    docstring)."""

    def __init__(self) -> None:
        super().__init__()
        #: Subject -> the futures of requests on it still waiting for a reply.
        self._waiting: dict[str, set[asyncio.Future[Msg]]] = {}

    async def request(
        self,
        subject: str,
        payload: bytes = b"",
        timeout: float = 0.5,
        old_style: bool = False,
        headers: dict[str, Any] | None = None,
    ) -> Msg:
        """A request on the shared reply subscription that raises
        :class:`PublishDenied` as soon as the server reports that it may not be
        published.  One future per request and no task: every JetStream
        publish is a request, and the stock client's (a task, a timeout
        wrapper and a done callback each) cost a third of a publish's CPU."""
        if old_style:
            return await super().request(subject, payload, timeout, old_style, headers)
        if self.is_draining_pubs:
            raise errors.ConnectionDrainingError
        if not self._resp_sub_prefix:
            await self._init_request_sub()
        assert self._resp_sub_prefix
        token = self._nuid.next()  # unique on this connection: no random suffix (a system call per request)
        key = token.decode()
        if subject.startswith(_UNNAMED_CREATE):
            subject, payload = named_create(subject, payload, f"eph{self._nuid.next().decode()}")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Msg] = loop.create_future()
        self._resp_map[key] = future
        waiting = self._waiting.get(subject)
        if waiting is None:
            waiting = self._waiting[subject] = set()
        waiting.add(future)
        try:
            await self.publish(subject, payload, reply=(self._resp_sub_prefix + token).decode(), headers=headers)
            timer = loop.call_later(timeout, _expire, future)  # cheaper than asyncio.timeout's task cancelling
            try:
                msg = await future
            finally:
                timer.cancel()
        finally:
            self._resp_map.pop(key, None)
            waiting.discard(future)
            if not waiting and self._waiting.get(subject) is waiting:
                del self._waiting[subject]
        if msg.headers and msg.headers.get(Header.STATUS) == NO_RESPONDERS_STATUS:
            raise errors.NoRespondersError
        return msg

    @staticmethod
    def _parse_header_lines(raw: bytes) -> dict[str, str]:
        """The stock client's header parser, made cheaper: every stored event
        carries its headers to every consumer, and the stock parser ran a
        generator over each header name's characters (a tenth of a decider's
        CPU).  Same result: ``Name: Value`` lines, names that are not ASCII or
        hold whitespace skipped, values stripped and decoded (bad UTF-8 replaced)."""
        out: dict[str, str] = {}
        for line in raw.split(b"\r\n"):
            name, sep, value = line.partition(b":")
            if not sep:
                continue
            try:
                key = name.strip().decode("ascii")
            except UnicodeDecodeError:
                continue
            if key.split() != ([key] if key else []):  # whitespace inside the name
                continue
            out[key] = value.strip().decode("utf-8", "replace")
        return out

    async def _process_err(self, err_msg: str) -> None:
        found = _DENIED_PUBLISH.search(err_msg)
        if found:
            # The client lowercases the server's error: fail the requests on
            # the one subject it can name, or none when two differ only in case
            # (those wait for their timeout).
            named = [s for s in self._waiting if s.lower() == found.group(1).lower()]
            for waiter in self._waiting[named[0]] if len(named) == 1 else ():
                if not waiter.done():
                    waiter.set_exception(PublishDenied(named[0]))
        if STALE_CONNECTION in err_msg or PERMISSIONS_ERR in err_msg:
            await super()._process_err(err_msg)  # stale: reconnects; permissions: reported, kept open
            return
        if AUTHORIZATION_VIOLATION in err_msg:
            err: errors.Error = errors.AuthorizationError()
        else:
            err = errors.Error(f"nats: {err_msg.strip().strip(chr(39))}")
        self._err = err
        log.warning("NATS server error %s: reconnecting", err)
        await self._error_cb(err)
        # The server drops the connection after such an error: reconnect and
        # replay the subscriptions, as after any lost connection.
        await self._process_op_err(err)
