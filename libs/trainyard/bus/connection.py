"""One connection to NATS and JetStream, and idempotent publishing."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import TYPE_CHECKING, Any

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy, PubAck
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError

from trainyard.bus.batching import GroupCommit
from trainyard.bus.client import PublishDenied, ResilientClient, check_publishable
from trainyard.bus.pull import BatchPull, ConsumerChanged, ack_floor, changed_settings
from trainyard.bus.streams import stream_of
from trainyard.events import encode, subjects

if TYPE_CHECKING:
    from trainyard.bus.consumer import ConsumerSpec

log = logging.getLogger(__name__)

#: JetStream error code for a failed Nats-Expected-Last-Subject-Sequence check.
ERR_WRONG_LAST_SEQUENCE = 10071

MSG_ID = "Nats-Msg-Id"
EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
#: The subject filter that check covers (a job's whole history, see subjects.fence_of).
EXPECTED_LAST_SUBJECT_SEQ_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"


#: Between a message id and the tag that binds it to its subject and its writer.
ID_TAG_SEPARATOR = "~"


def id_key(user: str, password: str) -> bytes:
    """The key that tags this bus user's message ids (see :meth:`Bus.message_id`):
    derived from its password, which no other credential knows."""
    seed = f"trainyard message ids\0{user}\0{password}".encode()
    return hashlib.blake2b(seed, digest_size=32).digest()


def logical_id(stored: str) -> str:
    """The id a publisher passed, from a stored ``Nats-Msg-Id`` (tag removed)."""
    return stored.rsplit(ID_TAG_SEPARATOR, 1)[0] if ID_TAG_SEPARATOR in stored else stored


def server_urls(url: str) -> list[str]:
    """The servers in ``url``: one URL, or several separated by commas."""
    urls = [one.strip() for one in url.split(",") if one.strip()]
    if not urls:
        raise ValueError("no NATS server URL given")
    return urls


class WrongLastSequence(Exception):
    """Someone else changed this entity first: re-read and decide again."""


class _Ack(msgspec.Struct):
    """JetStream's answer to a publish: the stored message's place, or an error."""

    stream: str = ""
    seq: int = 0
    duplicate: bool | None = None  # as the stock client reads it: absent when the server leaves it out
    domain: str | None = None
    error: dict[str, Any] | None = None


_decode_ack = msgspec.json.Decoder(_Ack).decode


def pub_ack(data: bytes) -> PubAck:
    """The ack of a JetStream publish (as ``JetStreamContext.publish`` reads
    it, without its JSON module and dataclass walk); raises the server's
    :class:`APIError` when it refused the message."""
    ack = _decode_ack(data)
    if ack.error is not None:
        raise APIError.from_error(ack.error)
    return PubAck(stream=ack.stream, seq=ack.seq, domain=ack.domain, duplicate=ack.duplicate)


class PublishRequest(msgspec.Struct):
    subject: str
    message: Any
    msg_id: str
    expected_last_subject_seq: int | None = None
    #: The filter the check covers; None: ``subjects.fence_of(subject)``.
    fence_subject: str | None = None


class Bus:
    """A NATS connection with JetStream, shared by everything in a process."""

    def __init__(
        self,
        nc: Client,
        js: JetStreamContext,
        publish_timeout: float = 10.0,
        id_key: bytes | None = None,
        group_commit: bool = True,
    ) -> None:
        self.nc = nc
        self.js = js
        self.publish_timeout = publish_timeout
        #: Tags every message id (see :meth:`message_id`); None: ids are sent as they are.
        self.id_key = id_key
        #: Bumped each time the connection is opened again after it closed;
        #: subscriptions made before are gone and must be made again.
        self.generation = 0
        self._closing = False
        self._options: dict[str, Any] = {}
        self._reopening: asyncio.Task[None] | None = None
        #: Publishes to one stream that wait at the same time share one
        #: durable write (see trainyard.bus.batching); None: each goes alone.
        self.group_commit: GroupCommit | None = (
            GroupCommit(nc, self._send_one, publish_timeout) if group_commit else None
        )

    @classmethod
    async def connect(cls, url: str, name: str, **options: Any) -> Bus:
        """Connect for good: lost connections and fatal server errors are
        followed by reconnects (see ``trainyard.bus.client``), and a
        connection closed by anything but :meth:`close` is opened again.
        ``url`` may list several servers of a cluster, comma-separated: the
        client connects to one and moves to another when it is lost.
        ``group_commit`` (default on): publishes that wait together share one
        durable write (see trainyard.bus.batching).  ``publish_timeout`` (default
        10 s): how long a publish waits for the server's ack, also while the
        connection is down, before it raises.  The other ``options`` go
        to the client as they are: ``user``, ``password``, ``inbox_prefix``
        and ``tls`` (see ``trainyard.runtime.nats_options``)."""
        nc = ResilientClient()
        password = options.get("password")
        key = id_key(str(options.get("user") or ""), str(password)) if password else None
        group_commit = bool(options.pop("group_commit", True))
        publish_timeout = float(options.pop("publish_timeout", 10.0))
        js = nc.jetstream(timeout=10.0, publish_async_max_pending=20_000)
        bus = cls(nc, js, publish_timeout=publish_timeout, id_key=key, group_commit=group_commit)
        bus._options = dict(
            options,
            servers=server_urls(url),
            name=name,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            pending_size=64 * 1024 * 1024,
            error_cb=bus._on_error,
            disconnected_cb=bus._on_disconnected,
            reconnected_cb=bus._on_reconnected,
            closed_cb=bus._on_closed,
        )
        await nc.connect(**bus._options)
        return bus

    async def _on_error(self, err: Exception) -> None:
        log.warning("NATS: %r", err)

    async def _on_disconnected(self) -> None:
        if not self._closing:
            log.warning("NATS connection lost; reconnecting")

    async def _on_reconnected(self) -> None:
        log.info("NATS connection back (%s)", self.nc.connected_url.netloc if self.nc.connected_url else "?")

    async def _on_closed(self) -> None:
        if not self._closing and (self._reopening is None or self._reopening.done()):
            self._reopening = asyncio.get_running_loop().create_task(self._reopen())

    async def _reopen(self) -> None:
        """The connection was closed without :meth:`close` being called: open
        it again, for as long as it takes."""
        log.error("NATS connection closed unexpectedly (%r); opening it again", self.nc.last_error)
        delay = 0.5
        while not self._closing and self.nc.is_closed:
            try:
                await self.nc.connect(**self._options)
            except Exception as err:  # noqa: BLE001 - keep trying; the cause is logged
                log.warning("NATS: could not connect again: %r", err)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self.generation += 1
            log.warning("NATS connection opened again; subscriptions are made anew")

    async def close(self) -> None:
        self._closing = True
        if self.group_commit is not None:
            await self.group_commit.close()
        if self._reopening is not None and not self._reopening.done():
            self._reopening.cancel()
        if self.nc.is_closed:
            return
        # Handlers have settled (acked or nakked) everything they took; push
        # those acks out and close.  (Draining would wait on pull subscriptions.)
        try:
            await self.nc.flush(timeout=2)
        except Exception:  # noqa: BLE001 - best effort; unacked messages are redelivered
            pass
        await self.nc.close()

    async def pull(self, spec: ConsumerSpec) -> BatchPull:
        """A pull subscription to the durable consumer ``spec`` names: made, or
        brought up to date when it was made with older settings or changed by
        another client.  A change put back is described in the subscription's
        ``changed``, with the first stream sequence the consumer may have
        skipped meanwhile (after its ack floor: a message it skipped before
        one it acked is not seen; see trainyard.bus.reread).  Raises
        :class:`ConsumerChanged` when its settings are still not these
        afterwards; the subscription checks them again every few seconds (see
        trainyard.bus.pull)."""
        # A filter without wildcards travels in the create's subject
        # (CONSUMER.CREATE.<stream>.<name>.<filter>), so a user may be allowed
        # to create its durable with that filter only (a node agent: its own orders).
        wildcard = any(t in ("*", ">") for t in (spec.filter_subject or ">").split("."))
        config = ConsumerConfig(
            durable_name=spec.durable,
            name=None if wildcard else spec.durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=spec.ack_wait_s,
            max_deliver=-1,  # the consumer loop decides when a message is dead, never the server
            max_ack_pending=spec.max_ack_pending,
            filter_subject=spec.filter_subject,
        )
        found = await self._changed(spec, config)
        info: ConsumerInfo | None = None
        try:
            info = await self.js.add_consumer(spec.stream, config)
        except nats.errors.Error as err:
            log.warning("%s: could not update the consumer: %r", spec.durable, err)
        else:
            changed = changed_settings(info.config, config)
            if changed:
                raise ConsumerChanged(spec.stream, spec.durable, changed)
        pull = BatchPull(self.nc, spec.stream, spec.durable, wanted=config)
        pull.changed = found
        if found is None and info is not None:
            pull.handled_up_to = ack_floor(info)
        return await pull.start()

    async def _changed(self, spec: ConsumerSpec, config: ConsumerConfig) -> ConsumerChanged | None:
        """How the existing consumer differs from ``config`` and what it may
        have skipped, or None (the same, new, or not readable now)."""
        try:
            info = await self.js.consumer_info(spec.stream, spec.durable)
        except NotFoundError:
            return None
        except (nats.errors.Error, PublishDenied) as err:
            log.warning("%s: could not read the consumer's settings: %r", spec.durable, err)
            return None
        changed = changed_settings(info.config, config)
        return ConsumerChanged(spec.stream, spec.durable, changed, ack_floor(info) + 1) if changed else None

    def message_id(self, subject: str, msg_id: str) -> str:
        """The ``Nats-Msg-Id`` sent for ``msg_id`` on ``subject``.

        JetStream drops a message whose id it stored in the duplicate window,
        whoever sent the first and on whichever subject.  Ids are predictable
        (``submit:<tenant>:<job_id>``), so on a locked bus each id carries a
        tag: a keyed hash of the subject and the id under a key derived from
        this user's password (:func:`id_key`).  Another credential cannot make
        the tag, so it cannot take an id of ours first (a duplicate answer
        means this user published the same id on the same subject); the
        same user (every replica of a service) makes the same tag for a
        retried publish.  Without a password (an unlocked bus, where every
        client may publish anything anyway) the id goes as it is."""
        if self.id_key is None:
            return msg_id
        tag = hashlib.blake2b(f"{subject}\n{msg_id}".encode(), key=self.id_key, digest_size=12).hexdigest()
        return f"{msg_id}{ID_TAG_SEPARATOR}{tag}"

    @staticmethod
    def _headers(req: PublishRequest) -> dict[str, str]:
        headers = {MSG_ID: req.msg_id}
        if req.expected_last_subject_seq is not None:
            headers[EXPECTED_LAST_SUBJECT_SEQ] = str(req.expected_last_subject_seq)
            fence = req.fence_subject or subjects.fence_of(req.subject)
            if fence != req.subject:
                headers[EXPECTED_LAST_SUBJECT_SEQ_SUBJECT] = fence
        return headers

    async def publish(
        self,
        subject: str,
        message: Any,
        msg_id: str,
        expected_last_subject_seq: int | None = None,
        fence_subject: str | None = None,
    ) -> PubAck:
        """Publish once.  A repeat with the same ``msg_id`` inside the stream's
        duplicate window returns the first message's ack (``duplicate=True``).
        Raises :class:`WrongLastSequence` when the fenced subjects moved on."""
        req = PublishRequest(subject, message, msg_id, expected_last_subject_seq, fence_subject)
        try:
            return await self.publish_raw(subject, encode(message), self._headers(req))
        except APIError as err:
            if err.err_code == ERR_WRONG_LAST_SEQUENCE:
                raise WrongLastSequence(subject) from err
            raise

    async def publish_raw(self, subject: str, data: bytes, headers: dict[str, str]) -> PubAck:
        """Publish bytes to JetStream.  A message larger than the server's
        ``max_payload`` (data and headers together) raises
        :class:`PayloadTooLarge` before anything is sent: the server would
        answer it by closing the connection.  A ``Nats-Msg-Id`` is tagged
        (see :meth:`message_id`)."""
        if self.id_key is not None and (msg_id := headers.get(MSG_ID)) is not None:
            headers = {**headers, MSG_ID: self.message_id(subject, msg_id)}
        check_publishable(self.nc, subject, data, headers)
        # Only a message with an id may share a batch: a batch whose commit
        # went unanswered is published again message by message.
        if self.group_commit is not None and MSG_ID in headers and (stream := stream_of(subject)) is not None:
            return await self.group_commit.publish(stream, (subject, data, headers))
        return await self._send_one(subject, data, headers)

    async def _send_one(self, subject: str, data: bytes, headers: dict[str, str]) -> PubAck:
        try:
            msg = await self.nc.request(subject, data, timeout=self.publish_timeout, headers=headers)
        except nats.errors.NoRespondersError:
            raise NoStreamResponseError from None
        return pub_ack(msg.data)

    async def publish_many(self, requests: list[PublishRequest]) -> list[PubAck | Exception]:
        """Publish a batch concurrently on the connection; one result per
        request, in order.  A failed check comes back as :class:`WrongLastSequence`.

        (Each publish is a request/reply rather than ``publish_async``, whose
        futures are never completed when the server answers with an error.)"""

        async def one(req: PublishRequest) -> PubAck | Exception:
            try:
                return await self.publish(
                    req.subject, req.message, req.msg_id, req.expected_last_subject_seq, req.fence_subject
                )
            except Exception as err:  # noqa: BLE001 - returned to the caller per request
                return err

        return list(await asyncio.gather(*(one(r) for r in requests)))
