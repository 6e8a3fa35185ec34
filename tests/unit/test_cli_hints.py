"""Where a user of Slurm, Kubernetes, Ray or Docker lands: a command
Trainyard does not have answers with the Trainyard command to use, and
``submit --nodes`` with ``--replicas``; and what ``--help`` points to."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from trainyard.cli.main import app


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, " ".join(result.output.split())  # the error box wraps lines


@pytest.mark.parametrize(
    ("typed", "instead"),
    [
        pytest.param("squeue", "trainyard jobs", id="squeue lists jobs"),
        pytest.param("sbatch", "trainyard submit -f job.yaml", id="sbatch submits a job file"),
        pytest.param("srun", "trainyard submit --tenant T --gpus N -- CMD", id="srun submits a command"),
        pytest.param("scancel", "trainyard cancel JOB", id="scancel cancels"),
        pytest.param("sinfo", "trainyard nodes", id="sinfo lists nodes"),
        pytest.param("status", "trainyard job JOB", id="ray's status shows a job"),
        pytest.param("run", "trainyard submit", id="docker's run submits"),
        pytest.param("ps", "trainyard jobs", id="ps lists jobs"),
        pytest.param("get", "trainyard jobs, trainyard job JOB, or trainyard nodes", id="kubectl get"),
        pytest.param("describe", "trainyard job JOB, or trainyard why JOB", id="kubectl describe"),
    ],
)
def test_a_command_of_another_tool_answers_with_the_trainyard_one(typed: str, instead: str) -> None:
    code, out = run(typed, "anything")

    assert code == 2
    assert f"No such command '{typed}'" in out and instead in out


def test_a_command_no_tool_has_still_gets_the_plain_answer() -> None:
    code, out = run("frobnicate")

    assert code == 2 and "No such command 'frobnicate'" in out and "In Trainyard" not in out


def test_submit_with_slurm_s_nodes_is_told_to_use_replicas() -> None:
    code, out = run("submit", "--tenant", "acme", "--nodes", "2", "--", "python", "train.py")

    assert code == 2
    assert "submit has no --nodes" in out and "--replicas 2 --gpus 8" in out


def test_help_points_to_the_output_formats_and_where_the_stack_is_found() -> None:
    code, out = run("--help")
    assert code == 0 and "-o table|wide|json|yaml|name" in out and "--no-headers" in out
    assert "~/.config/trainyard/config.toml" in out

    code, out = run("jobs", "--help")
    assert code == 0 and "--output" in out and "--no-headers" in out and "The same as -o json" in out


@pytest.mark.parametrize(
    ("verb", "instead"), [("list", "trainyard jobs"), ("logs", "trainyard logs JOB"), ("stop", "trainyard cancel JOB")]
)
def test_ray_s_job_verbs_after_job_name_the_trainyard_command(verb: str, instead: str) -> None:
    result = CliRunner().invoke(app, ["job", verb], env={"COLUMNS": "200", "TRAINYARD_API_URL": "http://127.0.0.1:9"})

    assert f"for `job {verb}` use: {instead}" in " ".join(result.output.split())


@pytest.mark.parametrize(
    ("typed", "instead"),
    [
        pytest.param(["--node", "2"], "use --replicas N", id="--node is --replicas, not --name"),
        pytest.param(["--nnodes", "2"], "use --replicas N", id="torchrun's --nnodes"),
        pytest.param(["--gpus-per-node", "8"], "use --gpus G", id="Slurm's --gpus-per-node is --gpus"),
        pytest.param(["--gpu", "8"], "use --gpus G", id="--gpu is --gpus"),
        pytest.param(["--partition", "p"], "use --queue Q", id="Slurm's --partition is --queue"),
        pytest.param(["-J", "x"], "use --name NAME", id="Slurm's -J is --name"),
        pytest.param(["--time", "60"], "use --max-runtime SECONDS", id="Slurm's --time is --max-runtime"),
    ],
)
def test_an_option_of_another_tool_is_answered_with_the_submit_option_that_means_it(
    typed: list[str], instead: str
) -> None:
    code, out = run("submit", "--tenant", "acme", *typed, "--", "python", "train.py")

    assert code == 2
    assert f"No such option: {typed[0]}; {instead}" in out and "--name," not in out


def test_a_misspelt_option_is_offered_the_options_help_shows_and_never_a_hidden_one() -> None:
    code, out = run("submit", "--tenant", "acme", "--nodez", "2")

    assert code == 2
    assert "No such option: --nodez" in out and "--name" in out and "--nodes" not in out
