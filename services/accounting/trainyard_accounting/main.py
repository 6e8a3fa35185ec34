"""Composition root of the accounting service."""

from __future__ import annotations

from trainyard.bus import ConsumerSpec, run_consumer
from trainyard.events import subjects
from trainyard.observability.metrics import LedgerMetrics, refresh_every, serve_metrics
from trainyard.runtime import Runtime, run_tasks, serve
from trainyard_accounting.handlers import LedgerHandler
from trainyard_accounting.writer import LedgerWriter


async def main(rt: Runtime) -> None:
    ledger = LedgerWriter(rt.settings.ledger_url)
    ledger.create_schema()
    spec = ConsumerSpec(stream="JOBS", durable="accounting", filter_subject=subjects.JOBS_ALL, batch=1000)
    metrics = LedgerMetrics(durable=spec.durable, stream=spec.stream)
    serve_metrics("accounting", metrics.registry, rt.settings)
    try:
        await run_tasks(
            rt.stop,
            run_consumer(rt.bus, spec, LedgerHandler(ledger, metrics), rt.stop),
            refresh_every(rt.stop, lambda: metrics.refresh(rt.bus)),
        )
    finally:
        ledger.close()


def run() -> None:
    serve("accounting", main)
