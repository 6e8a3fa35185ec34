"""Trace loading, synthetic mixes, what-if knobs and the report."""

import json
from itertools import pairwise

import pytest
from typer.testing import CliRunner

from trainyard.cli.main import app
from trainyard.sim import load_philly, synthetic
from trainyard.sim.fairness import jain
from trainyard.sim.report import percentile
from trainyard.sim.scenarios import build, parse_quotas
from trainyard.sim.workloads import gang_of, traces_dir

ROWS = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-09 07:01:55,66.0,1,66.0,vca
2017-10-09 06:13:03,2951.0,16,47216.0,vcb
2017-10-10 00:00:00,10.0,12,120.0,vcz
"""


@pytest.fixture
def traces(tmp_path):
    (tmp_path / "philly").mkdir()
    (tmp_path / "philly" / "philly_jobs_adaptdl.csv").write_text(ROWS)
    (tmp_path / "philly" / "philly_vc_nodes.csv").write_text("vc,node num\nvca,2\nvcb,4\n")
    return tmp_path


def test_philly_rows_are_sorted_and_vcs_become_tenants(traces):
    w = load_philly(traces)
    assert [j.tenant for j in w.jobs] == ["vcb", "vca", "vcz"]
    assert [j.submit for j in w.jobs] == [0.0, 48 * 60 + 52, 17 * 3600 + 46 * 60 + 57]
    assert w.quotas == {"vca": 16, "vcb": 32, "vcz": 16}  # vcz is not in the VC list: 2 nodes by default
    assert w.jobs[0].roles == (("worker", 2, 8),)
    assert w.jobs[2].roles == (("worker", 1, 8), ("tail", 1, 4))
    assert w.jobs[2].gpus == 12


def test_philly_date_window_and_env_path(traces, monkeypatch):
    monkeypatch.setenv("TRAINYARD_TRACES", str(traces))
    assert traces_dir() == traces
    assert len(load_philly(start="2017-10-10").jobs) == 1


@pytest.mark.parametrize(
    "gpus, roles",
    [
        pytest.param(1, (("worker", 1, 1),), id="one GPU is one replica"),
        pytest.param(8, (("worker", 1, 8),), id="a full node is one replica"),
        pytest.param(64, (("worker", 8, 8),), id="64 GPUs are 8 whole-node replicas"),
        pytest.param(20, (("worker", 2, 8), ("tail", 1, 4)), id="20 GPUs are 2 whole nodes and a 4-GPU tail"),
    ],
)
def test_gang_shapes(gpus, roles):
    assert gang_of(gpus) == roles


def test_synthetic_mix_is_seeded_and_has_every_kind():
    a, b = synthetic(4000, 32768, seed=7), synthetic(4000, 32768, seed=7)
    assert [(j.tenant, j.submit, j.duration, j.roles) for j in a.jobs] == [
        (j.tenant, j.submit, j.duration, j.roles) for j in b.jobs
    ]
    sizes = [j.gpus for j in a.jobs]
    assert sum(1 for g in sizes if g <= 8) > 0.7 * len(sizes)
    assert any(64 <= g <= 512 for g in sizes)
    assert any(len(j.roles) == 2 and j.roles[0][0] == "trainer" for j in a.jobs)
    assert all(j.submit <= k.submit for j, k in pairwise(a.jobs))


def test_what_if_knobs(traces):
    w, nodes = build("philly", str(traces), add_nodes=3, quotas={"vca": 64}, arrival_scale=2.0)
    assert nodes == (16 + 32 + 16) // 8 + 3
    assert w.quotas["vca"] == 64
    assert w.jobs[1].submit == pytest.approx((48 * 60 + 52) / 2)
    with pytest.raises(ValueError, match="no such tenant"):
        build("philly", str(traces), quotas={"nope": 8})
    assert parse_quotas(["a=8", "b = 16"]) == {"a": 8, "b": 16}
    with pytest.raises(ValueError, match="TENANT=GPUS"):
        parse_quotas(["a:8"])


def test_percentile_and_jain():
    assert percentile([5, 1, 3, 2, 4], 50) == 3
    assert percentile(list(range(1, 101)), 99) == 99
    assert jain([1, 1, 1, 1]) == 1.0
    assert jain([1, 0, 0, 0]) == 0.25


def test_cli_compare_prints_policies_and_writes_outputs(tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "sim",
            "compare",
            "--workload",
            "synthetic",
            "--jobs",
            "150",
            "--nodes",
            "8",
            "--policies",
            "fifo,sjf",
            "--out",
            str(out),
            "--failures",
            "--check-every",
            "5",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "fifo" in result.output and "sjf" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert [s["policy"] for s in summary] == ["fifo", "sjf"]
    assert all(s["violations"] == 0 for s in summary)
    assert (out / "jct_cdf.png").stat().st_size > 0 and (out / "jobs_sjf.csv").exists()


def test_cli_run_json_and_bad_policy():
    result = CliRunner().invoke(
        app, ["sim", "run", "--workload", "synthetic", "--jobs", "100", "--nodes", "8", "--policy", "sjf", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["policy"] == "sjf"  # progress lines go to stderr
    result = CliRunner().invoke(
        app, ["sim", "compare", "--workload", "synthetic", "--jobs", "10", "--nodes", "2", "--policies", "lottery"]
    )
    assert result.exit_code == 2
    assert "unknown policy" in result.output


def test_water_fill_caps_small_demands_and_splits_the_rest_by_weight():
    from trainyard.sim.fairness import water_fill

    fair = water_fill({"a": 10.0, "b": 100.0, "c": 100.0}, {"a": 1.0, "b": 1.0, "c": 2.0}, 100.0)
    assert fair["a"] == pytest.approx(10.0)
    assert fair["b"] == pytest.approx(30.0) and fair["c"] == pytest.approx(60.0)


def test_gangs_that_take_turns_are_unfair_in_each_sample_and_fair_over_the_day():
    from trainyard.sim.fairness import FairPeriod, jain, period_fairness, water_fill

    entitled = {"a": 0.5, "b": 0.5}
    # two tenants with 16-GPU gangs on a 16-GPU cluster, each wanting 16 all day, holding it in turn
    samples = [({"a": 16, "b": 0}, {"a": 16, "b": 16}), ({"a": 0, "b": 16}, {"a": 16, "b": 16})] * 6
    day, instant = FairPeriod({}, {}), []
    for held, wanted in samples:
        fair = water_fill(wanted, entitled, 16)
        instant.append(jain([held[t] / f for t, f in fair.items()]))
        day.add(held, wanted, 16)
    assert instant == [0.5] * 12
    assert period_fairness({0: day}, entitled) == 1.0
    # one tenant holding the cluster the whole day while the other waits is unfair either way
    hog = FairPeriod({}, {})
    for _ in range(12):
        hog.add({"a": 16, "b": 0}, {"a": 16, "b": 16}, 16)
    assert period_fairness({0: hog}, entitled) == 0.5
    assert period_fairness({}, entitled) is None


def test_the_report_gives_the_per_day_index_of_a_contended_run():
    from trainyard.sim import Scenario
    from trainyard.sim.report import summarise
    from trainyard.sim.scenarios import prepare, run_policies

    plan = prepare(workload="synthetic", jobs=400, nodes=8, seed=1, load=1.2, target_load=1.2)
    [sim] = run_policies(plan.workload, plan.nodes, ["trainyard"], Scenario(seed=1, record_events=False))
    summary = summarise(sim)
    assert sim.fair_periods and summary["jain_contended"] is not None
    assert 0.0 < summary["jain_contended_24h"] <= 1.0
    assert summary["jain_contended_24h"] == round(
        sum(p.jain(sim.entitled) for p in sim.fair_periods.values()) / len(sim.fair_periods), 4
    )


def test_a_job_carries_its_gpu_type_queue_and_class_into_its_spec_and_through_scaling():
    from trainyard.sim import SimJob, Workload

    job = SimJob(0, "t", 0.0, 60.0, gang_of(4), limit_s=600, priority_class="production", gpu_type="A100", queue="eval")
    spec = job.spec()
    assert (spec.queue, spec.priority_class, spec.max_runtime_s) == ("eval", "production", 600)
    assert {r.gpu_type for r in spec.roles} == {"A100"}
    later = Workload([job, job.but(index=1, submit=100.0)], {"t": 8}, "x").scaled(2.0)
    assert [(j.submit, j.gpu_type, j.queue, j.priority_class) for j in later.jobs] == [
        (0.0, "A100", "eval", "production"),
        (50.0, "A100", "eval", "production"),
    ]


@pytest.mark.parametrize(
    "demand, gpus, quotas",
    [
        pytest.param({"a": 3.0, "b": 1.0}, 64, {"a": 48, "b": 16}, id="in proportion to submitted GPU-time"),
        pytest.param(
            {"a": 1.0, "b": 1.0, "c": 1.0}, 16, {"a": 6, "b": 5, "c": 5}, id="the parts add up to the cluster"
        ),
        pytest.param({"a": 1000.0, "b": 0.001}, 8, {"a": 7, "b": 1}, id="a tenant that submits work gets a GPU"),
    ],
)
def test_quotas_split_by_demand(demand, gpus, quotas):
    from trainyard.sim import SimJob, Workload

    jobs = [SimJob(k, t, float(k), d, gang_of(1)) for k, (t, d) in enumerate(sorted(demand.items()))]
    assert Workload(jobs, dict.fromkeys(demand, 0), "x").split_by_demand(gpus).quotas == quotas
