"""Admission's fallback for preemption victims on executing nodes: it fails
such a victim only a margin after its grace period (the run dispatcher fails
it first, once its processes have exited); an emulated victim is failed at
its deadline, as before."""

from __future__ import annotations

import pytest
from test_admission_cycle import Clock, admission, spec
from test_placement_cycle import CLUSTER, NOW, harness

from trainyard.bus import Bus
from trainyard.domain import NodeInfo
from trainyard.events import NodeRegistered, PreemptionNotice, RunFailed, subjects
from trainyard.store import Store, views
from trainyard.testing.publish import publish_event
from trainyard.testing.streams import read_job_events


@pytest.mark.parametrize(
    ("executes", "stopped_after_s"),
    [
        pytest.param(True, 15, id="a victim on an executing node is failed by admission 15 s after its grace"),
        pytest.param(False, 0, id="an emulated victim is failed at its deadline"),
    ],
)
async def test_admission_fails_a_victim_after_its_grace_and_margin(
    bus: Bus, store: Store, executes: bool, stopped_after_s: int
) -> None:
    async with harness(bus, store) as h:
        info = NodeInfo(node_id="n1", cluster=CLUSTER, gpu_type="H100", gpus=8, executes=executes)
        await bus.publish(subjects.node(CLUSTER, "n1"), NodeRegistered(at=NOW - 999, node=info, boot_id="b"), "reg")
        await h.running("victim", spec(), {"n1": list(range(8))}, NOW - 900)
        deadline = NOW + 30
        notice = PreemptionNotice(
            at=NOW,
            job_id="victim",
            tenant="acme",
            run_id="victim-r1",
            preemptor="p",
            reason="priority",
            grace_period_s=30,
        )
        await publish_event(bus, notice, "victim-r1:notice")
        await h.settle()
        clock = Clock(deadline)
        cycle = admission(h, clock)
        cycle.preempt_kill_margin_s = 15.0
        times = [deadline, deadline + 14.9, deadline + 15]
        stopped_at = None
        for now in times:
            clock.now = now
            await cycle.run_once()
            await h.settle()
            if (await views.get_job(store, "victim")).status == "pending":
                stopped_at = now
                break
        failed = [e for e in await read_job_events(bus) if isinstance(e, RunFailed)]
    assert stopped_at == deadline + stopped_after_s
    assert [(f.reason, f.job_id) for f in failed] == [("preempted", "victim")]
