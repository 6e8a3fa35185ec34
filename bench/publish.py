"""CPU per JetStream publish through ``Bus``, the way the services publish.

Starts a nats-server (JetStream, the project's streams) and publishes fenced
``JobAccepted`` events: first through ``Bus.publish_many`` in batches of 50
(a decider's cycle), then one at a time (a consumer settling its outcomes).
Prints this process's CPU microseconds per publish (``time.process_time``;
the server's CPU is not counted) and the rate, for ``--rounds`` rounds.

    python bench/publish.py [--count 10000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import uvloop

from trainyard.bus import Bus, PublishRequest, ensure_streams
from trainyard.domain import JobSpec, Role
from trainyard.events import JobAccepted, subjects
from trainyard.local.servers import start_nats


def accepted(tag: str, i: int, spec: JobSpec) -> PublishRequest:
    job_id = f"{tag}-{i}"
    return PublishRequest(
        subjects.job("t", job_id, "admission"),
        JobAccepted(at=1.0, job_id=job_id, spec=spec, submitted_at=1.0),
        f"t/{job_id}:accepted",
        expected_last_subject_seq=0,
        fence_subject=subjects.job_id_anywhere(job_id),
    )


async def main(count: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-") as tmp:
        server = start_nats(Path(tmp))
        try:
            bus = await Bus.connect(server.url, "bench")
            await ensure_streams(bus.js)
            spec = JobSpec(tenant="t", queue="default", roles=[Role(name="worker", gpus_per_replica=1)])
            for r in range(rounds):
                batch = [accepted(f"b{r}", i, spec) for i in range(count)]
                single = [accepted(f"s{r}", i, spec) for i in range(count // 5)]
                c0, w0 = time.process_time(), time.perf_counter()
                for k in range(0, count, 50):
                    failed = [x for x in await bus.publish_many(batch[k : k + 50]) if isinstance(x, Exception)]
                    if failed:
                        raise failed[0]
                c1, w1 = time.process_time(), time.perf_counter()
                for req in single:
                    await bus.publish(req.subject, req.message, req.msg_id, 0, req.fence_subject)
                c2, w2 = time.process_time(), time.perf_counter()
                print(
                    f"round {r + 1}: batches of 50: {1e6 * (c1 - c0) / count:.0f} us CPU per publish, "
                    f"{count / (w1 - w0):,.0f}/s; one at a time: {1e6 * (c2 - c1) / len(single):.0f} us CPU, "
                    f"{len(single) / (w2 - w1):,.0f}/s",
                    flush=True,
                )
            await bus.close()
        finally:
            server.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=10_000, help="publishes per round in batches (default 10,000)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.count < 50 or args.rounds < 1:
        ap.error("--count must be at least 50 and --rounds at least 1")
    uvloop.run(main(args.count, args.rounds))
