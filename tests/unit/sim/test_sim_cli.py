"""``trainyard sim``: trace and node files, bad options, JSON output, invariants and progress."""

import json

import pytest
from typer.testing import CliRunner

from trainyard.cli.main import app

SMALL = ["--workload", "synthetic", "--jobs", "60", "--nodes", "4"]
TRACE = (
    "submit_time,duration,gpus,gpu_type,tenant,queue,priority_class,runtime_estimate,job_id\n"
    "0,3600,8,,team-a,,,,\n"
    "60,1800,0.5,,team-b,,,,\n"
    "120,600,2,V100,team-b,,,,\n"
    "300,7200,4,,team-a,,,,\n"
)
NODES = "node_id,gpus,gpu_model,rack,block\nv1,8,V100,r1,b1\nv2,8,V100,r1,b1\nv3,4,V100,r2,b1\n"


def sim(*args):
    return CliRunner().invoke(app, ["sim", *args])


@pytest.fixture
def files(tmp_path):
    (tmp_path / "trace.csv").write_text(TRACE)
    (tmp_path / "nodes.csv").write_text(NODES)
    return tmp_path


def test_a_trace_runs_on_exactly_the_nodes_of_its_node_list(files):
    result = sim(
        "run",
        "--trace",
        str(files / "trace.csv"),
        "--nodes-file",
        str(files / "nodes.csv"),
        "--policy",
        "fifo",
        "--json",
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["gpus"] == 20 and summary["done"] == 4
    assert summary["rounded_gpu_requests"] == 1
    assert set(summary["fairness"]) == {"team-a", "team-b"}
    assert "1 fractional GPU requests rounded up to whole GPUs" in result.stderr
    assert "20 V100 GPUs" in result.stderr


def test_a_trace_without_a_node_list_runs_on_generated_nodes_and_reports_its_load(files, tmp_path):
    (tmp_path / "any.csv").write_text(TRACE.replace("V100", ""))
    result = sim(
        "compare",
        "--trace",
        str(tmp_path / "any.csv"),
        "--nodes",
        "2",
        "--policies",
        "fifo,sjf",
        "--target-load",
        "0.5",
    )
    assert result.exit_code == 0, result.output
    assert "on 2 nodes, 16 H100 GPUs" in result.stdout
    assert "offered load: " in result.stdout and "-> 0.500" in result.stdout


def test_a_gang_larger_than_the_cluster_is_counted_and_named_as_rejected(files, tmp_path):
    (tmp_path / "big.csv").write_text(TRACE + "400,600,32,,team-a,,,,\n")
    result = sim("run", "--trace", str(tmp_path / "big.csv"), "--nodes-file", str(files / "nodes.csv"))
    assert result.exit_code == 0, result.output
    assert "1 job rejected on arrival" in result.stdout
    header = next(line for line in result.stdout.splitlines() if "unfinished" in line)
    assert "rejected" in header
    ok = sim("run", "--trace", str(files / "trace.csv"), "--nodes-file", str(files / "nodes.csv"))
    assert ok.exit_code == 0, ok.output
    assert "rejected on arrival" not in ok.stdout


def test_a_trace_asking_for_a_gpu_type_the_cluster_lacks_is_refused(files):
    result = sim("run", "--trace", str(files / "trace.csv"), "--nodes", "2")
    assert result.exit_code == 2
    assert "a GPU type the cluster does not have: V100 (1 job); its GPUs are H100" in result.stdout


@pytest.mark.parametrize(
    "args, says",
    [
        pytest.param(["--jobs", "-5"], "--jobs", id="a negative number of jobs"),
        pytest.param(["--nodes", "0"], "--nodes", id="no nodes"),
        pytest.param(["--load", "0"], "--load", id="zero load"),
        pytest.param(["--load", "-0.5"], "--load", id="negative load"),
        pytest.param(["--tick", "-1"], "--tick", id="a negative tick"),
        pytest.param(["--checkpoint", "-60"], "--checkpoint", id="a negative checkpoint interval"),
        pytest.param(["--lemons", "1.5"], "--lemons", id="more lemons than nodes"),
        pytest.param(["--lemons", "-0.1"], "--lemons", id="negative lemons"),
        pytest.param(["--arrival-scale", "0"], "--arrival-scale", id="arrivals never come"),
        pytest.param(["--target-load", "-1"], "--target-load", id="a negative target load"),
        pytest.param(["--limit", "0"], "--limit", id="a limit of no jobs"),
        pytest.param(["--add-nodes", "-2"], "--add-nodes", id="removing nodes by adding"),
        pytest.param(["--check-every", "-1"], "--check-every", id="a negative check interval"),
        pytest.param(["--seed", "-1"], "--seed", id="a negative seed"),
        pytest.param(["--jobs", "many"], "--jobs", id="a number of jobs that is no number"),
        pytest.param(["--jobs", "20000000"], "--jobs", id="more jobs than one run holds"),
        pytest.param(["--nodes", "99999999"], "--nodes", id="more nodes than one run builds"),
        pytest.param(["--add-nodes", "70000"], "--add-nodes", id="more nodes added than one run builds"),
        pytest.param(["--tick", "1e300"], "--tick", id="a tick past a day"),
    ],
)
def test_bad_numbers_exit_2_naming_the_option(args, says):
    result = sim("compare", *SMALL, "--policies", "fifo", *args)
    assert result.exit_code == 2, result.output
    assert says in result.output and "Invalid value" in result.output


@pytest.mark.parametrize(
    "args, says",
    [
        pytest.param(
            ["--target-load", "0.5", "--arrival-scale", "2"],
            "either --target-load or --arrival-scale",
            id="two ways to set the load at once",
        ),
        pytest.param(["--workload", "lottery"], "unknown workload", id="an unknown workload"),
        pytest.param(["--trace", "absent.csv"], "absent.csv: no such file", id="a trace file that is not there"),
        pytest.param(["--policies", "fifo,lottery"], "unknown policy 'lottery'", id="an unknown policy"),
        pytest.param(["--policies", ","], "no policy named", id="no policy at all"),
        pytest.param(["--quota", "team00:8"], "TENANT=GPUS", id="a quota without '='"),
        pytest.param(["--load", "1e-300"], "a simulation spans at most 100 years", id="arrivals over eons"),
        pytest.param(["--arrival-scale", "1e-12"], "raise the load or the arrival scale", id="arrivals slowed to eons"),
    ],
)
def test_impossible_choices_exit_2_with_what_to_fix(args, says):
    result = sim("compare", *SMALL, *args)
    assert result.exit_code == 2, result.output
    assert says in result.stdout


def test_an_out_folder_that_cannot_be_written_is_refused_before_the_run(tmp_path):
    a_file = tmp_path / "results.txt"
    a_file.write_text("not a folder")

    on_a_file = sim("run", *SMALL, "--out", str(a_file))
    under_a_file = sim("run", *SMALL, "--out", str(a_file / "inside"), "--json")

    assert on_a_file.exit_code == 2 and "is a file; give a folder for the results" in on_a_file.output
    assert "started" not in on_a_file.output  # refused before the simulation ran
    assert under_a_file.exit_code == 2
    assert json.loads(under_a_file.stdout)["error"].startswith(f"--out {a_file / 'inside'}: cannot make a folder")


def test_partition_mode_refuses_a_node_list(files):
    result = sim(
        "compare",
        "--trace",
        str(files / "trace.csv"),
        "--nodes-file",
        str(files / "nodes.csv"),
        "--partition-by-tenant",
    )
    assert result.exit_code == 2
    assert "drop --nodes-file" in result.stdout


@pytest.mark.parametrize(
    "args, says",
    [
        pytest.param(["--jobs", "-5"], "--jobs", id="a range error from option parsing"),
        pytest.param(["--lemons", "2"], "--lemons", id="lemons outside 0..1"),
        pytest.param(["--no-such-option"], "No such option", id="an unknown option"),
        pytest.param(["--workload", "lottery"], "unknown workload", id="an error found while loading"),
        pytest.param(["--policies", "lottery"], "unknown policy", id="an unknown policy"),
    ],
)
def test_json_errors_are_one_json_document(args, says):
    result = sim("compare", *SMALL, "--json", *args)
    assert result.exit_code == 2
    document = json.loads(result.stdout)
    assert list(document) == ["error"] and says in document["error"]


def test_json_error_for_a_bad_trace_row_names_row_and_column(tmp_path):
    (tmp_path / "bad.csv").write_text("submit_time,duration,gpus,tenant\n0,60,-2,t\n")
    result = sim("run", "--trace", str(tmp_path / "bad.csv"), "--json")
    assert result.exit_code == 2
    assert "bad.csv row 1, column gpus: '-2' is not a positive number" in json.loads(result.stdout)["error"]


@pytest.mark.parametrize(
    "extra, line, checked",
    [
        pytest.param([], "invariants: not checked", False, id="without --check-every the table says not checked"),
        pytest.param(
            ["--check-every", "5"],
            "invariants: checked every 5 cycles, 0 broken",
            True,
            id="with --check-every it says how often and how many broke",
        ),
    ],
)
def test_invariants_line_says_whether_they_were_checked(extra, line, checked):
    result = sim("compare", *SMALL, "--policies", "fifo", *extra)
    assert result.exit_code == 0, result.output
    assert line in result.stdout
    assert ("not checked" in result.stdout) is not checked
    result = sim("run", *SMALL, "--policy", "fifo", "--json", *extra)
    assert json.loads(result.stdout)["invariants_checked"] is checked


def test_compare_json_is_a_list_of_summaries_and_progress_goes_to_stderr():
    result = sim("compare", *SMALL, "--policies", "fifo,sjf", "--json")
    assert result.exit_code == 0, result.output
    assert [s["policy"] for s in json.loads(result.stdout)] == ["fifo", "sjf"]
    for policy in ("fifo", "sjf"):
        assert f"{policy}: started, 60 jobs" in result.stderr
        assert f"{policy}: finished 60 jobs in " in result.stderr
    assert result.stderr.index("fifo: finished") < result.stderr.index("sjf: started")


def test_partition_by_tenant_prints_one_merged_row_per_policy_and_per_vc_figures(tmp_path):
    result = sim(
        "compare",
        "--workload",
        "philly",
        "--limit",
        "300",
        "--partition-by-tenant",
        "--policies",
        "fifo,sjf",
        "--json",
        "--out",
        str(tmp_path / "out"),
    )
    assert result.exit_code == 0, result.output
    summaries = json.loads(result.stdout)
    assert [s["policy"] for s in summaries] == ["fifo", "sjf"]
    for s in summaries:
        assert s["partitioned"] and s["jobs"] == 300
        assert sum(p["jobs"] for p in s["partitions"].values()) == 300
        assert s["gpus"] == sum(p["gpus"] for p in s["partitions"].values())
    assert json.loads((tmp_path / "out" / "summary.json").read_text())[0]["partitioned"]


def test_convert_philly_writes_a_trace_and_node_list_the_simulator_runs(tmp_path):
    result = sim(
        "convert",
        "philly",
        "--out",
        str(tmp_path / "philly.parquet"),
        "--nodes-out",
        str(tmp_path / "nodes.csv"),
        "--limit",
        "200",
    )
    assert result.exit_code == 0, result.output
    assert "200 jobs of" in result.stdout and "--quota 6214e9=512" in result.stdout
    result = sim(
        "run",
        "--trace",
        str(tmp_path / "philly.parquet"),
        "--nodes-file",
        str(tmp_path / "nodes.csv"),
        "--policy",
        "fifo",
        "--json",
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["done"] == 200


def test_progress_reports_jobs_done_while_a_policy_runs():
    from trainyard.sim import Scenario, synthetic
    from trainyard.sim.scenarios import run_policies

    calls = []
    run_policies(
        synthetic(400, 64, seed=1),
        8,
        ["fifo"],
        Scenario(tick_s=0, record_events=False),
        lambda policy, done, total: calls.append((policy, done, total)),
    )
    assert calls[0] == ("fifo", 0, 400) and calls[-1] == ("fifo", 400, 400)
    middle = [done for _, done, _ in calls[1:-1]]
    assert middle and middle == sorted(middle) and all(0 <= d <= 400 for d in middle)


@pytest.mark.parametrize(
    "every, lines",
    [
        pytest.param(
            0.0,
            ["fifo: started, 10 jobs", "fifo: 3/10 jobs done", "fifo: 6/10 jobs done", "fifo: finished 10 jobs"],
            id="every update is a line when allowed",
        ),
        pytest.param(
            3600.0,
            ["fifo: started, 10 jobs", "fifo: finished 10 jobs"],
            id="updates closer together than the interval are dropped, start and finish never",
        ),
    ],
)
def test_progress_line_is_throttled(every, lines):
    import io

    from trainyard.cli.sim import ProgressLine

    stream = io.StringIO()
    progress = ProgressLine(stream, every=every)
    for done in (0, 3, 6, 10, 10):
        progress("fifo", done, 10)
    written = stream.getvalue().splitlines()
    assert len(written) == len(lines)
    assert all(w.startswith(want) for w, want in zip(written, lines, strict=True)), written
    assert written[-1].startswith("fifo: finished 10 jobs in ")
