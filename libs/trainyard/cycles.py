"""The loop every single-leader decider runs (admission, placement)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from trainyard.bus.lease import Lease
from trainyard.observability.metrics import DeciderMetrics
from trainyard.runtime import Runtime
from trainyard.store import Projector

log = logging.getLogger(__name__)


async def decision_loop(
    rt: Runtime,
    run_once: Callable[[], Awaitable[int]],
    lease: Lease,
    triggers: list[Projector],
    name: str,
    metrics: DeciderMetrics | None = None,
    standby: Callable[[], Awaitable[None]] | None = None,
    ready: asyncio.Event | None = None,
) -> None:
    """Run a cycle whenever a projection changes (or every cycle interval) while we lead.

    A cycle that decided something is followed by another once its own
    decisions reach the projections (they change them, which wakes the loop
    like any other change), so a busy decider runs one cycle per
    ``cycle_coalesce_s`` and not two.  While another process leads, ``standby``
    (if given) runs at the same moments instead: a decider keeps what it reads
    current there, so that it is hot when it takes over.  ``ready`` (if given)
    is set once ``standby`` has run without error (at once without one): the
    event to pass :meth:`Lease.keep` as ``after``, so that a process that has
    just started reads its state before it contends for the lease and its
    first cycle as leader is as fast as any later one.
    """
    if ready is not None and standby is None:
        ready.set()
    stopped = asyncio.ensure_future(rt.stop.wait())
    leading = False
    try:
        while not rt.stop.is_set():
            waits = [asyncio.ensure_future(p.changed.wait()) for p in triggers]
            await asyncio.wait(
                [*waits, stopped], timeout=rt.settings.cycle_interval_s, return_when=asyncio.FIRST_COMPLETED
            )
            for w in waits:
                w.cancel()
            # Let a burst of events land so one cycle decides for all of them.
            await asyncio.sleep(rt.settings.cycle_coalesce_s)
            for p in triggers:
                p.changed.clear()
            if lease.held != leading:
                leading = lease.held
                log.info("%s: %s", name, "leading" if leading else "standing by (another process leads)")
                if metrics is not None:
                    metrics.leader.set(1 if leading else 0)
            if not leading:
                if standby is not None:
                    try:
                        await standby()
                        if ready is not None and not ready.is_set():
                            ready.set()
                            log.info("%s: state read, contending for the lease", name)
                    except Exception as err:  # noqa: BLE001 - infrastructure; tried again on the next wake-up
                        log.warning("%s standby read failed: %r", name, err)
                continue
            try:
                await run_once()
            except Exception as err:  # noqa: BLE001 - infrastructure; the next cycle retries
                log.warning("%s cycle failed: %r", name, err)
                await asyncio.sleep(0.5)
    finally:
        stopped.cancel()
