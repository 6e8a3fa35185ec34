"""What operators and the health service tell the node state machine (:func:`trainyard.core.health.transition`)."""

from __future__ import annotations

import msgspec


class _Command(msgspec.Struct, tag_field="type", frozen=True, kw_only=True):
    node_id: str


class Cordon(_Command, tag="Cordon", frozen=True):
    by: str
    reason: str


class Uncordon(_Command, tag="Uncordon", frozen=True):
    by: str  # must be "operator:<name>": automation returns nodes only through checks
    reason: str


class Drain(_Command, tag="Drain", frozen=True):
    by: str
    reason: str


class DrainComplete(_Command, tag="DrainComplete", frozen=True):
    """No run is left on the node."""


class ChecksPassed(_Command, tag="ChecksPassed", frozen=True):
    checks: tuple[str, ...] = ()


class ChecksFailed(_Command, tag="ChecksFailed", frozen=True):
    reason: str


class HeartbeatResumed(_Command, tag="HeartbeatResumed", frozen=True):
    """A lost node's agent reports again."""

    same_boot: bool = False  # the boot declared lost heartbeats again: the loss was a false alarm


Command = Cordon | Uncordon | Drain | DrainComplete | ChecksPassed | ChecksFailed | HeartbeatResumed
