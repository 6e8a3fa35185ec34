"""Builders and fixtures for tests: real nats-server and Redis-compatible
servers on free loopback ports."""
