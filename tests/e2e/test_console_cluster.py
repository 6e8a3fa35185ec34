"""The console's fleet and finance pages in a real browser (Debian's chromium,
headless, driven by Playwright) against the whole local stack: tenants drawn
in distinct colours from the tenancy's order and never in health's marks, one
legend per mode, schedulable / in-use / total GPUs, the nodes list and its
state filter, node links only for roles that may follow them, node commands
offered by state and confirmed before they are sent, usage as stacked bars
per day and tenant, and capacity rows dated from the day the cluster began.
A screenshot of each page for each role is saved under tests/e2e/artifacts/
(git-ignored).  The stack and browser fixtures are test_console's, one stack
for this module."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

import pytest
from test_console import WAIT_MS, api, browser, console_stack, log_in, shot, site, wait_status

from trainyard.bus import Bus
from trainyard.config.store import ConfigStore

pytestmark = pytest.mark.e2e
__all__ = ["browser", "console_stack", "site"]  # fixtures this module uses

TENANTS = ("acme", "ads", "beta", "llm")  # `ads` and `beta` shared a hue, `acme` and `llm` nearly did
TEAMS = sorted((*TENANTS, "globex"))  # globex holds nothing, but has its place in the tenancy's order
OKABE_ITO = ["rgb(230, 159, 0)", "rgb(86, 180, 233)", "rgb(0, 158, 115)", "rgb(240, 228, 66)", "rgb(0, 114, 178)"]
COLOUR = {t: OKABE_ITO[TEAMS.index(t)] for t in TENANTS}  # acme, ads, beta, (globex), llm
TEAM = """
      - name: {name}
        quota: {{H100: {{nominal: 24}}}}
        queues: [{{name: default, quota: {{H100: {{nominal: 24}}}}}}]"""
TENANCY = """
flavors: [{{name: H100, node_pool: emulated, gpus_per_node: 8}}]
priority_classes: [{{name: standard, priority: 500}}]
default_priority_class: standard
organisations:
  - name: lab
    quota: {{H100: {{nominal: 128}}}}
    teams:{teams}
"""
TODAY = time.strftime("%Y-%m-%d", time.gmtime())


@pytest.fixture(scope="module")
def busy(console_stack):  # type: ignore[no-untyped-def]
    """The tenancy of TENANTS applied, and runs holding GPUs: `ads` three nodes, the others one each."""
    stack, callers = console_stack

    async def apply() -> None:
        bus = await Bus.connect(stack.nats_admin_url, "e2e-console-cluster")
        try:
            teams = "".join(TEAM.format(name=t) for t in TEAMS)
            await (await ConfigStore.open(bus)).apply(TENANCY.format(teams=teams), actor="test:e2e", reason="tenants")
        finally:
            await bus.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # Playwright's sync API holds this thread's loop
        pool.submit(asyncio.run, apply()).result()
    admin = api(stack, callers.tokens["admin"])
    for tenant in TENANTS:
        spec = {
            "tenant": tenant,
            "queue": "default",
            "simulated_duration_s": 900,
            "job_id": f"hold-{tenant}",
            "roles": [{"name": "trainer", "replicas": 3 if tenant == "ads" else 1, "gpus_per_replica": 8}],
        }
        answer = admin.post("/v1/jobs", json=spec)
        assert answer.status_code == 202, answer.text
    for tenant in TENANTS:
        wait_status(admin, f"hold-{tenant}", {"running"}, timeout=180)  # the machine may be busy
    return stack, callers


def colours(page, selector: str) -> list[str]:  # type: ignore[no-untyped-def]
    return page.eval_on_selector_all(selector, "els => els.map(e => getComputedStyle(e).backgroundColor)")


def confirm(page, node_id: str, op: str, reason: str) -> None:  # type: ignore[no-untyped-def]
    """Ask for ``op`` on the node's page, see the confirmation, confirm it."""
    from playwright.sync_api import expect

    page.goto(f"/nodes/{node_id}")
    page.fill("#node-ops input[name=reason]", reason)
    page.click(f"#node-ops button[value={op}]")
    expect(page.locator("#confirm h1")).to_contain_text(f"{op.capitalize()} node {node_id}?")
    expect(page.locator("#confirm")).to_contain_text(reason)
    page.click("#confirm button[type=submit]")
    expect(page.locator(".flash.ok")).to_contain_text(f"{op} accepted")


def node_state(client, node_id: str, state: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + WAIT_MS / 1000
    while time.monotonic() < deadline:
        nodes = {n["node_id"]: n["state"] for n in client.get("/v1/nodes").json()["nodes"]}
        if nodes.get(node_id) == state:
            return
        time.sleep(0.2)
    raise AssertionError(f"{node_id} never became {state}: {nodes.get(node_id)}")


def test_an_operator_tells_tenants_from_health_and_cordons_a_node_after_confirming(busy, site) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import expect

    stack, callers = busy
    page = log_in(site, callers.tokens["operator"])
    page.goto("/cluster")
    expect(page.locator("#cluster-map .gpu.held")).to_have_count(48, timeout=WAIT_MS)
    expect(page.locator("#gpu-counts")).to_contain_text("128 schedulable · 48 in use · 80 free to schedule")

    # 1. One legend, for tenants only, each tenant its own colour in the tenancy's sorted order.
    legend = page.locator("#tenant-legend .legend-item[data-tenant]")
    assert legend.evaluate_all("els => els.map(e => e.dataset.tenant)") == list(TENANTS)
    assert colours(page, "#tenant-legend .legend-item[data-tenant] .gpu") == [COLOUR[t] for t in TENANTS]
    assert page.locator("#health-legend").count() == 0
    for tenant, colour in COLOUR.items():
        assert set(colours(page, f"#cluster-map .gpu[data-tenant={tenant}]")) == {colour}, tenant
    ads_nodes = page.locator(".node:has(.gpu[data-tenant=ads])").evaluate_all("els => els.map(e => e.dataset.state)")
    assert ads_nodes == ["healthy"] * 3
    shot(page, "fleet-operator-cluster-by-tenant")

    # 2. A healthy node offers cordon and drain, not uncordon; each is confirmed before it is sent.
    target = page.locator(".node:has(.gpu[data-tenant=ads])").first.get_attribute("id").removeprefix("node-")
    page.goto(f"/nodes/{target}")
    assert page.locator("#node-ops button").all_inner_texts() == ["Cordon…", "Drain…"]
    page.fill("#node-ops input[name=reason]", "fan noise")
    page.click("#node-ops button[value=cordon]")
    shot(page, "fleet-operator-node-confirm")
    page.click("text=No, go back")
    expect(page).to_have_url(f"{stack.api_url}/nodes/{target}")
    assert page.locator("#node-state").inner_text() == "healthy", "going back sends nothing"
    confirm(page, target, "cordon", "replacing a fan")
    operator = api(stack, callers.tokens["operator"])
    node_state(operator, target, "cordoned")
    page.goto(f"/nodes/{target}")
    assert page.locator("#node-ops button").all_inner_texts() == ["Drain…", "Uncordon…"]
    shot(page, "fleet-operator-node")

    # 3. After the cordon, the tenant map still shows `ads` on all three nodes in one colour; the
    #    cordoned one says so in words, and is no longer counted as schedulable.
    page.goto("/cluster")
    tile = page.locator(f"#node-{target}")
    expect(tile).to_have_attribute("data-state", "cordoned")
    expect(tile.locator(".node-state")).to_have_text("cordoned")
    assert set(colours(page, "#cluster-map .gpu[data-tenant=ads]")) == {COLOUR["ads"]}
    assert page.locator(".node:has(.gpu[data-tenant=ads])").count() == 3
    assert page.locator("#health-legend").count() == 0
    expect(page.locator("#gpu-counts")).to_contain_text("120 schedulable · 48 in use · 80 free to schedule")
    shot(page, "fleet-operator-cluster-cordoned-by-tenant")

    # 4. Health mode: the health legend only, and health drawn without any tenant's colour.
    page.goto("/cluster?colour=health")
    expect(page.locator("#health-legend")).to_contain_text("cordoned")
    assert page.locator("#tenant-legend").count() == 0
    health = set(colours(page, "#cluster-map .gpu.held")) | set(colours(page, "#health-legend .health-swatch"))
    assert not health & set(OKABE_ITO)
    shot(page, "fleet-operator-cluster-by-health")

    # 5. The nodes list, filtered by state, links to the node; the filter refuses a state that is none.
    page.goto("/nodes?state=cordoned")
    rows = page.locator("#nodes tbody tr[data-node]")
    expect(rows).to_have_count(1)
    expect(rows.first.locator(f"a[href='/nodes/{target}']")).to_be_visible()
    shot(page, "fleet-operator-nodes-cordoned")
    page.goto("/nodes")
    expect(page.locator("#nodes tbody tr[data-node]")).to_have_count(16)
    shot(page, "fleet-operator-nodes")
    answer = page.goto("/nodes?state=sleepy")
    assert answer.status == 422
    expect(page.locator("main")).to_contain_text("'sleepy' is not a node state")

    # 6. Uncordon, confirmed; a healthy node again offers cordon and drain.
    confirm(page, target, "uncordon", "fan replaced")
    node_state(operator, target, "healthy")
    page.goto(f"/nodes/{target}")
    assert page.locator("#node-ops button").all_inner_texts() == ["Cordon…", "Drain…"]


@pytest.mark.parametrize(("caller", "links"), [("acme", False), ("finance", False), ("admin", True)])
def test_node_links_are_drawn_only_for_roles_that_may_open_the_node_page(busy, site, caller, links) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import expect

    _, callers = busy
    role = {"acme": "researcher", "finance": "finance", "admin": "admin"}[caller]
    page = log_in(site, callers.tokens[caller])
    page.goto("/cluster")
    expect(page.locator(".node")).to_have_count(16, timeout=WAIT_MS)
    assert page.locator("a.node").count() == (16 if links else 0)
    expect(page.locator("#gpu-counts")).to_contain_text("schedulable")
    shot(page, f"fleet-{role}-cluster")
    page.goto("/nodes")
    expect(page.locator("#nodes tbody tr[data-node]")).to_have_count(16)
    assert page.locator("#nodes a[href^='/nodes/']").count() == (16 if links else 0)
    shot(page, f"fleet-{role}-nodes")
    assert page.goto("/nodes/n01").status == (200 if links else 403)
    if links:
        shot(page, f"fleet-{role}-node")


def test_finance_sees_usage_as_bars_of_today_and_capacity_from_the_day_the_cluster_began(busy, site) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import expect

    stack, callers = busy
    admin = api(stack, callers.tokens["admin"])
    deadline = time.monotonic() + 60
    while not set(TENANTS) <= {row.get("tenant") for row in admin.get("/v1/usage").json()}:
        assert time.monotonic() < deadline, "accounting never metered the running jobs"
        time.sleep(0.3)

    page = log_in(site, callers.tokens["finance"])
    expect(page).to_have_url(f"{stack.api_url}/usage")
    segments = page.locator("#usage-bars g.segment")
    keys = segments.evaluate_all("els => els.map(e => e.dataset.key)")
    assert sorted(keys) == list(TENANTS), "one segment per tenant, all in today's bar"
    today = time.strftime("%b %d", time.gmtime())
    assert set(segments.evaluate_all("els => els.map(e => e.dataset.bucket)")) == {today}
    fills = segments.locator("rect.bar").evaluate_all("els => els.map(e => e.getAttribute('fill'))")
    assert len(set(fills)) == len(TENANTS)
    assert page.locator("#usage-bars ~ canvas, canvas").count() == 0, "no line chart any more"
    shot(page, "fleet-finance-usage")

    page.goto("/finance/capacity")
    days = page.locator("#capacity-days tbody tr td:first-child").all_inner_texts()
    assert days and days[0] == TODAY and set(days) == {TODAY}, days
    assert "00:00:00Z" not in page.locator("main").inner_text()
    if not TODAY.endswith("-01"):
        expect(page.locator("#capacity-start")).to_contain_text(f"began on {TODAY}")
    shot(page, "fleet-finance-capacity")

    for caller, role in (("admin", "admin"), ("acme", "researcher")):
        other = log_in(site, callers.tokens[caller])
        other.goto("/usage")
        expect(other.locator("#usage-bars g.segment").first).to_be_visible()
        shot(other, f"fleet-{role}-usage")
    other.goto("/finance/capacity")
    shot(other, "fleet-researcher-capacity-refused")
    admin_page = log_in(site, callers.tokens["admin"])
    admin_page.goto("/finance/capacity")
    expect(admin_page.locator("#capacity-days")).to_contain_text(TODAY)
    shot(admin_page, "fleet-admin-capacity")
