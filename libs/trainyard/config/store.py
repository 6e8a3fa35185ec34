"""The tenancy configuration in force: a NATS KV bucket, versioned and audited.

``apply`` validates, stores the new text as the next revision of the
``tenancy`` key (the bucket keeps history), and writes an audit record.
Services follow the key with a watch and switch to a new version as soon as it
is stored; a version that no longer validates is refused and the old one kept.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import msgspec
from nats.js.errors import BadRequestError, KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from trainyard.bus.audit import audit
from trainyard.bus.connection import Bus
from trainyard.config.diff import diff_tenancy
from trainyard.config.tenancy import ConfigError, TenancyConfig, TenancyConfigError, load_tenancy
from trainyard.config.validation import validate_tenancy

log = logging.getLogger(__name__)

BUCKET = "trainyard-config"
TENANCY_KEY = "tenancy"


class ConfigVersion(msgspec.Struct, frozen=True):
    revision: int
    text: str
    config: TenancyConfig


def parse_and_validate(text: str) -> TenancyConfig:
    """Load and validate; raises TenancyConfigError listing every problem with its path: the keys and
    values that do not fit, and what the rest means (checked with the unknown keys left out)."""
    try:
        cfg = load_tenancy(text)
    except TenancyConfigError as err:
        if err.without_unknown is None:
            raise
        raise TenancyConfigError(err.errors + validate_tenancy(err.without_unknown)) from err
    errors = validate_tenancy(cfg)
    if errors:
        raise TenancyConfigError(errors)
    return cfg


class ConfigStore:
    def __init__(self, bus: Bus, kv: KeyValue) -> None:
        self.bus = bus
        self.kv = kv

    @classmethod
    async def open(cls, bus: Bus, replicas: int = 1) -> ConfigStore:
        """The store; creates the bucket (with ``replicas``) if it is missing."""
        try:
            kv = await bus.js.key_value(BUCKET)
        except (NotFoundError, BadRequestError):
            kv = await bus.js.create_key_value(
                bucket=BUCKET, history=64, description="Trainyard configuration", replicas=replicas
            )
        return cls(bus, kv)

    async def current(self) -> ConfigVersion | None:
        try:
            entry = await self.kv.get(TENANCY_KEY)
        except KeyNotFoundError:
            return None
        if entry.value is None:
            return None
        text = entry.value.decode()
        return ConfigVersion(entry.revision or 0, text, load_tenancy(text))

    async def apply(self, text: str, actor: str, reason: str = "") -> tuple[int, list[str]]:
        """Store ``text`` as the next version; returns (revision, changes)."""
        new = parse_and_validate(text)
        old = await self.current()
        changes = diff_tenancy(old.config, new) if old else ["first tenancy configuration"]
        if old is not None and not changes:
            return old.revision, []
        if old is None:
            revision = await self.kv.create(TENANCY_KEY, text.encode())
        else:
            revision = await self.kv.update(TENANCY_KEY, text.encode(), last=old.revision)
        await audit(
            self.bus,
            actor,
            "config.apply",
            f"tenancy@{revision}",
            reason,
            details={"changes": "\n".join(changes)[:4000]},
            record_id=f"config:tenancy:{revision}",
        )
        return revision, changes

    async def follow(self, on_version: Callable[[ConfigVersion], Awaitable[None]], stop: asyncio.Event) -> None:
        """Call ``on_version`` with the current version and every later one, until ``stop``."""
        watcher = await self.kv.watch(TENANCY_KEY)
        try:
            while not stop.is_set():
                try:
                    entry = await watcher.updates(timeout=1.0)
                except TimeoutError:
                    continue
                if entry is None or entry.value is None or entry.operation is not None:
                    continue  # end of the initial values, or a delete marker
                text = entry.value.decode()
                try:
                    version = ConfigVersion(entry.revision or 0, text, parse_and_validate(text))
                except TenancyConfigError as err:
                    log.error("tenancy revision %s refused, keeping the previous one: %s", entry.revision, err)
                    continue
                await on_version(version)
        finally:
            await watcher.stop()


__all__ = ["ConfigError", "ConfigStore", "ConfigVersion", "parse_and_validate"]
