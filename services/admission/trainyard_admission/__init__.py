"""Trainyard admission service."""
