"""Trainyard accounting service."""
