"""Fair-share standing folded from the JOBS log: decayed usage and fair-share preemptions.

A run holds ``g`` GPUs of a type from its admission (``JobAdmitted``, which
names the queue and the gang's GPUs) to its end (``RunSucceeded``,
``RunFailed``, ``JobCancelled``).  Held from ``a`` to ``b``, it adds to the
queue's decayed GPU-seconds at time ``t >= b``, with half-life ``H``::

    g * H / ln 2 * (2^(-(t - b) / H) - 2^(-(t - a) / H))

the integral of ``g`` decayed from every instant it was held.  The fold keeps
the closed runs' total as of the latest time it has seen (``as_of``: the
greatest end time folded) and the open runs with their start; a reading at
``now`` decays the closed total to ``now`` and adds each open run held up to
``now``.  Only event times enter the fold, never a clock, so the same events
folded in the same order give the same figures, bit for bit, whenever and
however often the fold is stopped and resumed (JSON keeps floats exactly).

Fair-share preemptions are the times of ``PreemptionNotice(reason=fair_share)``;
the fold keeps those within :data:`KEEP_PREEMPTIONS_S` of the newest.
"""

from __future__ import annotations

import math

LN2 = math.log(2.0)
#: Fair-share preemption times older than this, counted back from the newest, are dropped.
KEEP_PREEMPTIONS_S = 24 * 3600.0

Table = dict[str, dict[str, float]]


def held(gpus: float, start: float, end: float, at: float, half_life: float) -> float:
    """Decayed GPU-seconds at ``at`` of ``gpus`` held from ``start`` to ``end``."""
    if end <= start:
        return 0.0
    scale = half_life / LN2
    later: float = 2.0 ** (-(at - end) / half_life)
    earlier: float = 2.0 ** (-(at - start) / half_life)
    return gpus * scale * (later - earlier)


class OpenRun:
    __slots__ = ("run_id", "queue", "gpus_by_type", "start")

    def __init__(self, run_id: str, queue: str, gpus_by_type: dict[str, int], start: float) -> None:
        self.run_id = run_id
        self.queue = queue
        self.gpus_by_type = gpus_by_type
        self.start = start

    def to_dict(self) -> dict[str, object]:
        return {"run_id": self.run_id, "queue": self.queue, "gpus_by_type": self.gpus_by_type, "start": self.start}


class UsageFold:
    """The fold's state; ``to_dict``/``from_dict`` round-trip it exactly."""

    def __init__(self, half_life: float) -> None:
        if half_life <= 0:
            raise ValueError(f"the fair-share half-life must be greater than 0, got {half_life}")
        self.half_life = half_life
        self.as_of = 0.0  # the time the closed total is given at
        self.closed: Table = {}  # queue -> GPU type -> decayed GPU-seconds at as_of
        self.open: dict[str, OpenRun] = {}  # job id -> its run holding GPUs
        self.preemptions: list[float] = []  # times of fair-share preemptions, in log order

    # --- events ---

    def admitted(self, job_id: str, run_id: str, queue: str, gpus_by_type: dict[str, int], at: float) -> None:
        self.ended(job_id, None, at)  # a job holds one run at a time
        if any(gpus_by_type.values()):
            self.open[job_id] = OpenRun(run_id, queue, dict(sorted(gpus_by_type.items())), at)

    def ended(self, job_id: str, run_id: str | None, at: float) -> None:
        """The job's run ``run_id`` (any, when None) gives its GPUs back at ``at``."""
        run = self.open.get(job_id)
        if run is None or (run_id is not None and run.run_id != run_id):
            return
        del self.open[job_id]
        ref = max(self.as_of, at)
        self._decay_to(ref)
        per_type = self.closed.setdefault(run.queue, {})
        for gpu_type, gpus in run.gpus_by_type.items():
            per_type[gpu_type] = per_type.get(gpu_type, 0.0) + held(gpus, run.start, at, ref, self.half_life)

    def preempted(self, at: float) -> None:
        self.preemptions.append(at)
        newest = max(self.preemptions)
        self.preemptions = [t for t in self.preemptions if t >= newest - KEEP_PREEMPTIONS_S]

    def _decay_to(self, ref: float) -> None:
        if ref == self.as_of:
            return
        factor: float = 2.0 ** (-(ref - self.as_of) / self.half_life)
        self.closed = {q: {t: v * factor for t, v in by_type.items()} for q, by_type in self.closed.items()}
        self.as_of = ref

    # --- readings ---

    def usage(self, now: float) -> Table:
        """Decayed GPU-seconds per queue and GPU type at ``now``."""
        factor: float = 2.0 ** (-(now - self.as_of) / self.half_life)
        out: Table = {q: {t: v * factor for t, v in by_type.items()} for q, by_type in self.closed.items()}
        for _, run in sorted(self.open.items()):  # one order, however the state was built
            per_type = out.setdefault(run.queue, {})
            for gpu_type, gpus in run.gpus_by_type.items():
                add = held(gpus, run.start, max(run.start, now), now, self.half_life)
                per_type[gpu_type] = per_type.get(gpu_type, 0.0) + add
        return {q: dict(sorted(by_type.items())) for q, by_type in sorted(out.items())}

    def recent_preemptions(self, now: float, window_s: float) -> list[float]:
        """Fair-share preemption times at or after ``now - window_s``, oldest first."""
        return sorted(t for t in self.preemptions if t >= now - window_s)

    # --- state ---

    def to_dict(self) -> dict[str, object]:
        return {
            "half_life": self.half_life,
            "as_of": self.as_of,
            "closed": {q: dict(sorted(v.items())) for q, v in sorted(self.closed.items())},
            "open": {j: r.to_dict() for j, r in sorted(self.open.items())},
            "preemptions": list(self.preemptions),
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> UsageFold:
        fold = cls(float(data["half_life"]))  # type: ignore[arg-type]
        fold.as_of = float(data["as_of"])  # type: ignore[arg-type]
        closed: Table = data["closed"]  # type: ignore[assignment]
        fold.closed = {q: dict(v) for q, v in closed.items()}
        runs: dict[str, dict[str, object]] = data["open"]  # type: ignore[assignment]
        fold.open = {
            j: OpenRun(str(r["run_id"]), str(r["queue"]), dict(r["gpus_by_type"]), float(r["start"]))  # type: ignore[call-overload, arg-type]
            for j, r in runs.items()
        }
        fold.preemptions = [float(t) for t in data["preemptions"]]  # type: ignore[attr-defined]
        return fold
