"""The PriorityClass and PodDisruptionBudgets (workloads.disruption): what they select, and what they leave alone."""
from __future__ import annotations

from tests.guards import nonempty
from workloads import disruption, raycluster

from .conftest import settings

PDB = "kubernetes:policy/v1:PodDisruptionBudget"
PRIORITY_CLASS = "kubernetes:scheduling.k8s.io/v1:PriorityClass"
RAYCLUSTER = "kubernetes:ray.io/v1:RayCluster"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/ray@sha256:" + "ab" * 32


def selects(budget: dict, pod_labels: dict) -> bool:
    return all(pod_labels.get(k) == v for k, v in budget["spec"]["selector"]["matchLabels"].items())


def test_every_ray_pod_has_a_budget_that_refuses_its_eviction_and_no_other_pod_does():
    cfg = settings("dev")
    budgets = disruption.budgets(cfg)
    # the labels KubeRay v1.7.0 gives the pods: ray.io/cluster and ray.io/node-type on every Ray pod, and
    # ray.io/originated-from-crd on those of a cluster it created for a RayJob (its name is generated)
    pods = {
        "stack head": {"ray.io/cluster": "raytrain", "ray.io/node-type": "head"},
        "stack worker": {"ray.io/cluster": "raytrain", "ray.io/node-type": "worker"},
        "rayjob head": {"ray.io/cluster": "sft-1-x7k2p", "ray.io/node-type": "head",
                        "ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": "sft-1"},
        "rayjob worker": {"ray.io/cluster": "sft-1-x7k2p", "ray.io/node-type": "worker",
                          "ray.io/originated-from-crd": "RayJob"},
    }
    for name, labels in nonempty(pods.items(), "pods"):
        matching = [b for b in budgets if selects(b, labels)]
        assert len(matching) == 1, (name, matching)
        assert matching[0]["spec"] == {"maxUnavailable": 0, "selector": matching[0]["spec"]["selector"]}
        assert matching[0]["metadata"]["namespace"] == cfg.namespace
    for other in ({"app": "coredns"}, {"ray.io/cluster": "raytrain"}, {"ray.io/node-type": "head"}):
        assert not any(selects(b, other) for b in budgets), other


def test_the_priority_class_is_on_the_head_only():
    cfg = settings("dev", scaleToZero=True)
    spec = raycluster.spec(cfg, image=IMAGE, checkpoint_uri="s3://ckpt")
    ranked = disruption.prioritized(spec)
    assert ranked["headGroupSpec"]["template"]["spec"]["priorityClassName"] == disruption.PRIORITY_CLASS
    assert "priorityClassName" not in spec["headGroupSpec"]["template"]["spec"]  # a copy
    for group in nonempty(ranked["workerGroupSpecs"], "worker groups"):
        assert "priorityClassName" not in group["template"]["spec"]
    pc = disruption.priority_class(cfg)
    assert 0 < pc["value"] < 2_000_000_000 and pc["globalDefault"] is False  # below system-cluster-critical


def test_the_stack_declares_them_before_the_raycluster(dev_run):
    (pc,) = dev_run.of_type(PRIORITY_CLASS)
    assert pc.inputs["metadata"]["name"] == disruption.PRIORITY_CLASS and pc.inputs["value"] == disruption.PRIORITY
    names = sorted(r.inputs["metadata"]["name"] for r in dev_run.of_type(PDB))
    assert names == ["rayjob-clusters-head", "rayjob-clusters-worker", "raytrain-head", "raytrain-worker"]
    (cluster,) = dev_run.of_type(RAYCLUSTER)
    assert cluster.inputs["spec"]["headGroupSpec"]["template"]["spec"]["priorityClassName"] == disruption.PRIORITY_CLASS
    deps = dev_run.registrations[dev_run.urn(RAYCLUSTER, "ray-raycluster")].dependencies
    assert dev_run.urn(PRIORITY_CLASS, "ray-priority-class") in deps  # pods naming an unknown class are refused
    assert {dev_run.urn(PDB, f"ray-pdb-{n}") for n in names} <= deps
