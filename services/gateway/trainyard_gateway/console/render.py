"""Rendering: the Jinja2 environment, the filters the templates use, and the
navigation each role sees (only what its role may do)."""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from pathlib import Path
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse

from trainyard.auth import Action, Principal
from trainyard.auth.policy import scope_of
from trainyard.core.reasons import REASON_TEXT, PendingReason
from trainyard_gateway.security import csrf_token

TEMPLATES = Path(__file__).parent / "templates"

#: (label, path, the action that must be allowed to show it)
NAV: tuple[tuple[str, str, Action], ...] = (
    ("Jobs", "/jobs", Action.JOB_LIST),
    ("Submit", "/jobs/new", Action.JOB_SUBMIT),
    ("Cluster", "/cluster", Action.NODE_LIST),
    ("Nodes", "/nodes", Action.NODE_LIST),
    ("Usage", "/usage", Action.USAGE_READ),
    ("Capacity", "/finance/capacity", Action.CAPACITY_READ),
    ("Tenancy", "/admin/tenancy", Action.TENANCY_READ),
)


def may(who: Principal, action: Action) -> bool:
    return scope_of(who.role, action) is not None


def clock(at: float | None) -> str:
    """A time of day (UTC), with the date when it is not today."""
    if at is None:
        return ""
    when = dt.datetime.fromtimestamp(at, dt.UTC)
    today = dt.datetime.now(dt.UTC).date()
    return when.strftime("%H:%M:%S" if when.date() == today else "%Y-%m-%d %H:%M:%S") + "Z"


def ago(at: float | None) -> str:
    if at is None:
        return ""
    seconds = max(0.0, time.time() - at)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def span(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5_400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3_600:.1f} h"


def reason_text(reason: str | None) -> str:
    """Why a job waits, in words (the same text as ``trainyard why``)."""
    if not reason:
        return "not yet considered by admission"
    try:
        return REASON_TEXT[PendingReason(reason)]
    except ValueError:
        return reason


def tenant_colour(tenant: str | None) -> str:
    """A stable colour per tenant (the same on every page and every gateway)."""
    if not tenant:
        return "#9aa5b1"
    hue = int(hashlib.sha256(tenant.encode()).hexdigest()[:4], 16) % 360
    return f"hsl({hue} 65% 52%)"


environment = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=jinja2.select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
    undefined=jinja2.StrictUndefined,
)
environment.filters.update(clock=clock, ago=ago, span=span, reason_text=reason_text, tenant_colour=tenant_colour)
environment.globals.update(may=may, Action=Action)


def fragment(name: str, **context: Any) -> str:
    return environment.get_template(name).render(**context)


def page(request: Request, name: str, who: Principal | None, status_code: int = 200, **context: Any) -> HTMLResponse:
    """A whole page: ``name`` inside the layout, with the caller's navigation
    and the CSRF token its forms carry."""
    nav = [(label, path) for label, path, action in NAV if who is not None and may(who, action)]
    csrf = context.pop("csrf", None) or (csrf_token(request) if who else "")
    html = environment.get_template(name).render(
        request=request, who=who, nav=nav, path=request.url.path, csrf=csrf, **context
    )
    return HTMLResponse(html, status_code=status_code, headers={"Cache-Control": "no-store"})
