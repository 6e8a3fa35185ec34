"""A small HTTP client for the gateway, used by the CLI, and where the CLI's
credentials come from: ``--token``, else ``$TRAINYARD_TOKEN``, else the local
stack's admin token (``<data_dir>/admin-token``, written by ``trainyard up``).
Which gateway and data directory: :mod:`trainyard.cli.discovery`.

Requests go through the standard library (:class:`Client`): no HTTP library
to import, so a command answers in a few hundred milliseconds."""

from __future__ import annotations

import json as _json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainyard.cli.discovery import DEFAULT_API_URL, find_data_dir, locate_api_url
from trainyard.cli.settings import cli_settings

if TYPE_CHECKING:
    import httpx

__all__ = ["DEFAULT_API_URL", "ApiError", "Client", "resolve_api_url", "resolve_token", "use_token"]

TOKEN_ENV = "TRAINYARD_TOKEN"
ADMIN_TOKEN_FILE = "admin-token"  # as trainyard.auth.bootstrap writes it (that package is slow to import)
MAX_PAGE = 1000  # the most items the gateway returns per page
_chosen: dict[str, str] = {}  # "token": the global --token option, when given


class ApiError(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status, None when the API could not be reached


def resolve_api_url(api_url: str | None, data_dir: str) -> str:
    """``--api-url``, else ``TRAINYARD_API_URL``, else the stack found from here (:mod:`.discovery`)."""
    return locate_api_url(api_url, cli_settings().api_url, data_dir)[0]


def use_token(token: str | None) -> None:
    """Remember the global ``--token`` for every request of this command."""
    if token:
        _chosen["token"] = token.strip()
    else:
        _chosen.pop("token", None)


def resolve_token(token: str | None, data_dir: str) -> str | None:
    """``token``, else ``--token``, else ``$TRAINYARD_TOKEN``, else the local stack's admin token."""
    return token or _chosen.get("token") or cli_settings().token.strip() or _admin_token(find_data_dir(data_dir))


def _admin_token(data_dir: str) -> str | None:
    try:
        text = (Path(data_dir) / ADMIN_TOKEN_FILE).read_text().strip()
    except OSError:
        return None
    return text or None


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def grpc_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Metadata that presents ``token`` to the gateway's gRPC service."""
    return (("authorization", f"Bearer {token}"),) if token else ()


class Reply:
    """An HTTP answer: what :func:`describe_error` reads (an ``httpx.Response`` has the same)."""

    def __init__(self, status_code: int, content: bytes) -> None:
        self.status_code = status_code
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return _json.loads(self.content)


class Client:
    """The gateway's REST API over the standard library's ``http.client``: the
    command answers sooner than it would after importing an HTTP library, and
    a plain-HTTP gateway (the local stack) costs no TLS set-up.  It connects
    directly; ``HTTP(S)_PROXY`` are not used."""

    def __init__(self, api_url: str, token: str | None = None, timeout: float = 10.0, found_in: str = "") -> None:
        self.api_url = api_url
        self.token = token
        self.timeout = timeout
        self.found_in = found_in  # where the URL came from, said when it does not answer

    @classmethod
    def for_cli(cls, api_url: str | None, data_dir: str, timeout: float = 10.0) -> Client:
        """The gateway the CLI talks to, with the credentials it finds."""
        url, found_in = locate_api_url(api_url, cli_settings().api_url, data_dir)
        return cls(url, resolve_token(None, data_dir), timeout, found_in)

    def request(self, method: str, path: str, params: Mapping[str, Any] | None = None, json: Any = None) -> Any:
        """``method path`` with query ``params`` and a JSON body; the decoded answer, or
        :class:`ApiError` saying what went wrong."""
        import http.client  # here: `trainyard --help` sends nothing

        try:
            reply = self._send(method, path, params, json)
        except (OSError, http.client.HTTPException, ValueError) as err:
            where = f", from {self.found_in}" if self.found_in else ""
            raise ApiError(
                f"cannot reach the Trainyard API at {self.api_url}{where} ({err}); is `trainyard up` running?"
            ) from err
        if reply.status_code >= 400:
            raise ApiError(describe_error(reply, self.token is not None), reply.status_code)
        return reply.json() if reply.content else None

    def walk(
        self, path: str, key: str, params: Mapping[str, Any], most: int | None, page: int = MAX_PAGE
    ) -> tuple[list[Any], str | None]:
        """The ``key`` items of the list at ``path``, page after page (each
        page's ``next_cursor`` sent back as ``cursor``), until ``most`` items
        (every one when None) or the last page; and the cursor of the page
        after the last one read (None: the list has ended)."""
        items: list[Any] = []
        cursor = params.get("cursor")
        while True:
            size = page if most is None else max(1, min(page, most - len(items)))
            answer = self.request("GET", path, params={**params, "limit": size, "cursor": cursor})
            items += answer[key]
            cursor = answer.get("next_cursor")
            if cursor is None or (most is not None and len(items) >= most):
                return items, cursor

    def _send(self, method: str, path: str, params: Mapping[str, Any] | None, body: Any) -> Reply:
        import http.client
        from urllib.parse import urlencode, urlsplit

        url = urlsplit(self.api_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"{self.api_url!r} is not an http:// or https:// URL")
        connection: http.client.HTTPConnection
        if url.scheme == "https":
            import ssl

            context = ssl.create_default_context()
            connection = http.client.HTTPSConnection(url.hostname, url.port, timeout=self.timeout, context=context)
        else:
            connection = http.client.HTTPConnection(url.hostname, url.port, timeout=self.timeout)
        query = {k: _query_value(v) for k, v in (params or {}).items() if v is not None}
        target = url.path.rstrip("/") + path + (f"?{urlencode(query, doseq=True)}" if query else "")
        headers = {"Accept": "application/json", "User-Agent": "trainyard-cli", **auth_headers(self.token)}
        data = None
        if body is not None:
            data = _json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            connection.request(method, target, body=data, headers=headers)
            answer = connection.getresponse()
            return Reply(answer.status, answer.read())
        finally:
            connection.close()


def _query_value(value: Any) -> Any:
    """A query value as httpx writes it: booleans as true/false."""
    return ("true" if value else "false") if isinstance(value, bool) else value


def describe_error(response: Reply | httpx.Response, token_sent: bool) -> str:
    """What went wrong, with a hint on credentials for a 401."""
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    message = _format_error(response.status_code, body)
    if response.status_code == 401:
        hint = "check the token" if token_sent else "no token found"
        message += (
            f"\n  ({hint}: pass --token, set {TOKEN_ENV}, or run `trainyard up`, which writes an admin "
            "token to <data dir>/admin-token)"
        )
    return message


def _format_error(status: int, body: Any) -> str:
    if isinstance(body, dict):
        errors = body.get("errors") or body.get("detail")
        if isinstance(errors, list):
            lines = [
                f"  {e.get('field', '?')}: {e.get('message', e)}" if isinstance(e, dict) else f"  {e}" for e in errors
            ]
            return f"request refused ({status}):\n" + "\n".join(lines)
        if errors:
            return f"request refused ({status}): {errors}"
        if body.get("message"):
            return f"request refused ({status}): {body['message']}"
    return f"request refused ({status}): {body}"
