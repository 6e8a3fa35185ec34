"""The console's dead-letter pages: the dead letters, newest first (filter by
the stream they came from), one with the data it kept, and replaying or
discarding one after a confirmation.  The same operations and audit record as ``/v1/deadletters``
(:mod:`trainyard_gateway.dlq_api`), for the roles that may read (operator,
admin) and replay them."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from trainyard.auth import Action
from trainyard.bus import Bus
from trainyard.bus import deadletters as dlq
from trainyard_gateway.console.render import page
from trainyard_gateway.console.session import form_for, principal, refusal
from trainyard_gateway.dlq_api import MAX_REASON_CHARS, discard_audited, replay_audited

LIST_LIMIT = 100


def build_router(bus: Bus) -> APIRouter:
    router = APIRouter(prefix="/admin/deadletters", include_in_schema=False)

    @router.get("")
    async def deadletters_page(
        request: Request, stream: str = "", replayed: int = 0, seq: int = 0, discarded: int = 0
    ) -> Response:
        who = principal(request)
        refused = refusal(request, who, Action.DLQ_READ)
        if refused:
            return refused
        stream = stream.upper() if stream.upper() in dlq.SOURCES else ""
        letters = await dlq.listing(bus, LIST_LIMIT, stream or None)
        return page(
            request,
            "deadletters.html",
            who,
            letters=letters,
            stream=stream,
            streams=dlq.SOURCES,
            counts=await dlq.counts(bus),
            replayed=replayed,
            replayed_of=seq,
            discarded=discarded,
        )

    async def letter_page(
        request: Request, seq: int, template: str, status_code: int = 200, **context: object
    ) -> Response:
        who = principal(request)
        refused = refusal(request, who, Action.DLQ_READ)
        if refused:
            return refused
        try:
            letter = await dlq.read(bus, seq)
        except dlq.DeadLetterNotFound as err:
            return page(request, "error.html", who, status_code=404, message=str(err))
        why_not = None if letter.replayable else dlq.NOT_REPLAYABLE.get(letter.stream, "")
        return page(request, template, who, status_code=status_code, letter=letter, why_not=why_not, **context)

    @router.get("/{seq}")
    async def deadletter_page(request: Request, seq: int) -> Response:
        return await letter_page(request, seq, "deadletter.html", problem=None)

    @router.get("/{seq}/replay")
    async def confirm_replay(request: Request, seq: int) -> Response:
        who = principal(request)
        return refusal(request, who, Action.DLQ_REPLAY) or await letter_page(request, seq, "deadletter_replay.html")

    @router.post("/{seq}/replay")
    async def replay(request: Request, seq: int) -> Response:
        who, fields, refused = await form_for(request, Action.DLQ_REPLAY)
        if refused:
            return refused
        if fields.get("confirm") != str(seq):
            return await letter_page(request, seq, "deadletter_replay.html")
        try:
            done = await replay_audited(bus, seq, who, (fields.get("reason") or "")[:MAX_REASON_CHARS])
        except dlq.DeadLetterNotFound as err:
            return page(request, "error.html", who, status_code=404, message=str(err))
        except dlq.NotReplayable as err:
            return await letter_page(request, seq, "deadletter.html", status_code=409, problem=str(err))
        return RedirectResponse(f"/admin/deadletters?replayed={done.replayed_seq}&seq={seq}", status_code=303)

    @router.get("/{seq}/discard")
    async def confirm_discard(request: Request, seq: int) -> Response:
        who = principal(request)
        return refusal(request, who, Action.DLQ_REPLAY) or await letter_page(request, seq, "deadletter_discard.html")

    @router.post("/{seq}/discard")
    async def discard(request: Request, seq: int) -> Response:
        who, fields, refused = await form_for(request, Action.DLQ_REPLAY)
        if refused:
            return refused
        if fields.get("confirm") != str(seq):
            return await letter_page(request, seq, "deadletter_discard.html")
        try:
            await discard_audited(bus, seq, who, (fields.get("reason") or "")[:MAX_REASON_CHARS])
        except dlq.DeadLetterNotFound as err:
            return page(request, "error.html", who, status_code=404, message=str(err))
        return RedirectResponse(f"/admin/deadletters?discarded={seq}", status_code=303)

    return router
