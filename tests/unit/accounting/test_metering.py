"""Metering one run from its lifecycle events (pure core, no database)."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import msgspec
import pytest
from accounting_builders import (
    HOUR,
    MINUTE,
    T0,
    accepted,
    admitted,
    cancelled,
    failed,
    lifecycle,
    placed,
    started,
    succeeded,
)

from trainyard.core.accounting import meter, meter_run, observe
from trainyard.domain.job import Role

START = T0 + 10 * MINUTE
END = START + 2 * HOUR


@pytest.mark.parametrize(
    "events, checkpoints, now, expected",
    [
        pytest.param(
            lifecycle(gpus=8, placed_at=T0, started_at=START, ended_at=END),
            [],
            None,
            dict(gpus=8, gpu_seconds=8 * 2 * HOUR, idle_seconds=8 * 10 * MINUTE, lost_seconds=0, outcome="succeeded"),
            id="a run that started and succeeded is charged GPUs x its wall time",
        ),
        pytest.param(
            [succeeded(at=END), started(at=START), placed(at=T0, gpus=8), admitted(at=T0), accepted(at=T0)],
            [],
            None,
            dict(started_at=START, ended_at=END, gpu_seconds=8 * 2 * HOUR, outcome="succeeded"),
            id="RunSucceeded arriving before RunStarted still meters the right interval",
        ),
        pytest.param(
            [*lifecycle(started_at=START, ended_at=END), succeeded(at=END), started(at=START)],
            [],
            None,
            dict(gpu_seconds=8 * 2 * HOUR),
            id="a redelivered RunSucceeded and RunStarted do not change the interval",
        ),
        pytest.param(
            [*lifecycle(started_at=START, ended_at=END), succeeded(at=END + HOUR)],
            [],
            None,
            dict(ended_at=END, gpu_seconds=8 * 2 * HOUR),
            id="a later second end report for the same run is ignored: the earliest end wins",
        ),
        pytest.param(
            lifecycle(gpus=16, started_at=START, ended_at=END, outcome="preempted"),
            [START + 30 * MINUTE, END - 10 * MINUTE],
            None,
            dict(outcome="failed:preempted", lost_seconds=16 * 10 * MINUTE, last_checkpoint_at=END - 10 * MINUTE),
            id="a run preempted 10 minutes after its last checkpoint loses 10 minutes x GPUs",
        ),
        pytest.param(
            lifecycle(gpus=8, started_at=START, ended_at=END, outcome="preempted"),
            [],
            None,
            dict(lost_seconds=8 * 2 * HOUR, last_checkpoint_at=None),
            id="a run preempted before its first checkpoint loses the whole run",
        ),
        pytest.param(
            lifecycle(gpus=8, started_at=START, ended_at=END, outcome="node_failure"),
            [START + HOUR],
            None,
            dict(outcome="failed:node_failure", lost_seconds=8 * HOUR),
            id="a node failure loses the work done since the last checkpoint",
        ),
        pytest.param(
            lifecycle(gpus=8, started_at=START, ended_at=END, outcome="workload_error"),
            [START + HOUR],
            None,
            dict(outcome="failed:workload_error", lost_seconds=0, gpu_seconds=8 * 2 * HOUR),
            id="a run that crashes on its own bug loses nothing to infrastructure",
        ),
        pytest.param(
            lifecycle(gpus=8, started_at=START, ended_at=END, outcome="preempted"),
            [START - MINUTE, END + MINUTE],
            None,
            dict(lost_seconds=8 * 2 * HOUR, last_checkpoint_at=None),
            id="checkpoints from before the start or after the end do not count",
        ),
        pytest.param(
            lifecycle(gpus=4, placed_at=T0, started_at=START, ended_at=None),
            [],
            START + HOUR,
            dict(
                ended_at=None, outcome=None, metered_to=START + HOUR, gpu_seconds=4 * HOUR, idle_seconds=4 * 10 * MINUTE
            ),
            id="an open run is metered up to now",
        ),
        pytest.param(
            lifecycle(gpus=4, started_at=START, ended_at=None),
            [],
            None,
            dict(ended_at=None, gpu_seconds=0, metered_to=None),
            id="an open run without a now is metered as nothing so far",
        ),
        pytest.param(
            lifecycle(gpus=8, placed_at=T0, started_at=None, ended_at=T0 + 5 * MINUTE, outcome="cancelled"),
            [],
            None,
            dict(outcome="cancelled", gpu_seconds=0, idle_seconds=8 * 5 * MINUTE),
            id="a run cancelled before it started is charged nothing but its reservation idled",
        ),
        pytest.param(
            [*lifecycle(started_at=START, ended_at=None), cancelled(at=START + HOUR)],
            [],
            START + 5 * HOUR,
            dict(outcome="cancelled", ended_at=START + HOUR, gpu_seconds=8 * HOUR),
            id="a job-wide cancel ends the job's open run",
        ),
        pytest.param(
            [*lifecycle(started_at=START, ended_at=END), cancelled(at=END + HOUR)],
            [],
            None,
            dict(outcome="succeeded", ended_at=END),
            id="a job-wide cancel after the run succeeded changes nothing",
        ),
        pytest.param(
            lifecycle(gpus=8, placed_at=T0, started_at=START, ended_at=START - MINUTE),
            [],
            None,
            dict(gpu_seconds=0, idle_seconds=8 * 9 * MINUTE),
            id="an end stamped before the start by a skewed clock never meters negative time",
        ),
        pytest.param(
            [*lifecycle(started_at=START, ended_at=None), failed(at=END, reason="preempted"), succeeded(at=END)],
            [],
            None,
            dict(outcome="failed:preempted"),
            id="a failure and a success at the same instant resolve to the failure whatever their order",
        ),
        pytest.param(
            [*lifecycle(started_at=START, ended_at=None), failed(at=END, reason="preempted"), succeeded(at=END - HOUR)],
            [],
            None,
            dict(outcome="succeeded", ended_at=END - HOUR),
            id="without stream sequences the earliest terminal report wins",
        ),
        pytest.param(
            [
                accepted(
                    roles=[
                        Role(name="trainer", replicas=2, gpus_per_replica=8, gpu_type="H100"),
                        Role(name="eval", replicas=1, gpus_per_replica=2, gpu_type="L40S"),
                    ]
                ),
                placed(at=T0, gpus=16, role="trainer"),
                placed(at=T0 + 1, gpus=2, role="eval"),
                started(at=START),
                succeeded(at=START + HOUR),
            ],
            [],
            None,
            dict(gpus=16, gpus_by_type={"H100": 16}, gpu_seconds=16 * HOUR),
            id="of two placements of one run the earliest counts",
        ),
        pytest.param(
            [admitted(at=T0), started(at=START), succeeded(at=START + HOUR), accepted(at=T0, gpus=16, gpu_type="A100")],
            [],
            None,
            dict(gpus=16, gpus_by_type={"A100": 16}, gpu_seconds=16 * HOUR, idle_seconds=0),
            id="a run whose placement was never seen is metered at the GPUs its spec asked for",
        ),
        pytest.param(
            [placed(at=T0, gpus=8), started(at=START), succeeded(at=START + HOUR)],
            [],
            None,
            dict(gpus=8, gpus_by_type={"unknown": 8}, gpu_seconds=8 * HOUR),
            id="a run whose job spec was never seen is metered under an unknown GPU type",
        ),
    ],
)
def test_meter_run(events, checkpoints, now, expected):
    usage = meter_run("r1", events, checkpoints=checkpoints, now=now)
    assert usage is not None
    actual = {field: getattr(usage, field) for field in expected}
    assert actual == expected


def test_mixed_gpu_types_are_split_by_type():
    roles = [
        Role(name="trainer", replicas=2, gpus_per_replica=8, gpu_type="H100"),
        Role(name="eval", replicas=1, gpus_per_replica=2, gpu_type="L40S"),
    ]
    placement = placed(at=T0, gpus=16, role="trainer")
    placement = type(placement)(
        at=T0,
        job_id="j1",
        tenant="acme",
        run_id="r1",
        cluster="c1",
        replicas=[*placement.replicas, *placed(gpus=2, role="eval").replicas],
    )
    usage = meter_run("r1", [accepted(roles=roles), placement, started(at=START), succeeded(at=START + HOUR)])
    assert usage is not None
    assert usage.gpus_by_type == {"H100": 16, "L40S": 2}
    assert usage.gpu_seconds == 18 * HOUR


def test_every_order_of_a_runs_events_meters_the_same():
    events = [
        accepted(at=T0),
        admitted(at=T0 + 1),
        placed(at=T0 + 2, gpus=8),
        started(at=START),
        failed(at=END, reason="preempted"),
        succeeded(at=END + 5),
    ]
    results = {
        msgspec.json.encode(meter_run("r1", order, checkpoints=[START + 60], now=END + HOUR))
        for order in itertools.permutations(events)
    }
    assert len(results) == 1


def test_an_event_of_another_run_cannot_be_folded_in():
    facts = observe(None, started(run="r1", at=START))
    with pytest.raises(ValueError, match="r2"):
        observe(facts, succeeded(run="r2", at=END))
    with pytest.raises(ValueError, match="names no run"):
        observe(facts, accepted())


def test_metering_is_pure_and_stores_nothing():
    facts = observe(observe(None, started(at=START)), placed(at=T0, gpus=2))
    first = meter(facts, now=START + HOUR)
    again = meter(facts, now=START + HOUR)
    assert first == again and facts.ended_at is None
    assert meter(facts, now=START + 2 * HOUR).gpu_seconds == 2 * 2 * HOUR


def test_accounting_core_imports_only_the_standard_library_msgspec_and_events():
    core = Path(__file__).resolve().parents[3] / "libs" / "trainyard" / "core" / "accounting"
    allowed = ("trainyard.core", "trainyard.events", "trainyard.domain", "msgspec", "__future__")
    third_party = {"sqlalchemy", "pyarrow", "psycopg", "redis", "nats"}
    for path in core.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                root = name.split(".")[0]
                assert name.startswith(allowed) or (root != "trainyard" and root not in third_party), (path.name, name)


RUN_EVENTS = [admitted(at=T0), placed(at=T0, gpus=8), started(at=START)]
FAILURE, LATE_SUCCESS = failed(at=END, reason="node_failure"), succeeded(at=END - HOUR)


@pytest.mark.parametrize(
    "reports, outcome, ended_at",
    [
        pytest.param(
            [(FAILURE, 4), (LATE_SUCCESS, 5)],
            "failed:node_failure",
            END,
            id="of two terminal reports the first in log order wins, not the earliest stamped",
        ),
        pytest.param(
            [(LATE_SUCCESS, 5), (FAILURE, 4)],
            "failed:node_failure",
            END,
            id="the first in log order wins whatever order the reports are observed in",
        ),
        pytest.param(
            [(LATE_SUCCESS, 5), (FAILURE, 4), (LATE_SUCCESS, 9), (FAILURE, 4)],
            "failed:node_failure",
            END,
            id="a terminal report published again under a later sequence changes nothing",
        ),
        pytest.param(
            [(LATE_SUCCESS, None), (FAILURE, 4)],
            "failed:node_failure",
            END,
            id="a report with a sequence wins over one without",
        ),
    ],
)
def test_the_outcome_follows_log_order_when_sequences_are_known(reports, outcome, ended_at) -> None:
    facts = None
    for seq, event in enumerate(RUN_EVENTS, start=1):
        facts = observe(facts, event, seq)
    for event, seq in reports:
        facts = observe(facts, event, seq)
    assert facts is not None and (facts.outcome, facts.ended_at) == (outcome, ended_at)
    assert meter(facts).gpu_seconds == 8 * (ended_at - START)
