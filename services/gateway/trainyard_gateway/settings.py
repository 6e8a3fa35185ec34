"""Gateway settings: where to listen, read from the shared TRAINYARD_* settings
(``TRAINYARD_GATEWAY_HOST``, ``TRAINYARD_GATEWAY_HTTP_PORT``,
``TRAINYARD_GATEWAY_GRPC_PORT``)."""

from __future__ import annotations

import msgspec

from trainyard.settings import ConfigurationError, Settings, load_settings

__all__ = ["ConfigurationError", "GatewaySettings", "Settings", "gateway_settings", "load_settings"]


class GatewaySettings(msgspec.Struct, frozen=True):
    host: str  # address both servers listen on
    http_port: int  # REST, OpenAPI and /metrics; 0 picks a free port
    grpc_port: int  # trainyard.v1.JobService; 0 picks a free port
    shutdown_grace_s: float = 5.0  # how long in-flight requests may finish on stop


def gateway_settings(settings: Settings) -> GatewaySettings:
    for name, port in (("HTTP", settings.gateway_http_port), ("GRPC", settings.gateway_grpc_port)):
        if not 0 <= port <= 65535:
            raise ConfigurationError(f"TRAINYARD_GATEWAY_{name}_PORT must be between 0 and 65535, got {port}")
    if settings.gateway_http_port and settings.gateway_http_port == settings.gateway_grpc_port:
        raise ConfigurationError("TRAINYARD_GATEWAY_HTTP_PORT and TRAINYARD_GATEWAY_GRPC_PORT must differ")
    return GatewaySettings(settings.gateway_host, settings.gateway_http_port, settings.gateway_grpc_port)
