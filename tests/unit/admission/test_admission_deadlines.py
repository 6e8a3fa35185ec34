"""When admission stops a run that holds quota."""

from __future__ import annotations

import pytest

from trainyard.core.admission.deadlines import HeldRun, Stop, overdue


@pytest.mark.parametrize(
    ("run", "now", "expected"),
    [
        pytest.param(HeldRun("j", "running", 0.0, preempt_deadline=30.0), 30.0, [Stop("j", "preempted")],
                     id="a victim is stopped when its grace period ends"),
        pytest.param(HeldRun("j", "running", 0.0, preempt_deadline=30.0), 29.9, [],
                     id="a victim keeps running until its grace period ends"),
        pytest.param(HeldRun("j", "admitted", 0.0), 60.0, [Stop("j", "placement_timeout")],
                     id="an admitted gang not placed within the timeout gives its quota back"),
        pytest.param(HeldRun("j", "placed", 0.0), 600.0, [], id="a placed gang is never timed out"),
        pytest.param(HeldRun("j", "admitted", 0.0, preempt_deadline=10.0), 60.0, [Stop("j", "preempted")],
                     id="a victim's deadline wins over the placement timeout"),
        pytest.param(HeldRun("j", "pending", 0.0, preempt_deadline=1.0), 60.0, [],
                     id="a job that holds nothing is never stopped"),
    ],
)
def test_overdue_runs(run: HeldRun, now: float, expected: list[Stop]) -> None:
    assert overdue([run], now, placement_timeout_s=60.0) == expected
