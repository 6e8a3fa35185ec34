"""Rendering: the Jinja2 environment, the filters the templates use, and the
navigation each role sees (only what its role may do)."""

from __future__ import annotations

import datetime as dt
import re
import time
from pathlib import Path
from typing import Any

import jinja2
import markupsafe
from fastapi import Request
from fastapi.responses import HTMLResponse

from trainyard.auth import Action, Principal
from trainyard.auth.policy import scope_of
from trainyard.core.reasons import REASON_TEXT, PendingReason
from trainyard_gateway.console.job_rows import elapsed, nodes_of
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
    ("Tokens", "/admin/tokens", Action.TOKEN_ADMIN),
    ("Dead letters", "/admin/deadletters", Action.DLQ_READ),
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


def when(at: float | None, text: str | None = None) -> markupsafe.Markup:
    """A ``<time>`` element showing the UTC time (as :func:`clock` writes it),
    or ``text`` (say, "3m ago"); console.js shows the time in the browser's time
    zone and keeps the UTC time on hover.  Without scripts it stays UTC."""
    if at is None:
        return markupsafe.Markup("")
    iso = dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    utc = clock(at)
    if text is not None:
        return markupsafe.Markup('<time class="ago" datetime="{}" title="{}">{}</time>').format(iso, utc, text)
    return markupsafe.Markup('<time datetime="{}" title="{}">{}</time>').format(iso, utc, utc)


#: ``token:<16 hex digits>:<name>``, alone or inside a longer actor (``operator:token:…:op1``).
_TOKEN_ACTOR = re.compile(r"(?:^|:)token:[0-9a-f]{16}:([A-Za-z0-9_-]{1,64})$")


def person(actor: str | None) -> str:
    """The name a person knows an actor by: a token's name, a JWT's subject,
    a service's name; the raw id when it is none of these."""
    if not actor:
        return ""
    found = _TOKEN_ACTOR.search(actor)
    if found:
        return found.group(1)
    for prefix in ("operator:", "jwt:", "service:"):  # "operator:jwt:<sub>" is the subject too
        if actor.startswith(prefix) and len(actor) > len(prefix):
            actor = actor[len(prefix) :]
    return actor


def actor(value: str | None) -> markupsafe.Markup:
    """An actor as a person's name, with the raw id on hover."""
    if not value:
        return markupsafe.Markup("")
    return markupsafe.Markup('<span class="actor" title="{}">{}</span>').format(value, person(value))


#: An actor inside free text, as health writes one into a node's reason and
#: history ("uncordoned by operator:token:…:op1: fan fixed").
_ACTOR_IN_TEXT = re.compile(r"(?:operator:)?(?:token:[0-9a-f]{16}:[A-Za-z0-9_-]{1,64}|jwt:[^\s:]+)")


def actors_in(text: str | None) -> markupsafe.Markup:
    """``text`` with each actor id in it shown as :func:`actor` shows one."""
    text = text or ""
    parts: list[markupsafe.Markup] = []
    start = 0
    for found in _ACTOR_IN_TEXT.finditer(text):
        parts += [markupsafe.escape(text[start : found.start()]), actor(found.group())]
        start = found.end()
    parts.append(markupsafe.escape(text[start:]))
    return markupsafe.Markup("").join(parts)


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


environment = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=jinja2.select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
    undefined=jinja2.StrictUndefined,
)
environment.filters.update(
    clock=clock, when=when, actor=actor, actors_in=actors_in, person=person, ago=ago, span=span, reason_text=reason_text
)
environment.globals.update(may=may, Action=Action, elapsed=elapsed, nodes_of=nodes_of, now=time.time)


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
