"""Size caps and name rules for everything a caller may send.

Every cap sits well below the 1 MiB payload limit of a NATS server, so that
any event built from valid input (a ``JobAccepted`` carrying the spec, a
``JobRejected`` listing what is wrong, a dead letter keeping a copy) always
fits in one message with room for its headers.  The same rules apply on every
path into the system: REST, gRPC and the intake stream.

Names and ids are matched whole: every pattern is anchored with ``\\A`` and
``\\Z`` (``$`` would let a trailing newline through), so ``match`` and
``fullmatch`` agree.
"""

from __future__ import annotations

import re
import unicodedata

#: Names of tenants, queues, jobs, roles and priority classes: like a DNS label.
NAME_RE = re.compile(r"\A[a-z0-9](?:[a-z0-9._-]{0,61}[a-z0-9])?\Z")
#: Job ids are subject tokens, Redis keys and part of Kubernetes object names.
JOB_ID_RE = re.compile(r"\A[A-Za-z0-9_-]{1,64}\Z")
LABEL_KEY_RE = re.compile(r"\A[A-Za-z0-9](?:[A-Za-z0-9._/-]{0,125}[A-Za-z0-9])?\Z")
GPU_TYPE_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_-]{0,31}\Z")

MAX_JOB_ID_CHARS = 64
#: The whole spec as JSON.  It travels inside JobAccepted, the Redis projection
#: and API answers; 64 KiB is far more than any real spec needs.
MAX_SPEC_BYTES = 64 * 1024
#: An OCI reference: registry host (253) + repository (255) + tag or digest.
MAX_IMAGE_CHARS = 512
MAX_COMMAND_ITEMS = 1024
MAX_COMMAND_CHARS = 32 * 1024  # all items together
MAX_WORKLOAD_REF_CHARS = 1024
MAX_LABELS = 64
MAX_LABEL_VALUE_CHARS = 256
MAX_CPU_PER_REPLICA = 4096.0
MAX_MEMORY_GIB_PER_REPLICA = 64 * 1024.0
#: One intake message (SubmitJob or CancelJob); larger ones are dead-lettered.
#: Four times the spec cap leaves room for the envelope and a spec somewhat
#: over its cap, which then gets a JobRejected saying so.
MAX_INTAKE_MESSAGE_BYTES = 4 * MAX_SPEC_BYTES
#: A cancel reason is copied into JobCancelled and shown to people.
MAX_REASON_CHARS = 1024
#: A rejection lists at most this many problems (and says how many more).
MAX_ERRORS_LISTED = 32
#: How much of an offending value an error message quotes.
QUOTE_CHARS = 48


def quoted(value: object, limit: int = QUOTE_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters, saying how long it was, so
    an error about a huge value stays small."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def control_character(text: str) -> str | None:
    """The first control character or lone surrogate in ``text`` (which no
    UTF-8 encoder accepts), as ``U+XXXX``; None when there is none."""
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cs"):
            return f"U+{ord(ch):04X}"
    return None


def job_id_problem(job_id: object) -> str | None:
    """Why ``job_id`` cannot be a job id; None when it can."""
    if not isinstance(job_id, str):
        return f"a job id is a string, got {type(job_id).__name__}"
    if JOB_ID_RE.fullmatch(job_id):
        return None
    length = f" ({len(job_id)} characters)" if len(job_id) > MAX_JOB_ID_CHARS else ""
    return f"{quoted(job_id)}{length} is not a job id: use 1-{MAX_JOB_ID_CHARS} letters, digits, '_' or '-'"


def name_problem(value: object) -> str | None:
    """Why ``value`` cannot be a name (tenant, queue, job, role, class); None when it can."""
    if isinstance(value, str) and NAME_RE.fullmatch(value):
        return None
    return (
        f"{quoted(value)} is not a valid name: use 1-63 lowercase letters, digits, "
        "'.', '_' or '-', starting and ending with a letter or digit"
    )


def text_problem(value: str, max_chars: int, *, spaces: bool) -> str | None:
    """Why a free-text field is refused: too long, a control character, or
    (``spaces`` False) white space in a reference."""
    if len(value) > max_chars:
        return f"at most {max_chars} characters, got {len(value)}"
    bad = control_character(value)
    if bad is not None:
        return f"contains the control character {bad}"
    if not spaces and any(ch.isspace() for ch in value):
        return "must not contain white space"
    return None


# --- what a run executes (roles' command, env and directories; see docs/execution.md) ---

#: Environment variable names a role may set (POSIX portable names).
ENV_KEY_RE = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_ENV_ENTRIES = 128
#: Variables of the environment contract, set by Trainyard for every process
#: (and any ``TRAINYARD_*``): a role's env may not set them.
RESERVED_ENV = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "NNODES",
        "MASTER_ADDR",
        "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
    }
)
RESERVED_ENV_PREFIX = "TRAINYARD_"
#: A working or checkpoint directory (Linux's PATH_MAX).
MAX_PATH_CHARS = 4096
#: How a role's replicas become processes.
LAUNCH_MODES = ("per_gpu", "per_replica")
#: Signals a job may ask for before it is stopped (``trainyard.events.work.STOP_SIGNALS``,
#: which a test holds equal: domain imports nothing from events).
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT")
#: Seconds a job may ask to have between its stop signal and the kill.
MAX_STOP_GRACE_S = 3600.0
