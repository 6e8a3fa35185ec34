"""REST routes for API tokens: create (the secret is in the answer, once),
list and revoke.  For admins, and for tenant-admins inside their own tenant
(researcher and tenant-admin tokens only).  Creating and revoking are audited
under the verified caller."""

from __future__ import annotations

import msgspec
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from trainyard.auth import Action, BadTokenRequest, Principal, TokenRecord, TokenStore, check_grant, may_see
from trainyard.auth.principal import TENANT_BOUND, parse_role
from trainyard.auth.tokens import is_token_id
from trainyard.bus import Bus
from trainyard.bus.audit import audit
from trainyard.domain.job import ValidationError
from trainyard_gateway import pages
from trainyard_gateway.errors import error_response, json_response
from trainyard_gateway.jobs import MAX_LIST_LIMIT, InvalidRequest
from trainyard_gateway.openapi import answer, request_body
from trainyard_gateway.schema import CreatedToken, CreateTokenBody, ErrorBody, TokenInfo, TokenList
from trainyard_gateway.security import allow, read_body

MAX_BODY_BYTES = 4096


def info(record: TokenRecord) -> TokenInfo:
    return TokenInfo(
        id=record.id,
        name=record.name,
        role=record.role.value,
        tenant=record.tenant,
        created_at=record.created_at,
        created_by=record.created_by,
        expires_at=record.expires_at,
        revoked=record.revoked,
        revoked_at=record.revoked_at,
        revoked_by=record.revoked_by,
    )


async def audit_created(bus: Bus, who: Principal, record: TokenRecord) -> None:
    """The audit record of a token ``who`` created (the REST API and the console write the same)."""
    details = {"name": record.name, "role": record.role.value, "tenant": record.tenant or ""}
    if record.expires_at is not None:
        details["expires_at"] = f"{record.expires_at:.0f}"
    await audit(
        bus,
        who.actor,
        "token.create",
        record.id,
        details=details,
        at=record.created_at,
        record_id=f"audit:token:create:{record.id}",
    )


async def revoke_audited(bus: Bus, tokens: TokenStore, who: Principal, record: TokenRecord) -> TokenRecord:
    """Revoke ``record``'s token for ``who``, audited the first time it is revoked."""
    revoked = await tokens.revoke(record.id, who.actor)
    if revoked.revoked_by == who.actor and not record.revoked:
        await audit(
            bus,
            who.actor,
            "token.revoke",
            record.id,
            details={"name": record.name},
            at=revoked.revoked_at,
            record_id=f"audit:token:revoke:{record.id}",
        )
    return revoked


def _no_store() -> Response:
    return error_response(501, "not_implemented", "this gateway has no token store")


def token_router(bus: Bus, tokens: TokenStore | None) -> APIRouter:
    router = APIRouter(prefix="/v1/auth/tokens", tags=["auth"])

    @router.post(
        "",
        status_code=201,
        summary="Create an API token (the secret is shown once)",
        responses={**answer(201, "The token and its record", CreatedToken), **answer(422, "Bad request", ErrorBody)},
        openapi_extra=request_body(CreateTokenBody),
    )
    async def create_token(request: Request, who: Principal = allow(Action.TOKEN_ADMIN)) -> Response:
        if tokens is None:
            return _no_store()
        raw = await read_body(request, MAX_BODY_BYTES, "a token request")
        try:
            body = msgspec.json.decode(raw, type=CreateTokenBody)
            role = parse_role(body.role)
        except (msgspec.DecodeError, RecursionError) as err:
            raise InvalidRequest(
                [ValidationError("body", f"give name, role, and tenant or expires_in_s: {err}")]
            ) from None
        except ValueError as err:
            raise InvalidRequest([ValidationError("role", str(err))]) from None
        tenant = body.tenant
        if tenant is None and who.tenant is not None and role in TENANT_BOUND:
            tenant = who.tenant  # a tenant-admin's tokens are for its own tenant
        check_grant(who, role, tenant)
        try:
            record, token = await tokens.create(body.name, role, tenant, who.actor, body.expires_in_s)
        except BadTokenRequest as err:
            raise InvalidRequest([ValidationError(err.field, str(err))]) from None
        await audit_created(bus, who, record)
        return json_response(CreatedToken(token=token, info=info(record)), 201)

    @router.get("", summary="List API tokens (never their secrets)", responses=answer(200, "The tokens", TokenList))
    async def list_tokens(
        who: Principal = allow(Action.TOKEN_ADMIN),
        limit: int | None = Query(None, ge=1, le=MAX_LIST_LIMIT, description="At most this many; default all."),
        cursor: str | None = Query(None, description="`next_cursor` of the previous page."),
    ) -> Response:
        if tokens is None:
            return _no_store()
        visible = [info(r) for r in await tokens.list() if may_see(who, Action.TOKEN_ADMIN, r.tenant or "")]
        shown, following = pages.page_of(visible, lambda t: t.id, "tokens", {}, limit, cursor)
        return json_response(TokenList(tokens=shown, next_cursor=following))

    @router.delete(
        "/{token_id}",
        summary="Revoke an API token (within about a second on every gateway)",
        responses={**answer(200, "The revoked token", TokenInfo), **answer(404, "No such token", ErrorBody)},
    )
    async def revoke_token(token_id: str, who: Principal = allow(Action.TOKEN_ADMIN)) -> Response:
        if tokens is None:
            return _no_store()
        if not is_token_id(token_id):
            message = f"{token_id!r} is not a token id: give the 16 hex digits `trainyard auth token list` shows"
            raise InvalidRequest([ValidationError("token_id", message)])
        record = await tokens.get(token_id)
        if record is None or not may_see(who, Action.TOKEN_ADMIN, record.tenant or ""):
            return error_response(404, "not_found", f"no token {token_id!r}")
        return json_response(info(await revoke_audited(bus, tokens, who, record)))

    return router
