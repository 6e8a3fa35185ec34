"""The tenancy configuration admission works under, swapped live when a new
revision is applied (``trainyard config apply``)."""

from __future__ import annotations

import logging

from trainyard.config.store import ConfigVersion
from trainyard.config.tenancy import TenancyConfig, compile_tenancy
from trainyard.core.admission import Tenancy

log = logging.getLogger(__name__)


class TenancyHolder:
    """None until a configuration is applied: then any tenant may submit and
    jobs are admitted first in first out while GPUs are free."""

    def __init__(self) -> None:
        self.revision: int | None = None
        self.config: TenancyConfig | None = None
        self.compiled: Tenancy | None = None
        self._classes: dict[str, tuple[int, bool, bool]] = {}

    async def use(self, version: ConfigVersion) -> None:
        self.set(compile_tenancy(version.config), version.config, version.revision)
        log.info("tenancy revision %d in force (%d queues)", version.revision, len(self.compiled.queues))

    def set(self, compiled: Tenancy, config: TenancyConfig | None = None, revision: int | None = None) -> None:
        self.config = config
        self.compiled = compiled
        self.revision = revision
        self._classes = {c.name: (c.priority, c.preemptible, c.may_only_borrow) for c in compiled.priority_classes}

    def priority_class(self, name: str | None) -> tuple[int, bool, bool]:
        """(priority, preemptible, may_only_borrow) of a class; defaults without a config."""
        if self.config is not None and name not in self._classes:  # the cluster default
            name = self.config.default_priority_class
        return self._classes.get(name or "", (0, True, False))
