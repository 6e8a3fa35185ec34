"""Health's outside surface against real NATS and Redis: the Prometheus
endpoint and ``trainyard emulate inject``."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import typer
from health_fixtures import CLUSTER, fleet, harness
from test_health_service import consume, eventually, xid
from typer.testing import CliRunner

from trainyard.cli.nodes import emulate_inject
from trainyard.emulator import EmulatedCluster
from trainyard.local.servers import free_port
from trainyard.settings import load_settings
from trainyard_health.metrics import HealthMetrics


async def test_the_metrics_endpoint_shows_states_xids_and_time_to_isolate(bus, store) -> None:
    async with harness(bus, store) as h:
        port = free_port()
        h.monitor.metrics = HealthMetrics()
        assert h.monitor.metrics.serve(load_settings({"TRAINYARD_HEALTH_METRICS_PORT": str(port)})) == port
        stop = asyncio.Event()
        tasks = await consume(h, stop)
        try:
            await h.run_job("j", ["n1"])
            await xid(h, "n1", 79)
            await eventually(lambda: _state_is(h, "n1", "repair"))
            await asyncio.sleep(0.6)  # one repair-loop tick refreshes the gauges
            async with httpx.AsyncClient() as http:
                text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
        finally:
            stop.set()
            await asyncio.gather(*tasks)
    assert 'trainyard_health_xids_total{xid="79"} 1.0' in text
    assert 'trainyard_health_nodes{state="repair"} 1.0' in text
    assert "trainyard_health_time_to_isolate_seconds_count 1.0" in text
    assert 'trainyard_health_runs_failed_total{reason="node_failure"} 1.0' in text


async def _state_is(h, node: str, state: str) -> bool:  # type: ignore[no-untyped-def]
    return await h.state(node) == state


@pytest.mark.parametrize(
    "args, code, words",
    [
        pytest.param(
            ["--node", "n4", "--xid", "79"], 0, "XID 79 injected on n4 GPU 0", id="an XID is injected and confirmed"
        ),
        pytest.param(["--node", "n4", "--gpu", "2", "--overheat", "97"], 0, "GPU 2 now at 97 C", id="overheating"),
        pytest.param(["--node", "n77", "--xid", "79"], 1, "no emulated node 'n77'", id="an unknown node is refused"),
        pytest.param(["--node", "n4"], 2, "exactly one of", id="no fault named"),
        pytest.param(["--node", "n4", "--xid", "79", "--silent"], 2, "exactly one of", id="two faults at once"),
    ],
)
async def test_emulate_inject(bus, store, nats_server, args, code, words) -> None:
    app = typer.Typer()
    app.command()(emulate_inject)
    stop = asyncio.Event()
    emulator = EmulatedCluster(bus, store, fleet(8))
    task = asyncio.create_task(emulator.run(stop))
    try:
        await asyncio.sleep(0.5)
        runner = CliRunner()
        result = await asyncio.to_thread(
            runner.invoke, app, [*args, "--cluster", CLUSTER, "--nats-url", nats_server.url], catch_exceptions=False
        )
    finally:
        stop.set()
        await task
    assert result.exit_code == code, result.output
    assert words in result.output.replace("\n", " ")
