"""Trace and node-list files, the Philly converter, offered load, the quota tree and dedicated partitions.

Philly (Jeon et al., ATC'19; CC BY 4.0) and the Helios reference figures
(HeliosArtifact, MIT) are read from the repository's traces/ (see its README.md).
"""

import csv

import pytest

from trainyard.core.admission.tree import TreeIndex
from trainyard.events.jobs import JobPlaced
from trainyard.sim import Scenario, load_philly, synthetic
from trainyard.sim.scenarios import prepare, simulate_partitions
from trainyard.sim.tenancy import tenancy_for
from trainyard.sim.trace_writers import convert_philly, write_nodes, write_trace
from trainyard.sim.traces import MAX_ERRORS, TraceError, load_nodes, load_trace
from trainyard.sim.workloads import GPU_TYPE, QUEUE, traces_dir

HEADER = "submit_time,duration,gpus,gpu_type,tenant,queue,priority_class,runtime_estimate,job_id\n"
GOOD = HEADER + (
    "1000,3600,8,,team-a,,,,a-1\n"
    "400,600,0.5,,team-b,research,best-effort,900,b-1\n"
    "700,7200,20,H100,team-a,,production,,a-2\n"
)
NODES = "node_id,gpus,gpu_model,rack,block,zone,nvlink_domain\nn1,8,H100,r1,b1,z1,nv1\nn2,8,H100,r1,b1,,\n"


def job_key(j):
    return (
        j.index,
        j.job_id,
        j.tenant,
        j.submit,
        j.duration,
        j.roles,
        j.gpus,
        j.limit_s,
        j.priority_class,
        j.gpu_type,
        j.queue,
    )


def write(tmp_path, text, name="trace.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_good_trace_is_sorted_moved_to_zero_and_keeps_every_field(tmp_path):
    w = load_trace(write(tmp_path, GOOD))
    assert [j.trace_id for j in w.jobs] == ["b-1", "a-2", "a-1"]
    assert [j.submit for j in w.jobs] == [0.0, 300.0, 600.0]
    b, a2, a1 = w.jobs
    assert (b.gpus, b.queue, b.priority_class, b.limit_s) == (1, "research", "best-effort", 900)
    assert (a2.roles, a2.priority_class, a2.limit_s) == ((("worker", 2, 8), ("tail", 1, 4)), "production", 4 * 3600)
    assert (a1.gpu_type, a1.queue, a1.limit_s) == (GPU_TYPE, QUEUE, 2 * 3600)
    assert w.queues == {"team-a": ["default"], "team-b": ["research"]}
    assert w.type_constraints == {"H100": 1}
    assert a2.spec().queue == "default" and b.spec().queue == "research"


@pytest.mark.parametrize(
    "first, second",
    [
        pytest.param("trace.csv", "copy.parquet", id="CSV written as Parquet reads back the same jobs"),
        pytest.param("trace.csv", "copy.csv", id="CSV written as CSV reads back the same jobs"),
    ],
)
def test_round_trip(tmp_path, first, second):
    w = load_trace(write(tmp_path, GOOD, first))
    write_trace(w, tmp_path / second)
    again = load_trace(tmp_path / second)
    assert [job_key(j) for j in again.jobs] == [job_key(j) for j in w.jobs]
    assert [j.trace_id for j in again.jobs] == [j.trace_id for j in w.jobs]
    assert again.quotas == w.quotas
    assert (w.rounded, again.rounded) == (1, 0)  # written as the whole GPUs it was rounded to


def test_fractional_gpu_requests_are_rounded_up_and_counted(tmp_path):
    rows = "".join(f"{k},60,{g},,t,,,,\n" for k, g in enumerate(["0.5", "1", "2.5", "3.0", "0.01", "8"]))
    w = load_trace(write(tmp_path, HEADER + rows))
    assert [j.gpus for j in w.jobs] == [1, 1, 3, 3, 1, 8]
    assert w.rounded == 3


@pytest.mark.parametrize(
    "row, column, says",
    [
        pytest.param("0,60,-2,,t,,,,", "gpus", "'-2' is not a positive number", id="negative GPUs"),
        pytest.param("0,60,two,,t,,,,", "gpus", "'two' is not a positive number", id="GPUs that are not a number"),
        pytest.param("0,60,9999999,,t,,,,", "gpus", "more GPUs than one job can ask for", id="more GPUs than a gang"),
        pytest.param("0,0,1,,t,,,,", "duration", "'0' is not a positive number", id="a job of no work"),
        pytest.param("soon,60,1,,t,,,,", "submit_time", "'soon' is not a number", id="a submit time that is no number"),
        pytest.param("0,60,1,,,,,,", "tenant", "'' is not a valid name", id="no tenant"),
        pytest.param("0,60,1,,Team A,,,,", "tenant", "'Team A' is not a valid name", id="a tenant name with capitals"),
        pytest.param("0,60,1,,t,Big Q,,,", "queue", "'Big Q' is not a valid name", id="a queue name with a space"),
        pytest.param(
            "0,60,1,,t,,gold,,",
            "priority_class",
            "use one of production, standard, best-effort",
            id="an unknown priority class",
        ),
        pytest.param("0,60,1,h100!,t,,,,", "gpu_type", "is not a GPU type name", id="a GPU type with punctuation"),
        pytest.param(
            "0,60,1,,t,,,-5,", "runtime_estimate", "'-5' is not a positive number", id="a negative run-time estimate"
        ),
        pytest.param(
            "0,60,1,,t,,,99999999,",
            "runtime_estimate",
            "longer than the longest run-time limit",
            id="a run-time estimate past the longest limit",
        ),
        pytest.param("0,60,1,,t,,,,a-1", "job_id", "'a-1' is used twice (first on row 1)", id="a job id used twice"),
    ],
)
def test_each_bad_cell_names_its_file_row_and_column(tmp_path, row, column, says):
    path = write(tmp_path, HEADER + "0,60,1,,t,,,,a-1\n" + row + "\n")
    with pytest.raises(TraceError) as e:
        load_trace(path)
    assert f"trace.csv row 2, column {column}: " in str(e.value)
    assert says in str(e.value)


def test_a_missing_column_is_named_with_the_columns_a_trace_needs(tmp_path):
    with pytest.raises(TraceError, match="missing column gpus; needs submit_time, duration, gpus, tenant"):
        load_trace(write(tmp_path, "submit_time,duration,tenant\n0,1,t\n"))


def test_errors_are_collected_up_to_a_limit_before_failing(tmp_path):
    rows = "".join(f"{k},60,-1,,t,,,,\n" for k in range(MAX_ERRORS + 15))
    with pytest.raises(TraceError) as e:
        load_trace(write(tmp_path, HEADER + rows))
    lines = str(e.value).splitlines()
    assert f"{MAX_ERRORS} errors (stopped reading there)" in lines[0]
    assert len(lines) == 1 + MAX_ERRORS
    assert lines[-1].startswith(f"trace.csv row {MAX_ERRORS}, column gpus")


@pytest.mark.parametrize(
    "text, says",
    [pytest.param("", "no jobs", id="an empty trace"), pytest.param(HEADER, "no jobs", id="a header without rows")],
)
def test_a_trace_without_jobs_is_refused(tmp_path, text, says):
    with pytest.raises(TraceError, match=says):
        load_trace(write(tmp_path, text if text else HEADER))


def test_an_unknown_file_type_or_a_missing_file_says_so(tmp_path):
    with pytest.raises(TraceError, match="use .csv or .parquet"):
        load_trace(write(tmp_path, GOOD, "trace.txt"))
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "absent.csv")


@pytest.mark.parametrize(
    "data, says",
    [
        pytest.param(b"\xc0\x80garbage\n", r"trace.csv line 1: byte 0xc0 is not UTF-8 text", id="not text"),
        pytest.param(
            HEADER.encode() + b"1,60,1,,a,,,,\n2,60,1,,\xff\xfe,,,,\n",
            r"trace.csv line 3: byte 0xff is not UTF-8 text; save the file as UTF-8 CSV",
            id="a bad byte on a later line",
        ),
        pytest.param(
            HEADER.encode() + b"1,60,1,,a,,,,\n2,60,1,," + b"x" * 200_000 + b",,,,\n",
            r"trace.csv row 2: not readable as CSV \(field larger than field limit",
            id="a cell too large for a CSV reader",
        ),
    ],
)
def test_a_file_that_is_not_a_csv_trace_names_the_file_and_where(tmp_path, data, says):
    path = tmp_path / "trace.csv"
    path.write_bytes(data)
    with pytest.raises(TraceError, match=says):
        load_trace(path)


def test_a_node_list_that_is_not_text_names_the_file_and_line(tmp_path):
    path = tmp_path / "nodes.csv"
    path.write_bytes(NODES.encode() + b"n3,8,H\xe4100,r1,b1,,\n")
    with pytest.raises(TraceError, match="nodes.csv line 4: byte 0xe4 is not UTF-8 text"):
        load_nodes(path)


def test_a_file_that_is_not_parquet_says_so(tmp_path):
    path = tmp_path / "trace.parquet"
    path.write_bytes(b"PAR1 but not really a Parquet file")
    with pytest.raises(TraceError, match=r"trace.parquet: not a readable Parquet file .*use a .csv"):
        load_trace(path)


@pytest.mark.parametrize("name", [pytest.param("nodes.csv", id="CSV"), pytest.param("nodes.parquet", id="Parquet")])
def test_node_list_round_trip(tmp_path, name):
    nodes = load_nodes(write(tmp_path, NODES, "nodes.csv"))
    assert [(n.node_id, n.gpus, n.gpu_type, n.rack, n.block, n.zone, n.nvlink_domain) for n in nodes] == [
        ("n1", 8, "H100", "r1", "b1", "z1", "nv1"),
        ("n2", 8, "H100", "r1", "b1", "z1", None),
    ]
    write_nodes(nodes, tmp_path / name)
    assert load_nodes(tmp_path / name) == nodes


@pytest.mark.parametrize(
    "row, column, says",
    [
        pytest.param("n1,8,H100,r1,b1", "node_id", "'n1' is used twice (first on row 1)", id="a duplicate node id"),
        pytest.param(",8,H100,r1,b1", "node_id", "is empty", id="a node without an id"),
        pytest.param("n2,0,H100,r1,b1", "gpus", "'0' is not a whole positive number", id="a node of no GPUs"),
        pytest.param("n2,-8,H100,r1,b1", "gpus", "'-8' is not a whole positive number", id="a node of negative GPUs"),
        pytest.param("n2,2.5,H100,r1,b1", "gpus", "'2.5' is not a whole positive number", id="half a GPU"),
        pytest.param("n2,8,,r1,b1", "gpu_model", "is not a GPU model name", id="no GPU model"),
        pytest.param("n2,8,H100,,b1", "rack", "is empty", id="no rack"),
        pytest.param("n2,8,H100,r1,", "block", "is empty", id="no block"),
    ],
)
def test_bad_node_lists_name_row_and_column(tmp_path, row, column, says):
    path = write(tmp_path, "node_id,gpus,gpu_model,rack,block\nn1,8,H100,r1,b1\n" + row + "\n", "nodes.csv")
    with pytest.raises(TraceError) as e:
        load_nodes(path)
    assert f"nodes.csv row 2, column {column}: " in str(e.value) and says in str(e.value)


def test_a_node_list_missing_a_column_is_refused(tmp_path):
    with pytest.raises(TraceError, match="missing column gpu_model"):
        load_nodes(write(tmp_path, "node_id,gpus,rack,block\nn1,8,r1,b1\n", "nodes.csv"))


@pytest.mark.parametrize("name", [pytest.param("philly.csv", id="CSV"), pytest.param("philly.parquet", id="Parquet")])
def test_converted_philly_loads_as_the_same_jobs(tmp_path, name):
    w, n = convert_philly(tmp_path / name, tmp_path / "nodes.csv", limit=400)
    again = load_trace(tmp_path / name)
    assert [job_key(j) for j in again.jobs] == [job_key(j) for j in load_philly(limit=400).jobs]
    nodes = load_nodes(tmp_path / "nodes.csv")
    assert len(nodes) == n == sum(w.quotas.values()) // 8
    assert {x.gpus for x in nodes} == {8}


@pytest.mark.parametrize(
    "make, gpus",
    [
        pytest.param(lambda tmp: load_trace(write(tmp, GOOD)), 64, id="a trace file"),
        pytest.param(lambda tmp: load_philly(limit=1500), 2816, id="the first Philly jobs"),
        pytest.param(lambda tmp: synthetic(800, 256, seed=3, load=0.5), 256, id="a synthetic mix"),
    ],
)
@pytest.mark.parametrize("target", [0.3, 0.9, 1.5])
def test_target_load_is_hit_within_one_percent(tmp_path, make, gpus, target):
    w = make(tmp_path)
    moved = w.at_load(target, gpus)
    assert moved.offered_load(gpus) == pytest.approx(target, rel=0.01)
    assert [j.duration for j in moved.jobs] == [j.duration for j in w.jobs]
    assert moved.jobs[0].submit == w.jobs[0].submit


def test_offered_load_is_demanded_gpu_seconds_over_capacity_times_span(tmp_path):
    w = load_trace(write(tmp_path, GOOD))
    work = 8 * 3600 + 1 * 600 + 20 * 7200
    assert w.offered_load(64) == pytest.approx(work / (64 * 600))
    with pytest.raises(ValueError, match="positive"):
        w.at_load(0, 64)


def test_tenancy_splits_quotas_across_gpu_types_and_queues():
    t = tenancy_for(
        {"a": 10, "b": 6}, capacity={"H100": 24, "A100": 8}, queues={"a": ["train", "eval"]}, borrowing=False
    )
    index = TreeIndex(t)
    assert set(t.flavors) == {"H100", "A100"}
    by_queue = {f"{q.tenant}/{q.name}": q.quota for q in t.queues}
    assert set(by_queue) == {"a/eval", "a/train", "b/default"}
    for tenant, nominal in (("a", 10), ("b", 6)):
        total = sum(f.nominal for name, quota in by_queue.items() if name.startswith(tenant) for f in quota.values())
        assert total == nominal
    team = next(c for c in t.cohorts if c.name == "team:a")
    assert team.parent == "org" and team.quota["H100"].borrowing_limit == 0
    assert sum(q.nominal for q in team.quota.values()) == 10
    assert index.queue_of["a/train"] and index.queue_of["b/default"]


def test_the_simulators_call_still_builds_one_queue_per_tenant_on_one_type():
    t = tenancy_for(
        {"a": 16, "b": 8}, borrowing=True, preemption=False, fair_share_preemption=False, min_runtime_s=60.0
    )
    assert t.flavors == [GPU_TYPE]
    assert [(q.tenant, q.name, q.quota[GPU_TYPE].nominal) for q in t.queues] == [("a", QUEUE, 16), ("b", QUEUE, 8)]
    classes = {c.name: c for c in t.priority_classes}
    assert (classes["production"].priority, classes["production"].preemptible) == (1000, False)
    assert classes["standard"].priority == 500
    assert (classes["best-effort"].priority, classes["best-effort"].may_only_borrow) == (0, True)


def test_partition_mode_runs_each_vc_alone_on_its_own_nodes():
    plan = prepare("philly", limit=600, partition=True)
    sims = simulate_partitions(plan.workload, "fifo", Scenario(record_events=True, check_every=10))
    assert set(sims) == {j.tenant for j in plan.workload.jobs}
    for tenant, sim in sims.items():
        assert sim.cluster.capacity == plan.workload.quotas[tenant]
        assert all(n.labels["partition"] == tenant for n in sim.cluster.nodes.values())
        assert {st.job.tenant for st in sim.jobs} == {tenant}
        placed = [e for e in sim.events if isinstance(e, JobPlaced)]
        assert placed and all(r.node_id in sim.cluster.nodes for e in placed for r in e.replicas)
        assert not sim.violations
    assert sum(len(s.jobs) for s in sims.values()) == len(plan.workload.jobs)


def test_partitioned_fifo_is_the_same_order_of_magnitude_as_helios():
    """A sanity bound, not a replication: Helios (SC'21) simulated FIFO on Philly's VCs over Oct-Nov 2017.

    One week here (Helios: two months).  The typical VC's average JCT is
    within a factor of ten of Helios's; the two busiest VCs (6214e9, 11cb48),
    where Helios has hours of queueing that this trace does not reproduce, are
    far below it, so the bound is on the median VC.
    """
    from statistics import median

    from trainyard.sim.scenarios import run_partitioned

    plan = prepare("philly", start="2017-10-01", end="2017-10-08", partition=True)
    [summary] = run_partitioned(plan.workload, ["fifo"], Scenario(record_events=False))
    with open(traces_dir() / "reference" / "helios_sc21_qssf_philly_per_vc.csv", newline="") as f:
        reference = {r["vc"]: float(r["fifo_avg_jct_s"]) for r in csv.DictReader(f)}
    ratios = {
        vc: p["jct_avg_s"] / reference[vc]
        for vc, p in summary["partitions"].items()
        if vc in reference and p["jobs"] >= 30
    }
    assert len(ratios) >= 5, ratios
    assert 0.1 < median(ratios.values()) < 10, ratios
    assert summary["jobs"] == len(plan.workload.jobs) == summary["done"]
