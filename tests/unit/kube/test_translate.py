"""Translating placements onto Jobs / JobSets, and Kubernetes nodes into NodeInfo."""

from __future__ import annotations

import copy

import pytest

from trainyard.core.placement import Placement
from trainyard.events.jobs import ReplicaPlacement
from trainyard.kube.nodes import gpu_type_of, node_info_from_k8s, node_view_from_k8s
from trainyard.kube.translate import (
    GATE,
    GPUS_ANNOTATION,
    HOSTNAME,
    RANK_ANNOTATION,
    BindError,
    bind_manifest,
    needs_bind,
    parse_quantity,
    pin_pod,
    workload_object,
)


def container(gpus: int | None = 8) -> dict:
    c = {"name": "main", "image": "trainer:1"}
    if gpus is not None:
        c["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return c


def batch_job(parallelism: int = 1, suspend: bool = True, queue: bool = True, gpus: int | None = 8) -> dict:
    labels = {"trainyard.io/queue": "research"} if queue else {}
    pod = {"containers": [container(gpus)], "restartPolicy": "Never"}
    spec: dict = {"suspend": suspend, "template": {"spec": pod}}
    if parallelism > 1:
        spec.update(parallelism=parallelism, completions=parallelism, completionMode="Indexed")
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "labels": labels}, "spec": spec}


def jobset(roles: dict[str, tuple[int, int]]) -> dict:
    """roles: name -> (Job replicas, pods per Job)."""
    rjs = []
    for name, (replicas, pods) in roles.items():
        job_spec: dict = {"template": {"spec": {"containers": [container()]}}}
        if pods > 1:
            job_spec.update(parallelism=pods, completions=pods)
        rjs.append({"name": name, "replicas": replicas, "template": {"spec": job_spec}})
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "llm", "labels": {"trainyard.io/queue": "research"}},
        "spec": {"suspend": True, "replicatedJobs": rjs},
    }


def placement(*replicas: tuple[str, int, str]) -> Placement:
    return Placement(
        "job-1",
        "job-1-run1",
        [ReplicaPlacement(role, rep, rank, node, list(range(8))) for rank, (role, rep, node) in enumerate(replicas)],
    )


def test_single_pod_job_is_pinned_by_node_selector_and_unsuspended():
    manifest = batch_job()
    before = copy.deepcopy(manifest)
    out = bind_manifest(manifest, placement(("worker", 0, "gpu-07")))
    assert manifest == before  # the input is not touched
    pod = out["spec"]["template"]
    assert out["spec"]["suspend"] is False
    assert pod["spec"]["nodeSelector"] == {HOSTNAME: "gpu-07"}
    assert pod["metadata"]["annotations"][RANK_ANNOTATION] == "0"
    assert pod["metadata"]["annotations"][GPUS_ANNOTATION] == "0,1,2,3,4,5,6,7"
    assert "schedulingGates" not in pod["spec"]
    assert out["metadata"]["annotations"]["trainyard.io/run-id"] == "job-1-run1"


def test_indexed_job_gets_node_affinity_and_a_gate_then_each_pod_its_node():
    manifest = batch_job(parallelism=2)
    chosen = placement(("worker", 0, "gpu-02"), ("worker", 1, "gpu-01"))
    out = bind_manifest(manifest, chosen)
    spec = out["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": ["gpu-01", "gpu-02"]}]}]
    assert spec["schedulingGates"] == [{"name": GATE}]
    pod = {
        "metadata": {"name": "train-1-abc", "labels": {"batch.kubernetes.io/job-completion-index": "1"}},
        "spec": {"schedulingGates": [{"name": GATE}, {"name": "other"}], "containers": [container()]},
    }
    pinned = pin_pod(pod, chosen, out)
    assert pinned["spec"]["nodeSelector"] == {HOSTNAME: "gpu-01"}
    assert pinned["spec"]["schedulingGates"] == [{"name": "other"}]
    assert pinned["metadata"]["annotations"][RANK_ANNOTATION] == "1"


def test_jobset_roles_are_pinned_per_replicated_job():
    manifest = jobset({"trainer": (2, 1), "rollout": (1, 1)})
    chosen = placement(("trainer", 0, "a"), ("trainer", 1, "b"), ("rollout", 0, "c"))
    out = bind_manifest(manifest, chosen, creating=True)
    trainer, rollout = out["spec"]["replicatedJobs"]
    t_pod = trainer["template"]["spec"]["template"]
    r_pod = rollout["template"]["spec"]["template"]
    assert r_pod["spec"]["nodeSelector"] == {HOSTNAME: "c"}
    assert t_pod["spec"]["schedulingGates"] == [{"name": GATE}]
    env = {e["name"]: e for e in t_pod["spec"]["containers"][0]["env"]}
    assert env["TRAINYARD_WORLD_SIZE"]["value"] == "3"
    assert env["TRAINYARD_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.annotations['{RANK_ANNOTATION}']"
    pod = {
        "metadata": {
            "name": "llm-trainer-1-0",
            "labels": {
                "jobset.sigs.k8s.io/replicatedjob-name": "trainer",
                "jobset.sigs.k8s.io/job-index": "1",
                "batch.kubernetes.io/job-completion-index": "0",
            },
        },
        "spec": {"schedulingGates": [{"name": GATE}]},
    }
    assert pin_pod(pod, chosen, out)["spec"]["nodeSelector"] == {HOSTNAME: "b"}


def test_a_new_manifest_gets_gpu_limits_and_env():
    manifest = batch_job(gpus=None)
    out = bind_manifest(manifest, placement(("worker", 0, "n1")), creating=True)
    (c,) = out["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert {e["name"] for e in c["env"]} == {
        "TRAINYARD_RANK",
        "TRAINYARD_WORLD_SIZE",
        "TRAINYARD_ROLE",
        "TRAINYARD_RUN_ID",
    }


def test_existing_node_affinity_terms_are_narrowed_not_replaced():
    manifest = batch_job(parallelism=2)
    pool = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["h100"]}]}
    required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [pool]}}
    manifest["spec"]["template"]["spec"]["affinity"] = {"nodeAffinity": required}
    out = bind_manifest(manifest, placement(("worker", 0, "n1"), ("worker", 1, "n2")))
    (term,) = out["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert [e["key"] for e in term["matchExpressions"]] == ["pool", HOSTNAME]


@pytest.mark.parametrize(
    "manifest, chosen, message",
    [
        pytest.param(
            batch_job(queue=False),
            placement(("worker", 0, "n1")),
            "trainyard.io/queue",
            id="a job Trainyard does not queue is refused",
        ),
        pytest.param(
            batch_job(suspend=False),
            placement(("worker", 0, "n1")),
            "not suspended",
            id="a job that is already running is refused",
        ),
        pytest.param(
            batch_job(),
            placement(("worker", 0, "n1"), ("worker", 1, "n2")),
            "has 1 pods",
            id="pod count must match the replica count",
        ),
        pytest.param(
            batch_job(),
            placement(("a", 0, "n1"), ("b", 0, "n2")),
            "use a JobSet",
            id="a batch Job cannot carry two roles",
        ),
        pytest.param(
            jobset({"trainer": (1, 1)}),
            placement(("trainer", 0, "n1"), ("rollout", 0, "n2")),
            "no replicatedJob",
            id="every role needs a replicatedJob",
        ),
        pytest.param(
            batch_job(gpus=4),
            placement(("worker", 0, "n1")),
            "ask for 4",
            id="an existing job asking for other GPU counts than placed is refused",
        ),
        pytest.param(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"labels": {"trainyard.io/queue": "q"}},
                "spec": {"suspend": True},
            },
            placement(("w", 0, "n1")),
            "only batch/v1 Job",
            id="other kinds are refused",
        ),
    ],
)
def test_manifests_that_cannot_be_bound_say_why(manifest, chosen, message):
    with pytest.raises(BindError, match=message):
        bind_manifest(manifest, chosen)


def k8s_node(name: str = "gpu-01", gpus: str | None = "8", labels: dict | None = None, **spec) -> dict:
    allocatable = {"cpu": "95500m", "memory": "2Ti"}
    if gpus is not None:
        allocatable["nvidia.com/gpu"] = gpus
    return {
        "metadata": {
            "name": name,
            "labels": labels
            if labels is not None
            else {
                "topology.kubernetes.io/zone": "us-east-1a",
                "network.topology.kubernetes.io/block": "b7",
                "network.topology.kubernetes.io/rack": "r42",
                "nvidia.com/gpu.clique": "clique-3",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            },
        },
        "spec": spec,
        "status": {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_node_topology_comes_from_labels():
    info = node_info_from_k8s(k8s_node(), "c1")
    assert (info.gpu_type, info.gpus, info.zone, info.block, info.rack, info.nvlink) == (
        "H100",
        8,
        "us-east-1a",
        "b7",
        "r42",
        "clique-3",
    )
    assert info.cpu == pytest.approx(95.5) and info.memory_gib == pytest.approx(2048)


def test_unlabelled_node_claims_no_locality():
    info = node_info_from_k8s(k8s_node(labels={}), "c1")
    assert info.rack == "~gpu-01" and info.block == "~gpu-01" and info.nvlink == "gpu-01"


def test_node_without_gpus_is_not_a_gpu_node():
    assert node_info_from_k8s(k8s_node(gpus=None), "c1") is None


@pytest.mark.parametrize(
    "node, schedulable",
    [
        pytest.param(k8s_node(), True, id="a ready node takes work"),
        pytest.param(k8s_node(unschedulable=True), False, id="a cordoned node takes no work"),
        pytest.param(
            k8s_node(taints=[{"key": "trainyard.io/health", "effect": "NoSchedule"}]),
            False,
            id="a node tainted by health checks takes no work",
        ),
        pytest.param(
            k8s_node(taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
            True,
            id="the usual GPU taint does not stop GPU jobs",
        ),
        pytest.param(
            k8s_node(taints=[{"key": "x", "effect": "PreferNoSchedule"}]), True, id="a soft taint does not stop work"
        ),
    ],
)
def test_node_schedulable(node, schedulable):
    assert node_view_from_k8s(node, "c1").schedulable is schedulable


def test_not_ready_node_takes_no_work_and_used_gpus_are_not_free():
    node = k8s_node()
    node["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    view = node_view_from_k8s(node, "c1", used_gpus=(0, 1))
    assert not view.schedulable and view.free_gpus == (2, 3, 4, 5, 6, 7)


@pytest.mark.parametrize(
    "product, expected",
    [
        ("NVIDIA-H100-80GB-HBM3", "H100"),
        ("NVIDIA-GB200", "GB200"),
        ("NVIDIA-L40S", "L40S"),
        ("Tesla-T4", "T4"),
        ("Weird GPU/9000", "Weird-GPU-9000"),
        (None, "unknown"),
    ],
)
def test_gpu_type_of(product, expected):
    assert gpu_type_of(product) == expected


@pytest.mark.parametrize("text, value", [("96", 96), ("95500m", 95.5), ("1Ki", 1024), ("2G", 2e9), (4, 4)])
def test_parse_quantity(text, value):
    assert parse_quantity(text) == pytest.approx(value)


@pytest.mark.parametrize(
    "ref, expected",
    [
        pytest.param("kube:Job/team-a/train", ("Job", "team-a", "train"), id="a Job by namespace and name"),
        pytest.param("kube:JobSet/research/llm-7b.v2", ("JobSet", "research", "llm-7b.v2"), id="a JobSet"),
        pytest.param(None, None, id="no workload_ref at all"),
        pytest.param("Job/team-a/train", None, id="without the kube: scheme"),
        pytest.param("kube:Deployment/team-a/web", None, id="a kind Trainyard does not bind"),
        pytest.param("kube:Job/team-a", None, id="no name"),
        pytest.param("kube:Job/Team_A/train", None, id="a namespace that is not a DNS name"),
        pytest.param("kube:Job/team-a/train/extra", None, id="a name with a slash"),
    ],
)
def test_a_workload_ref_names_the_object_to_bind(ref, expected):
    if expected is None:
        with pytest.raises(BindError, match="kube:Job/NAMESPACE/NAME"):
            workload_object(ref)
    else:
        assert workload_object(ref) == expected


def test_an_object_needs_binding_until_it_carries_this_run():
    chosen = placement(("worker", 0, "gpu-07"))
    assert needs_bind(batch_job(), chosen)
    bound = bind_manifest(batch_job(), chosen)
    assert not needs_bind(bound, chosen)  # a repeat after a restart changes nothing
    other = Placement(chosen.job_id, "job-1-run2", chosen.replicas)
    with pytest.raises(BindError, match="bound to run 'job-1-run1'"):
        needs_bind(bound, other)
    with pytest.raises(BindError, match="not suspended"):
        needs_bind(batch_job(suspend=False), chosen)
