"""Settings shared by every process, read from ``TRAINYARD_*`` environment
variables.  A bad value stops the process at start with a message saying
which variable to fix."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

#: Where ``trainyard up`` and a service run outside it keep their data.
DEFAULT_DATA_DIR = ".trainyard"


class ConfigurationError(Exception):
    pass


class Settings(msgspec.Struct, frozen=True):
    nats_url: str = "nats://127.0.0.1:4222"
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_prefix: str = "ty:"
    cluster: str = "local"
    data_dir: str = DEFAULT_DATA_DIR
    ledger_url: str = f"sqlite:///{DEFAULT_DATA_DIR}/ledger.db"  # default: <data_dir>/ledger.db
    stream_replicas: int = 1
    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 5.0
    cycle_interval_s: float = 1.0  # a decider cycles at least this often
    placement_timeout_s: float = 60.0  # an admitted gang not placed by then gives its quota back
    cycle_coalesce_s: float = 0.02  # and waits this long after a change, to decide in batches
    gateway_host: str = "127.0.0.1"
    gateway_http_port: int = 8080
    gateway_grpc_port: int = 50051
    log_level: str = "INFO"
    # Bearer JWTs (docs/security.md); no issuer: only API tokens are accepted.
    auth_jwt_issuer: str = ""  # the "iss" to trust, e.g. https://login.example.com/realms/ml
    auth_jwt_audience: str = ""  # must appear in "aud"
    auth_jwks_url: str = ""  # the issuer's JWKS (its OIDC discovery document's jwks_uri)
    auth_jwks_file: str = ""  # or a local JWKS file
    auth_jwt_role_claim: str = "trainyard_role"  # claim holding the role (dots reach into objects)
    auth_jwt_tenant_claim: str = "trainyard_tenant"  # claim holding the tenant of tenant-bound roles
    auth_jwt_algorithms: str = "RS256,ES256"  # comma-separated; asymmetric only
    auth_jwt_leeway_s: float = 30.0  # clock skew allowed on exp / nbf / iat


def load_settings(environ: dict[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for field in msgspec.structs.fields(Settings):
        name = f"TRAINYARD_{field.name.upper()}"
        if name in env:
            values[field.name] = env[name]
    if "ledger_url" not in values:
        values["ledger_url"] = default_ledger_url(str(values.get("data_dir") or DEFAULT_DATA_DIR))
    try:
        settings = msgspec.convert(values, Settings, strict=False)
    except msgspec.ValidationError as err:
        raise ConfigurationError(f"bad setting: {err} (check the TRAINYARD_* environment variables)") from err
    if settings.heartbeat_timeout_s <= settings.heartbeat_interval_s:
        raise ConfigurationError(
            "TRAINYARD_HEARTBEAT_TIMEOUT_S must be larger than TRAINYARD_HEARTBEAT_INTERVAL_S"
        )
    if not settings.redis_prefix.endswith(":"):
        raise ConfigurationError("TRAINYARD_REDIS_PREFIX must end with ':'")
    return settings


def default_ledger_url(data_dir: str) -> str:
    """SQLite at ``<data_dir>/ledger.db``; creates the directory, as SQLite
    will not."""
    path = Path(data_dir)
    path.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path.resolve() / 'ledger.db'}"
