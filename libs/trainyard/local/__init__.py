"""The whole system on one machine: ``trainyard up``, end-to-end tests, benchmarks."""

from trainyard.local.lock import PortError, StackRunning
from trainyard.local.stack import SERVICES, LocalStack, StackConfig

__all__ = ["SERVICES", "LocalStack", "PortError", "StackConfig", "StackRunning"]
