"""The web console in a real browser (Debian's chromium, headless, driven by
Playwright) against the whole local stack: each role's main path, a job going
from waiting to running to succeeded on screen without a reload, the cluster
map and node commands, the usage bars and the chargeback download, logout,
and /docs with every request off the machine refused.  A screenshot of every
page is saved under tests/e2e/artifacts/ (git-ignored)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import csv
import io
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from trainyard.bus import Bus
from trainyard.config.store import ConfigStore
from trainyard.local import LocalStack, StackConfig
from trainyard.testing.auth import Callers, issue_at

pytestmark = pytest.mark.e2e

ARTIFACTS = Path(__file__).parent / "artifacts"
CHROMIUM = os.environ.get("TRAINYARD_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
WAIT_MS = 90_000

# Records every status the job page shows, as it changes, and marks the page so a reload would show.
RECORD_STATUSES = """
window.__statuses = [];
window.__loaded = (window.__loaded || 0) + 1;
document.addEventListener('DOMContentLoaded', () => {
  const record = () => {
    const el = document.getElementById('job-status');
    const s = el ? el.textContent.trim() : 'absent';
    if (window.__statuses[window.__statuses.length - 1] !== s) window.__statuses.push(s);
  };
  record();
  new MutationObserver(record).observe(document.body, {subtree: true, childList: true, characterData: true});
});
"""


def chromium_path() -> str:
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"no chromium at {CHROMIUM}: the console's browser tests need Debian's chromium "
            "(`apt-get install -y chromium`, which `make install` does when run as root), "
            "or TRAINYARD_CHROMIUM naming a Chromium binary",
            pytrace=False,
        )
    return CHROMIUM


@pytest.fixture(scope="module")
def console_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, Callers]]:
    s = LocalStack(
        StackConfig(
            data_dir=str(tmp_path_factory.mktemp("console") / "stack"), heartbeat_timeout_s=15.0, log_level="WARNING"
        )
    )
    try:
        s.start()
        assert s.nats
        yield s, asyncio.run(issue_at(s.nats.admin_url))
    finally:
        for name in s.procs:
            print(f"--- {name} (exit {s.procs[name].poll()}) ---\n{s.log_tail(name, 40)}")
        s.stop()


@pytest.fixture(scope="module")
def browser(console_stack: tuple[LocalStack, Callers]) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def site(console_stack: tuple[LocalStack, Callers], browser):  # type: ignore[no-untyped-def]
    """A fresh browser context that may reach the stack and nothing else."""
    stack, _ = console_stack
    context = browser.new_context(
        base_url=stack.api_url, viewport={"width": 1400, "height": 900}, accept_downloads=True
    )
    allowed = urlparse(stack.api_url).netloc
    outside: list[str] = []

    def only_the_stack(route):  # type: ignore[no-untyped-def]
        if urlparse(route.request.url).netloc == allowed:
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", only_the_stack)
    context.set_default_timeout(30_000)
    try:
        yield context
    finally:
        context.close()
    assert outside == [], f"the console asked for something off the machine: {outside}"


def log_in(context, token: str):  # type: ignore[no-untyped-def]
    page = context.new_page()
    page.goto("/login")
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_load_state()
    return page


def shot(page, name: str) -> None:  # type: ignore[no-untyped-def]
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def api(stack: LocalStack, token: str) -> httpx.Client:
    return httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def wait_status(client: httpx.Client, job_id: str, statuses: set[str], timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    job: dict = {}
    while time.monotonic() < deadline:
        r = client.get(f"/v1/jobs/{job_id}")
        if r.status_code == 200:
            job = r.json()
            if job["status"] in statuses:
                return job
        time.sleep(0.2)
    raise AssertionError(f"{job_id} did not reach {statuses}: {job}")


def test_a_researcher_submits_from_the_form_and_watches_the_job_wait_run_and_succeed(console_stack, site) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import expect

    stack, callers = console_stack
    admin = api(stack, callers.tokens["admin"])
    # 1. Every GPU of the cluster is busy for a while, so the researcher's job has to wait.
    blocker = {
        "tenant": "globex",
        "queue": "default",
        "name": "whole-cluster",
        "simulated_duration_s": 15,
        "roles": [{"name": "trainer", "replicas": 16, "gpus_per_replica": 8}],
        "job_id": "blocker-1",
    }
    assert admin.post("/v1/jobs", json=blocker).status_code == 202
    wait_status(admin, "blocker-1", {"running"})

    # 2. The researcher logs in and lands on its jobs; it sees only what its role may do.
    page = log_in(site, callers.tokens["acme"])
    expect(page).to_have_url(f"{stack.api_url}/jobs")
    nav = page.locator("header nav").inner_text()
    assert "Jobs" in nav and "Submit" in nav and "Capacity" not in nav
    assert page.locator("#job-row-blocker-1").count() == 0, "another tenant's job is not shown"
    shot(page, "researcher-jobs-empty")

    # 3. Submits from the form and is taken to the job, which updates itself as it moves.
    page.add_init_script(RECORD_STATUSES)
    page.goto("/jobs/new")
    shot(page, "researcher-submit")
    form = page.locator("#submit-form")
    form.locator("input[name=name]").fill("console-run")
    form.locator("input[name=gpus_per_replica]").fill("8")
    form.locator("input[name=duration]").fill("4")
    form.locator("input[name=job_id]").fill("console-1")
    form.locator("button[type=submit]").click()
    expect(page).to_have_url(f"{stack.api_url}/jobs/console-1?submitted=1")
    expect(page.locator("#job-why")).to_be_visible(timeout=WAIT_MS)  # why it waits, and its place in line
    shot(page, "researcher-job-waiting")
    expect(page.locator("#job-status")).to_have_text("running", timeout=WAIT_MS)
    shot(page, "researcher-job-running")
    expect(page.locator("#job-status")).to_have_text("succeeded", timeout=WAIT_MS)
    shot(page, "researcher-job-succeeded")
    statuses = page.evaluate("window.__statuses")
    assert page.evaluate("window.__loaded") == 1, "the page was reloaded; it should update itself"
    waited = [i for i, s in enumerate(statuses) if s in ("pending", "admitted")]
    assert (
        waited and statuses.index("running") > waited[0] and statuses.index("succeeded") > statuses.index("running")
    ), statuses
    expect(page.locator("text=Run history")).to_be_visible()
    expect(page.locator("ol.timeline")).to_contain_text("succeeded")

    # 4. The list shows a new job appear and finish without a reload; cancel from the job's page.
    page.goto("/jobs")
    acme = api(stack, callers.tokens["acme"])
    spec = {
        "tenant": "acme",
        "queue": "default",
        "roles": [{"name": "trainer", "gpus_per_replica": 1}],
        "simulated_duration_s": 1,
    }
    assert acme.post("/v1/jobs", json=spec | {"job_id": "console-2"}).status_code == 202
    expect(page.locator("#job-row-console-2 .status")).to_have_text("succeeded", timeout=WAIT_MS)
    assert page.evaluate("window.__loaded") == 1
    shot(page, "researcher-jobs")
    assert acme.post("/v1/jobs", json=spec | {"job_id": "console-3", "simulated_duration_s": 600}).status_code == 202
    wait_status(acme, "console-3", {"running"})
    page.goto("/jobs/console-3")
    page.click("#cancel-job")  # asks first, naming the job and its GPUs
    expect(page.locator("#confirm-gpus")).to_have_text("1 GPU")
    page.fill("#confirm input[name=reason]", "wrong dataset")
    page.click("#confirm button[type=submit]")
    expect(page.locator("#job-status")).to_have_text("cancelled", timeout=WAIT_MS)

    # 5. The YAML form reports every bad field and submits nothing.
    page.goto("/jobs/new")
    page.fill("#yaml-form textarea", "queue: default\nroles:\n  - name: trainer\n    gpus_per_replica: 0\n")
    page.click("#yaml-form button[type=submit]")
    expect(page.locator(".flash.error")).to_contain_text("gpus_per_replica")
    shot(page, "researcher-submit-errors")


def test_an_operator_reads_the_cluster_map_and_cordons_and_uncordons_a_node(console_stack, site) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import expect

    stack, callers = console_stack
    page = log_in(site, callers.tokens["operator"])
    expect(page).to_have_url(f"{stack.api_url}/cluster")
    expect(page.locator("a.node")).to_have_count(16)
    assert page.locator(".rack").count() == 2
    admin = api(stack, callers.tokens["admin"])
    spec = {
        "tenant": "acme",
        "queue": "default",
        "simulated_duration_s": 20,
        "job_id": "map-1",
        "roles": [{"name": "trainer", "replicas": 2, "gpus_per_replica": 8}],
    }
    assert admin.post("/v1/jobs", json=spec).status_code == 202
    expect(page.locator("#cluster-map .gpu.held")).to_have_count(16, timeout=WAIT_MS)  # the map follows placements live
    shot(page, "operator-cluster-by-tenant")

    page.click("#node-n03")
    expect(page).to_have_url(f"{stack.api_url}/nodes/n03")
    page.fill("#node-ops input[name=reason]", "replacing a fan")
    page.click("#node-ops button[value=cordon]")
    page.click("#confirm button[type=submit]")  # cordon n03? yes
    expect(page.locator(".flash.ok")).to_contain_text("cordon accepted")
    shot(page, "operator-node")

    page.goto("/cluster?colour=health")
    expect(page.locator("#node-n03")).to_have_attribute("data-state", "cordoned", timeout=WAIT_MS)
    operator = api(stack, callers.tokens["operator"])
    assert operator.post("/v1/nodes/n03/uncordon", json={"reason": "fan replaced"}).status_code == 202
    expect(page.locator("#node-n03")).to_have_attribute("data-state", "healthy", timeout=WAIT_MS)  # live, no reload
    shot(page, "operator-cluster-by-health")
    page.goto("/nodes/n03")
    expect(page.locator("table.grid")).to_contain_text("uncordoned by operator: fan replaced")  # by name
    raw = f"operator:{callers.actor('operator')}"
    expect(page.locator("table.grid .actor").first).to_have_attribute("title", raw)  # the raw id on hover


def test_finance_reads_usage_over_time_downloads_the_chargeback_and_the_capacity_report(console_stack, site) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import expect

    stack, callers = console_stack
    admin = api(stack, callers.tokens["admin"])
    spec = {
        "tenant": "initech",
        "queue": "default",
        "roles": [{"name": "trainer", "gpus_per_replica": 4}],
        "simulated_duration_s": 1,
    }
    assert admin.post("/v1/jobs", json=spec | {"job_id": "usage-1"}).status_code == 202
    wait_status(admin, "usage-1", {"succeeded"})
    deadline = time.monotonic() + 60
    while not any(row.get("tenant") == "initech" for row in admin.get("/v1/usage").json()):
        assert time.monotonic() < deadline, "accounting never metered usage-1"
        time.sleep(0.3)

    page = log_in(site, callers.tokens["finance"])
    expect(page).to_have_url(f"{stack.api_url}/usage")
    expect(page.locator("#usage-bars g.segment[data-key=initech]")).to_be_visible()
    expect(page.locator("#usage-totals")).to_contain_text("initech")
    shot(page, "finance-usage")

    with page.expect_download() as download:
        page.click("#chargeback-form button[type=submit]")
    assert download.value.suggested_filename == f"chargeback-{time.strftime('%Y-%m', time.gmtime())}.csv"
    rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
    assert any(r["SubAccountId"] == "initech" for r in rows) and "BilledCost" in rows[0]

    page.click("header nav >> text=Capacity")
    expect(page.locator("#capacity-totals")).to_contain_text("H100")
    shot(page, "finance-capacity")
    assert page.goto("/jobs").status == 403  # finance reads no jobs


def test_an_admin_sees_every_page_and_logging_out_ends_the_session(console_stack, site) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import expect

    stack, callers = console_stack
    page = log_in(site, callers.tokens["admin"])
    assert page.locator("header nav a").all_inner_texts() == [
        "Jobs",
        "Submit",
        "Cluster",
        "Nodes",
        "Usage",
        "Capacity",
        "Tenancy",
        "Tokens",
        "Dead letters",
    ]
    cookie = next(c for c in site.cookies() if c["name"] == "trainyard_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert page.request.get("/v1/jobs").status == 401, "the session cookie is for console pages, not the API"
    shot(page, "admin-jobs")

    page.click("text=Log out")
    expect(page).to_have_url(f"{stack.api_url}/login")
    page.goto("/jobs")
    expect(page).to_have_url(f"{stack.api_url}/login")
    shot(page, "login")

    page.fill("input[name=token]", "ty_0000000000000000_nottherightsecretnottherightsecretnottherig")
    page.click("button[type=submit]")
    expect(page.locator(".flash.error")).to_contain_text("does not verify")

    page.goto("/docs")  # Swagger UI from the package: every request off the machine is refused (see `site`)
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Trainyard", timeout=WAIT_MS)
    shot(page, "api-docs")


TENANCY = """
flavors: [{{name: H100, node_pool: emulated, gpus_per_node: 8}}]
priority_classes: [{{name: standard, priority: 500}}]
organisations:
  - name: lab
    quota: {{H100: {{nominal: 128}}}}
    teams:
      - name: acme
        quota: {{H100: {{nominal: {acme}, lending_limit: 8}}}}
        queues: [{{name: default, quota: {{H100: {{nominal: {acme}}}}}}}]
      - name: globex
        quota: {{H100: {{nominal: 32}}}}
        queues: [{{name: default, quota: {{H100: {{nominal: 32}}}}}}]
"""


def test_an_admin_reads_the_quota_tree_fair_share_and_the_tenancy_history(console_stack, site) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import expect

    stack, callers = console_stack

    async def apply_twice() -> None:
        bus = await Bus.connect(stack.nats_admin_url, "e2e-console")
        try:
            config = await ConfigStore.open(bus)
            await config.apply(TENANCY.format(acme=16), actor="test:e2e", reason="first quota")
            await config.apply(TENANCY.format(acme=24), actor="test:e2e", reason="more for acme")
        finally:
            await bus.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # Playwright's sync API holds this thread's loop
        pool.submit(asyncio.run, apply_twice()).result()
    page = log_in(site, callers.tokens["admin"])
    page.goto("/admin/tenancy")

    expect(page.locator("#quota-tree tr[data-name=acme]")).to_contain_text("24")
    expect(page.locator("#quota-tree tr[data-name=globex]")).to_contain_text("32")
    expect(page.locator("#fair-share")).to_contain_text("acme/default")
    history = page.locator("details.revision")
    expect(history).to_have_count(2)
    expect(history.first).to_contain_text("nominal: 16 -> 24")
    shot(page, "admin-tenancy")

    researcher = log_in(site, callers.tokens["acme"])
    researcher.goto("/admin/tenancy")
    expect(researcher.locator("main")).to_contain_text("may not read the quota tree")
