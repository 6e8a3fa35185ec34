"""What a job runs, validated: role commands, env, directories, launch mode, stop signal."""

from __future__ import annotations

import pytest

from trainyard.domain import JobSpec, Role, validate_job_spec
from trainyard.domain.limits import MAX_ENV_ENTRIES, MAX_PATH_CHARS, STOP_SIGNALS
from trainyard.events import work


def spec(role: Role | None = None, **overrides) -> JobSpec:
    base = dict(
        tenant="acme",
        queue="research",
        roles=[role or Role(name="trainer", replicas=2, gpus_per_replica=4)],
        command=["python", "train.py"],
    )
    return JobSpec(**{**base, **overrides})


def trainer(**fields) -> Role:
    return Role(name="trainer", **fields)


@pytest.mark.parametrize(
    "job",
    [
        pytest.param(spec(), id="a job command without an image runs as a plain process"),
        pytest.param(
            spec(trainer(command=["torchrun", "train.py"], launch="per_replica"), command=[]),
            id="a role command alone says what to run",
        ),
        pytest.param(
            spec(trainer(env={"NCCL_DEBUG": "INFO", "_X1": "a\nb", "OMP_NUM_THREADS": "4"})),
            id="a role's own variables, a newline in a value included, are kept",
        ),
        pytest.param(
            spec(trainer(working_dir="/home/ada/run"), checkpoint_dir="/shared/ckpt", stop_signal="SIGUSR1"),
            id="absolute directories and a chosen stop signal",
        ),
        pytest.param(spec(stop_grace_s=0.0), id="no grace at all"),
        pytest.param(spec(stop_grace_s=3600.0), id="an hour's grace"),
    ],
)
def test_valid_launch_fields(job: JobSpec) -> None:
    assert validate_job_spec(job) == []


@pytest.mark.parametrize(
    ("job", "field", "words"),
    [
        pytest.param(
            spec(trainer(command=["python", "a\x00b"])),
            "roles[0].command[1]",
            "U+0000",
            id="a role command item with NUL is refused as the job's would be",
        ),
        pytest.param(
            spec(trainer(command=["x"] * 1025)),
            "roles[0].command",
            "at most 1024 items",
            id="a role command of too many items is refused",
        ),
        pytest.param(
            spec(trainer(command=["x" * 40_000])),
            "roles[0].command",
            "characters in all",
            id="a role command too long in all is refused",
        ),
        pytest.param(
            spec(trainer(env={"1BAD": "x"})), "roles[0].env.1BAD", "not a variable name", id="a name led by a digit"
        ),
        pytest.param(
            spec(trainer(env={"A-B": "x"})), "roles[0].env.A-B", "not a variable name", id="a name with a dash"
        ),
        pytest.param(
            spec(trainer(env={"RANK": "3"})), "roles[0].env.RANK", "RANK is reserved", id="RANK is the contract's"
        ),
        pytest.param(
            spec(trainer(env={"CUDA_VISIBLE_DEVICES": "0"})),
            "roles[0].env.CUDA_VISIBLE_DEVICES",
            "reserved",
            id="a role cannot choose its GPUs",
        ),
        pytest.param(
            spec(trainer(env={"TRAINYARD_JOB_ID": "x"})),
            "roles[0].env.TRAINYARD_JOB_ID",
            "TRAINYARD_* variable",
            id="anything TRAINYARD_* is reserved",
        ),
        pytest.param(spec(trainer(env={"A": "x\x00y"})), "roles[0].env.A", "U+0000", id="a value with NUL is refused"),
        pytest.param(
            spec(trainer(env={f"V{i}": "x" for i in range(MAX_ENV_ENTRIES + 1)})),
            "roles[0].env",
            f"at most {MAX_ENV_ENTRIES} variables",
            id="too many variables",
        ),
        pytest.param(
            spec(trainer(working_dir="runs/a")),
            "roles[0].working_dir",
            "absolute path",
            id="a relative working directory is refused",
        ),
        pytest.param(
            spec(trainer(working_dir="/a\x00b")), "roles[0].working_dir", "U+0000", id="a working directory with NUL"
        ),
        pytest.param(
            spec(checkpoint_dir="/" + "d" * MAX_PATH_CHARS),
            "checkpoint_dir",
            f"at most {MAX_PATH_CHARS} characters",
            id="a checkpoint directory past PATH_MAX",
        ),
        pytest.param(spec(checkpoint_dir="ckpt"), "checkpoint_dir", "absolute path", id="a relative checkpoint dir"),
        pytest.param(
            spec(trainer(launch="per_node")), "roles[0].launch", "per_gpu, per_replica", id="an unknown launch mode"
        ),
        pytest.param(spec(stop_signal="SIGKILL"), "stop_signal", "SIGTERM", id="SIGKILL leaves no grace to use"),
        pytest.param(spec(stop_grace_s=-1.0), "stop_grace_s", "from 0 to 3600", id="a negative grace"),
        pytest.param(spec(stop_grace_s=3601.0), "stop_grace_s", "from 0 to 3600", id="more than an hour's grace"),
        pytest.param(spec(stop_grace_s=float("nan")), "stop_grace_s", "from 0 to 3600", id="a grace that is NaN"),
        pytest.param(spec(stop_grace_s=float("inf")), "stop_grace_s", "from 0 to 3600", id="an infinite grace"),
        pytest.param(spec(command=[]), "image", "say what to run", id="nothing to run at all"),
    ],
)
def test_bad_launch_fields_name_the_field(job: JobSpec, field: str, words: str) -> None:
    errors = validate_job_spec(job)
    assert any(e.field == field and words in e.message for e in errors), errors


def test_every_launch_problem_is_reported_at_once() -> None:
    job = spec(
        trainer(command=["a\x00"], env={"RANK": "0", "9": "x"}, working_dir="rel", launch="x"),
        checkpoint_dir="rel",
        stop_signal="SIGSTOP",
        stop_grace_s=-1.0,
    )
    fields = {e.field for e in validate_job_spec(job)}
    assert fields >= {
        "roles[0].command[0]",
        "roles[0].env.RANK",
        "roles[0].env.9",
        "roles[0].working_dir",
        "roles[0].launch",
        "checkpoint_dir",
        "stop_signal",
        "stop_grace_s",
    }


def test_the_stop_signals_are_the_work_messages_own() -> None:
    assert STOP_SIGNALS == work.STOP_SIGNALS
