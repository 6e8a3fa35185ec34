"""The job spec a researcher submits, and its validation.

A job is a *gang* of one or more roles; every replica of every role must run at
once or not at all.  Validation returns every problem it finds, each naming the
field to fix, instead of stopping at the first.
"""

from __future__ import annotations

import enum
import re
from typing import Annotated

import msgspec

NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,125}[A-Za-z0-9])?$")
GPU_TYPE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")

MAX_REPLICAS_PER_ROLE = 16_384
MAX_GPUS_PER_REPLICA = 72
MAX_ROLES = 16
MAX_RUNTIME_S = 90 * 24 * 3600
MAX_LABELS = 64
MAX_RETRIES = 100
DEFAULT_MAX_RETRIES = 3


class TopologyLevel(str, enum.Enum):
    """Levels of the cluster network, tightest first."""

    NVLINK = "nvlink"
    RACK = "rack"
    BLOCK = "block"
    ZONE = "zone"


class TopologyConstraint(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """Keep a gang (or one role) inside one domain of ``level``.

    ``required`` means the job waits rather than spread wider; otherwise the
    level is a preference and placement packs as tightly as it can.
    """

    level: TopologyLevel
    required: bool = False


class Role(msgspec.Struct, frozen=True):
    """One kind of worker in a gang, e.g. ``trainer`` 4 x 8 GPUs."""

    name: str
    replicas: int = 1
    gpus_per_replica: int = 1
    gpu_type: str = "H100"
    cpu_per_replica: float = 8.0
    memory_gib_per_replica: float = 64.0
    topology: TopologyConstraint | None = None

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica


class JobSpec(msgspec.Struct, frozen=True):
    """Everything needed to run one training job (all attempts share it)."""

    tenant: str
    queue: str
    roles: list[Role]
    name: str = "job"
    priority_class: str = "standard"
    labels: dict[str, str] = {}
    topology: TopologyConstraint | None = None
    max_runtime_s: int = 24 * 3600
    image: str | None = None
    command: list[str] = []
    workload_ref: str | None = None
    # Retries after failures that are the job's own (not node failures or preemption).
    max_retries: int = DEFAULT_MAX_RETRIES
    # Emulated clusters only: how long a run takes before it reports success,
    # and how often it writes a checkpoint.
    simulated_duration_s: Annotated[float, msgspec.Meta(ge=0)] | None = None
    simulated_checkpoint_interval_s: Annotated[float, msgspec.Meta(gt=0)] | None = None

    @property
    def total_gpus(self) -> int:
        return sum(r.gpus for r in self.roles)

    @property
    def replica_count(self) -> int:
        return sum(r.replicas for r in self.roles)

    @property
    def gpu_types(self) -> set[str]:
        return {r.gpu_type for r in self.roles}


class ValidationError(msgspec.Struct, frozen=True):
    """One problem with a submitted spec: where it is and what to do."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def _check_name(value: str, field: str, errors: list[ValidationError]) -> None:
    if not NAME_RE.match(value or ""):
        errors.append(
            ValidationError(
                field,
                f"{value!r} is not a valid name: use 1-63 lowercase letters, digits, "
                "'.', '_' or '-', starting and ending with a letter or digit",
            )
        )


def validate_job_spec(spec: JobSpec) -> list[ValidationError]:
    """Return every problem with ``spec``; an empty list means it is valid.

    These are checks that need no cluster configuration.  Checks against the
    tenancy configuration (does the queue exist, is the GPU type offered) are
    made by admission.
    """
    errors: list[ValidationError] = []
    _check_name(spec.tenant, "tenant", errors)
    _check_name(spec.queue, "queue", errors)
    _check_name(spec.name, "name", errors)
    _check_name(spec.priority_class, "priority_class", errors)
    if not spec.roles:
        errors.append(ValidationError("roles", "a job needs at least one role"))
    if len(spec.roles) > MAX_ROLES:
        errors.append(ValidationError("roles", f"at most {MAX_ROLES} roles, got {len(spec.roles)}"))
    seen: set[str] = set()
    for i, role in enumerate(spec.roles):
        where = f"roles[{i}]"
        _check_name(role.name, f"{where}.name", errors)
        if role.name in seen:
            errors.append(ValidationError(f"{where}.name", f"role name {role.name!r} is used twice"))
        seen.add(role.name)
        if not 1 <= role.replicas <= MAX_REPLICAS_PER_ROLE:
            errors.append(
                ValidationError(
                    f"{where}.replicas", f"must be between 1 and {MAX_REPLICAS_PER_ROLE}, got {role.replicas}"
                )
            )
        if not 1 <= role.gpus_per_replica <= MAX_GPUS_PER_REPLICA:
            errors.append(
                ValidationError(
                    f"{where}.gpus_per_replica",
                    f"must be between 1 and {MAX_GPUS_PER_REPLICA}, got {role.gpus_per_replica}",
                )
            )
        if not GPU_TYPE_RE.match(role.gpu_type or ""):
            errors.append(ValidationError(f"{where}.gpu_type", f"{role.gpu_type!r} is not a GPU type name"))
        if not role.cpu_per_replica > 0:
            errors.append(ValidationError(f"{where}.cpu_per_replica", "must be greater than 0"))
        if not role.memory_gib_per_replica > 0:
            errors.append(ValidationError(f"{where}.memory_gib_per_replica", "must be greater than 0"))
    if not 1 <= spec.max_runtime_s <= MAX_RUNTIME_S:
        errors.append(
            ValidationError("max_runtime_s", f"must be between 1 and {MAX_RUNTIME_S} seconds, got {spec.max_runtime_s}")
        )
    if spec.simulated_duration_s is not None and spec.simulated_duration_s > spec.max_runtime_s:
        errors.append(ValidationError("simulated_duration_s", "must not exceed max_runtime_s"))
    if not 0 <= spec.max_retries <= MAX_RETRIES:
        errors.append(ValidationError("max_retries", f"must be between 0 and {MAX_RETRIES}, got {spec.max_retries}"))
    if len(spec.labels) > MAX_LABELS:
        errors.append(ValidationError("labels", f"at most {MAX_LABELS} labels, got {len(spec.labels)}"))
    for key, value in spec.labels.items():
        if not LABEL_KEY_RE.match(key):
            errors.append(ValidationError(f"labels.{key}", "label keys are 1-127 letters, digits, '.', '_', '/', '-'"))
        if len(value) > 256:
            errors.append(ValidationError(f"labels.{key}", "label values are at most 256 characters"))
    if spec.image is None and spec.workload_ref is None and spec.simulated_duration_s is None:
        errors.append(
            ValidationError(
                "image", "say what to run: an image (and command), a workload_ref, or simulated_duration_s"
            )
        )
    if spec.command and spec.image is None:
        errors.append(ValidationError("command", "a command needs an image to run in"))
    return errors
