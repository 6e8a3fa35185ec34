"""Real processes through preemption and the loss of a node: three node agents
of one fake GPU each, a tenancy whose production class preempts, and an agent
frozen until health declares its node lost (docs/execution.md)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import suppress

import pytest
from execution_fixtures import ALLREDUCE, Api, Sampler, agent_stack, commands, job_processes, rank_records, work_reports

from trainyard.bus import Bus
from trainyard.config.store import ConfigStore
from trainyard.events.work import ProcessExited
from trainyard.local import LocalStack

pytestmark = pytest.mark.e2e

GRACE_S = 10.0

TENANCY = f"""
flavors: [{{name: H100, node_pool: agents, gpus_per_node: 1}}]
priority_classes:
  - {{name: production, priority: 1000, preemptible: false}}
  - {{name: standard, priority: 500}}
  - {{name: preemptible, priority: 100}}
default_priority_class: standard
fair_share: {{half_life_s: 3600}}
preemption: {{within_queue: true, reclaim: true, fair_share: false, min_runtime_s: 0, grace_period_s: {GRACE_S}}}
organisations:
  - name: lab
    quota: {{H100: {{nominal: 3}}}}
    teams:
      - name: acme
        quota: {{H100: {{nominal: 3, borrowing_limit: 0}}}}
        priority_classes: [production, standard, preemptible]
        queues:
          - name: default
            quota: {{H100: {{nominal: 3, borrowing_limit: 0}}}}
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    # Health's default 5 s heartbeat timeout: the frozen agent's node is declared lost soon enough.
    with agent_stack(tmp_path_factory.mktemp("recovery"), agents=3, agent_gpus=1, heartbeat_timeout_s=5.0) as s:
        asyncio.run(_apply_tenancy(s))
        yield s


async def _apply_tenancy(stack: LocalStack) -> None:
    assert stack.nats
    bus = await Bus.connect(stack.nats.admin_url, "e2e")
    try:
        await (await ConfigStore.open(bus)).apply(TENANCY, actor="test:e2e", reason="priority classes")
    finally:
        await bus.close()


@pytest.fixture
def api(stack: LocalStack) -> Api:
    return Api(stack)


def allreduce(job_id: str, replicas: int, priority_class: str, *args: str, **spec: object) -> dict[str, object]:
    return {
        "job_id": job_id,
        "tenant": "acme",
        "queue": "default",
        "priority_class": priority_class,
        "roles": [
            {"name": "worker", "replicas": replicas, "gpus_per_replica": 1, "command": ["python3", ALLREDUCE, *args]}
        ],
        **spec,
    }


def log_of(api: Api, job_id: str, rank: int, attempt: int) -> str:
    return str(api.get(f"/v1/jobs/{job_id}/logs", rank=rank, attempt=attempt)["data"])


def test_a_preempted_all_reduce_checkpoints_exits_before_the_preemptor_starts_and_resumes_from_its_step(
    stack: LocalStack, api: Api
) -> None:
    """A preemptible 3-rank all-reduce fills the cluster; a production job preempts it. Every rank of
    the victim gets the stop signal, rank 0 saves a checkpoint and all exit 0; the preemptor's process
    starts only after the victim's last process has exited (and never lives beside one); the victim's
    next attempt starts with TRAINYARD_RESUME_STEP set to the step it saved."""
    victim = api.submit(
        allreduce("victim", 3, "preemptible", "--steps", "400", "--step-seconds", "0.2", "--checkpoint-every", "5")
    )
    api.wait(lambda: len(commands(stack, victim)) == 3, 60, "the victim's three processes")
    api.wait(lambda: (api.job(victim)["last_checkpoint_step"] or 0) >= 5, 60, "the victim's first checkpoint")
    first_run = api.job(victim)["run_id"]

    with Sampler(stack) as sampler:
        urgent = api.submit(
            {
                "job_id": "urgent",
                "tenant": "acme",
                "queue": "default",
                "priority_class": "production",
                "roles": [{"name": "w", "command": ["python3", "-c", "print('urgent ran')"]}],
            }
        )
        assert api.wait_status(urgent, {"succeeded", "failed"}, timeout=60) == "succeeded", api.job(urgent)
        api.wait(lambda: len(commands(stack, victim)) == 3, 60, "the victim's second run")

    # Every rank of the victim was signalled, rank 0 saved a checkpoint, and all exited 0.
    victim_exits = rank_records(stack, first_run)
    assert sorted(r.exit for r in victim_exits) == ["exit 0"] * 3
    exits = [r for r in work_reports(stack, first_run) if isinstance(r, ProcessExited)]
    assert sorted((r.rank, r.exit_code, r.stopped) for r in exits) == [(rank, 0, "preempted") for rank in range(3)]
    first_logs = [log_of(api, victim, rank, 1) for rank in range(3)]
    for rank, out in enumerate(first_logs):
        assert f"rank {rank}: stopping after step" in out, out[-500:]
    saved = int(first_logs[0].rsplit("checkpoint saved at step ", 1)[1].split()[0])

    # The preemptor's process started after the victim's last exit, and never ran beside it.
    [preemptor] = rank_records(stack, api.job(urgent)["run_id"])
    last_exit = max(r.exited_at or 0.0 for r in victim_exits)
    assert preemptor.started_at > last_exit, (preemptor.started_at, last_exit)
    for at, procs in sampler.samples:
        together = [
            p for p in procs if p.env.get("TRAINYARD_RUN_ID") == first_run or p.env["TRAINYARD_JOB_ID"] == urgent
        ]
        assert len({p.env["TRAINYARD_JOB_ID"] for p in together}) <= 1, (at, together)

    # The next attempt resumes from the saved step.
    resumed = commands(stack, victim)
    assert {p.run_id for p in resumed} != {first_run}
    assert {p.env.get("TRAINYARD_RESUME_STEP") for p in resumed} == {str(saved)}
    api.wait(lambda: f"starting at step {saved}" in log_of(api, victim, 0, 2), 30, "the second attempt's first line")

    api.cancel(victim)
    api.wait(lambda: not job_processes(stack, victim), 30, "the victim's processes to be gone")


def test_a_frozen_agent_loses_its_node_the_job_moves_and_the_old_rank_is_killed_once_it_thaws(
    stack: LocalStack, api: Api
) -> None:
    """The node of a running job freezes: its agent and the job's process there get SIGSTOP. Health
    declares the node lost after the heartbeat timeout and the job starts on another agent. Once the
    agent gets SIGCONT, the old rank (still stopped) is killed within 5 s. At no moment do two copies
    of the rank run at once: only the stopped copy may live beside the new one."""
    job_id = api.submit(
        allreduce("mover", 1, "standard", "--steps", "2000", "--step-seconds", "0.2", stop_grace_s=2, max_retries=3)
    )
    [old] = api.wait(lambda: len(p := commands(stack, job_id)) == 1 and p, 60, "the job's process")
    # The shim writes the pid file just after the process appears: wait for it, as for the process.
    [record] = api.wait(lambda: rank_records(stack, old.run_id), 30, "the rank's pid file")
    agent = stack.procs[f"agent-{record.node}"]
    frozen = [old.pid]  # the rank's command; its shim, which only waits for it, goes on waiting
    with Sampler(stack) as sampler:
        os.kill(agent.pid, signal.SIGSTOP)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            new = api.wait(
                lambda: [p for p in commands(stack, job_id) if p.run_id != old.run_id], 60, "the job on another agent"
            )
            [moved] = api.wait(lambda: rank_records(stack, new[0].run_id), 30, "the moved rank's pid file")
            assert moved.node != record.node
        finally:
            thawed = time.monotonic()
            os.kill(agent.pid, signal.SIGCONT)
        try:
            api.wait(
                lambda: not [p for p in job_processes(stack, job_id) if p.run_id == old.run_id],
                10,
                "the old rank to be killed",
            )
            assert time.monotonic() - thawed < 5.0
        finally:
            for pid in frozen:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
    for at, procs in sampler.samples:
        running = Counter((p.env["TRAINYARD_JOB_ID"], p.rank) for p in procs if not p.shim and not p.stopped)
        assert max(running.values(), default=0) <= 1, (at, procs)
    assert api.job(job_id)["status"] == "running"
    api.cancel(job_id)
    api.wait(lambda: not job_processes(stack, job_id), 30, "the job's processes to be gone")
