"""Console pages read the projections only when they are caught up.

A page that reads the JOBS or NODES projection directly reads it through
:class:`~trainyard.store.caught_up.CaughtUpReads`, as the REST API does.
While a projection is rebuilt (Redis lost it), such a read raises
:class:`~trainyard.store.caught_up.ProjectionRebuilding`; :func:`answers_rebuilding`
turns that into a 503 page with ``Retry-After``, so a page never shows a job
as missing, an empty fleet, or an older state.  Live streams skip a poll
that raises it (see :mod:`trainyard_gateway.console.live`), keeping what the
page shows.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from trainyard.store.caught_up import ProjectionRebuilding
from trainyard_gateway.console.render import page
from trainyard_gateway.console.session import principal

Endpoint = Callable[..., Awaitable[Response]]


def rebuilding_page(request: Request, err: ProjectionRebuilding) -> Response:
    """503 with ``Retry-After``: the page cannot be shown from a caught-up view yet."""
    message = f"{err}. This page shows only a caught-up view; reload it in a moment."
    answer = page(request, "error.html", principal(request), status_code=503, message=message)
    answer.headers["Retry-After"] = str(err.retry_after_s)
    return answer


def answers_rebuilding(endpoint: Endpoint) -> Endpoint:
    """The page ``endpoint`` draws, or :func:`rebuilding_page` when a read it
    makes finds its projection being rebuilt."""

    @functools.wraps(endpoint)
    async def answer(request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            return await endpoint(request, *args, **kwargs)
        except ProjectionRebuilding as err:
            return rebuilding_page(request, err)

    return answer
