"""A small HTTP client for the gateway, used by the CLI, and where the CLI's
credentials come from: ``--token``, else ``$TRAINYARD_TOKEN``, else the local
stack's admin token (``<data_dir>/admin-token``, written by ``trainyard up``).
Which gateway and data directory: :mod:`trainyard.cli.discovery`.

httpx is imported when a request is made, not before: ``trainyard --help``
never pays for it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainyard.cli.discovery import DEFAULT_API_URL, find_api_url, find_data_dir
from trainyard.cli.settings import cli_settings

if TYPE_CHECKING:
    import httpx

__all__ = ["DEFAULT_API_URL", "ApiError", "Client", "resolve_api_url", "resolve_token", "use_token"]

TOKEN_ENV = "TRAINYARD_TOKEN"
ADMIN_TOKEN_FILE = "admin-token"  # as trainyard.auth.bootstrap writes it (that package is slow to import)
_chosen: dict[str, str] = {}  # "token": the global --token option, when given


class ApiError(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status, None when the API could not be reached


def resolve_api_url(api_url: str | None, data_dir: str) -> str:
    """``--api-url``, else ``TRAINYARD_API_URL``, else the stack found from here (:mod:`.discovery`)."""
    return find_api_url(api_url, cli_settings().api_url, data_dir)


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


class Client:
    def __init__(self, api_url: str, token: str | None = None, timeout: float = 10.0) -> None:
        import httpx

        verify: Any = True
        if api_url.startswith("http://"):
            # No TLS to a plain-HTTP gateway (the local stack): skip loading the CA bundle, which takes
            # longer than the request.  The context still verifies: it trusts no one, and is never used.
            import ssl

            verify = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self.http = httpx.Client(base_url=api_url, timeout=timeout, headers=auth_headers(token), verify=verify)
        self.api_url = api_url
        self.token = token

    @classmethod
    def for_cli(cls, api_url: str | None, data_dir: str, timeout: float = 10.0) -> Client:
        """The gateway the CLI talks to, with the credentials it finds."""
        return cls(resolve_api_url(api_url, data_dir), resolve_token(None, data_dir), timeout)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as err:
            raise ApiError(
                f"cannot reach the Trainyard API at {self.api_url} ({err}); is `trainyard up` running?"
            ) from err
        if response.status_code >= 400:
            raise ApiError(describe_error(response, self.token is not None), response.status_code)
        return response.json() if response.content else None


def describe_error(response: httpx.Response, token_sent: bool) -> str:
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
