"""Orders the executor refuses, naming the field, before anything changes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from agent_fixtures import Reports, launch, order

from trainyard.agent.executor import Executor
from trainyard.events.work import SignalRun


@pytest.mark.parametrize(
    ("start", "field"),
    [
        pytest.param(order("../escape", launch(0, "true")), "run_id", id="a run id that climbs out of the state dir"),
        pytest.param(order("r", launch(0, "true"), tenant_="a/b"), "tenant", id="a tenant with a slash"),
        pytest.param(order("r", launch(0, "true"), launch(0, "true")), "processes", id="two processes of one rank"),
        pytest.param(order("r", launch(-1, "true")), "processes", id="a negative rank"),
        pytest.param(order("r", launch(0, "true", working_dir="rel/dir")), "processes[0].working_dir", id="a relative working directory"),
        pytest.param(order("r", launch(0, "true"), stop_signal="SIGNOPE"), "stop_signal", id="a stop signal that does not exist"),
    ],
)  # fmt: skip
async def test_a_start_the_agent_cannot_use_is_refused_naming_the_field(tmp_path: Path, start: Any, field: str) -> None:
    reports = Reports()
    ex = Executor(tmp_path / "state", "n1", reports)
    with pytest.raises(ValueError, match=rf"^{re.escape(field)}:"):
        await ex.apply(start)
    assert ex.runs == {} and reports.sent == [] and not (tmp_path / "state").exists()


async def test_a_signal_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    ex = Executor(tmp_path / "state", "n1", Reports())
    notice = SignalRun(at=0.0, job_id="j", tenant="acme", run_id="r", node_id="n1", signal="SIGBOGUS")
    with pytest.raises(ValueError, match="^signal: 'SIGBOGUS'"):
        await ex.apply(notice)
