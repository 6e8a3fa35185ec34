"""Settings shared by every process, read from ``TRAINYARD_*`` environment
variables.  A bad value stops the process at start with a message saying
which variable to fix.

This is the one place that reads the environment: every field ``x`` of
:class:`Settings` is the variable ``TRAINYARD_X`` (a test keeps other modules
from reading ``os.environ``).  A variable set to the empty string is the empty
text for a text setting and unset for a number.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

import msgspec

#: Where ``trainyard up`` and a service run outside it keep their data.
DEFAULT_DATA_DIR = ".trainyard"


#: The event loops a service may run on (``TRAINYARD_EVENT_LOOP``).
EVENT_LOOPS = ("uvloop", "asyncio")


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
    start_timeout_s: float = 60.0  # a run placed on executing nodes not started by then is failed as lost
    preempt_kill_margin_s: float = 15.0  # admission stops an executing victim this long after its grace
    # A finished job stays in the Redis projection this long, then moves to the
    # job archive in the ledger database (docs/design.md, state and retention).
    job_retention_s: float = 7 * 86400.0
    retention_sweep_interval_s: float = 60.0  # admission sweeps finished jobs out this often
    jobs_snapshot_interval_s: float = 3600.0  # and keeps a snapshot of the JOBS projection this often
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
    # Publishes to one stream that wait together go out as one atomic batch:
    # one fsync for all (trainyard.bus.batching); 0 only to measure what it saves.
    nats_group_commit: bool = True
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
    # Where the gateway and the command line find the finance files (docs/accounting.md).
    rate_card: str = ""  # JSON, or YAML by its name; "": examples/rate-card.json of the checkout
    cost_centres: str = ""  # tenant -> cost centre (YAML or JSON); "": examples/cost-centres.yaml, if there
    export_dir: str = ""  # where `trainyard export` writes; "": <the stack's data dir>/exports, else ~/.local/share
    # What one service does beyond the shared settings.
    placement_binder: str = "none"  # "kube": also bind each placed run to its Kubernetes Job or JobSet
    health_policy: str = ""  # JSON object of HealthPolicy fields to override (docs/health.md)
    health_kube_taints: str = ""  # "1": health cordons and taints the Kubernetes nodes too
    # Each service's Prometheus metrics (docs/operations.md): port 0 serves none;
    # address "" listens on every interface.
    admission_metrics_port: int = 0
    admission_metrics_addr: str = "127.0.0.1"
    placement_metrics_port: int = 0
    placement_metrics_addr: str = "127.0.0.1"
    health_metrics_port: int = 0
    health_metrics_addr: str = "127.0.0.1"
    accounting_metrics_port: int = 0
    accounting_metrics_addr: str = "127.0.0.1"
    event_loop: str = "uvloop"  # "uvloop" (libuv, less CPU per message) or "asyncio" (the standard library's)
    profile_dir: str = ""  # a service writes <dir>/<service>.prof (cProfile) when it stops; "": no profile
    # The command line: these beat the running `trainyard up` stack's state.json.
    api_url: str = ""  # the gateway; "": the running stack's, else http://127.0.0.1:8080
    token: str = ""  # API token or JWT the command line presents; "": the local stack's admin token
    traces: str = ""  # the simulator's traces folder; "": the repository's traces/
    redis_server: str = ""  # the Redis binary `trainyard up` and the tests start; "": redis-server on PATH, else Valkey
    # Not a variable: the fields the environment set (the others are defaults),
    # for the command line, which prefers a running stack to a default.
    from_environment: frozenset[str] = frozenset()

    def given(self, name: str) -> str:
        """Setting ``name`` as the environment set it; "" where it is unset or empty."""
        return str(getattr(self, name)) if name in self.from_environment else ""

    def metrics_endpoint(self, service: str) -> tuple[str, int]:
        """The address and port ``service`` serves its metrics on (port 0: none)."""
        return getattr(self, f"{service}_metrics_addr"), getattr(self, f"{service}_metrics_port")


def variable(name: str) -> str:
    """The environment variable of the setting ``name``."""
    return f"TRAINYARD_{name.upper()}"


_FROM_ENVIRONMENT = tuple(f for f in msgspec.structs.fields(Settings) if f.name != "from_environment")


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings ``environ`` (default: this process's environment) sets; reads
    and creates no file beyond checking the TLS files are there."""
    env = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for field in _FROM_ENVIRONMENT:
        raw = env.get(variable(field.name))
        if raw is not None and (raw or field.type is str):
            values[field.name] = raw
    given = frozenset(values)
    if "ledger_url" not in values:
        values["ledger_url"] = default_ledger_url(str(values.get("data_dir") or DEFAULT_DATA_DIR))
    try:
        settings = msgspec.convert({**values, "from_environment": given}, Settings, strict=False)
    except msgspec.ValidationError as err:
        raise ConfigurationError(_naming_the_variable(str(err))) from err
    if settings.heartbeat_timeout_s <= settings.heartbeat_interval_s:
        raise ConfigurationError("TRAINYARD_HEARTBEAT_TIMEOUT_S must be larger than TRAINYARD_HEARTBEAT_INTERVAL_S")
    if settings.event_loop not in EVENT_LOOPS:
        raise ConfigurationError(
            f"TRAINYARD_EVENT_LOOP: {settings.event_loop!r} is not an event loop; use one of {', '.join(EVENT_LOOPS)}"
        )
    if not settings.redis_prefix.endswith(":"):
        raise ConfigurationError("TRAINYARD_REDIS_PREFIX must end with ':'")
    if not 0 < settings.start_timeout_s < float("inf"):
        raise ConfigurationError("TRAINYARD_START_TIMEOUT_S must be a number of seconds above 0")
    if not 0 <= settings.preempt_kill_margin_s < float("inf"):
        raise ConfigurationError("TRAINYARD_PREEMPT_KILL_MARGIN_S must be a number of seconds, 0 or more")
    if not 0 < settings.job_retention_s < float("inf"):
        raise ConfigurationError(
            "TRAINYARD_JOB_RETENTION_S must be a number of seconds above 0 (default 604800: 7 days)"
        )
    if not 0 < settings.retention_sweep_interval_s < float("inf"):
        raise ConfigurationError("TRAINYARD_RETENTION_SWEEP_INTERVAL_S must be a number of seconds above 0")
    if not 0 < settings.jobs_snapshot_interval_s < float("inf"):
        raise ConfigurationError("TRAINYARD_JOBS_SNAPSHOT_INTERVAL_S must be a number of seconds above 0")
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


def _naming_the_variable(message: str) -> str:
    """msgspec's "Expected `int`, got `str` - at `$.x`" as "TRAINYARD_X: Expected ..."."""
    found = re.search(r" - at `\$\.(\w+)`", message)
    if found is None:
        return f"bad setting: {message} (check the TRAINYARD_* environment variables)"
    return f"{variable(found.group(1))}: {message[: found.start()]}"


def default_ledger_url(data_dir: str) -> str:
    """SQLite at ``<data_dir>/ledger.db``, an absolute path resolved once, at
    start (the ledger creates the directory when it opens the file)."""
    return f"sqlite:///{Path(data_dir).resolve() / 'ledger.db'}"
