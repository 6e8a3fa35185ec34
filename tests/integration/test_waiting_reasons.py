"""Why jobs wait, written in chunks of one script call each: what Redis holds
afterwards is what was written, entry for entry, whatever the number."""

from __future__ import annotations

import pytest

from trainyard.core.lifecycle import ADMITTED, PENDING, JobRecord
from trainyard.store import Store, waiting


def record(job_id: str, status: str) -> JobRecord:
    return JobRecord(job_id=job_id, status=status, tenant="acme", order=0, last_seq=1)


@pytest.mark.parametrize(
    "count",
    [
        pytest.param(1, id="one reason"),
        pytest.param(8192, id="exactly one chunk of reasons"),
        pytest.param(20_001, id="reasons over three chunks, the last one short"),
    ],
)
async def test_every_reason_written_is_read_back_and_gone_ones_are_forgotten(store: Store, count: int) -> None:
    why = {f"j{i}": waiting.Waiting("quota" if i % 2 else "queued_behind", position=i + 1) for i in range(count)}
    await waiting.write(store, PENDING, why)
    await waiting.write(store, PENDING, {"j0": waiting.Waiting("insufficient_gpus", position=1)}, gone=["j1"])
    placement = {"p": waiting.Waiting("no_fit", expected_start=12.5)}
    await waiting.write(store, ADMITTED, placement)

    read = await waiting.read(store, [record(j, PENDING) for j in why] + [record("p", ADMITTED)])
    expected = {**why, "j0": waiting.Waiting("insufficient_gpus", position=1), **placement}
    expected.pop("j1", None)
    assert read == expected
    assert await store.redis.hlen(waiting.key(store, PENDING)) == len(why) - (1 if count > 1 else 0)
