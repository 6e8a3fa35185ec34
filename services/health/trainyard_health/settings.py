"""Health settings: heartbeat interval and timeout come from TRAINYARD_HEARTBEAT_*."""

from trainyard.settings import Settings, load_settings

__all__ = ["Settings", "load_settings"]
