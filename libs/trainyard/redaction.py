"""Secrets kept out of what people read: reports, error messages, logs.

The stack's own commands reach NATS and Redis with URLs that carry the admin
credential (``redis://admin:<password>@127.0.0.1:6379``, see
``trainyard.local.state.read_state``); a URL is named in a report or an error
only through :func:`redact`, which leaves the user and the address and
replaces the password, and any ``password=`` / ``token=`` / ``secret=``
parameter, with ``***``."""

from __future__ import annotations

import re

HIDDEN = "***"

#: ``scheme://user:password@``: everything between the first colon after the
#: user and the last ``@`` before the host (a password may hold ``/`` or ``:``).
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*):(?P<password>[^\s@]*)@")
_PARAMETER = re.compile(r"(?P<head>\b(?:password|passwd|pwd|token|secret)=)(?P<value>[^&\s;]+)", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with the password of every URL in it and every password,
    token or secret parameter replaced by ``***``."""
    text = _USERINFO.sub(lambda m: f"{m['head']}:{HIDDEN}@", text)
    return _PARAMETER.sub(lambda m: f"{m['head']}{HIDDEN}", text)
