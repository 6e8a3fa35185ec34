"""What a job runs, checked: commands, a role's environment, its directories,
launch mode and stop signal (see docs/execution.md).

Each check returns ``(field, message)`` pairs, every problem at once;
:mod:`trainyard.domain.job` turns them into its validation errors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from trainyard.domain.limits import (
    ENV_KEY_RE,
    LAUNCH_MODES,
    MAX_COMMAND_CHARS,
    MAX_COMMAND_ITEMS,
    MAX_ENV_ENTRIES,
    MAX_PATH_CHARS,
    MAX_STOP_GRACE_S,
    RESERVED_ENV,
    RESERVED_ENV_PREFIX,
    STOP_SIGNALS,
    quoted,
)

Problems = list[tuple[str, str]]


def _unencodable(text: str) -> str | None:
    """NUL (which no process argument, variable or path can hold) or a lone
    surrogate (which no encoder takes), as ``U+XXXX``; None when there is none.
    Other control characters (a newline in a script) are fine."""
    bad = next((ch for ch in text if ch == "\x00" or "\ud800" <= ch <= "\udfff"), None)
    return None if bad is None else f"U+{ord(bad):04X}"


def command_problems(command: Sequence[str], field: str) -> Problems:
    """A job's or a role's command: item count, total size, and no item a process argument cannot hold."""
    problems: Problems = []
    if len(command) > MAX_COMMAND_ITEMS:
        problems.append((field, f"at most {MAX_COMMAND_ITEMS} items, got {len(command)}"))
    total = sum(len(item) for item in command)
    if total > MAX_COMMAND_CHARS:
        problems.append((field, f"at most {MAX_COMMAND_CHARS} characters in all, got {total}"))
    for i, item in enumerate(command[:MAX_COMMAND_ITEMS]):
        bad = _unencodable(item)
        if bad is not None:
            problems.append((f"{field}[{i}]", f"contains {bad}, which a process argument cannot hold"))
            break
    return problems


def reserved_env(key: str) -> bool:
    """Whether ``key`` is a variable of the environment contract, which Trainyard sets."""
    return key in RESERVED_ENV or key.startswith(RESERVED_ENV_PREFIX)


def env_problems(env: Mapping[str, str], field: str) -> Problems:
    """A role's environment: portable names, not the contract's, values a variable can hold."""
    problems: Problems = []
    if len(env) > MAX_ENV_ENTRIES:
        problems.append((field, f"at most {MAX_ENV_ENTRIES} variables, got {len(env)}"))
    for key, value in list(env.items())[: MAX_ENV_ENTRIES + 1]:
        where = f"{field}.{key if len(key) <= 64 else key[:64] + '...'}"
        if not ENV_KEY_RE.match(key):
            problems.append(
                (where, f"{quoted(key)} is not a variable name: letters, digits and '_', not starting with a digit")
            )
        elif reserved_env(key):
            problems.append(
                (
                    where,
                    f"{key} is reserved: Trainyard sets it for every process (the environment contract, "
                    f"and every {RESERVED_ENV_PREFIX}* variable)",
                )
            )
        bad = _unencodable(value)
        if bad is not None:
            problems.append((where, f"the value contains {bad}, which an environment variable cannot hold"))
    return problems


def path_problems(path: str | None, field: str) -> Problems:
    """A working or checkpoint directory: absolute, bounded, holdable by the kernel."""
    if path is None:
        return []
    if len(path) > MAX_PATH_CHARS:
        return [(field, f"at most {MAX_PATH_CHARS} characters, got {len(path)}")]
    bad = _unencodable(path)
    if bad is not None:
        return [(field, f"contains {bad}, which a path cannot hold")]
    if not path.startswith("/"):
        return [(field, f"must be an absolute path (starting with '/'), got {quoted(path)}")]
    return []


def launch_problems(launch: str, field: str) -> Problems:
    if launch in LAUNCH_MODES:
        return []
    return [(field, f"must be one of {', '.join(LAUNCH_MODES)}, got {quoted(launch)}")]


def stop_problems(signal: str, grace_s: float) -> Problems:
    """The job's stop signal and the grace it has before the kill."""
    problems: Problems = []
    if signal not in STOP_SIGNALS:
        problems.append(("stop_signal", f"must be one of {', '.join(STOP_SIGNALS)}, got {quoted(signal)}"))
    if not (math.isfinite(grace_s) and 0 <= grace_s <= MAX_STOP_GRACE_S):
        problems.append(("stop_grace_s", f"must be a number of seconds from 0 to {MAX_STOP_GRACE_S:g}"))
    return problems
