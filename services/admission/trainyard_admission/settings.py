"""Admission settings: the shared TRAINYARD_* settings are all it needs today."""

from trainyard.settings import Settings, load_settings

__all__ = ["Settings", "load_settings"]
