"""The local stack's lock and ports, and the relative periods the finance
commands accept."""

from __future__ import annotations

import datetime as dt
import os
import socket
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from trainyard.cli.finance import period_days, resolve_period
from trainyard.local.lock import LockInfo, PortError, StackLock, StackRunning, choose_ports, read_ports


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_second_start_on_the_same_data_dir_is_refused_naming_the_first(tmp_path: Path) -> None:
    first = StackLock(tmp_path)
    assert first.acquire() is None
    first.update(ports={"http": 8080, "nats": 4222})

    with pytest.raises(StackRunning) as refused:
        StackLock(tmp_path).acquire()

    message = str(refused.value)
    assert f"pid {os.getpid()} on {socket.gethostname()}" in message
    assert "http 8080" in message and "nats 4222" in message and str(tmp_path) in message
    first.release()
    second = StackLock(tmp_path)
    assert second.acquire() is None  # released cleanly: nothing stale
    second.release()


def test_a_stale_lock_left_by_a_crash_is_taken_over(tmp_path: Path) -> None:
    pid = dead_pid()
    stale = LockInfo(pid=pid, host=socket.gethostname(), ports={"http": 1234})
    (tmp_path / "stack.lock").write_bytes(msgspec.json.encode(stale))

    lock = StackLock(tmp_path)
    left = lock.acquire()

    assert left is not None and left.pid == pid
    assert msgspec.json.decode((tmp_path / "stack.lock").read_bytes(), type=LockInfo).pid == os.getpid()
    lock.release()


def test_ports_are_stored_with_the_data_and_reused(tmp_path: Path) -> None:
    first, notes = choose_ports(tmp_path, {})
    again, notes_again = choose_ports(tmp_path, {})

    assert set(first) == {"http", "grpc", "nats", "redis"} and len(set(first.values())) == 4
    assert again == first and notes == notes_again == []
    assert read_ports(tmp_path) == first


def test_a_port_asked_for_overrides_the_stored_one_and_is_kept(tmp_path: Path) -> None:
    stored, _ = choose_ports(tmp_path, {})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        wanted = s.getsockname()[1]

    chosen, _ = choose_ports(tmp_path, {"http": wanted})

    assert chosen["http"] == wanted and chosen["nats"] == stored["nats"]
    assert read_ports(tmp_path)["http"] == wanted


def test_a_stored_port_another_program_took_is_replaced_with_a_note(tmp_path: Path) -> None:
    stored, _ = choose_ports(tmp_path, {})
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", stored["nats"]))
        squatter.listen()

        chosen, notes = choose_ports(tmp_path, {})

    assert chosen["nats"] != stored["nats"] and chosen["http"] == stored["http"]
    assert notes == [
        f"nats port {stored['nats']} (kept from the last start) is now in use by another program; "
        f"using {chosen['nats']} instead"
    ]


def test_a_port_asked_for_that_is_taken_fails_saying_which(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]

        with pytest.raises(PortError, match=f"--redis-port {port} is in use"):
            choose_ports(tmp_path, {"redis": port})


def at(day: str) -> float:
    return dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC).timestamp()


@pytest.mark.parametrize(
    ("period", "now", "month"),
    [
        pytest.param("this-month", at("2026-11-17T09:30"), "2026-11", id="this month is the current UTC month"),
        pytest.param("last-month", at("2026-11-17T09:30"), "2026-10", id="last month is the one before"),
        pytest.param("last-month", at("2027-01-01T00:00"), "2026-12", id="last month in January is last December"),
        pytest.param(
            "this-month", at("2026-12-31T23:59"), "2026-12", id="the last minute of a month is still that month"
        ),
        pytest.param("2025-02", at("2026-11-17T00:00"), "2025-02", id="an explicit month is kept"),
    ],
)
def test_relative_periods(period: str, now: float, month: str) -> None:
    assert resolve_period(period, now) == month


@pytest.mark.parametrize(
    ("month", "days"),
    [
        pytest.param("2024-02", ("2024-02-01", "2024-02-29"), id="February of a leap year has 29 days"),
        pytest.param("2026-12", ("2026-12-01", "2026-12-31"), id="December ends on the 31st"),
        pytest.param("9999-12", ("9999-12-01", "9999-12-31"), id="the last month of the calendar"),
    ],
)
def test_a_period_covers_its_whole_month(month: str, days: tuple[str, str]) -> None:
    assert period_days(month) == days


def test_up_refuses_a_stack_without_nodes_before_starting_anything(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from trainyard.cli.main import app

    data_dir = tmp_path / "data"
    result = CliRunner().invoke(app, ["up", "--data-dir", str(data_dir), "--agents", "0", "--nodes", "0"])

    assert result.exit_code == 2 and "no nodes" in result.output and "--agents" in result.output
    assert not data_dir.exists()


@pytest.mark.parametrize(
    ("args", "option"),
    [
        pytest.param(["--nodes", "-1"], "--nodes", id="a negative number of emulated nodes"),
        pytest.param(["--agents", "1000"], "--agents", id="more node agents than one machine runs"),
        pytest.param(["--nodes", "1000000"], "--nodes", id="more nodes than one machine emulates"),
        pytest.param(["--gpus", "0"], "--gpus", id="nodes without GPUs"),
        pytest.param(["--http-port", "70000"], "--http-port", id="a port past 65535"),
        pytest.param(["--redis-port", "-1"], "--redis-port", id="a negative port"),
    ],
)
def test_up_refuses_a_stack_it_cannot_run_before_starting_anything(
    tmp_path: Path, args: list[str], option: str
) -> None:
    from typer.testing import CliRunner

    from trainyard.cli.main import app

    data_dir = tmp_path / "data"
    result = CliRunner().invoke(app, ["up", "--data-dir", str(data_dir), *args])

    assert result.exit_code == 2 and option in result.output and "Invalid value" in result.output
    assert not data_dir.exists()
