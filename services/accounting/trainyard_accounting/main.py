"""Composition root of the accounting service."""

from __future__ import annotations

from trainyard.bus import ConsumerSpec, run_consumer
from trainyard.events import subjects
from trainyard.observability.metrics import LedgerMetrics, refresh_every, serve_metrics
from trainyard.runtime import Runtime, run_tasks, serve
from trainyard_accounting.handlers import LedgerHandler
from trainyard_accounting.writer import LedgerWriter

#: The ledger consumer fetches at most this often (``ConsumerSpec.linger_s``):
#: each fetch is one database transaction, so a trickle of events is written
#: a few transactions a second instead of one per event; an event reaches the
#: ledger at most this much later.
LEDGER_LINGER_S = 0.25


async def main(rt: Runtime) -> None:
    ledger = LedgerWriter(rt.settings.ledger_url)
    ledger.create_schema()
    spec = ConsumerSpec(
        stream="JOBS", durable="accounting", filter_subject=subjects.JOBS_ALL, batch=1000, linger_s=LEDGER_LINGER_S
    )
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
