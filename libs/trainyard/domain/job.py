"""The job spec a researcher submits, and its validation.

A job is a *gang* of one or more roles; every replica of every role must run at
once or not at all.  Validation returns every problem it finds, each naming the
field to fix, instead of stopping at the first.
"""

from __future__ import annotations

import enum
import math
from typing import Annotated

import msgspec

from trainyard.domain import launch as launch_rules
from trainyard.domain.limits import (
    GPU_TYPE_RE,
    LABEL_KEY_RE,
    MAX_CPU_PER_REPLICA,
    MAX_ERRORS_LISTED,
    MAX_IMAGE_CHARS,
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
    MAX_MEMORY_GIB_PER_REPLICA,
    MAX_SPEC_BYTES,
    MAX_WORKLOAD_REF_CHARS,
    job_id_problem,
    name_problem,
    quoted,
    text_problem,
)

MAX_REPLICAS_PER_ROLE = 16_384
MAX_GPUS_PER_REPLICA = 72
MAX_ROLES = 16
MAX_RUNTIME_S = 90 * 24 * 3600
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
    # What each replica runs (see docs/execution.md).  An empty command falls
    # back to the job's ``command``.
    command: list[str] = []
    env: dict[str, str] = {}
    working_dir: str | None = None
    # "per_gpu": one process per GPU, each with RANK/LOCAL_RANK and one GPU;
    # "per_replica": one launcher per replica with all its GPUs (torchrun --nnodes --node-rank).
    launch: str = "per_gpu"

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
    # Execution: the signal every process gets on preemption, cancel and its
    # time limit, the seconds it then has before it is killed, and where its
    # checkpoints go (shared storage for a multi-node job; None: the node's own).
    stop_signal: str = "SIGTERM"
    stop_grace_s: float = 30.0
    checkpoint_dir: str | None = None
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

    @property
    def gpus_by_type(self) -> dict[str, int]:
        """GPUs of the whole gang by GPU type (what an active run holds)."""
        by_type: dict[str, int] = {}
        for role in self.roles:
            by_type[role.gpu_type] = by_type.get(role.gpu_type, 0) + role.gpus
        return by_type


class ValidationError(msgspec.Struct, frozen=True):
    """One problem with a submitted spec: where it is and what to do."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


_encoder = msgspec.json.Encoder()


def error_location(err: Exception) -> tuple[str, str]:
    """msgspec's ``"Expected `int`, got `str` - at `$.roles[0].replicas`"`` as its message and the path
    ``roles[0].replicas`` ("" where it names no place, or the whole document)."""
    message, found, where = str(err).rpartition(" - at `$")
    return (message, where.rstrip("`").lstrip(".")) if found else (str(err), "")


def _check_name(value: str, field: str, errors: list[ValidationError]) -> None:
    problem = name_problem(value)
    if problem is not None:
        errors.append(ValidationError(field, problem))


def _label_field(key: str) -> str:
    return f"labels.{key if len(key) <= 64 else key[:64] + '...'}"


def capped(errors: list[ValidationError]) -> list[ValidationError]:
    """At most MAX_ERRORS_LISTED problems, the last saying how many were left out."""
    if len(errors) <= MAX_ERRORS_LISTED:
        return errors
    more = len(errors) - (MAX_ERRORS_LISTED - 1)
    return [*errors[: MAX_ERRORS_LISTED - 1], ValidationError("spec", f"{more} more problems not listed")]


def validate_job_id(job_id: object) -> list[ValidationError]:
    """The job id rule every way in applies (REST, gRPC, the intake stream)."""
    problem = job_id_problem(job_id)
    return [] if problem is None else [ValidationError("job_id", problem)]


def validate_submission(spec: JobSpec, job_id: str | None) -> list[ValidationError]:
    """Everything checked about a submission before it is accepted, whichever
    way it came in: the job id (None: one is generated) and the spec."""
    errors = [] if job_id is None else validate_job_id(job_id)
    return capped(errors + _spec_problems(spec))


def validate_job_spec(spec: JobSpec) -> list[ValidationError]:
    """Return every problem with ``spec`` (at most MAX_ERRORS_LISTED); an empty
    list means it is valid.

    These are checks that need no cluster configuration.  Checks against the
    tenancy configuration (does the queue exist, is the GPU type offered) are
    made by admission.
    """
    return capped(_spec_problems(spec))


def _spec_problems(spec: JobSpec) -> list[ValidationError]:
    errors: list[ValidationError] = []
    # 1. The whole spec, then the names.
    try:
        size = len(_encoder.encode(spec))
    except (UnicodeEncodeError, OverflowError, TypeError) as err:
        errors.append(ValidationError("spec", f"cannot be encoded as JSON: {err}"))
    else:
        if size > MAX_SPEC_BYTES:
            errors.append(ValidationError("spec", f"the spec is {size} bytes as JSON; at most {MAX_SPEC_BYTES}"))
    _check_name(spec.tenant, "tenant", errors)
    _check_name(spec.queue, "queue", errors)
    _check_name(spec.name, "name", errors)
    _check_name(spec.priority_class, "priority_class", errors)
    # 2. Roles: the gang.
    if not spec.roles:
        errors.append(ValidationError("roles", "a job needs at least one role"))
    if len(spec.roles) > MAX_ROLES:
        errors.append(ValidationError("roles", f"at most {MAX_ROLES} roles, got {len(spec.roles)}"))
    seen: set[str] = set()
    for i, role in enumerate(spec.roles[: MAX_ROLES + 1]):
        _check_role(role, f"roles[{i}]", seen, errors)
    # 3. Limits and timings.
    if not 1 <= spec.max_runtime_s <= MAX_RUNTIME_S:
        errors.append(
            ValidationError("max_runtime_s", f"must be between 1 and {MAX_RUNTIME_S} seconds, got {spec.max_runtime_s}")
        )
    if spec.simulated_duration_s is not None and not (
        math.isfinite(spec.simulated_duration_s) and spec.simulated_duration_s <= spec.max_runtime_s
    ):
        errors.append(ValidationError("simulated_duration_s", "must be a number of seconds not above max_runtime_s"))
    interval = spec.simulated_checkpoint_interval_s
    if interval is not None and not (math.isfinite(interval) and interval <= MAX_RUNTIME_S):
        errors.append(
            ValidationError("simulated_checkpoint_interval_s", f"must be a number of seconds up to {MAX_RUNTIME_S}")
        )
    if not 0 <= spec.max_retries <= MAX_RETRIES:
        errors.append(ValidationError("max_retries", f"must be between 0 and {MAX_RETRIES}, got {spec.max_retries}"))
    # 4. Labels.
    if len(spec.labels) > MAX_LABELS:
        errors.append(ValidationError("labels", f"at most {MAX_LABELS} labels, got {len(spec.labels)}"))
    for key, value in list(spec.labels.items())[: MAX_LABELS + 1]:
        if not LABEL_KEY_RE.match(key):
            errors.append(
                ValidationError(
                    _label_field(key),
                    f"label keys are 1-127 letters, digits, '.', '_', '/', '-', starting and ending with "
                    f"a letter or digit; {quoted(key)} is not one",
                )
            )
        problem = text_problem(value, MAX_LABEL_VALUE_CHARS, spaces=True)
        if problem is not None:
            errors.append(ValidationError(_label_field(key), f"label value: {problem}"))
    # 5. What to run, and how it is stopped.
    _check_payload(spec, errors)
    _add(errors, launch_rules.stop_problems(spec.stop_signal, spec.stop_grace_s))
    _add(errors, launch_rules.path_problems(spec.checkpoint_dir, "checkpoint_dir"))
    return errors


def _add(errors: list[ValidationError], problems: launch_rules.Problems) -> None:
    errors.extend(ValidationError(field, message) for field, message in problems)


def _check_role(role: Role, where: str, seen: set[str], errors: list[ValidationError]) -> None:
    _check_name(role.name, f"{where}.name", errors)
    if role.name in seen:
        errors.append(ValidationError(f"{where}.name", f"role name {quoted(role.name)} is used twice"))
    seen.add(role.name)
    if not 1 <= role.replicas <= MAX_REPLICAS_PER_ROLE:
        errors.append(
            ValidationError(f"{where}.replicas", f"must be between 1 and {MAX_REPLICAS_PER_ROLE}, got {role.replicas}")
        )
    if not 1 <= role.gpus_per_replica <= MAX_GPUS_PER_REPLICA:
        errors.append(
            ValidationError(
                f"{where}.gpus_per_replica",
                f"must be between 1 and {MAX_GPUS_PER_REPLICA}, got {role.gpus_per_replica}",
            )
        )
    if not GPU_TYPE_RE.match(role.gpu_type):
        errors.append(
            ValidationError(
                f"{where}.gpu_type", f"{quoted(role.gpu_type)} is not a GPU type name: 1-32 letters, digits, '_' or '-'"
            )
        )
    # Comparisons are false for NaN, and the upper bounds exclude infinity.
    if not 0 < role.cpu_per_replica <= MAX_CPU_PER_REPLICA:
        errors.append(
            ValidationError(f"{where}.cpu_per_replica", f"must be greater than 0 and at most {MAX_CPU_PER_REPLICA:g}")
        )
    if not 0 < role.memory_gib_per_replica <= MAX_MEMORY_GIB_PER_REPLICA:
        errors.append(
            ValidationError(
                f"{where}.memory_gib_per_replica", f"must be greater than 0 and at most {MAX_MEMORY_GIB_PER_REPLICA:g}"
            )
        )
    # What each replica runs.
    _add(errors, launch_rules.command_problems(role.command, f"{where}.command"))
    _add(errors, launch_rules.env_problems(role.env, f"{where}.env"))
    _add(errors, launch_rules.path_problems(role.working_dir, f"{where}.working_dir"))
    _add(errors, launch_rules.launch_problems(role.launch, f"{where}.launch"))


def _check_payload(spec: JobSpec, errors: list[ValidationError]) -> None:
    # A command runs as a plain process, or in the node's container runtime when an image is given.
    commands = bool(spec.command) or any(role.command for role in spec.roles)
    if spec.image is None and spec.workload_ref is None and spec.simulated_duration_s is None and not commands:
        errors.append(
            ValidationError(
                "image",
                "say what to run: a command (the job's or each role's), an image, a workload_ref, "
                "or simulated_duration_s",
            )
        )
    if spec.image is not None:
        problem = text_problem(spec.image, MAX_IMAGE_CHARS, spaces=False) or (
            "must not be empty" if not spec.image else None
        )
        if problem is not None:
            errors.append(ValidationError("image", f"an image reference {problem}"))
    if spec.workload_ref is not None:
        problem = text_problem(spec.workload_ref, MAX_WORKLOAD_REF_CHARS, spaces=False) or (
            "must not be empty" if not spec.workload_ref else None
        )
        if problem is not None:
            errors.append(ValidationError("workload_ref", f"a workload reference {problem}"))
    _add(errors, launch_rules.command_problems(spec.command, "command"))
