"""When admission stops a run that holds quota."""

from __future__ import annotations

import pytest

from trainyard.core.admission.deadlines import HeldRun, Stop, overdue


@pytest.mark.parametrize(
    ("run", "now", "expected"),
    [
        pytest.param(
            HeldRun("j", "running", 0.0, preempt_deadline=30.0),
            30.0,
            [Stop("j", "preempted")],
            id="a victim is stopped when its grace period ends",
        ),
        pytest.param(
            HeldRun("j", "running", 0.0, preempt_deadline=30.0),
            29.9,
            [],
            id="a victim keeps running until its grace period ends",
        ),
        pytest.param(
            HeldRun("j", "admitted", 0.0),
            60.0,
            [Stop("j", "placement_timeout")],
            id="an admitted gang not placed within the timeout gives its quota back",
        ),
        pytest.param(HeldRun("j", "placed", 0.0), 600.0, [], id="a placed gang is never timed out"),
        pytest.param(
            HeldRun("j", "admitted", 0.0, preempt_deadline=10.0),
            60.0,
            [Stop("j", "preempted")],
            id="a victim's deadline wins over the placement timeout",
        ),
        pytest.param(
            HeldRun("j", "pending", 0.0, preempt_deadline=1.0), 60.0, [], id="a job that holds nothing is never stopped"
        ),
        pytest.param(
            HeldRun("j", "running", 0.0, started_at=100.0, runtime_limit_s=3600.0),
            3700.0,
            [Stop("j", "timeout")],
            id="a run is stopped when its run-time limit is reached",
        ),
        pytest.param(
            HeldRun("j", "running", 0.0, started_at=100.0, runtime_limit_s=3600.0),
            3699.9,
            [],
            id="a run keeps running until its run-time limit",
        ),
        pytest.param(
            HeldRun("j", "running", 0.0, started_at=None, runtime_limit_s=60.0),
            1e9,
            [],
            id="a run that never started has no run-time limit to reach",
        ),
        pytest.param(
            HeldRun("j", "placed", 0.0, started_at=0.0, runtime_limit_s=60.0),
            600.0,
            [],
            id="a placed run whose workload has not started is not timed out",
        ),
        pytest.param(
            HeldRun("j", "running", 0.0, started_at=0.0, runtime_limit_s=None),
            1e9,
            [],
            id="a run without a limit is never timed out",
        ),
        pytest.param(
            HeldRun("j", "running", 0.0, preempt_deadline=500.0, started_at=0.0, runtime_limit_s=400.0),
            600.0,
            [Stop("j", "timeout")],
            id="a run that reached its limit before its grace period ended timed out",
        ),
        pytest.param(
            HeldRun("j", "running", 0.0, preempt_deadline=300.0, started_at=0.0, runtime_limit_s=400.0),
            600.0,
            [Stop("j", "preempted")],
            id="a victim whose grace period ended before its limit was preempted",
        ),
    ],
)
def test_overdue_runs(run: HeldRun, now: float, expected: list[Stop]) -> None:
    assert overdue([run], now, placement_timeout_s=60.0) == expected


@pytest.mark.parametrize(
    ("margin", "now", "expected"),
    [
        pytest.param(15.0, 30.0, [], id="a victim on executing nodes is not failed by admission at its deadline"),
        pytest.param(15.0, 44.9, [], id="nor before the margin after it is over"),
        pytest.param(
            15.0, 45.0, [Stop("j", "preempted")], id="once the margin is over, admission stops it as a fallback"
        ),
        pytest.param(0.0, 30.0, [Stop("j", "preempted")], id="an emulated or simulated victim has no margin"),
    ],
)
def test_executing_victims_get_a_margin_after_their_grace(margin: float, now: float, expected: list[Stop]) -> None:
    run = HeldRun("j", "running", 0.0, preempt_deadline=30.0, kill_margin_s=margin)
    assert overdue([run], now, placement_timeout_s=60.0) == expected
