"""Node failures: rates and causes from published data, lemon nodes, detection and repair.

Default rate and cause mix: Meta's Llama 3 pre-training ("The Llama 3 Herd of
Models", Dubey et al., 2024, section 3.3.4 and Table 5) saw 419 unexpected
interruptions in a 54-day snapshot on up to 16,384 H100 GPUs (2,048 8-GPU
nodes): 419 / (2,048 x 54) = 3.8 per 1,000 node-days.  Table 5 attributes
58.7 % to GPU issues (faulty GPU 30.1 %, HBM3 17.2 %, SRAM 4.5 %, GPU system
processor 4.1 %, silent data corruption 1.4 %, thermal interface and sensor
1.4 %), 12.9 % to software bugs, 8.4 % to network switches and cables, 7.6 %
to host maintenance, and the rest to NICs, NCCL watchdog timeouts, SSDs, power
supplies, CPUs, memory and other host parts.  The causes are folded into five
groups below.  Repair times are not published there; the defaults are
assumptions to be overridden (``FailureModel.repair_s``).

A failed node leaves service at once; the runs on it are noticed failed after
``detection_s`` (the time the health service needs to see the fault) and lose
the work since their last checkpoint plus the detection time.
"""

from __future__ import annotations

import random

import msgspec

#: Llama 3 Table 5 interruptions folded into groups: (group, count of the 419).
LLAMA3_CAUSES: dict[str, int] = {
    "gpu": 148 + 19 + 17 + 6 + 6,  # faulty GPU, SRAM, system processor, SDC, thermal/sensor
    "hbm": 72,  # GPU HBM3 memory
    "software": 54 + 7 + 2,  # software bug, NCCL watchdog timeouts, dependency
    "network": 35 + 7,  # switch or cable, NIC
    "host": 32 + 3 + 3 + 2 + 2 + 2 + 2,  # maintenance, SSD, PSU, chassis, IO board, CPU, memory
}
REPAIR_S: dict[str, float] = {
    "gpu": 48 * 3600.0,
    "hbm": 48 * 3600.0,
    "software": 900.0,
    "network": 4 * 3600.0,
    "host": 8 * 3600.0,
}
LLAMA3_RATE_PER_1000_NODE_DAYS = 419 / (2048 * 54) * 1000  # ~3.79


class FailureModel(msgspec.Struct, frozen=True):
    rate_per_1000_node_days: float = LLAMA3_RATE_PER_1000_NODE_DAYS
    causes: dict[str, int] = msgspec.field(default_factory=lambda: dict(LLAMA3_CAUSES))  # weight of each cause
    # seconds until the node is back, per cause (assumptions, not published figures)
    repair_s: dict[str, float] = msgspec.field(default_factory=lambda: dict(REPAIR_S))
    lemon_fraction: float = 0.0  # share of nodes that fail far more often than the rest
    lemon_factor: float = 10.0  # how many times more often a lemon fails
    detection_s: float = 60.0  # fault to noticed: the gang keeps its GPUs meanwhile, doing nothing
    restart_overhead_s: float = 300.0  # every restart: rescheduling aside, load the checkpoint and warm up
    checkpoint_interval_s: float = 3600.0  # work since the last checkpoint is lost on failure or preemption
    # a preempted run checkpoints during its notice (PreemptionNotice -> CheckpointSaved, as the node agents
    # do) and loses only its restart; off: it loses the work since its last periodic checkpoint
    checkpoint_on_notice: bool = True
    enabled: bool = True


NO_FAILURES = FailureModel(enabled=False, restart_overhead_s=0.0)


class FailureSource:
    """Seeded failure times per node; lemons are chosen once, by seed."""

    def __init__(self, model: FailureModel, node_ids: list[str], seed: int) -> None:
        self.model = model
        self.rng = random.Random(seed ^ 0x5EED)
        count = round(len(node_ids) * model.lemon_fraction)
        self.lemons = set(self.rng.sample(sorted(node_ids), count)) if count else set()
        base = model.rate_per_1000_node_days / 1000.0 / 86400.0  # per node-second
        self.rate = {n: base * (model.lemon_factor if n in self.lemons else 1.0) for n in node_ids}
        self.cause_names = sorted(model.causes)
        self.cause_weights = [model.causes[c] for c in self.cause_names]

    def next_failure(self, node_id: str, now: float) -> float | None:
        """When ``node_id`` next fails after ``now`` (exponential inter-failure times)."""
        if not self.model.enabled:
            return None
        rate = self.rate[node_id]
        return now + self.rng.expovariate(rate) if rate > 0 else None

    def cause(self) -> tuple[str, float]:
        """A cause by the mix, and how long the node is out."""
        name = self.rng.choices(self.cause_names, self.cause_weights)[0]
        return name, self.model.repair_s.get(name, 3600.0)


def progress_lost(ran_s: float, interval_s: float) -> tuple[float, float]:
    """Of ``ran_s`` seconds of useful work: (saved by the last checkpoint, lost)."""
    if ran_s <= 0:
        return 0.0, 0.0
    if interval_s <= 0:
        return ran_s, 0.0
    saved = (ran_s // interval_s) * interval_s
    return saved, ran_s - saved
