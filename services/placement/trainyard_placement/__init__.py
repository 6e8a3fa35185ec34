"""Trainyard placement service."""
