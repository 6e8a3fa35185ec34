"""Opaque cursors for the lists that page (jobs, nodes, tokens, dead letters).

Every list takes ``limit`` and ``cursor`` and answers ``next_cursor``: the
cursor of the page after this one, or None when the list has ended.  A cursor
is the URL-safe base64 of a small JSON object: which list it pages, the filters
that list was asked with, and the position of the last item the page looked at
(for jobs: the job's index score, its order, and its id).  The next page
starts strictly after that position, so items added while a client walks the
list never shift it: nothing is returned twice or skipped.

A cursor is only a position.  It grants nothing: the server checks the
caller's scope on every page, and a cursor given back with other filters than
the list it came from (another tenant, status or time) is refused with
:class:`InvalidCursor`, whose message says what to send instead.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import msgspec

#: Longer than any cursor this module makes; a longer one is refused unread.
MAX_CURSOR_CHARS = 1024

Scalar = str | int | float | bool | None


class InvalidCursor(ValueError):
    """A cursor that is not one this API gave out, or was given for another list or filters."""


class _Cursor(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    of: str  # what it pages: "jobs", "nodes", "tokens", "deadletters"
    query: dict[str, Scalar]  # the filters of that list (a scope included)
    after: list[Scalar]  # the position of the last item looked at
    v: int = 1


_decoder = msgspec.json.Decoder(_Cursor)
START_OVER = "pass next_cursor from the previous page unchanged, or leave cursor out to start from the first page"


def encode(list_name: str, query: dict[str, Scalar], after: list[Scalar]) -> str:
    """The opaque cursor of the page after ``after`` in the list ``list_name`` asked with ``query``."""
    raw = msgspec.json.encode(_Cursor(list_name, query, after))
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode(cursor: str, list_name: str, query: dict[str, Scalar], arity: int) -> list[Scalar]:
    """The position a cursor of ``list_name`` holds (``arity`` values), checked
    against the ``query`` this page was asked with; :class:`InvalidCursor` when
    it is damaged, pages another list, or was given for other filters."""
    if len(cursor) > MAX_CURSOR_CHARS:
        raise InvalidCursor(
            f"the cursor is over {MAX_CURSOR_CHARS} characters, so not one this API gave out: {START_OVER}"
        )
    try:
        parsed = _decoder.decode(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, msgspec.DecodeError):
        raise InvalidCursor(f"the cursor is damaged or truncated: {START_OVER}") from None
    if parsed.v != 1:
        raise InvalidCursor(f"the cursor is not one this API gave out: {START_OVER}")
    if parsed.of != list_name:
        raise InvalidCursor(f"the cursor pages {parsed.of}, not {list_name}: {START_OVER}")
    if parsed.query != query:
        raise InvalidCursor(
            "the cursor was given for a list with other filters (or another tenant); send the same filters "
            f"({_filters(parsed.query)}) as the page it came from, or leave cursor out to start from the first page"
        )
    if len(parsed.after) != arity:
        raise InvalidCursor(f"the cursor is not one this API gave out: {START_OVER}")
    return parsed.after


def _filters(query: dict[str, Any]) -> str:
    named = [name for name, value in sorted(query.items()) if value is not None and not isinstance(value, bool)]
    return ", ".join(named) if named else "none"
