"""REST routes for node operations (cordon, drain, uncordon, history)."""

from __future__ import annotations

from fastapi import APIRouter

from trainyard.bus import Bus
from trainyard.settings import Settings
from trainyard.store import Store


def build_router(bus: Bus, store: Store, settings: Settings) -> APIRouter:
    return APIRouter(prefix="/v1/nodes", tags=["nodes"])
