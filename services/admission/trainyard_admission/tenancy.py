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
        self.config = version.config
        self.compiled = compile_tenancy(version.config)
        self.revision = version.revision
        self._classes = {c.name: (c.priority, c.preemptible, c.may_only_borrow) for c in self.compiled.priority_classes}
        log.info("tenancy revision %d in force (%d queues)", version.revision, len(self.compiled.queues))

    def priority_class(self, name: str | None) -> tuple[int, bool, bool]:
        """(priority, preemptible, may_only_borrow) of a class; defaults without a config."""
        if self.config is not None and name not in self._classes:
            name = self.config.default_priority_class
        return self._classes.get(name or "", (0, True, False))
