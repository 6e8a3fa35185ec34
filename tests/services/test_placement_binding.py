"""``TRAINYARD_PLACEMENT_BINDER=kube``: the placement leader hands every placed,
not yet started run to the Kubernetes binding, which binds the object the
job's ``workload_ref`` names and pins its pods.  The Kubernetes client is
replaced by a fake here (no API server); trainyard.kube's own tests check the
translation and the client calls."""

from __future__ import annotations

import msgspec
import pytest
from test_placement_cycle import harness, job, rack

from trainyard.bus import Bus
from trainyard.core.placement import Placement
from trainyard.domain.job import JobSpec
from trainyard.events.jobs import ReplicaPlacement
from trainyard.kube.translate import BindError
from trainyard.settings import ConfigurationError, load_settings
from trainyard.store import Store
from trainyard_placement.binding import KubeBinding
from trainyard_placement.main import binding_for
from trainyard_placement.settings import binder_kind


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param({}, "none", id="unset: JobPlaced is all, as with the emulator"),
        pytest.param({"TRAINYARD_PLACEMENT_BINDER": "kube"}, "kube", id="kube"),
        pytest.param({"TRAINYARD_PLACEMENT_BINDER": " Kube "}, "kube", id="spaces and case do not matter"),
        pytest.param({"TRAINYARD_PLACEMENT_BINDER": "slurm"}, None, id="an unknown binder stops the service at start"),
    ],
)
def test_the_binder_setting(environ: dict[str, str], expected: str | None) -> None:
    if expected is None:
        with pytest.raises(ConfigurationError, match="TRAINYARD_PLACEMENT_BINDER must be one of none, kube"):
            binder_kind(load_settings(environ))
    else:
        assert binder_kind(load_settings(environ)) == expected


def test_without_a_binder_the_service_builds_none() -> None:
    assert binding_for("none") is None


class FakeBinder:
    """Stands in for KubeBinder: records calls; fails as told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, str]] = []
        self.fail_with: Exception | None = None

    def reconcile(self, kind: str, namespace: str, name: str, placement: Placement) -> int:
        self.calls.append((kind, namespace, name, placement.run_id))
        if self.fail_with is not None:
            raise self.fail_with
        return len(placement.replicas)


def placed(job_id: str, ref: str | None) -> tuple[Placement, JobSpec]:
    spec = msgspec.structs.replace(job(8), workload_ref=ref)
    return Placement(job_id, f"{job_id}-r1", [ReplicaPlacement("trainer", 0, 0, "n1", list(range(8)))]), spec


async def test_each_pass_binds_every_placed_run_and_says_once_why_one_cannot_be() -> None:
    now = [0.0]
    fake = FakeBinder()
    binding = KubeBinding(fake, lambda: now[0], interval_s=2.0)
    runs = [placed("a", "kube:Job/team-a/a"), placed("b", "image-only")]

    await binding.reconcile(runs)
    assert fake.calls == [("Job", "team-a", "a", "a-r1")]
    assert list(binding.refused) == ["b-r1"] and binding.pinned == {"a-r1": 1}

    now[0] = 1.0
    await binding.reconcile(runs)
    assert len(fake.calls) == 1  # within the interval: no pass

    now[0] = 3.0
    fake.fail_with = ConnectionError("API server away")
    await binding.reconcile(runs)
    assert len(fake.calls) == 2 and "a-r1" not in binding.refused  # tried again next pass

    now[0] = 6.0
    fake.fail_with = BindError("bound to another run")
    await binding.reconcile(runs)
    assert set(binding.refused) == {"a-r1", "b-r1"}

    now[0] = 9.0
    await binding.reconcile([])
    assert binding.refused == {} and binding.pinned == {}  # started or ended runs are forgotten


class RecordingBinding:
    def __init__(self) -> None:
        self.seen: list[list[tuple[Placement, JobSpec]]] = []

    async def reconcile(self, placed: list[tuple[Placement, JobSpec]]) -> None:
        self.seen.append(placed)


async def test_the_leader_hands_placed_runs_with_their_nodes_and_spec_to_the_binding(bus: Bus, store: Store) -> None:
    async with harness(bus, store) as h:
        for node_id, rack_name, _ in rack("r1", 2):
            await h.node(node_id, rack_name)
        spec = msgspec.structs.replace(job(8, replicas=2), workload_ref="kube:JobSet/research/llm")
        await h.submit("llm", spec)
        await h.running("other", job(4), {"r1n0": [0, 1, 2, 3]}, 1.0)  # started: not the binding's
        await h.settle()
        recording = RecordingBinding()
        cycle = h.cycle(binding=recording)

        assert await cycle.run_once() == 0  # "other" holds r1n0's GPUs: the gang of 2 x 8 waits
        assert recording.seen == []  # nothing placed yet, nothing to bind
        await h.finish("other", "other-r1")
        await h.settle()
        assert await cycle.run_once() == 1
        await h.settle()
        await cycle.run_once()

        (handed,) = recording.seen
        ((placement, given),) = handed
        assert (placement.job_id, placement.run_id, given) == ("llm", "llm-r1", spec)
        assert sorted(r.node_id for r in placement.replicas) == ["r1n0", "r1n1"]
