"""docs/api.md lists every REST endpoint the gateway serves and every gRPC
method of the protos, so the reference cannot drift from the code."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import trainyard_gateway
from trainyard.auth import Authenticator
from trainyard.settings import Settings
from trainyard_gateway.jobs import JobOperations
from trainyard_gateway.rest import create_app

ROOT = Path(__file__).resolve().parents[2]
API_DOC = (ROOT / "docs" / "api.md").read_text()


def gateway_endpoints() -> list[str]:
    """``METHOD /path`` of every route of the gateway's app, with every router
    the ``trainyard_gateway`` package builds (as the gateway mounts them)."""
    routers = []
    for module in pkgutil.iter_modules(trainyard_gateway.__path__):
        if module.name == "__main__":  # importing it would start a gateway
            continue
        loaded = importlib.import_module(f"trainyard_gateway.{module.name}")
        if hasattr(loaded, "build_router"):
            routers.append(loaded.build_router(None, None, Settings()))  # type: ignore[arg-type]
    app = create_app(JobOperations(None, None), None, Authenticator(), routers=routers)  # type: ignore[arg-type]
    return [f"{method.upper()} {path}" for path, ops in app.openapi()["paths"].items() for method in ops]


def grpc_methods() -> list[str]:
    return [
        m
        for proto in (ROOT / "proto").rglob("*.proto")
        for m in re.findall(r"^\s*rpc\s+(\w+)\s*\(", proto.read_text(), re.M)
    ]


def test_every_rest_endpoint_of_the_gateway_is_in_the_api_reference() -> None:
    endpoints = gateway_endpoints()

    assert "GET /v1/reports/capacity" in endpoints and len(endpoints) >= 10
    missing = [e for e in endpoints if f"`{e}" not in API_DOC]
    assert not missing, f"docs/api.md does not list: {missing}"


def test_every_grpc_method_is_in_the_api_reference() -> None:
    methods = grpc_methods()

    assert "SubmitJob" in methods
    missing = [m for m in methods if not re.search(rf"\brpc {m}\(", API_DOC)]
    assert not missing, f"docs/api.md does not list the gRPC methods: {missing}"
