"""Carrying placements to Kubernetes (``TRAINYARD_PLACEMENT_BINDER=kube``).

After each snapshot the leader hands every placed run (placed, not yet
started) to ``KubeBinding.reconcile``: the Job or JobSet the job's
``workload_ref`` names (``kube:Job/NAMESPACE/NAME``) is bound to the run's
nodes if it is still suspended, and its gated pods are pinned as they appear.
Every step is level-triggered and safe to repeat, so a restarted or new
leader picks up where the last one stopped.  The translation is pure and
tested (``trainyard.kube.translate``); the API calls were never run against a
live API server (docs/placement.md, section 8).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from trainyard.core.placement import Placement
from trainyard.domain.job import JobSpec
from trainyard.kube.translate import BindError, workload_object

log = logging.getLogger(__name__)


class Binder(Protocol):
    """What binding needs of the Kubernetes adapter (``KubeBinder``)."""

    def reconcile(self, kind: str, namespace: str, name: str, placement: Placement) -> int: ...


class KubeBinding:
    def __init__(self, binder: Binder, clock: Callable[[], float], interval_s: float = 2.0) -> None:
        self.binder = binder
        self.clock = clock
        self.interval_s = interval_s  # at most one pass this often: each run costs a read and a pod list
        self.refused: dict[str, str] = {}  # run id -> why it cannot be bound (said once, not retried)
        self.pinned: dict[str, int] = {}  # run id -> pods pinned so far (logged)
        self._last = float("-inf")

    async def reconcile(self, placed: list[tuple[Placement, JobSpec]]) -> None:
        now = self.clock()
        if now - self._last < self.interval_s:
            return
        self._last = now
        current = {p.run_id for p, _ in placed}
        for done in [r for r in self.refused if r not in current]:
            del self.refused[done]
        for done in [r for r in self.pinned if r not in current]:
            del self.pinned[done]
        for placement, spec in placed:
            if placement.run_id not in self.refused:
                await self._one(placement, spec)

    async def _one(self, placement: Placement, spec: JobSpec) -> None:
        run = placement.run_id
        try:
            kind, namespace, name = workload_object(spec.workload_ref)
            pinned = await asyncio.to_thread(self.binder.reconcile, kind, namespace, name, placement)
        except BindError as err:
            self.refused[run] = str(err)
            log.warning("placement: cannot bind %s (run %s) to Kubernetes: %s", placement.job_id, run, err)
            return
        except Exception as err:  # noqa: BLE001 - API server away or refused: the next pass tries again
            log.warning("placement: binding %s (run %s) failed, retrying: %r", placement.job_id, run, err)
            return
        if pinned:
            self.pinned[run] = self.pinned.get(run, 0) + pinned
            log.info("placement: %s/%s pinned %d pods of run %s", namespace, name, pinned, run)
