import pytest
from health_builders import gpu, record, sample

from trainyard.core.health import DEFAULT_POLICY, FindingKind, HealthPolicy, HeartbeatGap, Remedy, Severity, evaluate
from trainyard.domain.node import NodeState
from trainyard.gpu import NodeSample, NvLinkErrorCounts, XidEvent

HOUR = 3600.0


def kinds(findings):
    return sorted((f.kind, f.severity, f.action) for f in findings)


@pytest.mark.parametrize(
    "previous, current, expected",
    [
        pytest.param(
            sample(0, ecc_corrected_volatile=0),
            sample(60, ecc_corrected_volatile=1),
            [],
            id="one correctable ECC error is not a fault",
        ),
        pytest.param(
            sample(0, ecc_corrected_volatile=0),
            sample(HOUR, ecc_corrected_volatile=1000),
            [(FindingKind.ECC_CORRECTED_RATE, Severity.SUSPECT, Remedy.RESET_GPU)],
            id="1,000 correctable ECC errors in an hour make the node suspect",
        ),
        pytest.param(
            sample(0, ecc_corrected_volatile=0),
            sample(HOUR, ecc_corrected_volatile=999),
            [],
            id="999 correctable ECC errors in an hour stay under the limit",
        ),
        pytest.param(
            sample(0, ecc_corrected_volatile=0),
            sample(30, ecc_corrected_volatile=9),
            [(FindingKind.ECC_CORRECTED_RATE, Severity.SUSPECT, Remedy.RESET_GPU)],
            id="nine correctable errors in 30 s is a rate above 1,000 an hour",
        ),
        pytest.param(
            sample(0, ecc_corrected_volatile=0),
            sample(0.5, ecc_corrected_volatile=2),
            [],
            id="two errors in half a second are not extrapolated into a burst",
        ),
        pytest.param(
            sample(0, ecc_corrected_volatile=5000, ecc_corrected_aggregate=5000),
            sample(60, ecc_corrected_volatile=3, ecc_corrected_aggregate=5003),
            [],
            id="a volatile counter reset by a GPU reset is not read as negative errors",
        ),
        pytest.param(
            None, sample(60, ecc_corrected_volatile=10_000), [], id="without a previous sample no rate is computed"
        ),
        pytest.param(
            sample(0),
            sample(60, ecc_uncorrected_volatile=1),
            [(FindingKind.ECC_UNCORRECTED, Severity.SUSPECT, Remedy.RESET_GPU)],
            id="a new uncorrectable ECC error makes the node suspect",
        ),
        pytest.param(
            sample(0),
            sample(60, row_remap_pending=True),
            [(FindingKind.ROW_REMAP_PENDING, Severity.SUSPECT, Remedy.RESET_GPU)],
            id="a pending row remap asks for a GPU reset",
        ),
        pytest.param(
            sample(0),
            sample(60, row_remap_pending=True, row_remap_failed=True),
            [(FindingKind.ROW_REMAP_FAILED, Severity.FATAL, Remedy.DRAIN_NOW)],
            id="a failed row remap drains the node for a GPU replacement",
        ),
        pytest.param(
            sample(0),
            sample(60, temperature_c=90.0),
            [(FindingKind.TEMPERATURE, Severity.SUSPECT, Remedy.IGNORE)],
            id="a GPU at 90 C is suspect",
        ),
        pytest.param(sample(0), sample(60, temperature_c=86.0), [], id="a GPU at 86 C is fine"),
        pytest.param(
            sample(0),
            sample(60, clock_event_reasons=0x8, clock_event_reason_names=["hw_slowdown"]),
            [],
            id="HW slowdown in one sample is a blip",
        ),
        pytest.param(
            sample(0, clock_event_reasons=0x40, clock_event_reason_names=["hw_thermal_slowdown"]),
            sample(60, clock_event_reasons=0x40, clock_event_reason_names=["hw_thermal_slowdown"]),
            [(FindingKind.THROTTLE, Severity.SUSPECT, Remedy.IGNORE)],
            id="thermal slowdown held across two samples is suspect",
        ),
        pytest.param(
            sample(0, clock_event_reasons=0x1, clock_event_reason_names=["gpu_idle"]),
            sample(60, clock_event_reasons=0x1, clock_event_reason_names=["gpu_idle"]),
            [],
            id="an idle GPU running slow clocks is not throttled",
        ),
        pytest.param(
            sample(0),
            sample(60, nvlink_links_up=list(range(1, 18)), nvlink_links_down=[0]),
            [(FindingKind.NVLINK_DOWN, Severity.FATAL, Remedy.RESET_GPU)],
            id="an NVLink link going down is fatal",
        ),
        pytest.param(
            None,
            sample(60, nvlink_links_up=list(range(1, 18)), nvlink_links_down=[0]),
            [(FindingKind.NVLINK_DOWN, Severity.SUSPECT, Remedy.RESET_GPU)],
            id="an NVLink link already down at the first sample is suspect",
        ),
        pytest.param(
            sample(0),
            sample(60, nvlink_error_counts=NvLinkErrorCounts(replay=60, recovery=0, crc=40)),
            [(FindingKind.NVLINK_ERRORS, Severity.SUSPECT, Remedy.RESET_GPU)],
            id="100 NVLink errors between two samples are suspect",
        ),
        pytest.param(
            sample(0),
            sample(60, nvlink_error_counts=NvLinkErrorCounts(replay=99, recovery=0, crc=0)),
            [],
            id="99 NVLink errors between two samples are tolerated",
        ),
        pytest.param(
            sample(0),
            sample(60, pcie_replay_counter=150),
            [(FindingKind.PCIE_REPLAY, Severity.SUSPECT, Remedy.IGNORE)],
            id="a burst of PCIe replays is suspect",
        ),
        pytest.param(
            sample(0),
            sample(60, gpu_lost=True, temperature_c=None),
            [(FindingKind.GPU_LOST, Severity.FATAL, Remedy.DRAIN_NOW)],
            id="a lost GPU drains the node and nothing else about it is judged",
        ),
        pytest.param(
            sample(0),
            sample(60, reset_required=True),
            [(FindingKind.RESET_REQUIRED, Severity.FATAL, Remedy.RESET_GPU)],
            id="the driver asking for a reset is fatal",
        ),
        pytest.param(
            sample(0),
            sample(60, recovery_action="node_reboot"),
            [(FindingKind.RECOVERY_ACTION, Severity.FATAL, Remedy.REBOOT_NODE)],
            id="the driver's recovery action node_reboot reboots the node",
        ),
        pytest.param(
            sample(0),
            sample(60, recovery_action="drain_p2p"),
            [(FindingKind.RECOVERY_ACTION, Severity.SUSPECT, Remedy.RESET_GPU)],
            id="the driver's recovery action drain_p2p is suspect",
        ),
        pytest.param(
            sample(0),
            sample(60, retired_pages_sbe=40, retired_pages_dbe=20),
            [(FindingKind.RETIRED_PAGES, Severity.FATAL, Remedy.DRAIN_NOW)],
            id="60 retired pages means replacing the GPU",
        ),
        pytest.param(
            sample(0, retired_pages_dbe=1),
            sample(60, retired_pages_dbe=2),
            [(FindingKind.RETIRED_PAGES, Severity.SUSPECT, Remedy.RESET_GPU)],
            id="a newly retired double-bit page is suspect",
        ),
        pytest.param(sample(0), sample(60), [], id="a healthy node yields no findings"),
    ],
)
def test_sample_rules(previous, current, expected):
    assert kinds(evaluate(record(), current, DEFAULT_POLICY, now=current.at, previous=previous)) == sorted(expected)


def test_unreported_fields_yield_no_findings():
    bare = NodeSample(node_id="n1", at=60, gpus=[gpu(0).__class__(index=i) for i in range(8)])
    assert evaluate(record(), bare, DEFAULT_POLICY, now=60, previous=bare.__class__("n1", 0, bare.gpus)) == []


def test_findings_name_the_gpu_the_time_and_the_rules_version():
    policy = HealthPolicy(rules_version="rules-test-7")
    [f] = evaluate(record(), sample(60, temperature_c=95.0), policy, now=61, previous=sample(0))
    assert (f.node_id, f.gpu, f.at, f.rules_version) == ("n1", 0, 60, "rules-test-7")
    assert "95" in f.message


def test_missing_gpus_drain_the_node():
    findings = evaluate(record(expected_gpus=8), sample(60, gpus=7), DEFAULT_POLICY, now=60, previous=sample(0))
    assert kinds(findings) == [(FindingKind.GPU_MISSING, Severity.FATAL, Remedy.DRAIN_NOW)]


def test_sample_of_another_node_is_a_bug():
    with pytest.raises(ValueError, match="n2"):
        evaluate(record("n1"), sample(0, node="n2"), DEFAULT_POLICY, now=0)


@pytest.mark.parametrize(
    "xid, gpu_index, severity, action",
    [
        pytest.param(79, 3, Severity.FATAL, Remedy.DRAIN_NOW, id="XID 79 on any GPU drains the node at once"),
        pytest.param(13, 0, Severity.INFO, Remedy.RESTART_JOB, id="XID 13 restarts the job and leaves the node alone"),
        pytest.param(4242, 1, Severity.SUSPECT, Remedy.RESET_GPU, id="an unknown XID makes the node suspect"),
    ],
)
def test_xid_rules(xid, gpu_index, severity, action):
    events = [XidEvent(gpu_index=gpu_index, uuid="GPU-x", xid=xid, at=12.0)]
    [f] = evaluate(record(), events, DEFAULT_POLICY, now=13.0)
    assert (f.kind, f.gpu, f.severity, f.action, f.at) == (FindingKind.XID, gpu_index, severity, action, 12.0)
    assert f"XID {xid}" in f.message


@pytest.mark.parametrize(
    "state, last_seen, now, lost",
    [
        pytest.param(NodeState.HEALTHY, 0.0, 59.0, False, id="a heartbeat 59 s ago is in time"),
        pytest.param(NodeState.HEALTHY, 0.0, 61.0, True, id="no heartbeat for 61 s means the node is lost"),
        pytest.param(NodeState.LOST, 0.0, 600.0, False, id="a node already lost is not reported lost again"),
    ],
)
def test_heartbeat_rule(state, last_seen, now, lost):
    findings = evaluate(record(state=state), HeartbeatGap(last_seen_at=last_seen), DEFAULT_POLICY, now=now)
    assert [(f.kind, f.severity) for f in findings] == (
        [(FindingKind.HEARTBEAT_TIMEOUT, Severity.FATAL)] if lost else []
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        pytest.param({"heartbeat_timeout_s": 0}, "heartbeat_timeout_s", id="a zero heartbeat timeout is refused"),
        pytest.param(
            {"blast_radius_max_share": 1.5}, "blast_radius_max_share", id="a blast radius over 100% is refused"
        ),
        pytest.param({"flap_limit": 1}, "flap_limit", id="a flap limit of one would cordon every suspect node"),
    ],
)
def test_bad_policy_is_refused_with_the_field_named(overrides, message):
    with pytest.raises(ValueError, match=message):
        HealthPolicy(**overrides)
