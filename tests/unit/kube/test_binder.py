"""The binder's calls, checked against the real client's signatures (no API server here).

``create_autospec`` makes every call fail unless it matches the signature of
the installed ``kubernetes`` client, so argument order and method names are
checked; what the API server would answer is not.
"""

from __future__ import annotations

from unittest import mock

from kubernetes import client
from test_translate import batch_job, jobset, k8s_node, placement

from trainyard.kube.binder import JOBSET_GROUP, JOBSET_PLURAL, JOBSET_VERSION, KubeBinder
from trainyard.kube.translate import GATE, HOSTNAME


def binder() -> KubeBinder:
    b = KubeBinder(client.ApiClient())
    b._custom = mock.create_autospec(client.CustomObjectsApi, instance=True)
    b._batch = mock.create_autospec(client.BatchV1Api, instance=True)
    b._core = mock.create_autospec(client.CoreV1Api, instance=True)
    return b


def test_bind_job_reads_translates_and_replaces():
    b = binder()
    b._batch.read_namespaced_job.return_value = batch_job()
    b._batch.replace_namespaced_job.side_effect = lambda name, ns, body: body
    out = b.bind("Job", "team-a", "train", placement(("worker", 0, "gpu-07")))
    b._batch.read_namespaced_job.assert_called_once_with("train", "team-a")
    assert out["spec"]["suspend"] is False
    assert out["spec"]["template"]["spec"]["nodeSelector"] == {HOSTNAME: "gpu-07"}


def test_bind_jobset_goes_through_the_custom_objects_api():
    b = binder()
    b._custom.get_namespaced_custom_object.return_value = jobset({"trainer": (1, 1)})
    b._custom.replace_namespaced_custom_object.side_effect = lambda *args: args[-1]
    b.bind("JobSet", "team-a", "llm", placement(("trainer", 0, "n1")))
    args = b._custom.replace_namespaced_custom_object.call_args.args
    assert args[:5] == (JOBSET_GROUP, JOBSET_VERSION, "team-a", JOBSET_PLURAL, "llm")


def test_create_binds_a_new_manifest_before_creating_it():
    b = binder()
    b._batch.create_namespaced_job.side_effect = lambda ns, body: body
    out = b.create("team-a", batch_job(gpus=None), placement(("worker", 0, "n1")))
    assert out["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
    b._custom.create_namespaced_custom_object.side_effect = lambda *args: args[-1]
    b.create("team-a", jobset({"trainer": (1, 1)}), placement(("trainer", 0, "n1")))
    assert b._custom.create_namespaced_custom_object.call_args.args[:4] == (
        JOBSET_GROUP,
        JOBSET_VERSION,
        "team-a",
        JOBSET_PLURAL,
    )


def test_pin_pods_pins_only_gated_pods():
    b = binder()
    chosen = placement(("worker", 0, "n1"), ("worker", 1, "n2"))
    b._batch.read_namespaced_job.return_value = batch_job(parallelism=2)
    gated = {
        "metadata": {"name": "p1", "labels": {"batch.kubernetes.io/job-completion-index": "1"}},
        "spec": {"schedulingGates": [{"name": GATE}]},
    }
    free = {"metadata": {"name": "p0"}, "spec": {}}
    b._core.list_namespaced_pod.return_value = {"items": [gated, free]}
    assert b.pin_pods("Job", "team-a", "train", chosen) == 1
    name, ns, body = b._core.replace_namespaced_pod.call_args.args
    assert (name, ns, body["spec"]["nodeSelector"]) == ("p1", "team-a", {HOSTNAME: "n2"})


def test_nodes_keeps_gpu_nodes_only():
    b = binder()
    b._core.list_node.return_value = {"items": [k8s_node("a"), k8s_node("cpu-only", gpus=None)]}
    views = b.nodes("c1", used={"a": (0,)})
    assert [v.info.node_id for v in views] == ["a"]
    assert views[0].free_gpus == (1, 2, 3, 4, 5, 6, 7)


def test_reconcile_binds_a_suspended_object_once_and_pins_gated_pods_every_time():
    b = binder()
    chosen = placement(("worker", 0, "n1"), ("worker", 1, "n2"))
    stored = {"job": batch_job(parallelism=2)}
    b._batch.read_namespaced_job.side_effect = lambda name, ns: stored["job"]
    b._batch.replace_namespaced_job.side_effect = lambda name, ns, body: stored.update(job=body) or body
    gated = {
        "metadata": {"name": "p0", "labels": {"batch.kubernetes.io/job-completion-index": "0"}},
        "spec": {"schedulingGates": [{"name": GATE}]},
    }
    b._core.list_namespaced_pod.return_value = {"items": [gated]}

    assert b.reconcile("Job", "team-a", "train", chosen) == 1
    assert b._batch.replace_namespaced_job.call_count == 1
    b._core.list_namespaced_pod.return_value = {"items": []}
    assert b.reconcile("Job", "team-a", "train", chosen) == 0
    assert b._batch.replace_namespaced_job.call_count == 1  # bound already: not written again
