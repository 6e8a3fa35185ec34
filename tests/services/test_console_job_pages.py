"""The console's job pages and submit form: what they compute (a run's real
state and live GPU-hours, a job's elapsed time and nodes, local times, people's
names, the form's tenancy pickers and fields, the expected start placement's
reservation gives) and what they serve, in the gateway's app against real NATS
and Redis."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest
from gateway_fixtures import client, csrf_of, gateway_app, log_in
from test_console_rebuilding import run_a_job

from trainyard.auth import Role
from trainyard.auth.principal import Principal
from trainyard.bus import Bus
from trainyard.config.store import ConfigStore
from trainyard.config.tenancy import load_tenancy
from trainyard.core.placement import ClusterSnapshot, NodeView, PlacementRequest, RunningAlloc, place
from trainyard.domain import JobSpec, NodeInfo
from trainyard.domain import Role as JobRole
from trainyard.events import JobAccepted, JobAdmitted, JobCancelled, SubmitJob
from trainyard.events.jobs import ReplicaPlacement
from trainyard.ledger.records import LedgerRun
from trainyard.settings import Settings
from trainyard.store import Store, waiting
from trainyard.testing.auth import Callers
from trainyard.testing.publish import publish_event
from trainyard.testing.streams import project, read_raw
from trainyard_gateway.console.job_rows import elapsed, nodes_of, run_rows
from trainyard_gateway.console.render import actor, person, when
from trainyard_gateway.console.submit_form import body_from_form, choices, form_context, time_limit_s
from trainyard_gateway.jobs import InvalidRequest
from trainyard_gateway.schema import JobView

TENANCY = """
flavors: [{name: H100, node_pool: emulated, gpus_per_node: 8}]
priority_classes: [{name: standard, priority: 500}, {name: urgent, priority: 900, preemptible: false}]
default_priority_class: standard
organisations:
  - name: lab
    teams:
      - name: acme
        queues: [{name: default}, {name: big, priority_classes: [urgent, standard], default_priority_class: urgent}]
      - name: globex
        queues: [{name: research}, {name: batch}]
"""
RESEARCHER = Principal(subject="0123456789abcdef:alice", role=Role.RESEARCHER, tenant="acme", method="token")
ADMIN = Principal(subject="fedcba9876543210:root", role=Role.ADMIN, tenant=None, method="token")


def ledger_run(run_id: str, **kw: Any) -> LedgerRun:
    fields: dict[str, Any] = dict(
        run_id=run_id, job_id="j", tenant="acme", queue="default", priority_class=None, name=None, labels={},
        attempt=1, cluster="c1", gpus=16, gpu_type="H100", gpus_by_type={"H100": 16}, placed_at=90.0,
        started_at=100.0, ended_at=None, outcome=None, gpu_seconds=None, lost_seconds=None, idle_seconds=None,
    )  # fmt: skip
    return LedgerRun(**(fields | kw))


def test_a_running_run_shows_gpu_hours_so_far_and_counts_them_up() -> None:
    job = JobView(job_id="j", status="running", tenant="acme", gpus=16, run_id="r1", attempt=1, started_at=100.0)
    [row] = run_rows(job, [ledger_run("r1")], now=100.0 + 1800)

    assert row.state == "running" and row.live and row.gpu_hours == pytest.approx(8.0)  # 16 GPUs x half an hour


def test_a_cancelled_jobs_open_run_says_stopping_then_the_ledgers_outcome() -> None:
    job = JobView(
        job_id="j", status="cancelled", tenant="acme", gpus=16, run_id="r1", started_at=100.0, finished_at=460.0
    )
    [open_run] = run_rows(job, [ledger_run("r1")], now=10_000.0)
    [closed] = run_rows(job, [ledger_run("r1", ended_at=470.0, outcome="cancelled", gpu_seconds=16 * 370.0)], 10_000.0)

    assert open_run.state == "stopping" and not open_run.live and open_run.gpu_hours == pytest.approx(16 * 360 / 3600)
    assert closed.state == "cancelled" and closed.gpu_hours == pytest.approx(16 * 370 / 3600)


def test_a_run_the_ledger_has_not_metered_yet_is_shown_from_the_job() -> None:
    job = JobView(job_id="j", status="running", tenant="acme", gpus=4, run_id="r2", attempt=2, started_at=50.0)
    rows = run_rows(job, [ledger_run("r1", ended_at=40.0, outcome="failed:oom", gpu_seconds=3600.0)], now=950.0)

    assert [(r.run_id, r.state, r.live) for r in rows] == [("r1", "failed:oom", False), ("r2", "running", True)]
    assert rows[1].gpu_hours == pytest.approx(1.0)


def test_elapsed_counts_while_running_and_stops_at_the_end_and_nodes_are_listed_once() -> None:
    running = JobView(job_id="j", status="running", tenant="acme", started_at=100.0)
    done = JobView(job_id="j", status="succeeded", tenant="acme", started_at=100.0, finished_at=160.0)
    waiting = JobView(job_id="j", status="pending", tenant="acme")
    placed = msgspec.convert(
        {"job_id": "j", "status": "running", "tenant": "a", "placement": [
            {"role": "t", "replica": r, "rank": r, "node_id": n, "gpus": [0]} for r, n in enumerate(["n2", "n2", "n1"])
        ]},
        JobView,
    )  # fmt: skip

    assert elapsed(running, 400.0) == (300.0, True) and elapsed(done, 400.0) == (60.0, False)
    assert elapsed(waiting, 400.0) == (None, False) and nodes_of(placed) == ["n2", "n1"]


def test_times_are_time_elements_with_the_utc_time_on_hover_and_actors_are_names() -> None:
    html = str(when(0.0))
    assert re.fullmatch(
        r'<time datetime="1970-01-01T00:00:00Z" title="1970-01-01 00:00:00Z">1970-01-01 00:00:00Z</time>', html
    )
    assert person("token:0123456789abcdef:alice") == "alice" == person("operator:token:0123456789abcdef:alice")
    assert person("jwt:bob@example.com") == "bob@example.com" and person("something-else") == "something-else"
    assert person("operator:jwt:bob@example.com") == "bob@example.com" == person("operator:bob@example.com")
    assert str(actor("token:0123456789abcdef:<op>")) == (
        '<span class="actor" title="token:0123456789abcdef:&lt;op&gt;">token:0123456789abcdef:&lt;op&gt;</span>'
    )


def test_the_form_offers_only_the_callers_queues_default_first_with_their_classes() -> None:
    cfg = load_tenancy(TENANCY)
    mine = choices(cfg, RESEARCHER)
    every = choices(cfg, ADMIN)

    assert [(c.value, c.classes, c.default_class) for c in mine] == [
        ("acme/default", ("standard",), "standard"),
        ("acme/big", ("urgent", "standard"), "urgent"),
    ]
    assert [c.value for c in every][2:] == ["globex/research", "globex/batch"]  # no `default`: its first queue
    context = form_context(ADMIN, cfg, {}, [])
    assert context["tenants"] == ["acme", "globex"] and context["form"]["queue"] == "acme/default"


def test_the_form_makes_a_submission_with_command_env_and_time_limit() -> None:
    fields = {
        "queue": "acme/big", "priority_class": "urgent", "command": "python train.py --lr '1e-4'",
        "env": "WANDB_MODE=offline\n\nSEED=7", "time_limit": "90m", "replicas": "2", "gpus_per_replica": "8",
    }  # fmt: skip
    body = body_from_form(RESEARCHER, fields)

    assert body["tenant"] == "acme" and body["queue"] == "big" and body["priority_class"] == "urgent"
    assert body["command"] == ["python", "train.py", "--lr", "1e-4"] and body["max_runtime_s"] == 5400
    assert body["roles"][0]["env"] == {"WANDB_MODE": "offline", "SEED": "7"}
    assert time_limit_s("2h") == 7200 == time_limit_s("120") and time_limit_s("1d") == 86_400


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("time_limit", "soon", "give e.g. 30m"),
        ("time_limit", "0h", "give e.g. 30m"),
        ("command", "python 'train.py", "close the quote"),
        ("env", "not a pair", "NAME=value"),
    ],
)
def test_a_bad_field_is_named_with_what_to_write(field: str, value: str, says: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        body_from_form(RESEARCHER, {"queue": "acme/default", field: value})
    [problem] = err.value.errors
    assert problem.field == field and says in problem.message


@pytest.fixture
async def app(bus: Bus, store: Store, callers: Callers, tmp_path: Any) -> Any:
    await run_a_job(bus, "run-1", [0, 1, 2, 3], succeed=False)
    await run_a_job(bus, "done-1", [4, 5], succeed=True)
    await (await ConfigStore.open(bus)).apply(TENANCY, actor="test:admin")
    await project(bus, store, "JOBS")
    return gateway_app(bus, store, callers.authenticator, Settings(ledger_url=f"sqlite:///{tmp_path}/ledger.db"))


@pytest.fixture
async def researcher(app: Any, callers: Callers) -> AsyncIterator[httpx.AsyncClient]:
    async with client(app) as browser:
        await log_in(browser, callers.tokens["acme"])
        yield browser


async def test_the_jobs_list_shows_elapsed_and_nodes_and_an_empty_filter_says_so(researcher: httpx.AsyncClient) -> None:
    listed = (await researcher.get("/jobs")).text
    row = re.search(r'<tr id="job-row-run-1".*?</tr>', listed, re.S)
    assert row and 'class="ticking" data-since="4.0"' in row.group(0) and "n1" in row.group(0)
    assert '<th class="num">Elapsed</th><th>Nodes</th>' in listed

    empty = (await researcher.get("/jobs?status=rejected")).text
    assert "No jobs match these filters" in empty and 'href="/jobs" id="clear-filters"' in empty
    assert "No jobs yet" not in empty


async def test_the_job_page_counts_gpu_hours_and_cancel_asks_first_naming_the_gpus(
    researcher: httpx.AsyncClient, bus: Bus, store: Store
) -> None:
    page = (await researcher.get("/jobs/run-1")).text
    assert 'id="job-gpu-hours" data-since="4.0" data-gpus="4"' in page
    assert 'data-run="run-1-r1"' in page and ">running</span>" in page and 'href="/jobs/run-1/cancel"' in page
    assert 'href="/jobs/done-1/cancel"' not in (await researcher.get("/jobs/done-1")).text  # succeeded: no cancel

    confirm = await researcher.get("/jobs/run-1/cancel")
    assert confirm.status_code == 200 and "Cancel job <code>run-1</code>?" in confirm.text and "4 GPUs" in confirm.text
    unconfirmed = await researcher.post("/jobs/run-1/cancel", data={"csrf": csrf_of(page), "reason": "oops"})
    assert unconfirmed.status_code == 200 and 'name="confirm" value="run-1"' in unconfirmed.text
    assert await read_raw(bus, "INTAKE") == [], "nothing is cancelled without the confirmation"
    done = await researcher.post(
        "/jobs/run-1/cancel", data={"csrf": csrf_of(page), "confirm": "run-1", "reason": "oops"}
    )
    assert done.status_code == 303
    assert b"CancelJob" in (await read_raw(bus, "INTAKE"))[0][2]
    assert (await researcher.get("/jobs/done-1/cancel")).status_code == 409

    await publish_event(bus, JobCancelled(at=20.0, job_id="run-1", tenant="acme", run_id="run-1-r1"), msg_id="c1")
    await project(bus, store, "JOBS")
    after = (await researcher.get("/jobs/run-1")).text
    assert 'status s-stopping run-state">stopping</span>' in after, "the open run is stopping, not running"


async def test_the_submit_form_has_pickers_from_the_tenancy_and_submits_the_chosen_queue(
    researcher: httpx.AsyncClient, bus: Bus
) -> None:
    form = (await researcher.get("/jobs/new")).text
    assert '<select name="queue" id="queue-pick"' in form and 'value="acme/big"' in form
    assert "globex" not in form, "a researcher is offered its own tenant's queues only"
    assert ">acme / big</option>" in form, "without scripts the queue picker names each queue's tenant"
    assert '<label class="js-only" hidden>Tenant' in form, "the tenant picker is for scripts to show"
    assert 'name="command"' in form and 'name="time_limit"' in form and 'name="env"' in form

    fields = {
        "csrf": csrf_of(form), "mode": "form", "queue": "acme/big", "priority_class": "urgent", "name": "t",
        "command": "python train.py", "time_limit": "2h", "replicas": "1", "gpus_per_replica": "8",
        "gpu_type": "H100", "job_id": "form-1",
    }  # fmt: skip
    sent = await researcher.post("/jobs/new", data=fields)
    assert sent.status_code == 303 and sent.headers["location"] == "/jobs/form-1?submitted=1", sent.text
    [(_, _, data)] = await read_raw(bus, "INTAKE")
    spec = msgspec.json.decode(data, type=SubmitJob).spec
    assert (spec.tenant, spec.queue, spec.priority_class, spec.command, spec.max_runtime_s) == (
        "acme", "big", "urgent", ["python", "train.py"], 7200,
    )  # fmt: skip

    other = await researcher.post("/jobs/new", data=fields | {"queue": "globex/batch", "job_id": "form-2"})
    assert other.status_code == 403 and "acts only for tenant" in other.text


async def test_an_admitted_gang_placement_cannot_place_yet_shows_when_its_reservation_starts(
    researcher: httpx.AsyncClient, bus: Bus, store: Store
) -> None:
    # Placement's cycle: run-1 holds GPUs 0-3 of n1 with a 2-hour limit, so an 8-GPU gang
    # admitted now fits only once run-1 ends, and reserves n1 from then.
    held = [ReplicaPlacement(role="trainer", replica=0, rank=0, node_id="n1", gpus=[0, 1, 2, 3])]
    running = RunningAlloc(job_id="run-1", run_id="run-1-r1", replicas=held, started_at=4.0, max_runtime_s=7200)
    n1 = NodeView(info=NodeInfo(node_id="n1", cluster="c1", gpu_type="H100", gpus=8), free_gpus=(4, 5, 6, 7))
    spec = JobSpec(tenant="acme", queue="default", roles=[JobRole(name="trainer", replicas=1, gpus_per_replica=8)])
    request = PlacementRequest(job_id="wait-1", run_id="wait-1-r1", spec=spec, order=0)
    [unplaced] = place(ClusterSnapshot(nodes=[n1], running=[running]), [request], now=10.0).unplaced
    assert unplaced.expected_start == 4.0 + 7200

    await publish_event(bus, JobAccepted(at=5.0, job_id="wait-1", spec=spec, submitted_at=5.0), msg_id="w:0")
    await publish_event(
        bus, JobAdmitted(at=6.0, job_id="wait-1", tenant="acme", run_id="wait-1-r1", attempt=1), msg_id="w:1"
    )
    await project(bus, store, "JOBS")
    # what the placement service records of the gangs it leaves waiting
    outlook = waiting.Waiting(unplaced.reason.value, expected_start=unplaced.expected_start)
    await waiting.write(store, "admitted", {"wait-1": outlook})

    page = (await researcher.get("/jobs/wait-1")).text
    assert f"Expected to start around <strong>{when(4.0 + 7200)}</strong>" in page
