"""The whole stack, every service in its own process, on free loopback ports."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from trainyard.local import LocalStack, StackConfig


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[LocalStack]:
    # A generous heartbeat timeout: on a loaded two-core CI machine a heartbeat can be late, and
    # a spurious node loss would re-run jobs these tests count.  (Node loss has its own tests.)
    s = LocalStack(StackConfig(data_dir=str(tmp_path / "stack"), heartbeat_timeout_s=15.0, log_level="WARNING"))
    try:
        s.start()
        yield s
    finally:
        # Shown by pytest only when the test failed.
        for name in s.procs:
            print(f"--- {name} (exit {s.procs[name].poll()}) ---\n{s.log_tail(name, 40)}")
        s.stop()
    # The stack runs on a locked bus: every service did its whole job with
    # its own user, or the servers and the services said what was refused.
    assert s.nats and s.nats.admin, "the e2e stack runs on a locked bus"
    assert denials(s) == []


def denials(s: LocalStack) -> list[str]:
    """Every permission refused during the test, by nats-server or Redis."""
    assert s.nats
    lines = s.nats.log_path.read_text(errors="replace").splitlines()
    found = [line for line in lines if "Violation" in line]
    for name in s.procs:
        found += [
            f"{name}: {line}"
            for line in s.log_tail(name, 100_000).splitlines()
            if "NOPERM" in line or "no permissions" in line
        ]
    return found
