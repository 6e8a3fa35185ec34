"""Trainyard: the operating system for large GPU training clusters (shared package)."""

__version__ = "0.1.0"
