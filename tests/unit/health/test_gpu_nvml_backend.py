"""NvmlBackend without a GPU.

No GPU exists where these tests run, so NVML itself is not exercised here.
What is tested: the module imports without a GPU, construction fails with a
clear error, and the mapping of NVML answers (values, "not supported", "GPU is
lost", other errors) onto samples, events and the probe report, using a stand-in
module with pynvml's interface and pynvml's own error classes.
"""

import ctypes
import subprocess
import sys
from types import SimpleNamespace

import pynvml
import pytest

from trainyard.gpu import NvLinkErrorCounts, NvmlBackend, NvmlUnavailable, XidEvent


def nvml_error(code):
    return pynvml.NVMLError(code)


def _nvml_library_present():
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_importing_the_gpu_package_does_not_load_nvml():
    code = "import sys, trainyard.gpu, trainyard.core.health; print('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(
    _nvml_library_present(), reason="an NVIDIA driver is installed here; this case is about machines without one"
)
def test_constructing_the_backend_without_a_gpu_says_nvml_is_not_available():
    with pytest.raises(NvmlUnavailable, match=r"^NVML is not available: .+"):
        NvmlBackend()


class StubNvml:
    """pynvml's interface over two GPUs: GPU 0 answers, GPU 1 has fallen off the bus."""

    def __init__(self, init_error=None):
        for name in dir(pynvml):
            if name.startswith(("NVML_", "NVMLError", "nvmlEventType")):
                setattr(self, name, getattr(pynvml, name))
        self.init_error = init_error
        self.events = []
        self.shutdowns = 0

    def nvmlInit(self):
        if self.init_error is not None:
            raise nvml_error(self.init_error)

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("handle", i)

    def nvmlDeviceGetIndex(self, handle):
        return handle[1]

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-stub-{handle[1]}"

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H200"

    def nvmlDeviceGetTemperature(self, handle, sensor):
        if handle[1] == 1:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return 61

    def nvmlDeviceGetPowerUsage(self, handle):
        return 350_500  # milliwatts

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter_type):
        return {(0, 0): 11, (1, 0): 0, (0, 1): 1234, (1, 1): 2}[(error_type, counter_type)]

    def nvmlDeviceGetRetiredPages(self, handle, cause):
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # Hopper uses row remapping

    def nvmlDeviceGetRemappedRows(self, handle):
        return (0, 1, 1, 0)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)  # an older driver

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return 0x48

    def nvmlDeviceGetNvLinkState(self, handle, link):
        if link >= 4:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0 if link == 2 else 1

    def nvmlDeviceGetNvLinkErrorCounter(self, handle, link, counter):
        return {0: 1, 1: 2, 2: 3, 3: 4}[counter]

    def nvmlDeviceGetPcieReplayCounter(self, handle):
        raise nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)

    def nvmlDeviceGetFieldValues(self, handle, fields):
        assert fields == [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
        return [SimpleNamespace(nvmlReturn=0, valueType=1, value=SimpleNamespace(uiVal=1))]

    def nvmlEventSetCreate(self):
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle, types, event_set):
        assert types == pynvml.nvmlEventTypeXidCriticalError

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        if not self.events:
            raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
        return self.events.pop(0)

    def nvmlEventSetFree(self, event_set):
        pass


def test_a_driver_that_is_not_loaded_gives_a_clear_error():
    with pytest.raises(NvmlUnavailable, match="^NVML is not available: Driver Not Loaded$"):
        NvmlBackend(nvml=StubNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))


def test_nvml_answers_map_onto_a_sample_and_unsupported_calls_stay_none():
    backend = NvmlBackend(nvml=StubNvml())
    s = backend.sample(0)
    assert (s.uuid, s.name, s.temperature_c, s.power_w) == ("GPU-stub-0", "NVIDIA H200", 61.0, 350.5)
    assert (s.ecc_corrected_volatile, s.ecc_uncorrected_volatile) == (11, 0)
    assert (s.ecc_corrected_aggregate, s.ecc_uncorrected_aggregate) == (1234, 2)
    assert (s.retired_pages_sbe, s.retired_pages_dbe) == (None, None)
    assert (s.row_remap_pending, s.row_remap_failed) == (True, False)
    assert s.clock_event_reasons == 0x48 and s.clock_event_reason_names == ["hw_slowdown", "hw_thermal_slowdown"]
    assert (s.nvlink_links_up, s.nvlink_links_down) == ([0, 1, 3], [2])
    assert s.nvlink_error_counts == NvLinkErrorCounts(replay=4, recovery=8, crc=28)
    assert s.pcie_replay_counter is None and "nvmlDeviceGetPcieReplayCounter" in s.read_errors
    assert s.recovery_action == "gpu_reset"
    assert not s.gpu_lost and not s.reset_required


def test_a_gpu_that_fell_off_the_bus_is_reported_lost_with_nothing_invented():
    s = NvmlBackend(nvml=StubNvml()).sample(1)
    assert s.gpu_lost and s.temperature_c is None and s.ecc_corrected_volatile is None


def test_xid_events_are_read_with_their_gpu_and_the_injected_clock():
    stub = StubNvml()
    backend = NvmlBackend(nvml=stub, clock=lambda: 99.0)
    xid = pynvml.nvmlEventTypeXidCriticalError
    stub.events = [
        SimpleNamespace(device=("handle", 1), eventType=xid, eventData=79),
        SimpleNamespace(device=("handle", 0), eventType=xid, eventData=13),
    ]
    assert backend.wait_xid(0.1) == [XidEvent(1, "GPU-stub-1", 79, 99.0), XidEvent(0, "GPU-stub-0", 13, 99.0)]
    assert backend.wait_xid(0.1) == []


def test_probe_reports_each_call():
    report = NvmlBackend(nvml=StubNvml()).probe(0)
    assert report["nvmlDeviceGetTemperature"] == "ok"
    assert report["nvmlDeviceGetRetiredPages"] == "not supported"
    assert report["nvmlDeviceGetCurrentClocksEventReasons"] == "not supported"
    assert report["nvmlDeviceGetPcieReplayCounter"].startswith("NVMLError_NoPermission")
    assert report["nvmlEventSetWait_v2"] == "ok"
    assert report["nvmlDeviceGetFieldValues(GPU_RECOVERY_ACTION)"] == "ok"


def test_close_shuts_nvml_down_once():
    stub = StubNvml()
    backend = NvmlBackend(nvml=stub)
    backend.close()
    backend.close()
    assert stub.shutdowns == 1
