"""The node agent's executor: starts, watches, signals and stops the
processes of the runs placed on this node, and reports what became of them.

Orders (:mod:`trainyard.events.work`) come in through :meth:`Executor.apply`;
reports go out through an :class:`Outbox`, which publishes them (retrying for
as long as NATS is away) under message ids derived from the run:
``<run_id>:<node>:started``, ``<run_id>:<rank>:exited``,
``<run_id>:<node>:checkpoint:<step>``.

1. ``StartRun`` makes ``<state>/runs/<run_id>/`` (a run whose directory exists
   is never started again: a repeated or redelivered order is a no-op), waits
   while another run's live process holds one of its GPUs, then starts every
   process through the shim in its own session, and reports
   ``ProcessesStarted`` once all of them are up.
2. Each run is supervised every ``poll_s``: an exit file (or a process and shim
   both gone: ``lost``) ends a process, once nothing of its process group is
   left (what is left is SIGKILLed); the first failure on this node stops the
   others (``peer_failed``); ``max_runtime_s`` stops the run (``timeout``);
   the step file ``$TRAINYARD_CHECKPOINT_DIR/trainyard-step`` is read about
   every second and a new step is reported as ``CheckpointWritten``; logs
   past ``log_max_bytes`` are rotated.
3. ``SignalRun`` / ``StopRun`` deliver the signal to every process group of the
   run at once and SIGKILL the groups still alive ``grace`` seconds later; the
   exits are reported with ``stopped`` set to the reason.
4. :meth:`Executor.reattach`, at start, picks up every recorded run that is
   not over: processes still alive (same pid and start time) are watched
   again, ended ones reported from their exit files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pwd
import shutil
import signal
import time
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from trainyard.agent import processes, runlogs, runstate
from trainyard.agent.orders import STOP_REASONS, check_order, signal_number
from trainyard.agent.processes import Exit, alive, group_alive, signal_group
from trainyard.agent.runstate import Proc, Run
from trainyard.agent.workload import STEP_FILE
from trainyard.events.work import (
    CheckpointWritten,
    ProcessesStarted,
    ProcessExited,
    SignalRun,
    StartRun,
    StopRun,
    WorkOrder,
    WorkReport,
)

log = logging.getLogger(__name__)

#: A StartRun older than this is never started: the dispatcher failed the run
#: long ago (its start timeout), and an agent with a new, empty state
#: directory reading its orders from the start of the stream must not start
#: last week's runs.
MAX_ORDER_AGE_S = 600.0
#: The grace the other processes of a run get when one of them failed.
PEER_GRACE_S = 5.0


class Outbox(Protocol):
    def put(self, report: WorkReport, msg_id: str, on_sent: Callable[[], None] | None = None) -> None: ...


class Executor:
    def __init__(
        self,
        state_dir: Path,
        node_id: str,
        outbox: Outbox,
        *,
        boot_id: str = "",
        clock: Callable[[], float] = time.time,
        run_as: str | None = None,
        container_runtime: str | None = None,
        log_max_bytes: int = 64 * 1024 * 1024,
        poll_s: float = 0.1,
        checkpoint_poll_s: float = 1.0,
        max_order_age_s: float | None = MAX_ORDER_AGE_S,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.node_id = node_id
        self.outbox = outbox
        self.boot_id = boot_id
        self.clock = clock
        self.run_as = run_as
        self.container_runtime = container_runtime
        self.log_max_bytes = log_max_bytes
        self.poll_s = poll_s
        self.checkpoint_every = max(1, round(checkpoint_poll_s / poll_s))  # in supervision ticks
        self.max_order_age_s = max_order_age_s  # an older StartRun is never started (None: any age)
        self.runs: dict[str, Run] = {}  # the runs not over, by run id

    def running_runs(self) -> list[str]:
        return sorted(self.runs)

    # --- paths ---

    def run_dir(self, run_id: str) -> Path:
        return self.state_dir / "runs" / run_id

    def checkpoint_dir(self, order: StartRun) -> Path:
        return Path(order.checkpoint_dir or self.state_dir / "checkpoints" / order.tenant / order.job_id)

    def logs_of(self, order: StartRun) -> dict[int, Path]:
        return {p.rank: runlogs.log_path(self.state_dir, order.job_id, order.attempt, p.rank) for p in order.processes}

    # --- orders ---

    async def apply(self, order: WorkOrder) -> None:
        """Apply one order; every order may be applied any number of times.
        Raises ValueError, changing nothing, for an order it cannot use (:func:`check_order`)."""
        check_order(order)
        if isinstance(order, StartRun):
            self.start(order)
            return
        run = self.runs.get(order.run_id)
        if run is None:
            if isinstance(order, StopRun) and runstate.tombstone(self.run_dir(order.run_id)):
                log.info("stop of run %s before its start: it will not start here", order.run_id)
            return
        if isinstance(order, SignalRun):
            reason = order.reason if order.reason in STOP_REASONS else "preempted"
            self.stop(run, order.signal, order.grace_period_s, reason)
        else:
            self.stop(run, order.signal, order.grace_period_s, order.reason)

    def start(self, order: StartRun) -> Run | None:
        run_dir = self.run_dir(order.run_id)
        age = self.clock() - order.at
        if self.max_order_age_s is not None and age > self.max_order_age_s:
            if runstate.tombstone(run_dir):  # a state directory younger than the order stream: never start it
                log.warning(
                    "StartRun of run %s is %.0fs old (over %.0fs): not started", order.run_id, age, self.max_order_age_s
                )
            return None
        if not runstate.create(run_dir, order):
            return None
        checkpoints = self.checkpoint_dir(order)
        logs = self.logs_of(order)
        procs = [Proc(p, run_dir / f"rank-{p.rank}", logs[p.rank]) for p in order.processes]
        run = Run(order, run_dir, procs, checkpoints, checkpoint_step=order.resume_from_step)
        self._supervise(run)
        return run

    def stop(self, run: Run, signal_name: str, grace_s: float, reason: str) -> None:
        """Signal every process group of ``run`` now; SIGKILL what is left after ``grace_s``."""
        if run.stopping is None:
            run.stopping = reason
        run.stop_signal = signal_name
        kill_at = self.clock() + max(0.0, grace_s)
        if run.kill_at is None or kill_at < run.kill_at:
            run.kill_at = kill_at
        run.save_stopping()
        self._signal(run, signal_number(signal_name))

    @staticmethod
    def _signal(run: Run, sig: int) -> None:
        for p in run.procs:
            if p.live and p.pids is not None and alive(p.pids.pid, p.pids.start):
                signal_group(p.pids.pid, sig)

    # --- restart ---

    async def reattach(self) -> list[str]:
        """Pick up every recorded run that is not over; returns their ids."""
        found = []
        for run_dir in sorted((self.state_dir / "runs").glob("*")):
            try:
                order = runstate.load_order(run_dir)
                if order is None or order.run_id in self.runs:
                    continue
                run = runstate.load(run_dir, order, self.logs_of(order), self.checkpoint_dir(order))
            except (OSError, ValueError) as err:  # msgspec errors are ValueErrors
                log.error("run directory %s cannot be read (%r): left alone", run_dir, err)
                continue
            if run.started_at is not None:
                for p in run.procs:
                    if p.pids is None and p.exit is None:  # the agent stopped while starting it
                        p.exit = Exit(start_error="the agent restarted while starting it")
                        processes.write_exit(p.dir, p.exit)
                if not run.started_reported and all(p.pids is not None for p in run.procs):
                    self._report_started(run, at=run.started_at)  # late: stamped when they were started
            found.append(run.run_id)
            self._supervise(run)
        if found:
            log.info("reattached to %d runs: %s", len(found), ", ".join(found))
        return found

    async def close(self) -> None:
        """Stop supervising (the processes go on; a new executor reattaches)."""
        tasks = [r.task for r in self.runs.values() if r.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.runs.clear()

    # --- supervision ---

    def _supervise(self, run: Run) -> None:
        self.runs[run.run_id] = run
        run.task = asyncio.ensure_future(self._run(run))

    async def _run(self, run: Run) -> None:
        try:
            if run.started_at is None:
                await self._launch(run)
            tick = 0
            while True:
                await self._tick(run, checkpoint=tick % self.checkpoint_every == 0)
                if run.over:
                    run.mark("done")
                    self.runs.pop(run.run_id, None)
                    log.info("run %s is over on %s", run.run_id, self.node_id)
                    return
                tick += 1
                await asyncio.sleep(self.poll_s)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("supervising run %s failed; it is picked up again at the next start", run.run_id)
            self.runs.pop(run.run_id, None)

    def _held_by_others(self, run: Run) -> set[int]:
        return {g for other in self.runs.values() if other is not run for g in other.held_gpus}

    async def _launch(self, run: Run) -> None:
        waited = False
        while run.stopping is None and (busy := run.gpus & self._held_by_others(run)):
            if not waited:
                log.info("run %s waits for GPUs %s held by another run", run.run_id, sorted(busy))
                waited = True
            await asyncio.sleep(self.poll_s)
        if run.stopping is not None:  # stopped before it started: nothing was started
            for p in run.procs:
                p.exit, p.stopped = Exit(), run.stopping
                processes.write_exit(p.dir, p.exit)
            return
        run.claimed = True
        run.started_at = self.clock()
        run.mark("started-at", repr(run.started_at))
        run.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        base = processes.base_environment(self.run_as)
        results = await asyncio.gather(*(self._spawn(run, p, base) for p in run.procs))
        if run.stop_signal is not None:  # stopped while starting: what started gets the signal too
            self._signal(run, signal_number(run.stop_signal))
        if all(results):
            self._report_started(run)

    def _report_started(self, run: Run, at: float | None = None) -> None:
        report = ProcessesStarted(
            **{**self._about(run.order), **({"at": at} if at is not None else {})},
            ranks=[p.rank for p in run.procs],
            pids=[p.pids.pid for p in run.procs if p.pids is not None],
            boot_id=self.boot_id,
        )
        self.outbox.put(report, f"{run.run_id}:{self.node_id}:started", lambda: run.mark("started-reported"))

    def environment(self, run: Run, launch_env: dict[str, str], base: dict[str, str]) -> dict[str, str]:
        """The whole environment of a process: the base, the launch's, and this node's paths."""
        env = {**base, **launch_env, "TRAINYARD_CHECKPOINT_DIR": str(run.checkpoint_dir)}
        env.setdefault("TRAINYARD_STOP_SIGNAL", run.order.stop_signal)
        if run.order.resume_from_step is not None:
            env["TRAINYARD_RESUME_STEP"] = str(run.order.resume_from_step)
        return env

    async def _spawn(self, run: Run, p: Proc, base: dict[str, str]) -> bool:
        env = self.environment(run, p.launch.env, base)
        cwd = p.launch.working_dir
        if cwd is None:
            workdir = self.state_dir / "work" / run.run_id
            workdir.mkdir(parents=True, exist_ok=True)
            cwd = str(workdir)
        argv = list(p.launch.argv)
        if not argv and "TRAINYARD_SIMULATED_DURATION_S" in p.launch.env:
            argv = processes.workload_argv(env)
        if run.order.image and self.container_runtime:  # no argv: the image's entrypoint
            argv = processes.container_argv(self.container_runtime, run.order.image, p.launch.gpus, cwd, env, argv)
        p.log.parent.mkdir(parents=True, exist_ok=True)
        if self.run_as:  # the shim and the job write these as that user
            owned = [p.dir, p.log.parent, run.checkpoint_dir]
            for path in owned if p.launch.working_dir else [*owned, Path(cwd)]:
                shutil.chown(path, self.run_as, pwd.getpwnam(self.run_as).pw_gid)
        shim, result = await processes.spawn(p.dir, p.log, argv, env, cwd, self.run_as)
        p.shim = shim
        if isinstance(result, Exit):
            p.exit = result
            processes.write_exit(p.dir, result)
            log.warning("rank %d of run %s could not start: %s", p.rank, run.run_id, result.start_error)
            return False
        p.pids = result
        return True

    async def _tick(self, run: Run, checkpoint: bool) -> None:
        for p in run.procs:
            if p.live:
                await self._observe(run, p)
        if run.stopping is None and (failed := min((p for p in run.procs if p.failed), key=_exited_at, default=None)):
            log.info("rank %d of run %s failed: stopping its other processes here", failed.rank, run.run_id)
            self.stop(run, run.order.stop_signal, min(run.order.stop_grace_s, PEER_GRACE_S), "peer_failed")
        limit = run.order.max_runtime_s
        running_for = self.clock() - run.started_at if run.started_at is not None else 0.0
        if run.stopping is None and limit is not None and running_for >= limit:
            log.info("run %s ran past its %.0fs limit: stopping it", run.run_id, limit)
            self.stop(run, run.order.stop_signal, run.order.stop_grace_s, "timeout")
        if run.kill_at is not None and self.clock() >= run.kill_at:
            self._signal(run, signal.SIGKILL)
        if checkpoint or any(p.exit is not None and not p.reported for p in run.procs):
            self._check_step(run)  # a step written just before an exit is reported before it
        if checkpoint:
            for p in run.procs:
                if p.live:
                    runlogs.rotate(p.log, self.log_max_bytes)
        # In the order they ended: the first rank to fail is the one the run's failure names.
        for p in sorted((p for p in run.procs if p.exit is not None and not p.reported), key=_exited_at):
            self._report_exit(run, p)

    async def _observe(self, run: Run, p: Proc) -> None:
        assert p.pids is not None
        ended = processes.read_exit(p.dir)
        if ended is None:
            if alive(p.pids.pid, p.pids.start) or alive(p.pids.shim_pid, p.pids.shim_start):
                return
            ended = processes.read_exit(p.dir) or Exit()  # both gone without a word: lost
            if ended == Exit():
                processes.write_exit(p.dir, ended)
                with open(p.log, "a") as out:  # the reason, in the tail the report carries
                    out.write("trainyard: the process and its shim are gone without an exit status\n")
        if group_alive(p.pids.pid):  # what the process left in its group goes with it
            signal_group(p.pids.pid, signal.SIGKILL)
            return
        p.exit = ended
        p.stopped = run.stopping  # a process lost on its own is a failure, not a stop
        if p.shim is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(p.shim.wait(), 5.0)
            p.shim = None

    def _report_exit(self, run: Run, p: Proc) -> None:
        assert p.exit is not None
        p.reported = True  # queued: the outbox publishes it, however long NATS is away
        stopped = p.stopped if p.stopped in STOP_REASONS else None
        report = ProcessExited(
            **self._about(run.order),
            rank=p.rank,
            exit_code=p.exit.exit_code,
            signal=p.exit.signal_name,
            start_error=p.exit.start_error,
            stopped=stopped,  # type: ignore[arg-type]
            log_tail=runlogs.tail(p.log),
            exited_at=ended if (ended := _exited_at(p)) != float("inf") else None,
        )

        def sent() -> None:
            runstate.write_atomic(p.dir / "reported", "")
            p.sent = True

        self.outbox.put(report, f"{run.run_id}:{p.rank}:exited", sent)

    def _check_step(self, run: Run) -> None:
        text = processes.read_text(run.checkpoint_dir / STEP_FILE)
        try:
            step = int(text.strip()) if text else None
        except ValueError:
            return
        if step is None or (run.checkpoint_step is not None and step <= run.checkpoint_step):
            return
        run.checkpoint_step = step
        report = CheckpointWritten(**self._about(run.order), step=step)
        self.outbox.put(
            report, f"{run.run_id}:{self.node_id}:checkpoint:{step}", lambda: run.mark("checkpoint", str(step))
        )

    def _about(self, order: StartRun) -> dict[str, typing.Any]:
        return {
            "at": self.clock(),
            "job_id": order.job_id,
            "tenant": order.tenant,
            "run_id": order.run_id,
            "node_id": self.node_id,
        }


def _exited_at(p: Proc) -> float:
    """When ``p`` ended, as its exit record's time says (records written together keep rank order)."""
    try:
        return (p.dir / "exit").stat().st_mtime
    except OSError:
        return float("inf")
