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
