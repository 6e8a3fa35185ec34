"""REST routes for dead letters: list, show, replay, discard.

``GET /v1/deadletters`` lists them newest first (reason, original stream,
subject and sequence, time, size); ``GET /v1/deadletters/{seq}`` shows one
with the data it kept; ``POST /v1/deadletters/{seq}/replay`` publishes its
message again on the original subject with a new message id (409 with the
reason when the copy was cut short, the stream's messages are not replayed,
or the dead letter's subject or data are not those of the original message
its stream still holds, see :mod:`trainyard.bus.deadletters`) and records
the replay in the audit stream under the verified caller;
``DELETE /v1/deadletters/{seq}`` discards one (nothing is published; audited
as ``deadletter.discard``).

For the operator and admin roles (403 for the others).
"""

from __future__ import annotations

import msgspec
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from trainyard.auth import Action, Principal
from trainyard.bus import Bus
from trainyard.bus import deadletters as dlq
from trainyard.bus.audit import audit
from trainyard.bus.permissions import STREAMS
from trainyard.settings import Settings
from trainyard.store import Store
from trainyard_gateway import pages
from trainyard_gateway.errors import error_response, json_response
from trainyard_gateway.schema import DeadLetterList, ReplayBody
from trainyard_gateway.security import allow, read_body

MAX_BODY_BYTES = 4096
MAX_REASON_CHARS = 256


async def reason_of(request: Request) -> tuple[str, Response | None]:
    """The reason a replay or discard gives in its body, or the 422 that says what is wrong with the body."""
    try:
        body = msgspec.json.decode(await read_body(request, MAX_BODY_BYTES) or b"{}", type=ReplayBody)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as err:
        return "", error_response(422, "invalid_argument", f"the body is not a JSON object with a reason: {err}")
    if len(body.reason) > MAX_REASON_CHARS:
        return "", error_response(422, "invalid_argument", f"reason: at most {MAX_REASON_CHARS} characters")
    return body.reason, None


async def replay_audited(bus: Bus, seq: int, who: Principal, reason: str) -> dlq.Replayed:
    """Replay dead letter ``seq`` for ``who`` and record it in the audit stream
    (the REST API and the console do the same); raises as :func:`dlq.replay`."""
    done = await dlq.replay(bus, seq, who.actor)
    details = {
        "stream": done.stream,
        "subject": done.subject,
        "replayed_seq": str(done.replayed_seq),
        "msg_id": done.msg_id,
    }
    await audit(
        bus, who.actor, "deadletter.replay", str(seq), reason.strip(), details=details, record_id=f"audit:{done.msg_id}"
    )
    return done


async def discard_audited(bus: Bus, seq: int, who: Principal, reason: str) -> dlq.DeadLetter:
    """Discard dead letter ``seq`` for ``who`` and record it in the audit stream
    (the REST API and the console do the same); raises as :func:`dlq.discard`."""
    letter = await dlq.discard(bus, seq)
    details = {"stream": letter.stream, "subject": letter.subject, "reason": letter.reason}
    record_id = f"audit:deadletter:discard:{seq}"
    await audit(bus, who.actor, "deadletter.discard", str(seq), reason.strip(), details=details, record_id=record_id)
    return letter


def build_router(bus: Bus, store: Store, settings: Settings) -> APIRouter:
    router = APIRouter(prefix="/v1/deadletters", tags=["dead letters"])

    @router.get("", summary="Dead letters, newest first")
    async def list_deadletters(
        limit: int = Query(50, ge=1, le=1000, description="At most this many"),
        stream: str | None = Query(None, description=f"Only those from this stream ({', '.join(STREAMS[:-1])})"),
        before: int | None = Query(None, ge=1, description="Only those below this sequence (or use cursor)"),
        cursor: str | None = Query(None, description="`next_cursor` of the previous page."),
        who: Principal = allow(Action.DLQ_READ),
    ) -> Response:
        if stream is not None and stream.upper() not in STREAMS:
            return error_response(422, "invalid_argument", f"stream: one of {', '.join(STREAMS)}, not {stream!r}")
        stream = stream.upper() if stream else None
        query: pages.Query = {"stream": stream}
        after = pages.position(cursor, "deadletters", query, (int,))
        if after is not None and before is not None:
            return error_response(422, "invalid_argument", "before: leave it out when you pass cursor")
        before = int(after[0]) if after is not None else before  # type: ignore[arg-type]
        letters, lowest = await dlq.listing_page(bus, limit, stream, before)
        following = pages.next_cursor("deadletters", query, None if lowest is None else [lowest])
        return json_response(DeadLetterList(letters, following))

    @router.get("/{seq}", summary="One dead letter with the data it kept")
    async def show_deadletter(seq: int, who: Principal = allow(Action.DLQ_READ)) -> Response:
        try:
            return json_response(await dlq.read(bus, seq))
        except dlq.DeadLetterNotFound as err:
            return error_response(404, "not_found", str(err))

    @router.post("/{seq}/replay", status_code=202, summary="Publish a dead letter's message again")
    async def replay_deadletter(seq: int, request: Request, who: Principal = allow(Action.DLQ_REPLAY)) -> Response:
        reason, refused = await reason_of(request)
        if refused is not None:
            return refused
        try:
            done = await replay_audited(bus, seq, who, reason)
        except dlq.DeadLetterNotFound as err:
            return error_response(404, "not_found", str(err))
        except dlq.NotReplayable as err:
            return error_response(409, "conflict", str(err))
        return json_response(done, 202)

    @router.delete("/{seq}", summary="Discard a dead letter (nothing is published)")
    async def discard_deadletter(seq: int, request: Request, who: Principal = allow(Action.DLQ_REPLAY)) -> Response:
        reason, refused = await reason_of(request)
        if refused is not None:
            return refused
        try:
            return json_response(await discard_audited(bus, seq, who, reason))
        except dlq.DeadLetterNotFound as err:
            return error_response(404, "not_found", str(err))

    return router
