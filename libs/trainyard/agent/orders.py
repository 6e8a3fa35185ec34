"""What the executor accepts as an order: ids that can name directories,
distinct ranks, absolute working directories and real signal names.  An order
that fails these changes nothing; the agent dead-letters it with the reason."""

from __future__ import annotations

import logging
import os
import signal
import typing

from trainyard.events.subjects import token
from trainyard.events.work import StartRun, StopReason, WorkOrder

log = logging.getLogger(__name__)

STOP_REASONS: tuple[str, ...] = typing.get_args(StopReason)


def signal_number(name: str) -> signal.Signals:
    try:
        return signal.Signals[name]
    except KeyError:
        log.warning("unknown signal %r: SIGTERM is sent instead", name)
        return signal.SIGTERM


def check_order(order: WorkOrder) -> None:
    """Raise ValueError naming the field of ``order`` that the agent cannot use
    (ids become directory names; ranks name a process each; signals must exist)."""
    for name in ("run_id", "job_id", "tenant"):
        try:
            token(getattr(order, name))
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
    field, sig = ("stop_signal", order.stop_signal) if isinstance(order, StartRun) else ("signal", order.signal)
    if sig not in signal.Signals.__members__:
        raise ValueError(f"{field}: {sig!r} is not a signal name such as SIGTERM")
    if isinstance(order, StartRun):
        ranks = [p.rank for p in order.processes]
        if len(set(ranks)) != len(ranks) or any(r < 0 for r in ranks):
            raise ValueError(f"processes: ranks must be distinct and 0 or more, not {ranks}")
        for i, p in enumerate(order.processes):
            if p.working_dir is not None and not os.path.isabs(p.working_dir):
                raise ValueError(f"processes[{i}].working_dir: {p.working_dir!r} is not an absolute path")
