"""The ledger: exactly-once application of lifecycle events, and usage queries.

Every test runs against each database in the ``ledger_url`` fixture.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from accounting_builders import (
    HOUR,
    MINUTE,
    T0,
    accepted,
    admitted,
    cancelled,
    failed,
    lifecycle,
    numbered,
    placed,
    started,
    succeeded,
)

from trainyard_accounting import batch
from trainyard_accounting.writer import LedgerWriter

START = T0 + 10 * MINUTE
END = START + 2 * HOUR


def apply_batches(ledger: LedgerWriter, batches: list[list[tuple[str, object]]]) -> None:
    for events in batches:
        ledger.apply(events)  # type: ignore[arg-type]


ONE_RUN = numbered(lifecycle(gpus=8, placed_at=T0, started_at=START, ended_at=END))  # ids 1..5
# A run ended by a node failure, then a success reported by a clock an hour behind (ids 1..6).
SKEWED = numbered(
    [*lifecycle(started_at=START, ended_at=None), failed(at=END, reason="node_failure"), succeeded(at=END - HOUR)]
)


@pytest.mark.parametrize(
    "batches, gpu_seconds, outcome",
    [
        pytest.param([ONE_RUN], 8 * 2 * HOUR, "succeeded", id="a run applied in one batch is charged GPUs x wall time"),
        pytest.param(
            [ONE_RUN, [ONE_RUN[-1]]], 8 * 2 * HOUR, "succeeded", id="a redelivered RunSucceeded does not charge twice"
        ),
        pytest.param(
            [ONE_RUN, ONE_RUN, ONE_RUN[::-1]],
            8 * 2 * HOUR,
            "succeeded",
            id="a whole batch redelivered after a lost ack changes nothing",
        ),
        pytest.param(
            [ONE_RUN, [("99", ONE_RUN[-1][1])]],
            8 * 2 * HOUR,
            "succeeded",
            id="a RunSucceeded published twice under two stream sequences does not charge twice",
        ),
        pytest.param(
            [[ONE_RUN[4]], [ONE_RUN[3]], ONE_RUN[:3]],
            8 * 2 * HOUR,
            "succeeded",
            id="RunSucceeded arriving before RunStarted in an earlier batch still meters the right interval",
        ),
        pytest.param(
            [[pair] for pair in ONE_RUN[::-1]],
            8 * 2 * HOUR,
            "succeeded",
            id="every event in its own batch in reverse order gives the same row",
        ),
        pytest.param(
            [[("0", cancelled(at=START + HOUR))], numbered(lifecycle(started_at=START, ended_at=None))],
            8 * HOUR,
            "cancelled",
            id="a job-wide cancel applied before the run's events still ends the run",
        ),
        pytest.param(
            [numbered(lifecycle(started_at=START, ended_at=None)), [("9", cancelled(at=START + HOUR))]],
            8 * HOUR,
            "cancelled",
            id="a job-wide cancel ends the run already in the ledger",
        ),
        pytest.param(
            [numbered(lifecycle(started_at=START, ended_at=END, outcome="preempted"))],
            8 * 2 * HOUR,
            "failed:preempted",
            id="a preempted run is charged for the time it held the GPUs",
        ),
        pytest.param(
            [SKEWED],
            8 * 2 * HOUR,
            "failed:node_failure",
            id="a success stamped earlier by a skewed clock but later in the log than a failure counts for nothing",
        ),
        pytest.param(
            [[pair] for pair in SKEWED[::-1]],
            8 * 2 * HOUR,
            "failed:node_failure",
            id="the first terminal event in log order counts whatever order the ledger receives them in",
        ),
        pytest.param(
            [ONE_RUN, [("6", cancelled(at=START + HOUR))]],
            8 * 2 * HOUR,
            "succeeded",
            id="a job-wide cancel later in the log than the run's success changes nothing even when stamped earlier",
        ),
        pytest.param(
            [
                [("9", succeeded(at=START + HOUR))],
                numbered([*lifecycle(started_at=START, ended_at=None), cancelled(at=END)]),
            ],
            8 * 2 * HOUR,
            "cancelled",
            id="a job-wide cancel earlier in the log than a success ends the run at the cancel",
        ),
    ],
)
def test_one_row_per_run_whatever_the_delivery(ledger: LedgerWriter, batches, gpu_seconds, outcome):
    apply_batches(ledger, batches)
    (run,) = ledger.runs()
    assert (run.gpu_seconds, run.outcome) == (gpu_seconds, outcome)
    assert ledger.total_gpu_seconds() == gpu_seconds


def test_apply_reports_how_many_events_were_new(ledger: LedgerWriter):
    assert ledger.apply(ONE_RUN) == 5
    assert ledger.apply(ONE_RUN) == 0
    assert ledger.apply([*ONE_RUN, ("6", cancelled(at=END + HOUR))]) == 1
    assert ledger.applied_count() == 6


def test_a_batch_that_fails_midway_stores_nothing_and_can_be_redelivered(ledger: LedgerWriter, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(batch, "write_runs", broken)
    with pytest.raises(RuntimeError):
        ledger.apply(ONE_RUN)
    assert ledger.applied_count() == 0 and ledger.runs() == []
    monkeypatch.undo()
    assert ledger.apply(ONE_RUN) == 5
    assert ledger.total_gpu_seconds() == 8 * 2 * HOUR


@pytest.mark.parametrize(
    "bad, message",
    [
        pytest.param([("", succeeded())], "event id", id="an empty event id is refused"),
        pytest.param(
            [("1", "RunSucceeded")], "not a job lifecycle event", id="something that is not an event is refused"
        ),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(ledger: LedgerWriter, bad, message):
    with pytest.raises(ValueError, match=message):
        ledger.apply([*ONE_RUN, *bad])
    assert ledger.applied_count() == 0


def test_a_job_accepted_after_its_run_ended_fills_in_the_gpu_type_and_queue(ledger: LedgerWriter):
    events = lifecycle(gpus=8, started_at=START, ended_at=END, gpu_type="A100")
    ledger.apply(numbered(events[1:]))
    assert ledger.runs()[0].gpu_type == "unknown"
    ledger.apply([("100", events[0])])
    (run,) = ledger.runs()
    assert (run.gpu_type, run.gpus_by_type, run.queue) == ("A100", {"A100": 8}, "research")


def test_checkpoints_recorded_after_the_run_ended_still_count_lost_work(ledger: LedgerWriter):
    ledger.apply(numbered(lifecycle(gpus=16, started_at=START, ended_at=END, outcome="preempted")))
    assert ledger.runs()[0].lost_seconds == 16 * 2 * HOUR
    assert ledger.record_checkpoints("r1", [START + HOUR, END - 10 * MINUTE]) == 2
    assert ledger.record_checkpoints("r1", [END - 10 * MINUTE]) == 0
    assert ledger.runs()[0].lost_seconds == 16 * 10 * MINUTE


def test_a_run_preempted_10_minutes_after_its_last_checkpoint_loses_10_minutes_of_gpus(ledger: LedgerWriter):
    ledger.record_checkpoints("r1", [START + 30 * MINUTE, END - 10 * MINUTE])
    ledger.apply(numbered(lifecycle(gpus=8, started_at=START, ended_at=END, outcome="preempted")))
    (run,) = ledger.runs()
    assert run.lost_seconds == 8 * 10 * MINUTE
    assert run.idle_seconds == 8 * 10 * MINUTE  # placed at T0, started 10 minutes later


def test_open_runs_have_no_stored_charge_but_are_metered_up_to_now(ledger: LedgerWriter):
    ledger.apply(numbered(lifecycle(gpus=4, started_at=START, ended_at=None)))
    (run,) = ledger.runs()
    assert run.gpu_seconds is None and run.ended_at is None
    assert ledger.total_gpu_seconds() == 0
    assert ledger.total_gpu_seconds(now=START + HOUR) == 4 * HOUR
    assert ledger.usage(now=START + HOUR) == {("acme",): 4 * HOUR}
    assert ledger.runs()[0].gpu_seconds is None  # metering did not store anything


def _two_tenants(ledger: LedgerWriter) -> None:
    events = [
        *lifecycle("r1", "j1", "acme", gpus=8, started_at=T0, ended_at=T0 + 2 * HOUR),
        *lifecycle("r2", "j2", "acme", gpus=2, started_at=T0 + HOUR, ended_at=None, gpu_type="L40S"),
        *lifecycle("r3", "j3", "globex", gpus=16, started_at=T0 - HOUR, ended_at=T0 + HOUR, outcome="node_failure"),
    ]
    ledger.apply(numbered(events))


@pytest.mark.parametrize(
    "query, expected",
    [
        pytest.param(
            dict(now=T0 + 3 * HOUR),
            {("acme",): 8 * 2 * HOUR + 2 * 2 * HOUR, ("globex",): 16 * 2 * HOUR},
            id="usage per tenant includes the open run metered up to now",
        ),
        pytest.param(
            dict(start=T0, end=T0 + HOUR, now=T0 + 3 * HOUR),
            {("acme",): 8 * HOUR, ("globex",): 16 * HOUR},
            id="usage is clipped to the window, including runs that began before it",
        ),
        pytest.param(
            dict(tenant="globex", now=T0 + 3 * HOUR),
            {("globex",): 16 * 2 * HOUR},
            id="a tenant filter sees only that tenant's runs",
        ),
        pytest.param(
            dict(now=T0 + 3 * HOUR, group_by=("tenant", "gpu_type")),
            {("acme", "H100"): 8 * 2 * HOUR, ("acme", "L40S"): 2 * 2 * HOUR, ("globex", "H100"): 16 * 2 * HOUR},
            id="usage can be grouped by tenant and GPU type",
        ),
        pytest.param(
            dict(now=T0 + 3 * HOUR, group_by=("queue", "job_id")),
            {("research", "j1"): 8 * 2 * HOUR, ("research", "j2"): 2 * 2 * HOUR, ("research", "j3"): 16 * 2 * HOUR},
            id="usage can be grouped by queue and job",
        ),
        pytest.param(
            dict(now=T0 + 3 * HOUR, group_by=()),
            {(): 8 * 2 * HOUR + 2 * 2 * HOUR + 16 * 2 * HOUR},
            id="usage with no grouping is one total",
        ),
        pytest.param(
            dict(start=T0 + 10 * HOUR, now=T0 + 3 * HOUR), {}, id="a window after every run has ended holds no usage"
        ),
    ],
)
def test_usage(ledger: LedgerWriter, query, expected):
    _two_tenants(ledger)
    assert ledger.usage(**query) == expected


def test_usage_refuses_an_unknown_grouping(ledger: LedgerWriter):
    with pytest.raises(ValueError, match="cannot group usage by"):
        ledger.usage(group_by=("colour",))


def test_several_runs_of_one_job_are_separate_rows(ledger: LedgerWriter):
    first = lifecycle("r1", gpus=8, started_at=T0, ended_at=T0 + HOUR, outcome="preempted")
    second = [
        admitted("r2", at=T0 + 2 * HOUR, attempt=2),
        placed("r2", at=T0 + 2 * HOUR),
        started("r2", at=T0 + 2 * HOUR),
    ]
    second.append(failed("r2", at=T0 + 3 * HOUR, reason="node_failure"))
    third = [placed("r3", at=T0 + 4 * HOUR), started("r3", at=T0 + 4 * HOUR), succeeded("r3", at=T0 + 5 * HOUR)]
    ledger.apply(numbered([*third, *second, *first, accepted(at=T0 - 5)]))
    runs = ledger.runs(job_id="j1")
    assert [(r.run_id, r.outcome, r.gpu_seconds) for r in runs] == [
        ("r1", "failed:preempted", 8 * HOUR),
        ("r2", "failed:node_failure", 8 * HOUR),
        ("r3", "succeeded", 8 * HOUR),
    ]
    assert runs[1].attempt == 2
    assert ledger.total_gpu_seconds() == 3 * 8 * HOUR


def test_a_ledger_created_before_runs_kept_their_end_sequence_gains_the_columns(ledger: LedgerWriter):
    t = ledger.tables
    with ledger.engine.begin() as conn:  # the tables as an earlier release created them
        conn.execute(sa.text(f"ALTER TABLE {t.runs.name} DROP COLUMN ended_seq"))
        conn.execute(sa.text(f"ALTER TABLE {t.jobs.name} DROP COLUMN cancelled_seq"))
    ledger.create_schema()
    assert ledger.apply(SKEWED) == 6
    (run,) = ledger.runs()
    assert (run.outcome, run.gpu_seconds) == ("failed:node_failure", 8 * 2 * HOUR)
