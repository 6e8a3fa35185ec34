"""The submit form: what it offers (the tenants, queues and priority classes
of the applied tenancy that the caller may use, each tenant's default queue)
and the submission it makes, from its fields or from pasted YAML.

Without a tenancy applied any tenant and queue may be used, so the form then
takes them as text.  With one, the queue picker lists ``tenant / queue`` pairs
(a page without scripts still works); console.js adds a tenant picker and
narrows the queues and priority classes to the chosen tenant and queue."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

import msgspec
from nats.js.errors import BadRequestError, KeyNotFoundError, NoKeysError, NotFoundError

from trainyard.auth import Principal
from trainyard.bus import Bus
from trainyard.config.store import BUCKET, TENANCY_KEY
from trainyard.config.tenancy import TenancyConfig, TenancyConfigError, allowed_classes, load_tenancy
from trainyard.domain.job import ValidationError
from trainyard.yaml_input import YamlTooLarge, check_yaml
from trainyard_gateway.jobs import InvalidRequest

GPU_TYPES = ("H100", "A100", "H200", "B200")
EXAMPLE_YAML = """\
name: llama-7b
queue: default
priority_class: standard
max_runtime_s: 3600
command: ["python", "train.py"]
roles:
  - name: trainer
    replicas: 2
    gpus_per_replica: 8
    gpu_type: H100
"""
DEFAULT_TIME_LIMIT = "1h"
_LIMIT = re.compile(r"\s*([0-9]{1,7})\s*([smhd]?)\s*")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "": 60}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


@dataclass(frozen=True)
class QueueChoice:
    tenant: str
    queue: str
    classes: tuple[str, ...]  # the priority classes its jobs may use
    default_class: str

    @property
    def value(self) -> str:
        return f"{self.tenant}/{self.queue}"


async def current_tenancy(bus: Bus) -> TenancyConfig | None:
    """The tenancy in force, or None when none is applied (or it does not load)."""
    try:
        kv = await bus.js.key_value(BUCKET)
        entry = await kv.get(TENANCY_KEY)
    except (NotFoundError, BadRequestError, KeyNotFoundError, NoKeysError):
        return None
    if entry.value is None:
        return None
    try:
        return load_tenancy(entry.value.decode())
    except TenancyConfigError:
        return None


def choices(cfg: TenancyConfig, who: Principal) -> list[QueueChoice]:
    """The queues ``who`` may submit to: its own tenant's when bound to one,
    else every tenant's; each tenant's default queue first."""
    out = []
    for org in cfg.organisations:
        for team in org.teams:
            if who.tenant is not None and team.name != who.tenant:
                continue
            queues = sorted(team.queues, key=lambda q: q.name != default_queue([q.name for q in team.queues]))
            for queue in queues:
                classes = tuple(allowed_classes(cfg, team, queue))
                preferred = queue.default_priority_class or cfg.default_priority_class
                default = preferred if preferred in classes or not classes else classes[0]
                out.append(QueueChoice(team.name, queue.name, classes, default))
    return out


def default_queue(names: list[str]) -> str:
    """A tenant's default queue: the one named ``default``, else its first."""
    return "default" if "default" in names or not names else names[0]


def form_context(
    who: Principal, cfg: TenancyConfig | None, fields: dict[str, str], errors: list[ValidationError]
) -> dict[str, Any]:
    picks = choices(cfg, who) if cfg is not None else []
    first = picks[0] if picks else None
    defaults = {
        "mode": "form",
        "tenant": who.tenant or (first.tenant if first else ""),
        "queue": first.value if first else "default",
        "name": "job",
        "replicas": "1",
        "gpus_per_replica": "8",
        "gpu_type": "H100",
        "priority_class": first.default_class if first else "standard",
        "command": "",
        "env": "",
        "time_limit": DEFAULT_TIME_LIMIT,
        "duration": "",
        "image": "",
        "job_id": "",
        "yaml": EXAMPLE_YAML,
    }
    form = defaults | {k: v for k, v in fields.items() if k in defaults}
    return {
        "form": form,
        "errors": errors,
        "gpu_types": GPU_TYPES,
        "tenancy": cfg is not None,
        "picks": picks,
        "tenants": list(dict.fromkeys(p.tenant for p in picks)),
        "classes": list(dict.fromkeys(c for p in picks for c in p.classes)),
    }


def time_limit_s(text: str) -> int:
    """``90m``, ``2h``, ``1d``, ``3600s``, or a bare number of minutes, in seconds."""
    found = _LIMIT.fullmatch(text)
    if not found or int(found.group(1)) == 0:
        raise InvalidRequest(
            [
                ValidationError(
                    "time_limit", f"{text!r} is not a time limit: give e.g. 30m, 2h or 1d (a bare number is minutes)"
                )
            ]
        )
    return int(found.group(1)) * _UNIT_S[found.group(2)]


def command_of(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as err:
        raise InvalidRequest(
            [ValidationError("command", f"cannot split it into words ({err}): close the quote")]
        ) from None


def env_of(text: str) -> dict[str, str]:
    """``NAME=value`` lines (blank lines skipped)."""
    env = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, sep, value = line.strip().partition("=")
        if not sep or not _ENV_NAME.fullmatch(name):
            message = f"line {number} {line.strip()!r}: write NAME=value, NAME of letters, digits and '_'"
            raise InvalidRequest([ValidationError("env", message)])
        env[name] = value
    return env


def _int(fields: dict[str, str], name: str) -> int | str:
    """The field as a whole number when it is ASCII digits (so '²', which
    ``str.isdigit`` accepts, stays text), else as sent, for the API to refuse."""
    value = fields.get(name, "").strip()
    return int(value) if _DIGITS.fullmatch(value) else value


_DIGITS = re.compile(r"[0-9]{1,12}")
#: How deep a job spec written as YAML may nest: a real one is four or five levels.
MAX_YAML_DEPTH = 32


def _yaml_problem(body: Any) -> str | None:
    """Why the decoded YAML cannot be a JSON job spec: a key that is not text
    (``~: 1``, ``yes: 1``, ``1: x``), or nesting past :data:`MAX_YAML_DEPTH`."""
    stack: list[tuple[Any, str, int]] = [(body, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_YAML_DEPTH:
            return f"nested more than {MAX_YAML_DEPTH} levels deep; a job spec is a few levels deep"
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    where = f" in {path}" if path else ""
                    return f"every key must be text, but {key!r}{where} is not (quote it)"
                stack.append((item, f"{path}.{key}" if path else key, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))
    return None


def _yaml_body(who: Principal, fields: dict[str, str]) -> dict[str, Any]:
    try:
        text = fields.get("yaml", "").encode()
        check_yaml(text, "the job spec")
        body = msgspec.yaml.decode(text)
    except YamlTooLarge as err:
        raise InvalidRequest([ValidationError("yaml", str(err))]) from None
    except msgspec.DecodeError as err:
        raise InvalidRequest([ValidationError("yaml", f"not valid YAML: {err}")]) from None
    except RecursionError:
        raise InvalidRequest([ValidationError("yaml", "nested too deeply; a job spec is a few levels deep")]) from None
    problem = _yaml_problem(body)
    if problem:
        raise InvalidRequest([ValidationError("yaml", problem)])
    if not isinstance(body, dict):
        raise InvalidRequest([ValidationError("yaml", "give one job spec: a mapping with tenant, queue and roles")])
    body.setdefault("tenant", who.tenant or fields.get("tenant") or "")
    return body


def body_from_form(who: Principal, fields: dict[str, str]) -> dict[str, Any]:
    """The submission as the REST API takes it, from the form or its YAML;
    a tenant-bound caller's tenant is its own unless the YAML names another
    (which is then refused, as the API refuses it).  The queue picker sends
    ``tenant/queue``; without a tenancy the tenant and queue come as text."""
    if fields.get("mode") == "yaml":
        return _yaml_body(who, fields)
    tenant, _, queue = fields.get("queue", "").strip().rpartition("/")
    tenant = tenant or fields.get("tenant", "").strip()
    role: dict[str, Any] = {
        "name": "trainer",
        "replicas": _int(fields, "replicas"),
        "gpus_per_replica": _int(fields, "gpus_per_replica"),
        "gpu_type": fields.get("gpu_type", "H100"),
    }
    body: dict[str, Any] = {
        "tenant": who.tenant if who.tenant and not tenant else tenant,
        "queue": queue or "default",
        "name": fields.get("name", "").strip() or "job",
        "priority_class": fields.get("priority_class", "").strip() or "standard",
        "max_runtime_s": time_limit_s(fields.get("time_limit", "").strip() or DEFAULT_TIME_LIMIT),
        "roles": [role],
    }
    command = command_of(fields.get("command", ""))
    if command:
        body["command"] = command
    env = env_of(fields.get("env", ""))
    if env:
        role["env"] = env
    duration, image = fields.get("duration", "").strip(), fields.get("image", "").strip()
    if image:
        body["image"] = image
    if duration:
        try:
            body["simulated_duration_s"] = float(duration)
        except ValueError:
            raise InvalidRequest([ValidationError("duration", f"{duration!r} is not a number of seconds")]) from None
    if fields.get("job_id", "").strip():
        body["job_id"] = fields["job_id"].strip()
    return body
