"""What operators see of a running service: Prometheus metrics on a port of
its own (metrics.py) and structured log lines (logs.py)."""
