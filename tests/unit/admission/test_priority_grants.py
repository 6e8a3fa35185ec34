"""Which priority classes a queue may use comes from the tenancy file; a
class nobody can preempt (production) must be granted."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainyard.config import compile_tenancy, load_tenancy, validate_against_tenancy, validate_tenancy
from trainyard.config.tenancy import allowed_classes
from trainyard.domain import JobSpec, Role

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tenancy.yaml"

BASE = """
flavors: [{name: H100, node_pool: h100}]
priority_classes:
  - {name: production, priority: 1000, preemptible: false}
  - {name: standard, priority: 500}
  - {name: research, priority: 300, restricted: true}
  - {name: best-effort, priority: 0, may_only_borrow: true}
organisations:
  - name: org
    quota: {H100: {nominal: 64}}
    teams:
      - name: serving
        quota: {H100: {nominal: 32}}
        priority_classes: [production, standard]
        queues:
          - {name: main, quota: {H100: {nominal: 16}}}
          - {name: only-prod, quota: {H100: {nominal: 16}}, priority_classes: [production], default_priority_class: production}
      - name: lab
        quota: {H100: {nominal: 32}}
        queues:
          - {name: main, quota: {H100: {nominal: 32}}}
"""


def config(**edits):
    data = yaml.safe_load(BASE)
    for path, value in edits.items():
        node = data
        *parents, last = path.split("/")
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        node[int(last) if last.isdigit() else last] = value
    return load_tenancy(yaml.safe_dump(data))


def submit(tenant: str, queue: str, klass: str) -> JobSpec:
    return JobSpec(
        tenant=tenant, queue=queue, priority_class=klass, roles=[Role(name="t", gpus_per_replica=8)], image="i"
    )


def test_classes_come_from_the_queue_then_the_team_then_the_unrestricted_ones() -> None:
    cfg = config()
    assert validate_tenancy(cfg) == []
    [org] = cfg.organisations
    serving, lab = org.teams
    assert allowed_classes(cfg, serving, serving.queues[0]) == ["production", "standard"]
    assert allowed_classes(cfg, serving, serving.queues[1]) == ["production"]
    # production is restricted because it cannot be preempted; research says so itself.
    assert allowed_classes(cfg, lab, lab.queues[0]) == ["standard", "best-effort"]
    assert {q.name: q.priority_classes for q in compile_tenancy(cfg).queues if q.tenant == "lab"} == {
        "main": ("standard", "best-effort")
    }


@pytest.mark.parametrize(
    "tenant, queue, klass",
    [
        pytest.param("lab", "main", "production", id="a team not granted production may not use it"),
        pytest.param("lab", "main", "research", id="a class marked restricted needs a grant"),
        pytest.param("serving", "only-prod", "standard", id="a queue's own list narrows its team's"),
    ],
)
def test_a_class_the_queue_may_not_use_is_rejected_naming_it_and_the_allowed_ones(tenant, queue, klass) -> None:
    errors = validate_against_tenancy(submit(tenant, queue, klass), config())
    [error] = [e for e in errors if e.field == "priority_class"]
    assert f"may not use priority class {klass!r}" in error.message
    allowed = ", ".join(
        sorted(
            next(q.priority_classes for q in compile_tenancy(config()).queues if (q.tenant, q.name) == (tenant, queue))
        )
    )
    assert f"it may use: {allowed}" in error.message


@pytest.mark.parametrize(
    "tenant, queue, klass",
    [
        pytest.param("serving", "main", "production", id="a granted team uses production"),
        pytest.param("lab", "main", "standard", id="anyone uses an unrestricted class"),
        pytest.param("lab", "main", "best-effort", id="best effort is open to all"),
    ],
)
def test_granted_and_open_classes_are_accepted(tenant, queue, klass) -> None:
    assert validate_against_tenancy(submit(tenant, queue, klass), config()) == []


@pytest.mark.parametrize(
    "edits, path, words",
    [
        pytest.param(
            {"organisations/0/teams/1/priority_classes": ["gold"]},
            "organisations[0].teams[1].priority_classes[0]",
            "unknown priority class 'gold'",
            id="an unknown class in a grant",
        ),
        pytest.param(
            {"organisations/0/teams/1/priority_classes": []},
            "organisations[0].teams[1].priority_classes",
            "at least one",
            id="an empty grant",
        ),
        pytest.param(
            {"organisations/0/teams/0/queues/0/priority_classes": ["standard", "research"]},
            "organisations[0].teams[0].queues[0].priority_classes[1]",
            "the team may not use",
            id="a queue granted more than its team",
        ),
        pytest.param(
            {"organisations/0/teams/1/queues/0/default_priority_class": "production"},
            "organisations[0].teams[1].queues[0].default_priority_class",
            "not one it may use",
            id="a queue whose default class it may not use",
        ),
        pytest.param(
            {"default_priority_class": "research"},
            "organisations[0].teams[0].queues[0].priority_classes",
            "default priority class 'research'",
            id="a cluster default that queues are not granted",
        ),
    ],
)
def test_bad_grants_are_configuration_errors_with_their_path(edits, path, words) -> None:
    errors = validate_tenancy(config(**edits))
    assert any(e.path == path and words in e.message for e in errors), errors


def test_the_example_keeps_production_for_the_queue_granted_it() -> None:
    cfg = load_tenancy(EXAMPLE.read_text())
    assert validate_tenancy(cfg) == []
    tenancy = compile_tenancy(cfg)
    granted = sorted(f"{q.tenant}/{q.name}" for q in tenancy.queues if "production" in (q.priority_classes or ()))
    assert granted == ["search/ranking"]
    errors = validate_against_tenancy(submit("llm", "pretrain", "production"), cfg)
    assert any(e.field == "priority_class" and "llm/pretrain may not use" in e.message for e in errors), errors
    assert not [
        e
        for e in validate_against_tenancy(submit("search", "ranking", "production"), cfg)
        if e.field == "priority_class"
    ]
