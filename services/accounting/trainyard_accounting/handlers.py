"""Accounting's handler: every JOBS event goes into the ledger, exactly once.

A batch is committed in one transaction before any of it is acknowledged; the
ledger skips event ids (stream sequences) it has already applied, so a
redelivery after a crash between commit and ack charges nothing twice.
Checkpoints are recorded too, so work lost to preemption or a node failure is
measured from the run's last checkpoint.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgspec
from nats.aio.msg import Msg

from trainyard.bus import PoisonMessage
from trainyard.events import CheckpointSaved, decode_job_event
from trainyard.ledger import Ledger


class LedgerHandler:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    async def __call__(self, msgs: Sequence[Msg]) -> list[BaseException | None]:
        outcomes: list[BaseException | None] = [None] * len(msgs)
        events = []
        for i, msg in enumerate(msgs):
            try:
                events.append((str(msg.metadata.sequence.stream), decode_job_event(msg.data)))
            except (msgspec.DecodeError, msgspec.ValidationError) as err:
                outcomes[i] = PoisonMessage(f"not a job event: {err}")
        # The database calls block; keep the event loop (and acks) moving.
        await asyncio.to_thread(self.ledger.apply, events)
        checkpoints: dict[str, list[float]] = {}
        for _, event in events:
            if isinstance(event, CheckpointSaved):
                checkpoints.setdefault(event.run_id, []).append(event.at)
        for run_id, times in checkpoints.items():  # idempotent: a checkpoint time is recorded once
            await asyncio.to_thread(self.ledger.record_checkpoints, run_id, times)
        return outcomes
