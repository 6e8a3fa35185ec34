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
    nats_url: str = "nats://127.0.0.1:4222"  # or every server of a cluster, comma-separated
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_prefix: str = "ty:"
    cluster: str = "local"
    data_dir: str = DEFAULT_DATA_DIR
    ledger_url: str = f"sqlite:///{DEFAULT_DATA_DIR}/ledger.db"  # default: <data_dir>/ledger.db
    stream_replicas: int = 1  # of every stream and KV bucket this process creates: 3 on a NATS cluster
    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 5.0
    cycle_interval_s: float = 1.0  # a decider cycles at least this often
    placement_timeout_s: float = 60.0  # an admitted gang not placed by then gives its quota back
    cycle_coalesce_s: float = 0.02  # and waits this long after a change, to decide in batches
    gateway_host: str = "127.0.0.1"
    gateway_http_port: int = 8080
    gateway_grpc_port: int = 50051
    log_level: str = "INFO"
    log_format: str = "text"  # "text": the line, then key=value fields; "json": one object per line
    # Bearer JWTs (docs/security.md); no issuer: only API tokens are accepted.
    auth_jwt_issuer: str = ""  # the "iss" to trust, e.g. https://login.example.com/realms/ml
    auth_jwt_audience: str = ""  # must appear in "aud"
    auth_jwks_url: str = ""  # the issuer's JWKS (its OIDC discovery document's jwks_uri)
    auth_jwks_file: str = ""  # or a local JWKS file
    auth_jwt_role_claim: str = "trainyard_role"  # claim holding the role (dots reach into objects)
    auth_jwt_tenant_claim: str = "trainyard_tenant"  # claim holding the tenant of tenant-bound roles
    auth_jwt_algorithms: str = "RS256,ES256"  # comma-separated; asymmetric only
    auth_jwt_leeway_s: float = 30.0  # clock skew allowed on exp / nbf / iat
    # The bus and Redis users of this process (docs/security.md); "" connects
    # without one, as to a server with no users.
    nats_user: str = ""
    nats_password: str = ""
    redis_user: str = ""
    redis_password: str = ""
    # Optional TLS: a CA to verify the server with, and a client certificate
    # and key where the server asks for one (Redis: with a rediss:// URL).
    nats_tls_ca: str = ""
    nats_tls_cert: str = ""
    nats_tls_key: str = ""
    redis_tls_ca: str = ""
    redis_tls_cert: str = ""
    redis_tls_key: str = ""


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
    _check_credentials(settings)
    return settings


def _check_credentials(settings: Settings) -> None:
    for kind in ("nats", "redis"):
        user, password = getattr(settings, f"{kind}_user"), getattr(settings, f"{kind}_password")
        if bool(user) != bool(password):
            raise ConfigurationError(
                f"TRAINYARD_{kind.upper()}_USER and TRAINYARD_{kind.upper()}_PASSWORD are set together or not at all"
            )
        cert, key = getattr(settings, f"{kind}_tls_cert"), getattr(settings, f"{kind}_tls_key")
        if bool(cert) != bool(key):
            raise ConfigurationError(
                f"TRAINYARD_{kind.upper()}_TLS_CERT and TRAINYARD_{kind.upper()}_TLS_KEY are set together or not at all"
            )
        for name in ("tls_ca", "tls_cert", "tls_key"):
            path = getattr(settings, f"{kind}_{name}")
            if path and not Path(path).is_file():
                raise ConfigurationError(f"TRAINYARD_{kind.upper()}_{name.upper()}: no file at {path}")
    uses_tls = settings.redis_tls_ca or settings.redis_tls_cert
    if uses_tls and not settings.redis_url.startswith("rediss://"):
        raise ConfigurationError("TRAINYARD_REDIS_TLS_* need a rediss:// TRAINYARD_REDIS_URL")


def default_ledger_url(data_dir: str) -> str:
    """SQLite at ``<data_dir>/ledger.db``, an absolute path resolved once, at
    start (the ledger creates the directory when it opens the file)."""
    return f"sqlite:///{Path(data_dir).resolve() / 'ledger.db'}"
