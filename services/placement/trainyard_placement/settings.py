"""Placement settings: the shared TRAINYARD_* settings, and which binder
carries placements to where jobs run."""

from __future__ import annotations

from trainyard.settings import ConfigurationError, Settings, load_settings, variable

__all__ = ["BINDER_VARIABLE", "BINDERS", "Settings", "binder_kind", "load_settings"]

BINDER_VARIABLE = variable("placement_binder")
#: "none": ``JobPlaced`` is all (the emulator and node agents start runs from it);
#: "kube": each placed run is also bound to the Kubernetes Job or JobSet its spec names.
BINDERS = ("none", "kube")


def binder_kind(settings: Settings) -> str:
    kind = settings.placement_binder.strip().lower() or "none"
    if kind not in BINDERS:
        raise ConfigurationError(f"{BINDER_VARIABLE} must be one of {', '.join(BINDERS)}; got {kind!r}")
    return kind
