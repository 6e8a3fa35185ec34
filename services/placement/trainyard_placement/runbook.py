"""The run dispatcher's per-run state, kept in Redis so that a restarted
process or a standby that takes the lease over finds it (docs/execution.md).

Every write is idempotent (a set field, a flag taken with HSETNX), so a
message handled twice leaves the same state; each run's hash expires
:data:`TTL_S` after its last write, the WORK stream's retention.

- ``dispatch:run:<run_id>`` (hash): ``meta`` (the run as dispatched:
  :class:`RunMeta`), ``started:<node>`` per node that reported its processes
  started, ``exit:<rank>`` per rank that ended (``ok``, ``failed`` or
  ``stopped``), ``signalled`` (a preemption notice was delivered),
  ``failure`` (the first failure, which the run's one ``RunFailed`` names:
  kept, so a redelivery publishes the same event under the same id) and
  ``over`` (JOBS says the run ended; why); ``failed:<rank>`` (its exit time, node and
  message) for each rank that failed on its own before the failure was decided, and
  ``failing-until`` (when it is decided: the first such report plus a short settling time).
- ``dispatch:ports:<node>`` (hash): run id -> MASTER_PORT of the runs whose
  rank 0 is on that node.
- ``dispatch:starting`` (sorted set): runs not yet started, by the time their
  start timeout is up.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from trainyard.store import Store

TTL_S = 7 * 24 * 3600  # the WORK stream's max age


class RunMeta(msgspec.Struct, frozen=True):
    """A run as the dispatcher started it."""

    job_id: str
    tenant: str
    cluster: str
    ranks: dict[str, list[int]]  # node id -> the ranks of the run's processes there
    master: str  # the node holding rank 0
    port: int  # MASTER_PORT
    stop_signal: str
    stop_grace_s: float
    deadline: float  # when it is failed if not every node has started its processes

    @property
    def nodes(self) -> list[str]:
        return list(self.ranks)

    @property
    def rank_count(self) -> int:
        return sum(len(r) for r in self.ranks.values())


class RunState(msgspec.Struct, frozen=True):
    """What the dispatcher knows of one run."""

    meta: RunMeta
    started: frozenset[str]  # nodes whose processes are all up
    exits: dict[int, str]  # rank -> ok | failed | stopped
    signalled: bool
    failure: str | None  # the message of the run's RunFailed, once one was decided
    over: str | None
    started_at: float | None = None  # when the last node's processes were all up, by its agent's clock
    ended_at: float | None = None  # when the last rank that has exited ended, by its node's clock

    @property
    def all_started(self) -> bool:
        return self.started >= set(self.meta.ranks)

    @property
    def all_exited(self) -> bool:
        return len(self.exits) >= self.meta.rank_count

    def holding(self) -> list[str]:
        """Nodes with a rank of the run that has not exited (by report)."""
        return [n for n, ranks in self.meta.ranks.items() if any(r not in self.exits for r in ranks)]


_meta = msgspec.json.Decoder(RunMeta)
_encode = msgspec.json.Encoder().encode
_failed = msgspec.json.Decoder(tuple[float, str, str])


class RunBook:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.redis = store.redis

    def _run(self, run_id: str) -> str:
        return self.store.key("dispatch", "run", run_id)

    def _ports(self, node_id: str) -> str:
        return self.store.key("dispatch", "ports", node_id)

    @property
    def _starting(self) -> str:
        return self.store.key("dispatch", "starting")

    async def get(self, run_id: str) -> RunState | None:
        fields = await self.redis.hgetall(self._run(run_id))
        raw = fields.get("meta")
        if raw is None:
            return None
        started = frozenset(k.split(":", 1)[1] for k in fields if k.startswith("started:"))
        exits = {int(k.split(":", 1)[1]): v for k, v in fields.items() if k.startswith("exit:")}
        return RunState(
            meta=_meta.decode(raw),
            started=started,
            exits=exits,
            signalled="signalled" in fields,
            failure=fields.get("failure"),
            over=fields.get("over"),
            started_at=_latest(v for k, v in fields.items() if k.startswith("started:")),
            ended_at=_latest(v for k, v in fields.items() if k.startswith("exitat:")),
        )

    async def port(self, run_id: str, master: str) -> tuple[int | None, list[int]]:
        """The port the run already has on its rank-0 node (None: none yet), and the other runs' ports there."""
        ports = await self.redis.hgetall(self._ports(master))
        mine = ports.pop(run_id, None)
        return (None if mine is None else int(mine)), [int(p) for p in ports.values()]

    async def open(self, run_id: str, meta: RunMeta, started: bool) -> RunMeta:
        """Record a dispatched run (the first record wins, so a redelivery gets the same port)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hsetnx(self._run(run_id), "meta", _encode(meta))
        pipe.expire(self._run(run_id), TTL_S)
        pipe.hsetnx(self._ports(meta.master), run_id, str(meta.port))
        if not started:
            pipe.zadd(self._starting, {run_id: meta.deadline}, nx=True)
        pipe.hget(self._run(run_id), "meta")
        *_, raw = await pipe.execute()
        return _meta.decode(raw)

    async def mark(self, run_id: str, field: str, value: str = "1") -> str:
        """Set ``field`` once; returns its value (``value`` when this call set it)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hsetnx(self._run(run_id), field, value)
        pipe.expire(self._run(run_id), TTL_S)
        pipe.hget(self._run(run_id), field)
        *_, kept = await pipe.execute()
        return str(kept)

    async def started(self, run_id: str, node_id: str, at: float) -> None:
        await self.mark(run_id, f"started:{node_id}", repr(at))

    async def exited(self, run_id: str, rank: int, how: str, at: float) -> None:
        await self.mark(run_id, f"exitat:{rank}", repr(at))
        await self.mark(run_id, f"exit:{rank}", how)

    async def failed_rank(
        self, run_id: str, rank: int, exited_at: float, node_id: str, message: str, decide_at: float
    ) -> float:
        """Note a rank that failed on its own; returns when the run's failure is to be decided (the
        first such report's ``decide_at``, kept): the earliest failure noted by then is the one named."""
        await self.mark(run_id, f"failed:{rank}", _encode([exited_at, node_id, message]).decode())
        return float(await self.mark(run_id, "failing-until", repr(decide_at)))

    async def first_failure(self, run_id: str) -> tuple[str, str] | None:
        """The (node, message) of the rank that failed first, by its exit time (then its rank)."""
        fields = await self.redis.hgetall(self._run(run_id))
        found = []
        for k, v in fields.items():
            if k.startswith("failed:"):
                exited_at, node_id, message = _failed.decode(v)
                found.append((exited_at, int(k.split(":", 1)[1]), node_id, message))
        return (min(found)[2], min(found)[3]) if found else None

    async def first_failure_at(self, run_id: str) -> float | None:
        """When the rank that failed first ended (by its node's clock)."""
        fields = await self.redis.hgetall(self._run(run_id))
        times = [_failed.decode(v)[0] for k, v in fields.items() if k.startswith("failed:")]
        return min(times, default=None)

    async def done_starting(self, run_id: str) -> None:
        await self.redis.zrem(self._starting, run_id)

    async def due(self, now: float) -> list[str]:
        """Runs whose start timeout is up."""
        return list(await self.redis.zrangebyscore(self._starting, "-inf", now))

    async def close(self, run_id: str, meta: RunMeta) -> None:
        """The run is over: free its port and forget its start timeout (its hash expires by itself)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hdel(self._ports(meta.master), run_id)
        pipe.zrem(self._starting, run_id)
        await pipe.execute()


def _latest(values: Iterable[str]) -> float | None:
    """The latest of recorded times (a field written before times were recorded holds "1": left out)."""
    times = []
    for v in values:
        try:
            at = float(v)
        except ValueError:
            continue
        if at > 1.0:
            times.append(at)
    return max(times, default=None)
