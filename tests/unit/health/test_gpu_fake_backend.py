import random
import threading

import pytest

from trainyard.core.health import DEFAULT_POLICY, FindingKind, NodeHealthRecord, Severity, evaluate
from trainyard.gpu import FakeGpuBackend, GpuBackend, XidEvent, sample_node


def test_fresh_fake_reports_healthy_gpus_and_no_xids():
    fake = FakeGpuBackend(gpus=8)
    node = sample_node(fake, "n1", at=0.0)
    assert len(node.gpus) == 8
    assert all(not g.gpu_lost and g.ecc_corrected_volatile == 0 and g.nvlink_links_down == [] for g in node.gpus)
    assert len({g.uuid for g in node.gpus}) == 8
    assert fake.wait_xid(0) == []
    assert evaluate(NodeHealthRecord(node_id="n1"), node, DEFAULT_POLICY, 0.0, previous=node) == []


def test_fake_satisfies_the_backend_protocol_structurally():
    backend: GpuBackend = FakeGpuBackend(gpus=1)
    assert {"device_count", "sample", "wait_xid", "close"} <= set(dir(backend))


@pytest.mark.parametrize(
    "inject, field, value",
    [
        pytest.param(
            lambda f: f.inject_ecc_burst(2, 500, 1),
            "ecc_corrected_volatile",
            500,
            id="an ECC burst raises the corrected count",
        ),
        pytest.param(
            lambda f: f.inject_ecc_burst(2, 500, 1),
            "ecc_uncorrected_aggregate",
            1,
            id="an ECC burst counts into the lifetime total",
        ),
        pytest.param(lambda f: f.set_temperature(2, 93.0), "temperature_c", 93.0, id="the temperature is what was set"),
        pytest.param(
            lambda f: f.set_nvlink_down(2, [0, 5]), "nvlink_links_down", [0, 5], id="links set down are reported down"
        ),
        pytest.param(
            lambda f: f.set_row_remap(2, pending=True, failed=False),
            "row_remap_pending",
            True,
            id="a pending row remap",
        ),
        pytest.param(
            lambda f: f.set_clock_event_reasons(2, 0x48),
            "clock_event_reason_names",
            ["hw_slowdown", "hw_thermal_slowdown"],
            id="clock event reasons are decoded by name",
        ),
        pytest.param(
            lambda f: f.add_nvlink_errors(2, replay=3, crc=4),
            "nvlink_error_counts",
            (3, 0, 4),
            id="NVLink error counters",
        ),
        pytest.param(
            lambda f: f.set_recovery_action(2, "gpu_reset"),
            "recovery_action",
            "gpu_reset",
            id="the driver's recovery action",
        ),
    ],
)
def test_fault_injection_shows_in_the_sample_of_that_gpu_only(inject, field, value):
    fake = FakeGpuBackend(gpus=4)
    healthy = fake.sample(1)
    inject(fake)
    got = getattr(fake.sample(2), field)
    if field == "nvlink_error_counts":
        got = (got.replay, got.recovery, got.crc)
    assert got == value
    assert fake.sample(1) == healthy


def test_a_lost_gpu_reports_nothing_but_being_lost():
    fake = FakeGpuBackend(gpus=2)
    fake.lose_gpu(1)
    lost = fake.sample(1)
    assert lost.gpu_lost and lost.temperature_c is None and lost.ecc_corrected_volatile is None
    assert fake.device_count() == 2


def test_injected_xids_come_out_once_in_order_with_the_clock_time():
    fake = FakeGpuBackend(gpus=8)
    fake.advance(42.0)
    fake.inject_xid(3, 79)
    fake.inject_xid(0, 13)
    assert fake.wait_xid(0) == [XidEvent(3, "GPU-fake-0003", 79, 42.0), XidEvent(0, "GPU-fake-0000", 13, 42.0)]
    assert fake.wait_xid(0) == []


def test_wait_xid_wakes_when_an_xid_arrives_from_another_thread():
    fake = FakeGpuBackend(gpus=1)
    got = []
    waiter = threading.Thread(target=lambda: got.extend(fake.wait_xid(30)))
    waiter.start()
    fake.inject_xid(0, 48)
    waiter.join(30)
    assert [e.xid for e in got] == [48]


def test_clear_restores_every_gpu_and_drops_queued_xids():
    fake = FakeGpuBackend(gpus=2)
    baseline = [fake.sample(i) for i in range(2)]
    fake.lose_gpu(0)
    fake.inject_ecc_burst(1, 10)
    fake.inject_xid(1, 79)
    fake.clear()
    assert [fake.sample(i) for i in range(2)] == baseline
    assert fake.wait_xid(0) == []


def test_a_gpu_reset_clears_volatile_counters_and_completes_the_remap():
    fake = FakeGpuBackend(gpus=1)
    fake.inject_ecc_burst(0, 7, 1)
    fake.set_row_remap(0, pending=True, failed=False)
    fake.reset_gpu(0)
    s = fake.sample(0)
    assert (s.ecc_corrected_volatile, s.ecc_corrected_aggregate, s.row_remap_pending) == (0, 7, False)


def test_without_a_random_source_the_fake_is_deterministic_and_with_a_seed_it_repeats():
    assert FakeGpuBackend(gpus=1).sample(0) == FakeGpuBackend(gpus=1).sample(0)
    a = [FakeGpuBackend(gpus=1, rng=random.Random(7)).sample(0).temperature_c for _ in range(2)]
    b = FakeGpuBackend(gpus=1, rng=random.Random(8)).sample(0).temperature_c
    assert a[0] == a[1] and a[0] != b and abs(a[0] - 45.0) <= 1.0


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda f: f.sample(8), id="sampling a GPU the node does not have"),
        pytest.param(lambda f: f.inject_xid(-1, 79), id="injecting into a negative GPU index"),
        pytest.param(lambda f: f.set_nvlink_down(0, [18]), id="setting down a link the GPU does not have"),
        pytest.param(lambda f: f.set_recovery_action(0, "format_disk"), id="an unknown recovery action"),
        pytest.param(lambda f: f.inject_ecc_burst(0, -1), id="a negative ECC burst"),
    ],
)
def test_bad_injections_are_refused(bad):
    with pytest.raises((IndexError, ValueError)):
        bad(FakeGpuBackend(gpus=8))


def test_faults_from_the_fake_drive_the_rules_end_to_end():
    fake = FakeGpuBackend(gpus=8)
    rec = NodeHealthRecord(node_id="n1", expected_gpus=8)
    before = sample_node(fake, "n1", at=0.0)
    fake.advance(60)
    fake.set_nvlink_down(4, [2])
    fake.inject_xid(6, 79)
    after = sample_node(fake, "n1", at=fake.now)
    from_sample = evaluate(rec, after, DEFAULT_POLICY, fake.now, previous=before)
    from_xids = evaluate(rec, fake.wait_xid(0), DEFAULT_POLICY, fake.now)
    assert [(f.kind, f.gpu, f.severity) for f in from_sample] == [(FindingKind.NVLINK_DOWN, 4, Severity.FATAL)]
    assert [(f.kind, f.gpu, f.severity) for f in from_xids] == [(FindingKind.XID, 6, Severity.FATAL)]
