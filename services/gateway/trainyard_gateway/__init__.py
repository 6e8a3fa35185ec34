"""Trainyard gateway service."""
