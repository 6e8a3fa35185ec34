"""A small HTTP client for the gateway, used by the CLI."""

from __future__ import annotations

import os
from typing import Any

import httpx

from trainyard.local.stack import read_state

DEFAULT_API_URL = "http://127.0.0.1:8080"


class ApiError(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status, None when the API could not be reached


def resolve_api_url(api_url: str | None, data_dir: str) -> str:
    if api_url:
        return api_url
    if os.environ.get("TRAINYARD_API_URL"):
        return os.environ["TRAINYARD_API_URL"]
    state = read_state(data_dir)
    return state.api_url if state else DEFAULT_API_URL


class Client:
    def __init__(self, api_url: str, tenant: str | None = None, timeout: float = 10.0) -> None:
        headers = {"X-Trainyard-Tenant": tenant} if tenant else {}
        self.http = httpx.Client(base_url=api_url, timeout=timeout, headers=headers)
        self.api_url = api_url

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as err:
            raise ApiError(
                f"cannot reach the Trainyard API at {self.api_url} ({err}); is `trainyard up` running?"
            ) from err
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = response.text
            raise ApiError(_format_error(response.status_code, body), response.status_code)
        return response.json() if response.content else None


def _format_error(status: int, body: Any) -> str:
    if isinstance(body, dict):
        errors = body.get("errors") or body.get("detail")
        if isinstance(errors, list):
            lines = [f"  {e.get('field', '?')}: {e.get('message', e)}" if isinstance(e, dict) else f"  {e}" for e in errors]
            return f"request refused ({status}):\n" + "\n".join(lines)
        if errors:
            return f"request refused ({status}): {errors}"
        if body.get("message"):
            return f"request refused ({status}): {body['message']}"
    return f"request refused ({status}): {body}"
