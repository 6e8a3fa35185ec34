"""Trainyard health service."""
