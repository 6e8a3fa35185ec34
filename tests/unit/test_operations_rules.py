"""The alert rules, the Grafana dashboard and the runbooks agree with the
code: every alert parses, links to a runbook that exists in
docs/operations.md, and every metric an expression names is one the services
export (so a renamed metric cannot silently break an alert or a panel)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from trainyard.observability.metrics import (
    AdmissionMetrics,
    LedgerMetrics,
    PlacementMetrics,
    ProjectionMetrics,
    serve_metrics,
)
from trainyard.settings import ConfigurationError, load_settings
from trainyard_gateway.metrics import FleetSnapshot, GatewayMetrics
from trainyard_health.metrics import HealthMetrics

ROOT = Path(__file__).resolve().parents[2]
ALERTS = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
DASHBOARD = json.loads((ROOT / "deploy" / "grafana" / "trainyard.json").read_text())
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()
METRIC = re.compile(r"\btrainyard_[a-z0-9_]+")
#: What Prometheus itself records about each scrape.
PROMETHEUS_SERIES = {"up"}


class _Projector:
    """Enough of a projector for its metrics to be declared."""

    def __init__(self, stream: str) -> None:
        self.stream, self.position, self.lost_count = stream, 0, 0


def exported() -> set[str]:
    """Every sample name the services can export (histogram buckets, counters' _total ...)."""
    gateway = GatewayMetrics()
    gateway._fleet.snapshot = FleetSnapshot(
        jobs_by_status={"running": 1},
        gpus_capacity={"H100": 8},
        gpus_in_use={"H100": 8},
        nodes_by_state={"healthy": 1},
        deadletters={"INTAKE": 1},
    )
    gateway.http_requests.labels("GET", "/v1/jobs", "200").inc()
    gateway.grpc_requests.labels("GetJob", "OK").inc()
    admission, placement = AdmissionMetrics(), PlacementMetrics()
    ProjectionMetrics(admission.registry, [_Projector("JOBS")])  # type: ignore[list-item]
    admission.set_queues({("acme", "q"): (1, 8)})
    admission.cycle_done(0.1)
    placement.cycle_done(0.1)
    health = HealthMetrics()
    health.xids.labels("79").inc()
    health.findings.labels("xid", "fatal").inc()
    health.transitions.labels("lost", "automation").inc()
    health.alerts.labels("page").inc()
    health.runs_failed.labels("node_failure").inc()
    health.held.inc()
    health.rack_faults.inc()
    ledger = LedgerMetrics()
    ledger.metered.labels("succeeded").inc()
    registries: list[CollectorRegistry] = [
        gateway.registry,
        admission.registry,
        placement.registry,
        health.registry,
        ledger.registry,
    ]
    return {sample.name for r in registries for family in r.collect() for sample in family.samples}


EXPORTED = exported()
RULES = [rule for group in ALERTS["groups"] for rule in group["rules"]]
PANEL_EXPRS = [t["expr"] for p in DASHBOARD["panels"] for t in p.get("targets", [])]


def anchors(markdown: str) -> list[str]:
    """GitHub's anchors of the headings of a Markdown document, in order."""
    out = []
    for heading in re.findall(r"^#+\s+(.+?)\s*$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        out.append(slug)
    return out


def test_the_rules_cover_what_on_call_needs_and_each_is_complete() -> None:
    names = {r["alert"] for r in RULES}
    assert {
        "TrainyardServiceDown",
        "TrainyardDeadLettersGrowing",
        "TrainyardAdmissionCycleSlow",
        "TrainyardPlacementStalled",
        "TrainyardNodesLost",
        "TrainyardLedgerLag",
        "TrainyardProjectionRebuilding",
    } <= names
    assert len(names) == len(RULES), "two rules share a name"
    for rule in RULES:
        assert rule["expr"].strip() and rule["labels"]["severity"] in ("page", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


@pytest.mark.parametrize("rule", RULES, ids=[r["alert"] for r in RULES])
def test_every_alert_links_to_a_runbook_in_the_operations_guide(rule: dict) -> None:
    link = rule["annotations"]["runbook_url"]
    page, _, anchor = link.partition("#")
    assert page == "docs/operations.md" and anchor, link
    assert anchor in anchors(OPERATIONS), f"docs/operations.md has no heading for #{anchor}"
    sections = {next(iter(anchors(f"### {part}")), ""): part for part in OPERATIONS.split("\n### ")[1:]}
    runbook = sections[anchor]
    assert rule["alert"] in runbook, f"the runbook at #{anchor} does not name {rule['alert']}"
    for part in ("**What it means.**", "**How to look.**", "**What to do.**"):
        assert part in runbook, f"the runbook at #{anchor} lacks {part}"


@pytest.mark.parametrize("rule", RULES, ids=[r["alert"] for r in RULES])
def test_every_metric_an_alert_uses_is_exported(rule: dict) -> None:
    unknown = set(METRIC.findall(rule["expr"])) - EXPORTED
    assert not unknown, f"{rule['alert']} uses metrics no service exports: {sorted(unknown)}"


def test_every_metric_the_dashboard_uses_is_exported() -> None:
    assert len(PANEL_EXPRS) >= 15
    used = {m for expr in PANEL_EXPRS for m in METRIC.findall(expr)}
    assert not used - EXPORTED, f"the dashboard uses metrics no service exports: {sorted(used - EXPORTED)}"
    assert {
        "trainyard_queue_pending_jobs",
        "trainyard_admission_cycle_seconds_bucket",
        "trainyard_placement_cycle_seconds_bucket",
        "trainyard_decision_latency_seconds_bucket",
        "trainyard_health_nodes",
        "trainyard_ledger_lag_events",
        "trainyard_deadletters",
    } <= used


def test_the_service_down_alert_matches_the_scrape_jobs_the_guide_names() -> None:
    [down] = [r for r in RULES if r["alert"] == "TrainyardServiceDown"]
    assert set(re.findall(r"\b([a-z_]+)\{", down["expr"])) <= PROMETHEUS_SERIES
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = {c["job_name"] for c in scrape["scrape_configs"]}
    assert jobs == {f"trainyard-{s}" for s in ("admission", "placement", "health", "accounting", "gateway")}


def test_every_exported_metric_family_is_in_the_operations_guide() -> None:
    families = {re.sub(r"_(bucket|count|sum|total|created)$", "", name) for name in EXPORTED}
    missing = [f for f in sorted(families) if f not in OPERATIONS]
    assert not missing, f"docs/operations.md does not describe: {missing}"


def test_a_bad_metrics_port_is_refused_naming_the_variable() -> None:
    with pytest.raises(ConfigurationError, match="TRAINYARD_PLACEMENT_METRICS_PORT"):
        load_settings({"TRAINYARD_PLACEMENT_METRICS_PORT": "nine"})
    assert serve_metrics("placement", CollectorRegistry(), load_settings({"TRAINYARD_PLACEMENT_METRICS_PORT": ""})) == 0
