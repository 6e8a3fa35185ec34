"""The console's job pages, submit form and admin pages in a real browser
(Debian's chromium, headless, Playwright) against the whole local stack, with
a tenancy applied: the form's pickers follow the tenancy and the chosen tenant
and queue, a command with a time limit runs, a running job's GPU-hours count
up, cancel asks first and the run history says stopping/cancelled at once,
the jobs list's elapsed and nodes columns and its empty filter, local times
with UTC on hover, people's names, and the token and dead-letter pages per
role.  A screenshot of every page for every role goes to tests/e2e/artifacts/."""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from test_console import WAIT_MS, api, browser, console_stack, log_in, shot, site, wait_status

from trainyard.bus import Bus
from trainyard.config.store import ConfigStore
from trainyard.domain import JobSpec, Role
from trainyard.events import SubmitJob, subjects
from trainyard.local import LocalStack
from trainyard.testing.deadletters import give_up_on

pytestmark = pytest.mark.e2e
__all__ = ["browser", "console_stack", "site"]  # test_console's fixtures: this module gets a stack of its own

TENANCY = """
flavors: [{name: H100, node_pool: emulated, gpus_per_node: 8}]
priority_classes: [{name: standard, priority: 500}, {name: urgent, priority: 900, preemptible: false, restricted: true}]
default_priority_class: standard
organisations:
  - name: lab
    quota: {H100: {nominal: 128}}
    teams:
      - name: acme
        quota: {H100: {nominal: 64}}
        queues:
          - {name: default, quota: {H100: {nominal: 32}}}
          - {name: big, quota: {H100: {nominal: 32}}, priority_classes: [urgent, standard], default_priority_class: urgent}
      - name: globex
        quota: {H100: {nominal: 64}}
        queues: [{name: research, quota: {H100: {nominal: 64}}}]
"""
ROLES = ("researcher", "operator", "finance", "admin")
CALLER = {"researcher": "acme", "operator": "operator", "finance": "finance", "admin": "admin"}


def on_the_bus(stack: LocalStack, work: Callable[[Bus], Awaitable[Any]]) -> Any:
    """``work`` on an admin connection to the stack's NATS, off Playwright's thread (its sync API holds the loop)."""

    async def run() -> Any:
        bus = await Bus.connect(stack.nats_admin_url, "e2e-console-admin")
        try:
            return await work(bus)
        finally:
            await bus.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result()


async def dead_submission(bus: Bus, job_id: str) -> int:
    """A submission, dead-lettered as a consumer that gave up on it writes it; the dead letter's sequence."""
    spec = JobSpec(tenant="acme", queue="default", roles=[Role(name="t", gpus_per_replica=1)], simulated_duration_s=1)
    ack = await bus.publish(subjects.intake("acme"), SubmitJob(at=1.0, spec=spec, job_id=job_id), msg_id=job_id)
    return await give_up_on(bus, "INTAKE", ack.seq, "cannot be handled: Redis is not answering")


@pytest.fixture(scope="module")
def prepared(console_stack) -> int:  # type: ignore[no-untyped-def]
    """The tenancy applied, and one dead letter (a submission admission gave up on); its sequence."""
    stack, _ = console_stack

    async def prepare(bus: Bus) -> int:
        await (await ConfigStore.open(bus)).apply(TENANCY, actor="test:e2e", reason="console pickers")
        return await dead_submission(bus, "dl-job")

    return on_the_bus(stack, prepare)


def test_a_researcher_submits_a_command_watches_gpu_hours_count_and_cancels_after_a_confirmation(
    console_stack,
    site,
    prepared,  # type: ignore[no-untyped-def]
) -> None:
    from playwright.sync_api import expect

    stack, callers = console_stack
    page = log_in(site, callers.tokens["acme"])
    cdp = site.new_cdp_session(page)
    cdp.send("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Kolkata"})  # local time differs from UTC
    me = page.locator("header .me .actor")
    expect(me).to_have_text("acme")
    assert me.get_attribute("title") == callers.actor("acme"), "the raw id is on hover"
    nav = page.locator("header nav").inner_text()
    assert "Tokens" not in nav and "Dead letters" not in nav

    # An empty filter says so, with a way back.
    page.goto("/jobs?status=failed")
    expect(page.locator("#job-rows")).to_contain_text("No jobs match these filters")
    page.click("#clear-filters")
    expect(page).to_have_url(f"{stack.api_url}/jobs")

    # The form's pickers: the tenant's queues only, its default queue first, the queue's classes.
    page.goto("/jobs/new")
    tenant, queue, klass = page.locator("#tenant-pick"), page.locator("#queue-pick"), page.locator("#class-pick")
    expect(tenant).to_be_visible()
    assert tenant.locator("option").all_inner_texts() == ["acme"]
    assert queue.locator("option").all_inner_texts() == ["default", "big"] and queue.input_value() == "acme/default"
    assert klass.locator("option").all_inner_texts() == ["standard"]
    queue.select_option("acme/big")
    expect(klass).to_have_value("urgent")
    assert klass.locator("option").all_inner_texts() == ["urgent", "standard"]
    form = page.locator("#submit-form")
    form.locator("input[name=name]").fill("console-cmd")
    form.locator("input[name=command]").fill("sh -c 'echo hello from the console; sleep 300'")
    form.locator("textarea[name=env]").fill("GREETING=hi")
    form.locator("input[name=time_limit]").fill("10m")
    form.locator("input[name=duration]").fill("300")  # the stack's nodes are emulated: how long the run lasts
    form.locator("input[name=gpus_per_replica]").fill("8")
    form.locator("input[name=job_id]").fill("cmd-1")
    shot(page, "researcher-submit-pickers")
    form.locator("button[type=submit]").click()
    expect(page).to_have_url(f"{stack.api_url}/jobs/cmd-1?submitted=1")
    expect(page.locator("#job-status")).to_have_text("running", timeout=WAIT_MS)
    job = api(stack, callers.tokens["acme"]).get("/v1/jobs/cmd-1").json()
    assert job["queue"] == "big" and job["priority_class"] == "urgent" and job["spec"]["max_runtime_s"] == 600
    assert job["spec"]["command"] == ["sh", "-c", "echo hello from the console; sleep 300"]
    assert job["spec"]["roles"][0]["env"] == {"GREETING": "hi"}

    # GPU-hours of the running job and its run count up on the page; times are local, UTC on hover.
    hours = page.locator("#job-gpu-hours")
    expect(hours).not_to_have_text("0.000", timeout=WAIT_MS)
    first = hours.inner_text()
    expect(hours).not_to_have_text(first)
    expect(page.locator("#runs .run-state").last).to_have_text("running")
    started = page.locator("#runs time").nth(1)
    expect(started).to_have_attribute("data-local", "1")
    utc = started.get_attribute("title")
    assert utc and utc.endswith("Z (UTC)") and started.inner_text() + "Z (UTC)" != utc, (started.inner_text(), utc)
    shot(page, "researcher-job-running-live-gpu-hours")

    # The list: elapsed time counting and the nodes.
    page.goto("/jobs")
    row = page.locator("#job-row-cmd-1")
    expect(row.locator(".nodes")).to_contain_text("1 ")
    elapsed = row.locator(".elapsed .ticking")
    was = elapsed.inner_text()
    expect(elapsed).not_to_have_text(was)
    shot(page, "researcher-jobs-elapsed-nodes")

    # Cancel asks first, naming the job and its GPUs; the run history says so at once.
    page.goto("/jobs/cmd-1")
    page.click("#cancel-job")
    expect(page.locator("#confirm")).to_contain_text("cmd-1")
    expect(page.locator("#confirm-gpus")).to_have_text("8 GPUs")
    shot(page, "researcher-job-cancel-confirm")
    page.fill("#confirm input[name=reason]", "wrong dataset")
    page.click("#confirm button[type=submit]")
    expect(page).to_have_url(f"{stack.api_url}/jobs/cmd-1")
    state = page.locator("#runs .run-state").last
    expect(state).to_have_text(re.compile("stopping|cancelled"), timeout=10_000)
    expect(page.locator("#cancel-job")).to_have_count(0)
    shot(page, "researcher-job-cancelled")
    expect(state).to_have_text("cancelled", timeout=WAIT_MS)


def test_an_operator_inspects_and_replays_a_dead_letter_after_a_confirmation(console_stack, site, prepared) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import expect

    stack, callers = console_stack
    page = log_in(site, callers.tokens["operator"])
    page.click("header nav >> text=Dead letters")
    row = page.locator(f"#dl-{prepared}")
    expect(row).to_contain_text("Redis is not answering")
    row.locator(f"a[href='/admin/deadletters/{prepared}']").click()
    expect(page.locator("#deadletter-data")).to_contain_text("dl-job")
    page.click("#replay-link")
    expect(page.locator("#confirm")).to_contain_text(f"Replay dead letter {prepared}?")
    page.fill("#confirm input[name=reason]", "Redis is back")
    page.click("#confirm button[type=submit]")
    expect(page.locator("#replayed")).to_contain_text("was replayed")
    wait_status(api(stack, callers.tokens["admin"]), "dl-job", {"succeeded"})  # admission took the replayed submission
    page.click(f"#dl-{prepared} a.discard")  # dealt with: discard it, after a confirmation
    expect(page.locator("#confirm")).to_contain_text(f"Discard dead letter {prepared}?")
    shot(page, "operator-deadletter-discard-confirm")
    page.click("#confirm button[type=submit]")
    expect(page.locator("#discarded")).to_contain_text(f"Dead letter {prepared} was discarded")
    expect(page.locator(f"#dl-{prepared}")).to_have_count(0)
    assert page.goto("/admin/tokens").status == 403


def test_an_admin_creates_a_token_seen_once_revokes_it_after_a_confirmation_and_picks_any_tenant(
    console_stack,
    site,
    prepared,  # type: ignore[no-untyped-def]
) -> None:
    from playwright.sync_api import expect

    stack, callers = console_stack
    page = log_in(site, callers.tokens["admin"])
    page.click("header nav >> text=Tokens")
    form = page.locator("#token-form")
    form.locator("input[name=name]").fill("carol")
    form.locator("input[name=tenant]").fill("globex")
    form.locator("button[type=submit]").click()
    secret = page.locator("#token-secret").input_value()
    assert re.fullmatch(r"ty_[0-9a-f]{16}_[A-Za-z0-9_-]{43}", secret)
    shot(page, "admin-token-created")
    token_id = secret[3:19]
    row = page.locator(f"#token-{token_id}")
    expect(row).to_contain_text("carol")
    expect(row.locator(".actor")).to_have_text("admin")  # the creator by name
    page.goto("/admin/tokens")
    assert secret not in page.content(), "the secret is shown once"
    page.click(f"#token-{token_id} a.revoke")
    expect(page.locator("#confirm")).to_contain_text("Revoke token carol?")
    shot(page, "admin-token-revoke-confirm")
    page.click("#confirm button[type=submit]")
    expect(page.locator(f"#token-{token_id}")).to_have_attribute("data-state", "revoked")
    assert api(stack, secret).get("/v1/jobs").status_code == 401

    page.goto("/jobs/new")
    page.locator("#tenant-pick").select_option("globex")
    assert page.locator("#queue-pick option").all_inner_texts() == ["research"]
    expect(page.locator("#class-pick")).to_have_value("standard")


PAGES = {
    "jobs": "/jobs",
    "job": "/jobs/shots-1",
    "submit": "/jobs/new",
    "cancel-confirm": "/jobs/shots-1/cancel",
    "tenancy": "/admin/tenancy",
    "tokens": "/admin/tokens",
    "deadletters": "/admin/deadletters",
    "deadletter": "/admin/deadletters/{dl}",
    "replay-confirm": "/admin/deadletters/{dl}/replay",
    "discard-confirm": "/admin/deadletters/{dl}/discard",
}
#: The pages each role may open (every other one answers 403).
ALLOWED = {
    "researcher": {"jobs", "job", "submit", "cancel-confirm"},
    "operator": {"jobs", "job", "cancel-confirm", "deadletters", "deadletter", "replay-confirm", "discard-confirm"},
    "finance": set(),
    "admin": set(PAGES),
}


def test_every_page_for_every_role_is_shown_or_refused_as_the_policy_says(console_stack, site, prepared) -> None:  # type: ignore[no-untyped-def]
    stack, callers = console_stack
    spec = {"tenant": "acme", "queue": "default", "roles": [{"name": "t", "gpus_per_replica": 2}], "job_id": "shots-1"}
    admin = api(stack, callers.tokens["admin"])
    assert admin.post("/v1/jobs", json=spec | {"simulated_duration_s": 600, "max_runtime_s": 900}).status_code == 202
    wait_status(admin, "shots-1", {"running"})
    dead = on_the_bus(stack, lambda bus: dead_submission(bus, "dl-shots"))  # the other test discarded the first
    for role in ROLES:
        page = log_in(site, callers.tokens[CALLER[role]])
        for name, path in PAGES.items():
            answer = page.goto(path.format(dl=dead))
            assert answer is not None
            assert answer.status == (200 if name in ALLOWED[role] else 403), (role, name, answer.status)
            shot(page, f"pages-{role}-{name}")
        page.close()
