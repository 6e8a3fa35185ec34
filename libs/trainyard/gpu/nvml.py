"""What the node agent reads from its GPUs, and the NVML backend that reads it.

The sample types are plain data shared by the agent, the emulator and the
health rules.  A field the driver cannot report is ``None``; nothing is
guessed.  ``pynvml`` (package ``nvidia-ml-py``) is imported only when an
``NvmlBackend`` is built, so importing this module needs neither a GPU nor the
NVML library.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

# The sample types live in trainyard.domain.telemetry so the pure health
# rules can read them; they are re-exported here for the agent and backends.
from trainyard.domain.telemetry import (
    CLOCK_EVENT_REASONS,
    RECOVERY_ACTIONS,
    GpuSample,
    NodeSample,
    NvLinkErrorCounts,
    XidEvent,
    decode_clock_event_reasons,
)

__all__ = [
    "CLOCK_EVENT_REASONS",
    "RECOVERY_ACTIONS",
    "GpuBackend",
    "GpuSample",
    "NodeSample",
    "NvLinkErrorCounts",
    "NvmlBackend",
    "NvmlUnavailable",
    "XidEvent",
    "decode_clock_event_reasons",
    "sample_node",
]


class GpuBackend(Protocol):
    """What the node agent reads GPUs through: NVML, or the fake in tests and the emulator."""

    def device_count(self) -> int: ...

    def sample(self, index: int) -> GpuSample: ...

    def wait_xid(self, timeout_s: float) -> list[XidEvent]: ...

    def close(self) -> None: ...


def sample_node(backend: GpuBackend, node_id: str, at: float) -> NodeSample:
    """Read every GPU of the node once."""
    return NodeSample(node_id=node_id, at=at, gpus=[backend.sample(i) for i in range(backend.device_count())])


# --- NVML ---------------------------------------------------------------------


class NvmlUnavailable(RuntimeError):
    """NVML could not be loaded or initialised (no driver, no GPU, no library)."""


class _GpuLost(Exception):
    pass


_MISSING = object()


class NvmlBackend:
    """Reads GPUs through NVML.  ``wait_xid`` blocks; call it from a thread of its own.

    ``nvml`` may be given a module with pynvml's interface (used to test the
    mapping of NVML answers onto samples); by default ``pynvml`` is imported.
    """

    def __init__(self, *, clock: Callable[[], float] = time.time, nvml: Any = None) -> None:
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError as exc:  # nvidia-ml-py not installed
                raise NvmlUnavailable(f"NVML is not available: {exc}") from exc
        self._nvml = nvml
        self._clock = clock
        self._lock = threading.Lock()
        self._event_set: Any = None
        self._closed = False
        try:
            nvml.nvmlInit()
        except Exception as exc:  # pynvml raises NVMLError subclasses (LibraryNotFound, DriverNotLoaded, ...)
            raise NvmlUnavailable(f"NVML is not available: {exc}") from exc

    # -- calls, each mapped onto a value or None

    def _is(self, exc: BaseException, name: str) -> bool:
        cls = getattr(self._nvml, name, None)
        return isinstance(cls, type) and isinstance(exc, cls)

    def _try(
        self, name: str, *args: Any, errors: dict[str, str] | None = None, flags: dict[str, bool] | None = None
    ) -> Any:
        """Call ``nvml.<name>(*args)``; return the value, or ``_MISSING`` when not reported.

        Not supported / function not found (old driver or bindings) -> missing, silently.
        GPU lost -> raises _GpuLost.  Reset required -> missing, and flags the sample.
        Anything else -> missing, and the error text is kept in ``errors``.
        """
        fn = getattr(self._nvml, name, None)
        if fn is None:
            return _MISSING
        try:
            return fn(*args)
        except Exception as exc:
            if self._is(exc, "NVMLError_NotSupported") or self._is(exc, "NVMLError_FunctionNotFound"):
                return _MISSING
            if self._is(exc, "NVMLError_GpuIsLost"):
                raise _GpuLost from exc
            if self._is(exc, "NVMLError_ResetRequired") and flags is not None:
                flags["reset_required"] = True
            if errors is not None:
                errors[name] = str(exc) or type(exc).__name__
            return _MISSING

    def device_count(self) -> int:
        return int(self._nvml.nvmlDeviceGetCount())

    def sample(self, index: int) -> GpuSample:
        try:
            return self._sample(index)
        except _GpuLost:
            return GpuSample(index=index, gpu_lost=True)

    def _sample(self, index: int) -> GpuSample:
        n = self._nvml
        errors: dict[str, str] = {}
        flags: dict[str, bool] = {}
        handle = self._try("nvmlDeviceGetHandleByIndex", index, errors=errors, flags=flags)
        if handle is _MISSING:
            return GpuSample(index=index, reset_required=flags.get("reset_required", False), read_errors=errors)

        def get(name: str, *args: Any) -> Any:
            value = self._try(name, handle, *args, errors=errors, flags=flags)
            return None if value is _MISSING else value

        uuid = _text(get("nvmlDeviceGetUUID"))
        name = _text(get("nvmlDeviceGetName"))
        temperature = get("nvmlDeviceGetTemperature", getattr(n, "NVML_TEMPERATURE_GPU", 0))
        power_mw = get("nvmlDeviceGetPowerUsage")
        corrected, uncorrected = (
            getattr(n, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0),
            getattr(n, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
        )
        volatile, aggregate = getattr(n, "NVML_VOLATILE_ECC", 0), getattr(n, "NVML_AGGREGATE_ECC", 1)
        sbe_pages = get(
            "nvmlDeviceGetRetiredPages", getattr(n, "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0)
        )
        dbe_pages = get("nvmlDeviceGetRetiredPages", getattr(n, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1))
        remap = get("nvmlDeviceGetRemappedRows")  # (correctable rows, uncorrectable rows, pending, failed)
        reasons = get("nvmlDeviceGetCurrentClocksEventReasons")
        if reasons is None:
            reasons = get("nvmlDeviceGetCurrentClocksThrottleReasons")
        up, down, link_errors = self._nvlinks(handle, errors, flags)
        return GpuSample(
            index=index,
            uuid=uuid,
            name=name,
            temperature_c=None if temperature is None else float(temperature),
            power_w=None if power_mw is None else power_mw / 1000.0,
            ecc_corrected_volatile=get("nvmlDeviceGetTotalEccErrors", corrected, volatile),
            ecc_uncorrected_volatile=get("nvmlDeviceGetTotalEccErrors", uncorrected, volatile),
            ecc_corrected_aggregate=get("nvmlDeviceGetTotalEccErrors", corrected, aggregate),
            ecc_uncorrected_aggregate=get("nvmlDeviceGetTotalEccErrors", uncorrected, aggregate),
            retired_pages_sbe=None if sbe_pages is None else len(sbe_pages),
            retired_pages_dbe=None if dbe_pages is None else len(dbe_pages),
            row_remap_pending=None if remap is None else bool(remap[2]),
            row_remap_failed=None if remap is None else bool(remap[3]),
            clock_event_reasons=None if reasons is None else int(reasons),
            clock_event_reason_names=[] if reasons is None else decode_clock_event_reasons(int(reasons)),
            nvlink_links_up=up,
            nvlink_links_down=down,
            nvlink_error_counts=link_errors,
            pcie_replay_counter=get("nvmlDeviceGetPcieReplayCounter"),
            recovery_action=self._recovery_action(handle, errors, flags),
            reset_required=flags.get("reset_required", False),
            read_errors=errors,
        )

    def _nvlinks(
        self, handle: Any, errors: dict[str, str], flags: dict[str, bool]
    ) -> tuple[list[int] | None, list[int] | None, NvLinkErrorCounts | None]:
        n = self._nvml
        up: list[int] = []
        down: list[int] = []
        for link in range(getattr(n, "NVML_NVLINK_MAX_LINKS", 18)):
            # Links a GPU does not have answer "not supported" or "invalid argument".
            state = self._try("nvmlDeviceGetNvLinkState", handle, link)
            if state is _MISSING:
                continue
            (up if state else down).append(link)
        if not up and not down:
            return None, None, None
        counters = {
            "replay": [getattr(n, "NVML_NVLINK_ERROR_DL_REPLAY", 0)],
            "recovery": [getattr(n, "NVML_NVLINK_ERROR_DL_RECOVERY", 1)],
            "crc": [getattr(n, "NVML_NVLINK_ERROR_DL_CRC_FLIT", 2), getattr(n, "NVML_NVLINK_ERROR_DL_CRC_DATA", 3)],
        }
        totals: dict[str, int | None] = {}
        for key, counter_ids in counters.items():
            total: int | None = None
            for link in up + down:
                for counter in counter_ids:
                    value = self._try(
                        "nvmlDeviceGetNvLinkErrorCounter", handle, link, counter, errors=errors, flags=flags
                    )
                    if value is not _MISSING:
                        total = (total or 0) + int(value)
            totals[key] = total
        counts = NvLinkErrorCounts(**totals)
        return up, down, None if counts == NvLinkErrorCounts() else counts

    def _recovery_action(self, handle: Any, errors: dict[str, str], flags: dict[str, bool]) -> str | None:
        field = getattr(self._nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field is None:  # bindings older than the field
            return None
        values = self._try("nvmlDeviceGetFieldValues", handle, [field], errors=errors, flags=flags)
        if values is _MISSING or len(values) == 0:
            return None
        value = values[0]
        if getattr(value, "nvmlReturn", 0) != getattr(self._nvml, "NVML_SUCCESS", 0):
            return None
        raw = _field_value(value)
        return None if raw is None else RECOVERY_ACTIONS.get(raw, f"unknown_{raw}")

    # -- XID events

    def _events(self) -> Any:
        with self._lock:
            if self._event_set is None:
                n = self._nvml
                event_set = n.nvmlEventSetCreate()
                for index in range(self.device_count()):
                    handle = n.nvmlDeviceGetHandleByIndex(index)
                    # A GPU that cannot report XIDs is still sampled; it just sends no events.
                    self._try("nvmlDeviceRegisterEvents", handle, n.nvmlEventTypeXidCriticalError, event_set)
                self._event_set = event_set
            return self._event_set

    def wait_xid(self, timeout_s: float) -> list[XidEvent]:
        """Block up to ``timeout_s`` for XIDs; return every event already queued."""
        n = self._nvml
        event_set = self._events()
        events: list[XidEvent] = []
        wait_ms = max(0, int(timeout_s * 1000))
        while len(events) < 256:
            try:
                data = n.nvmlEventSetWait_v2(event_set, wait_ms)
            except Exception as exc:
                if self._is(exc, "NVMLError_Timeout"):
                    break
                if events:
                    break
                raise
            wait_ms = 0  # drain what is queued without waiting again
            if not data.eventType & n.nvmlEventTypeXidCriticalError:
                continue
            index = self._try("nvmlDeviceGetIndex", data.device)
            uuid = self._try("nvmlDeviceGetUUID", data.device)
            events.append(
                XidEvent(
                    gpu_index=-1 if index is _MISSING else int(index),
                    uuid=None if uuid is _MISSING else _text(uuid),
                    xid=int(data.eventData),
                    at=self._clock(),
                )
            )
        return events

    # -- one-off report

    def probe(self, index: int = 0) -> dict[str, str]:
        """Try every call the agent uses on one GPU: call name -> "ok" | "not supported" | error."""
        n = self._nvml
        report: dict[str, str] = {}

        def run(label: str, fn_name: str, *args: Any) -> Any:
            fn = getattr(n, fn_name, None)
            if fn is None:
                report[label] = "not supported (missing from the installed bindings)"
                return None
            try:
                value = fn(*args)
            except Exception as exc:  # noqa: BLE001 - whatever the bindings raise goes into the report
                if self._is(exc, "NVMLError_NotSupported") or self._is(exc, "NVMLError_FunctionNotFound"):
                    report[label] = "not supported"
                else:
                    report[label] = f"{type(exc).__name__}: {exc}"
                return None
            report[label] = "ok"
            return value

        run("nvmlDeviceGetCount", "nvmlDeviceGetCount")
        handle = run("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            return report
        for fn_name, args in [
            ("nvmlDeviceGetUUID", ()),
            ("nvmlDeviceGetName", ()),
            ("nvmlDeviceGetTemperature", (getattr(n, "NVML_TEMPERATURE_GPU", 0),)),
            ("nvmlDeviceGetPowerUsage", ()),
            (
                "nvmlDeviceGetTotalEccErrors",
                (getattr(n, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0), getattr(n, "NVML_VOLATILE_ECC", 0)),
            ),
            ("nvmlDeviceGetRetiredPages", (getattr(n, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1),)),
            ("nvmlDeviceGetRemappedRows", ()),
            ("nvmlDeviceGetCurrentClocksEventReasons", ()),
            ("nvmlDeviceGetCurrentClocksThrottleReasons", ()),
            ("nvmlDeviceGetNvLinkState", (0,)),
            ("nvmlDeviceGetNvLinkErrorCounter", (0, getattr(n, "NVML_NVLINK_ERROR_DL_REPLAY", 0))),
            ("nvmlDeviceGetPcieReplayCounter", ()),
        ]:
            run(fn_name, fn_name, handle, *args)
        field = getattr(n, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field is None:
            report["nvmlDeviceGetFieldValues(GPU_RECOVERY_ACTION)"] = (
                "not supported (constant missing from the bindings)"
            )
        else:
            values = run("nvmlDeviceGetFieldValues(GPU_RECOVERY_ACTION)", "nvmlDeviceGetFieldValues", handle, [field])
            if values is not None and getattr(values[0], "nvmlReturn", 0) != getattr(n, "NVML_SUCCESS", 0):
                report["nvmlDeviceGetFieldValues(GPU_RECOVERY_ACTION)"] = (
                    f"field returned NVML error {values[0].nvmlReturn}"
                )
        event_set = run("nvmlEventSetCreate", "nvmlEventSetCreate")
        if event_set is not None:
            run(
                "nvmlDeviceRegisterEvents(XidCriticalError)",
                "nvmlDeviceRegisterEvents",
                handle,
                getattr(n, "nvmlEventTypeXidCriticalError", 8),
                event_set,
            )
            run("nvmlEventSetWait_v2", "nvmlEventSetWait_v2", event_set, 0)
            if report["nvmlEventSetWait_v2"].startswith("NVMLError_Timeout"):
                report["nvmlEventSetWait_v2"] = "ok"  # nothing queued: the call works
            run("nvmlEventSetFree", "nvmlEventSetFree", event_set)
        return report

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._event_set is not None:
                self._try("nvmlEventSetFree", self._event_set)
                self._event_set = None
        self._try("nvmlShutdown")


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _field_value(value: Any) -> int | None:
    """The integer in an nvmlFieldValue_t, read by its value type."""
    kind = getattr(value, "valueType", None)
    union = value.value
    member = {1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(kind)
    if member is None:
        return None
    return int(getattr(union, member))
