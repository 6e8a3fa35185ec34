"""The node agent's checks, control requests and the emulator's fault injection, without servers."""

from __future__ import annotations

import pytest

from trainyard.agent import ControlRequest, run_checks
from trainyard.agent.control import ControlReply, decode_request, encode
from trainyard.emulator.faults import FaultRefused, apply_fault
from trainyard.gpu import FakeGpuBackend


@pytest.mark.parametrize(
    "fault, passed, problem",
    [
        pytest.param(lambda g: None, True, None, id="healthy GPUs pass"),
        pytest.param(lambda g: g.set_temperature(3, 95.0), False, "temperature 95 C", id="a hot GPU fails the checks"),
        pytest.param(lambda g: g.lose_gpu(0), False, "fallen off the bus", id="a lost GPU fails the checks"),
        pytest.param(lambda g: g.set_nvlink_down(1, [2]), False, "NVLink", id="a link down fails the checks"),
        pytest.param(
            lambda g: g.set_row_remap(0, pending=True, failed=False),
            False,
            "row remap pending",
            id="a pending row remap fails until the GPU is reset",
        ),
    ],
)
def test_checks(fault, passed, problem) -> None:
    gpus = FakeGpuBackend(8)
    fault(gpus)
    report = run_checks(gpus, "n1", at=10.0, expected_gpus=8)
    assert report.passed is passed
    if problem:
        assert any(problem in p for p in report.problems)


def test_checks_fail_when_gpus_are_missing() -> None:
    report = run_checks(FakeGpuBackend(7), "n1", at=0.0, expected_gpus=8)
    assert not report.passed and "7 of 8 GPUs" in report.problems[0]


@pytest.mark.parametrize(
    "request_, effect",
    [
        pytest.param(
            ControlRequest(op="xid", node_id="n1", gpu=2, xid=79),
            lambda g: g.wait_xid(0)[0].xid == 79,
            id="an XID is queued",
        ),
        pytest.param(
            ControlRequest(op="ecc", node_id="n1", gpu=1),
            lambda g: g.sample(1).ecc_corrected_volatile == 5000,
            id="an ECC burst defaults to 5000 corrected errors",
        ),
        pytest.param(
            ControlRequest(op="overheat", node_id="n1"),
            lambda g: g.sample(0).temperature_c == 95.0,
            id="overheat defaults to 95 C",
        ),
        pytest.param(
            ControlRequest(op="nvlink_down", node_id="n1", links=[3, 4]),
            lambda g: g.sample(0).nvlink_links_down == [3, 4],
            id="links go down",
        ),
        pytest.param(
            ControlRequest(op="gpu_lost", node_id="n1", gpu=5), lambda g: g.sample(5).gpu_lost, id="a GPU is lost"
        ),
    ],
)
def test_faults(request_, effect) -> None:
    gpus = FakeGpuBackend(8)
    message = apply_fault(gpus, request_, set())
    assert message and effect(gpus)


def test_silent_and_clear() -> None:
    gpus, silent = FakeGpuBackend(8), set()
    apply_fault(gpus, ControlRequest(op="gpu_lost", node_id="n1"), silent)
    apply_fault(gpus, ControlRequest(op="silent", node_id="n1"), silent)
    assert silent == {"n1"}
    apply_fault(gpus, ControlRequest(op="clear", node_id="n1"), silent)
    assert silent == set() and not gpus.sample(0).gpu_lost


@pytest.mark.parametrize(
    "request_, words",
    [
        pytest.param(ControlRequest(op="xid", node_id="n1"), "positive --xid", id="an XID needs its code"),
        pytest.param(ControlRequest(op="xid", node_id="n1", gpu=8, xid=79), "GPUs 0..7", id="a GPU the node lacks"),
        pytest.param(
            ControlRequest(op="nvlink_down", node_id="n1", links=[99]), "links must be", id="a link the GPU lacks"
        ),
    ],
)
def test_bad_faults_are_refused_with_the_reason(request_, words) -> None:
    with pytest.raises(FaultRefused, match=words):
        apply_fault(FakeGpuBackend(8), request_, set())


@pytest.mark.parametrize(
    "raw, words",
    [
        pytest.param(b"nope", "bad control request", id="not JSON"),
        pytest.param(b'{"op": "xid"}', "node_id", id="no node"),
        pytest.param(b'{"op": "explode", "node_id": "n1"}', "unknown op", id="an unknown operation"),
    ],
)
def test_bad_control_requests_get_a_refusal(raw, words) -> None:
    reply = decode_request(raw)
    assert isinstance(reply, ControlReply) and not reply.ok and words in reply.message


def test_a_request_round_trips() -> None:
    request = ControlRequest(op="xid", node_id="n12", xid=79)
    assert decode_request(encode(request)) == request
