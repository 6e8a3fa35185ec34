"""The YAML tenancy configuration: decoding, validation with paths, diffs, intake checks."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from trainyard.config import (
    ConfigError,
    TenancyConfigError,
    compile_tenancy,
    diff_tenancy,
    load_tenancy,
    priority_class_of,
    validate_against_tenancy,
    validate_tenancy,
)
from trainyard.core.admission.tree import Scheduling
from trainyard.domain.job import JobSpec, Role

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tenancy.yaml"

SMALL = """
flavors:
  - {name: H100, node_pool: h100}
  - {name: A100, node_pool: a100}
priority_classes:
  - {name: standard, priority: 10}
  - {name: best-effort, priority: 0, may_only_borrow: true}
organisations:
  - name: org
    quota: {H100: {nominal: 32}}
    teams:
      - name: t1
        quota: {H100: {nominal: 16}}
        queues:
          - {name: q1, quota: {H100: {nominal: 8, borrowing_limit: 4}}}
          - {name: q2, quota: {H100: {nominal: 8}}}
      - name: t2
        quota: {H100: {nominal: 16}}
        queues:
          - {name: q1, quota: {H100: {nominal: 16}}}
"""


def small(**edits) -> dict:
    import yaml

    data = yaml.safe_load(SMALL)
    for path, value in edits.items():
        node = data
        *parents, last = path.split("/")
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        node[int(last) if last.isdigit() else last] = value
    return data


def errors_for(data: dict) -> list[ConfigError]:
    return validate_tenancy(msgspec.convert(data, type(load_tenancy(SMALL))))


def test_the_example_is_valid_and_has_what_the_docs_promise():
    cfg = load_tenancy(EXAMPLE.read_text())
    assert validate_tenancy(cfg) == []
    assert len(cfg.organisations) == 2
    assert {f.name for f in cfg.flavors} == {"H100", "H200", "A100"}
    classes = {c.name: c for c in cfg.priority_classes}
    assert not classes["production"].preemptible
    assert classes["best-effort"].may_only_borrow
    assert classes["production"].priority > classes["standard"].priority > classes["preemptible"].priority
    assert compile_tenancy(cfg).queues


@pytest.mark.parametrize(
    "edits, path, words",
    [
        pytest.param(
            {"organisations/0/teams/0/queues/1/quota/H100/borrowing_limit": -1},
            "organisations[0].teams[0].queues[1].quota.H100.borrowing_limit",
            "negative",
            id="a negative borrowing limit names the queue, flavor and field",
        ),
        pytest.param(
            {"organisations/0/teams/0/queues/0/quota/H100/lending_limit": 9},
            "organisations[0].teams[0].queues[0].quota.H100.lending_limit",
            "more than the nominal",
            id="a lending limit above nominal",
        ),
        pytest.param(
            {"organisations/0/teams/1/queues/0/quota/H100/nominal": 20},
            "organisations[0].teams[1].quota.H100.nominal",
            "add up to 20",
            id="queues whose nominal quotas exceed their team's",
        ),
        pytest.param(
            {"organisations/0/teams/0/quota/H100/nominal": 24},
            "organisations[0].quota.H100.nominal",
            "add up to 40",
            id="teams whose nominal quotas exceed their organisation's",
        ),
        pytest.param(
            {"organisations/0/teams/0/queues/0/quota/B200": {"nominal": 1}},
            "organisations[0].teams[0].queues[0].quota.B200",
            "unknown flavor",
            id="a quota for a flavor that is not declared",
        ),
        pytest.param(
            {"organisations/0/teams/1/name": "t1"},
            "organisations[0].teams[1].name",
            "already declared",
            id="team names are tenant names and must be unique",
        ),
        pytest.param(
            {"organisations/0/teams/0/queues/1/name": "q1"},
            "organisations[0].teams[0].queues[1].name",
            "already has a queue",
            id="queue names are unique within a team",
        ),
        pytest.param(
            {"default_priority_class": "gold"},
            "default_priority_class",
            "unknown priority class",
            id="an unknown default priority class",
        ),
        pytest.param(
            {"organisations/0/teams/0/queues/0/default_priority_class": "gold"},
            "organisations[0].teams[0].queues[0].default_priority_class",
            "unknown priority class",
            id="an unknown queue default priority class",
        ),
        pytest.param(
            {"organisations/0/weight": 0}, "organisations[0].weight", "greater than 0", id="a fair-share weight of zero"
        ),
        pytest.param(
            {"priority_classes/1/name": "standard"},
            "priority_classes[1].name",
            "declared twice",
            id="a priority class declared twice",
        ),
        pytest.param(
            {"priority_classes/1/preemptible": False},
            "priority_classes[1].preemptible",
            "must be preemptible",
            id="a best-effort class that could not be preempted",
        ),
        pytest.param(
            {"fair_share": {"half_life_s": 0}}, "fair_share.half_life_s", "greater than 0", id="a half-life of zero"
        ),
        pytest.param(
            {"scheduling": {"order": "sjf"}},
            "scheduling.order",
            "unknown order 'sjf'; known: las, fifo",
            id="an unknown order inside a queue",
        ),
        pytest.param(
            {"scheduling": {"service_levels_gpu_h": [1, 64, 32]}},
            "scheduling.service_levels_gpu_h[2]",
            "levels must rise",
            id="service levels that do not rise",
        ),
        pytest.param(
            {"scheduling": {"service_levels_gpu_h": [0, 64]}},
            "scheduling.service_levels_gpu_h[0]",
            "greater than 0",
            id="a service level of zero",
        ),
        pytest.param(
            {"scheduling": {"starvation_s": 0}},
            "scheduling.starvation_s",
            "greater than 0",
            id="aging that would put every job ahead of the levels",
        ),
        pytest.param(
            {"scheduling": {"reserve_after_s": -5}},
            "scheduling.reserve_after_s",
            "0 or more",
            id="a negative reservation delay",
        ),
        pytest.param(
            {"preemption": {"restart_cost_s": -1}},
            "preemption.restart_cost_s",
            "negative",
            id="a negative restart cost",
        ),
    ],
)
def test_validation_names_the_path(edits, path, words):
    errors = errors_for(small(**edits))
    assert [e.path for e in errors] == [path], errors
    assert words in errors[0].message


def test_the_small_config_is_valid():
    assert validate_tenancy(load_tenancy(SMALL)) == []


def test_the_scheduling_section_reaches_the_core():
    cfg = load_tenancy(
        SMALL
        + """
scheduling: {backfill: false, reserve: false, reserve_after_s: 60, order: fifo, service_levels_gpu_h: [2, 20],
             starvation_s: 3600}
preemption: {restart_cost_s: 120}
"""
    )
    assert validate_tenancy(cfg) == []
    tree = compile_tenancy(cfg)
    assert (tree.scheduling.backfill, tree.scheduling.order) == (False, "fifo")
    assert (tree.scheduling.reserve, tree.scheduling.reserve_after_s) == (False, 60.0)
    assert tree.scheduling.service_levels_gpu_h == (2.0, 20.0) and tree.scheduling.starvation_s == 3600.0
    assert tree.preemption.restart_cost_s == 120.0


def test_without_a_scheduling_section_the_core_defaults_apply():
    tree = compile_tenancy(load_tenancy(SMALL))
    assert tree.scheduling == Scheduling()
    assert tree.preemption.min_runtime_s >= 4 * 3600  # shorter fair-share minimums thrash


def test_the_example_preempts_without_thrashing():
    cfg = load_tenancy(EXAMPLE.read_text())
    p = cfg.preemption
    assert not p.fair_share or p.min_runtime_s >= 4 * 3600
    assert p.grace_period_s > 0
    assert cfg.scheduling.backfill and cfg.scheduling.order == "las"


@pytest.mark.parametrize(
    "text, path, words",
    [
        pytest.param(
            SMALL.replace("priority: 10", "priority: high"),
            "priority_classes[0].priority",
            "int",
            id="a wrong type names its path",
        ),
        pytest.param(
            SMALL.replace("node_pool: h100", "node_pool: h100, colour: red"),
            "flavors[0]",
            "colour",
            id="an unknown field is refused, catching typos",
        ),
        pytest.param("flavors: [", "line", "YAML", id="broken YAML says where"),
        pytest.param("- a list", "", "mapping", id="a document that is not a mapping"),
        pytest.param(
            SMALL + "scheduling: {backfill: maybe}\n",
            "scheduling.backfill",
            "bool",
            id="a scheduling switch that is not true or false names its path",
        ),
        pytest.param(
            SMALL + "scheduling: {reorder: las}\n", "scheduling", "reorder", id="an unknown scheduling field is refused"
        ),
    ],
)
def test_load_errors(text, path, words):
    with pytest.raises(TenancyConfigError) as caught:
        load_tenancy(text)
    [error] = caught.value.errors
    assert error.path.startswith(path)
    assert words in error.message


def test_diff_names_each_change():
    old = load_tenancy(SMALL)
    data = small(**{"organisations/0/teams/0/queues/0/quota/H100/nominal": 6})
    data["organisations"][0]["teams"][1]["queues"].append({"name": "q9", "quota": {"H100": {"nominal": 0}}})
    data["organisations"][0]["teams"][0]["queues"].pop(1)
    data["priority_classes"][0]["priority"] = 20
    new = msgspec.convert(data, type(old))
    assert diff_tenancy(old, new) == [
        "removed queue t1/q2",
        "added queue t2/q9",
        "priority class standard priority: 10 -> 20",
        "queue t1/q1 quota H100 nominal: 8 -> 6",
    ]
    assert diff_tenancy(old, old) == []


def job_spec(**kw) -> JobSpec:
    role = Role("trainer", replicas=kw.pop("replicas", 1), gpus_per_replica=8, gpu_type=kw.pop("gpu_type", "H100"))
    return JobSpec(kw.pop("tenant", "t1"), kw.pop("queue", "q1"), [role], **kw)


@pytest.mark.parametrize(
    "spec, field, words",
    [
        pytest.param(job_spec(tenant="t9"), "tenant", "unknown tenant 't9'", id="unknown tenant"),
        pytest.param(job_spec(queue="q9"), "queue", "team 't1' has no queue 'q9'", id="unknown queue"),
        pytest.param(job_spec(gpu_type="B200"), "roles[0].gpu_type", "not offered", id="a GPU type not offered"),
        pytest.param(
            job_spec(gpu_type="A100"), "roles[0].gpu_type", "no A100 quota", id="a type the queue has no quota for"
        ),
        pytest.param(
            job_spec(replicas=3), "roles", "can get at most 12", id="a gang larger than the queue could borrow"
        ),
        pytest.param(
            job_spec(priority_class="gold"), "priority_class", "unknown priority class", id="unknown priority class"
        ),
    ],
)
def test_intake_validation_against_the_tenancy(spec, field, words):
    errors = validate_against_tenancy(spec, load_tenancy(SMALL))
    assert [e.field for e in errors] == [field]
    assert words in errors[0].message


def test_a_spec_that_could_run_passes_intake_and_finds_its_class():
    cfg = load_tenancy(SMALL)
    spec = job_spec(tenant="t2", replicas=2)
    assert validate_against_tenancy(spec, cfg) == []
    assert validate_against_tenancy(spec, compile_tenancy(cfg)) == []
    assert priority_class_of(cfg, spec).name == "standard"


def test_the_example_drives_an_admission_cycle_within_quota():
    from trainyard.core.admission import AdmissionPolicy, AdmissionSnapshot, PendingJob, RunningJob, admit, check_quota

    cfg = load_tenancy(EXAMPLE.read_text())
    tree = compile_tenancy(cfg)
    specs = [
        job_spec(tenant=team, queue=q, replicas=r, gpu_type=t)
        for team, q, t in [
            ("llm", "pretrain", "H100"),
            ("vision", "default", "H100"),
            ("ads", "scratch", "A100"),
            ("search", "ranking", "H200"),
            ("speech", "default", "A100"),
        ]
        for r in (1, 4, 16, 64)
    ]
    assert any(validate_against_tenancy(s, cfg) for s in specs)  # some gangs are too large for their queue
    priority = {c.name: c.priority for c in tree.priority_classes}
    pending = [
        PendingJob(f"j{i}", s.tenant, s.queue, i, s.gpus_by_type, priority.get(s.priority_class, 0))
        for i, s in enumerate(specs)
    ]
    result = admit(
        AdmissionSnapshot(pending, {"H100": 1536, "H200": 768, "A100": 512}, {}), AdmissionPolicy(tenancy=tree), 0.0
    )
    assert len(result.admitted) + len(result.waiting) == len(pending)
    by_id = {p.job_id: p for p in pending}
    running = [
        RunningJob(a.job_id, by_id[a.job_id].tenant, by_id[a.job_id].queue, by_id[a.job_id].gpus_by_type, 0.0)
        for a in result.admitted
    ]
    assert running and check_quota(tree, running) == []
