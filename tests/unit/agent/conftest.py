"""Executor tests run real processes over a temporary state directory; the
reports go to a list instead of NATS (agent_fixtures.Reports)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_fixtures import Reports

from trainyard.agent.executor import Executor


@pytest.fixture
def reports() -> Reports:
    return Reports()


@pytest.fixture
async def executor(tmp_path: Path, reports: Reports) -> AsyncIterator[Executor]:
    ex = Executor(tmp_path / "state", "n1", reports, boot_id="b1", poll_s=0.05, checkpoint_poll_s=0.2)
    yield ex
    for run in list(ex.runs.values()):  # leave nothing running behind a failed test
        ex.stop(run, "SIGKILL", 0, "cancelled")
    await ex.close()
