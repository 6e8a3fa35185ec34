"""The console's API-token page: list tokens (never their secrets), create one
(its secret shown once, on the answer to the form), revoke one after a
confirmation.  The same checks and audit records as ``/v1/auth/tokens``
(:mod:`trainyard_gateway.tokens_api`): admins manage every token,
tenant-admins researcher and tenant-admin tokens of their own tenant."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from trainyard.auth import Action, BadTokenRequest, PermissionDenied, Principal, Role, TokenStore, check_grant, may_see
from trainyard.auth.principal import TENANT_BOUND, parse_role
from trainyard.auth.tokens import is_token_id
from trainyard.bus import Bus
from trainyard.domain.job import ValidationError
from trainyard_gateway.console.render import page
from trainyard_gateway.console.session import form_for, principal, refusal
from trainyard_gateway.tokens_api import audit_created, revoke_audited

#: Lifetimes the form offers: label -> seconds (None: until revoked).
LIFETIMES = {
    "until revoked": None,
    "1 day": 86_400.0,
    "30 days": 30 * 86_400.0,
    "90 days": 90 * 86_400.0,
    "1 year": 365 * 86_400.0,
}


def grantable(who: Principal) -> list[Role]:
    """The roles ``who`` may create tokens for."""
    out = []
    for role in Role:
        try:
            check_grant(who, role, who.tenant if role in TENANT_BOUND else None)
        except PermissionDenied:
            continue
        out.append(role)
    return out


def build_router(bus: Bus, tokens: TokenStore | None) -> APIRouter:
    router = APIRouter(prefix="/admin/tokens", include_in_schema=False)

    async def listing(request: Request, who: Principal, status_code: int = 200, **context: object) -> Response:
        if tokens is None:
            return page(request, "error.html", who, status_code=501, message="this gateway has no token store")
        visible = [r for r in await tokens.list() if may_see(who, Action.TOKEN_ADMIN, r.tenant or "")]
        context.setdefault("errors", [])
        context.setdefault(
            "form", {"name": "", "role": Role.RESEARCHER.value, "tenant": who.tenant or "", "lifetime": "90 days"}
        )
        return page(
            request,
            "tokens.html",
            who,
            status_code=status_code,
            tokens=list(reversed(visible)),
            roles=grantable(who),
            lifetimes=list(LIFETIMES),
            **context,
        )

    @router.get("")
    async def tokens_page(request: Request) -> Response:
        who = principal(request)
        return refusal(request, who, Action.TOKEN_ADMIN) or await listing(request, who)

    @router.post("")
    async def create(request: Request) -> Response:
        who, fields, refused = await form_for(request, Action.TOKEN_ADMIN)
        if refused or tokens is None:
            return refused or await listing(request, who)
        form = {k: fields.get(k, "").strip() for k in ("name", "role", "tenant", "lifetime")}
        try:
            role = parse_role(form["role"])
            tenant = (form["tenant"] or who.tenant) if role in TENANT_BOUND else None
            if form["lifetime"] not in LIFETIMES:
                raise BadTokenRequest("lifetime", f"choose one of {', '.join(LIFETIMES)}")
            check_grant(who, role, tenant)
            record, secret = await tokens.create(form["name"], role, tenant, who.actor, LIFETIMES[form["lifetime"]])
        except ValueError as err:  # BadTokenRequest too
            problem = ValidationError(getattr(err, "field", "role"), str(err))
            return await listing(request, who, status_code=422, errors=[problem], form=form)
        except PermissionDenied as err:
            return await listing(request, who, status_code=403, errors=[ValidationError("role", str(err))], form=form)
        await audit_created(bus, who, record)
        return await listing(request, who, status_code=201, created=record, secret=secret)

    async def visible_record(who: Principal, token_id: str):  # type: ignore[no-untyped-def]
        if tokens is None or not is_token_id(token_id):
            return None
        record = await tokens.get(token_id)
        return record if record is not None and may_see(who, Action.TOKEN_ADMIN, record.tenant or "") else None

    @router.get("/{token_id}/revoke")
    async def confirm_revoke(request: Request, token_id: str) -> Response:
        who = principal(request)
        refused = refusal(request, who, Action.TOKEN_ADMIN)
        if refused:
            return refused
        record = await visible_record(who, token_id)
        if record is None:
            return page(request, "error.html", who, status_code=404, message=f"no token {token_id!r}")
        return page(request, "token_revoke.html", who, token=record, mine=who.subject.startswith(f"{token_id}:"))

    @router.post("/{token_id}/revoke")
    async def revoke(request: Request, token_id: str) -> Response:
        who, fields, refused = await form_for(request, Action.TOKEN_ADMIN)
        if refused:
            return refused
        record = await visible_record(who, token_id)
        if record is None or tokens is None:
            return page(request, "error.html", who, status_code=404, message=f"no token {token_id!r}")
        if fields.get("confirm") != token_id:
            return page(request, "token_revoke.html", who, token=record, mine=who.subject.startswith(f"{token_id}:"))
        await revoke_audited(bus, tokens, who, record)
        return RedirectResponse(f"/admin/tokens?revoked={token_id}", status_code=303)

    return router
