"""Stream declarations.  Every setting is explicit so that a stream created by
one service is the stream every other service expects."""

from __future__ import annotations

import asyncio
import logging

import msgspec
import nats.errors
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from trainyard.bus.client import PublishDenied
from trainyard.events import subjects

log = logging.getLogger(__name__)

DAY = 24 * 3600.0
JOBS_MAX_AGE_S = 90 * DAY


class StreamSpec(msgspec.Struct, frozen=True):
    name: str
    subjects: list[str]
    max_age_s: float  # 0 keeps messages until limits say otherwise
    max_msgs_per_subject: int = -1
    duplicate_window_s: float = 120.0
    description: str = ""


STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec(
        "INTAKE", [subjects.INTAKE_ALL], 30 * DAY, description="SubmitJob / CancelJob from portals and the gateway"
    ),
    # JOBS keeps 90 days: a projection rebuilt after Redis is lost starts from
    # its newest snapshot, taken hourly (trainyard.store.snapshot),
    # and accounting applies each event within seconds.
    StreamSpec("JOBS", [subjects.JOBS_ALL], JOBS_MAX_AGE_S, description="job and run lifecycle: the source of truth"),
    StreamSpec("NODES", [subjects.NODES_ALL], 365 * DAY, description="node registration and state changes"),
    StreamSpec(
        "TELEMETRY",
        [subjects.TELEMETRY_ALL],
        3600.0,
        max_msgs_per_subject=100,
        duplicate_window_s=10.0,
        description="heartbeats and GPU samples; short-lived",
    ),
    StreamSpec(
        "WORK",
        [subjects.WORK_ALL],
        7 * DAY,
        description="run orders to node agents and their reports on the processes they run",
    ),
    StreamSpec("AUDIT", [subjects.AUDIT_ALL], 400 * DAY, description="every human or automatic state change"),
    StreamSpec("DEADLETTER", [subjects.DEADLETTER_ALL], 30 * DAY, description="poison messages with the reason"),
)


def stream_of(subject: str) -> str | None:
    """The stream that stores ``subject``; None for a subject no stream takes."""
    for spec in STREAMS:
        for pattern in spec.subjects:
            if subject.startswith(pattern[:-1]) if pattern.endswith(">") else subject == pattern:
                return spec.name
    return None


def stream_config(spec: StreamSpec, replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        name=spec.name,
        description=spec.description,
        subjects=list(spec.subjects),
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_age=spec.max_age_s,
        max_msgs_per_subject=spec.max_msgs_per_subject,
        duplicate_window=spec.duplicate_window_s,
        num_replicas=replicas,
        allow_direct=True,
        allow_atomic=True,  # publishes that wait together share one durable write (trainyard.bus.batching)
    )


#: The settings :func:`stream_config` sets, compared to decide whether a stream needs an update.
_SETTINGS = (
    "description",
    "subjects",
    "retention",
    "storage",
    "discard",
    "max_age",
    "max_msgs_per_subject",
    "duplicate_window",
    "num_replicas",
    "allow_direct",
    "allow_atomic",
)


def differs(current: StreamConfig, wanted: StreamConfig) -> list[str]:
    """The settings of ``wanted`` that ``current`` does not have."""
    changed = []
    for name in _SETTINGS:
        now, then = getattr(current, name), getattr(wanted, name)
        if isinstance(then, float) and isinstance(now, (int, float)):
            if abs(now - then) > 1e-3:
                changed.append(name)
        elif (now or None) != (then or None):
            changed.append(name)
    return changed


async def ensure_streams(js: JetStreamContext, replicas: int = 1) -> None:
    """Create the streams, or bring an existing stream's settings up to date.

    On a locked bus only admin may update a stream (``trainyard up`` does it
    at start); a service whose user may not is told so in the log and carries
    on with the stream as it is."""
    for spec in STREAMS:
        config = stream_config(spec, replicas)
        try:
            info = await js.stream_info(spec.name)
        except NotFoundError:
            await js.add_stream(config)
            continue
        changed = differs(info.config, config)
        if not changed:
            continue
        try:
            await js.update_stream(config)
        except PublishDenied:
            log.warning(
                "stream %s differs from this version's settings (%s); its update is left to admin",
                spec.name,
                ", ".join(changed),
            )


async def wait_for_leaders(js: JetStreamContext, names: list[str], timeout: float = 30.0) -> None:
    """Return once every stream in ``names`` has a leader to answer publishes.

    On a NATS cluster a stream just made (an R3 bucket on a first start)
    elects its leader a moment later; a publish before that has no responder.
    A single server answers at once.  Raises ``TimeoutError`` naming the
    streams still without a leader after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    waiting = list(names)
    delay = 0.05
    while waiting:
        still = []
        for name in waiting:
            try:
                info = await js.stream_info(name)
            except (TimeoutError, nats.errors.Error):
                still.append(name)  # no leader to answer the info request yet either
                continue
            if info.cluster is not None and not info.cluster.leader:
                still.append(name)
        waiting = still
        if waiting:
            if loop.time() >= deadline:
                raise TimeoutError(f"no leader elected within {timeout:g} s for stream(s) {', '.join(waiting)}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
