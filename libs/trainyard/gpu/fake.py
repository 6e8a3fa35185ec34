"""A fake GPU backend with fault injection, for tests and the emulated cluster.

Deterministic: readings change only through the injection methods, unless a
seeded ``random.Random`` is passed, which adds small jitter to temperature and
power.  Time comes from the injected clock (a settable counter by default).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from trainyard.gpu.nvml import RECOVERY_ACTIONS, GpuSample, NvLinkErrorCounts, XidEvent, decode_clock_event_reasons


@dataclass
class _FakeGpu:
    """Mutable state of one fake GPU; ``sample`` turns it into an immutable GpuSample."""

    temperature_c: float = 45.0
    power_w: float = 120.0
    ecc_corrected: int = 0  # volatile; aggregate = lifetime_* + volatile
    ecc_uncorrected: int = 0
    lifetime_corrected: int = 0
    lifetime_uncorrected: int = 0
    row_remap_pending: bool = False
    row_remap_failed: bool = False
    clock_event_reasons: int = 0
    links_down: set[int] = field(default_factory=set)
    nvlink_replay: int = 0
    nvlink_recovery: int = 0
    nvlink_crc: int = 0
    pcie_replay: int = 0
    recovery_action: str = "none"
    lost: bool = False


class FakeGpuBackend:
    """Same interface as NvmlBackend; GPUs start healthy, faults are injected."""

    def __init__(
        self,
        gpus: int = 8,
        *,
        name: str = "NVIDIA H100 80GB HBM3",
        nvlinks: int = 18,
        uuid_prefix: str = "GPU-fake",
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if gpus < 0 or nvlinks < 0:
            raise ValueError("gpus and nvlinks must not be negative")
        self._count = gpus
        self._name = name
        self._nvlinks = nvlinks
        self._uuid_prefix = uuid_prefix
        self.now = 0.0  # the default clock; advance() moves it
        self._clock = clock or (lambda: self.now)
        self._rng = rng
        self._gpus = [_FakeGpu() for _ in range(gpus)]
        self._xids: list[XidEvent] = []
        self._cond = threading.Condition()
        self.closed = False

    # -- GpuBackend

    def device_count(self) -> int:
        return self._count

    def sample(self, index: int) -> GpuSample:
        gpu = self._gpu(index)
        if gpu.lost:
            return GpuSample(index=index, gpu_lost=True)
        temperature, power = gpu.temperature_c, gpu.power_w
        if self._rng is not None:
            temperature += self._rng.uniform(-1.0, 1.0)
            power += self._rng.uniform(-5.0, 5.0)
        links = range(self._nvlinks)
        has_links = self._nvlinks > 0
        return GpuSample(
            index=index,
            uuid=self.uuid(index),
            name=self._name,
            temperature_c=temperature,
            power_w=power,
            ecc_corrected_volatile=gpu.ecc_corrected,
            ecc_uncorrected_volatile=gpu.ecc_uncorrected,
            ecc_corrected_aggregate=gpu.lifetime_corrected + gpu.ecc_corrected,
            ecc_uncorrected_aggregate=gpu.lifetime_uncorrected + gpu.ecc_uncorrected,
            retired_pages_sbe=None,  # the fake models Ampere-or-later memory: row remapping
            retired_pages_dbe=None,
            row_remap_pending=gpu.row_remap_pending,
            row_remap_failed=gpu.row_remap_failed,
            clock_event_reasons=gpu.clock_event_reasons,
            clock_event_reason_names=decode_clock_event_reasons(gpu.clock_event_reasons),
            nvlink_links_up=[link for link in links if link not in gpu.links_down] if has_links else None,
            nvlink_links_down=sorted(gpu.links_down) if has_links else None,
            nvlink_error_counts=NvLinkErrorCounts(gpu.nvlink_replay, gpu.nvlink_recovery, gpu.nvlink_crc)
            if has_links
            else None,
            pcie_replay_counter=gpu.pcie_replay,
            recovery_action=gpu.recovery_action,
        )

    def wait_xid(self, timeout_s: float) -> list[XidEvent]:
        """Return queued XIDs; with none queued, wait up to ``timeout_s`` for one."""
        with self._cond:
            if not self._xids and timeout_s > 0:
                self._cond.wait(timeout_s)
            events, self._xids = self._xids, []
            return events

    def close(self) -> None:
        self.closed = True

    # -- fault injection

    def advance(self, seconds: float) -> None:
        """Move the default clock forward."""
        self.now += seconds

    def inject_xid(self, gpu: int, xid: int) -> XidEvent:
        self._gpu(gpu)
        event = XidEvent(gpu_index=gpu, uuid=self.uuid(gpu), xid=xid, at=self._clock())
        with self._cond:
            self._xids.append(event)
            self._cond.notify_all()
        return event

    def inject_ecc_burst(self, gpu: int, corrected: int, uncorrected: int = 0) -> None:
        if corrected < 0 or uncorrected < 0:
            raise ValueError("error counts must not be negative")
        state = self._gpu(gpu)
        state.ecc_corrected += corrected
        state.ecc_uncorrected += uncorrected

    def set_temperature(self, gpu: int, c: float) -> None:
        self._gpu(gpu).temperature_c = c

    def set_nvlink_down(self, gpu: int, links: Iterable[int]) -> None:
        """Mark exactly these links down (an empty list brings every link back up)."""
        down = set(links)
        if any(not 0 <= link < self._nvlinks for link in down):
            raise ValueError(f"links must be in 0..{self._nvlinks - 1}")
        self._gpu(gpu).links_down = down

    def add_nvlink_errors(self, gpu: int, *, replay: int = 0, recovery: int = 0, crc: int = 0) -> None:
        state = self._gpu(gpu)
        state.nvlink_replay += replay
        state.nvlink_recovery += recovery
        state.nvlink_crc += crc

    def add_pcie_replays(self, gpu: int, count: int) -> None:
        self._gpu(gpu).pcie_replay += count

    def set_clock_event_reasons(self, gpu: int, mask: int) -> None:
        self._gpu(gpu).clock_event_reasons = mask

    def set_recovery_action(self, gpu: int, action: str) -> None:
        if action not in RECOVERY_ACTIONS.values():
            raise ValueError(f"unknown recovery action {action!r}")
        self._gpu(gpu).recovery_action = action

    def lose_gpu(self, gpu: int) -> None:
        """The GPU falls off the bus: every later sample reports it lost."""
        self._gpu(gpu).lost = True

    def set_row_remap(self, gpu: int, pending: bool, failed: bool) -> None:
        state = self._gpu(gpu)
        state.row_remap_pending = pending
        state.row_remap_failed = failed

    def reset_gpu(self, gpu: int) -> None:
        """What a GPU reset does: volatile counters clear, a pending remap completes."""
        state = self._gpu(gpu)
        state.lifetime_corrected += state.ecc_corrected
        state.lifetime_uncorrected += state.ecc_uncorrected
        state.ecc_corrected = state.ecc_uncorrected = 0
        state.row_remap_pending = False
        state.recovery_action = "none"
        state.lost = False

    def clear(self) -> None:
        """Every GPU back to a fresh healthy state; queued XIDs dropped."""
        self._gpus = [_FakeGpu() for _ in range(self._count)]
        with self._cond:
            self._xids = []

    # -- helpers

    def uuid(self, gpu: int) -> str:
        return f"{self._uuid_prefix}-{gpu:04d}"

    def _gpu(self, index: int) -> _FakeGpu:
        if not 0 <= index < self._count:
            raise IndexError(f"no GPU {index}: this fake has {self._count}")
        return self._gpus[index]
