"""What protects a running job from voluntary disruptions: a PriorityClass and PodDisruptionBudgets, as data.

A node-group update (EKS managed node groups: a new launch template, AMI or Kubernetes version) drains
each old node through the Eviction API. Without a budget, the Ray head's eviction takes GCS with it and
every running job dies (a Ray Train run does not survive a head restart, kuberay issue 2153); a GPU
worker's eviction fails the run's worker group. With `maxUnavailable: 0` budgets on the head and the
workers, evictions of those pods are refused: EKS retries the drain for up to 15 minutes, then fails the
update with PodEvictionFailure (unless the update is forced), so the job keeps running and the update is
applied once no job runs (see docs/operations.md). The Ray autoscaler removes idle workers by deleting
their pods, not by eviction, so the budgets never block scale-down; the Cluster Autoscaler removes the
empty node afterwards.

The PriorityClass (on the head, see `prioritized`) puts it above everything else a user schedules (the default priority is 0): the
scheduler never preempts it for lower-priority pods, and a head waiting for room on a system node may
preempt those. It stays below system-cluster-critical (2000000000), so CoreDNS and the CNI keep theirs.
"""
from __future__ import annotations

from facts import ray as ray_facts
from workloads.network_policy import ORIGINATED_FROM_CRD_LABEL, RAY_JOB_CRD
from workloads.settings import Workloads

PRIORITY_CLASS = "raytrain-ray"
PRIORITY = 1_000_000
NODE_TYPE_LABEL = "ray.io/node-type"  # KubeRay v1.7.0 labels every Ray pod head or worker (utils.RayNodeTypeLabelKey)
NODE_TYPES = ("head", "worker")


def priority_class(settings: Workloads) -> dict:
    return {
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": PRIORITY_CLASS, "labels": {"app.kubernetes.io/part-of": settings.project}},
        "value": PRIORITY,
        "globalDefault": False,
        "preemptionPolicy": "PreemptLowerPriority",
        "description": "Ray head and workers of raytrain: above user pods, below the system's critical classes",
    }


def budget(settings: Workloads, node_type: str, owner: tuple[str, str], name: str) -> dict:
    """No voluntary eviction of the selected Ray pods (maxUnavailable 0)."""
    key, value = owner
    return {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": settings.namespace,
                     "labels": {"app.kubernetes.io/part-of": settings.project}},
        "spec": {"maxUnavailable": 0,
                 "selector": {"matchLabels": {key: value, NODE_TYPE_LABEL: node_type}}},
    }


def budgets(settings: Workloads) -> list[dict]:
    """Head and workers of the stack's RayCluster, and of every RayJob's own cluster (`submit --rayjob`)."""
    stack = (ray_facts.CLUSTER_LABEL, settings.ray_cluster_name)
    jobs = (ORIGINATED_FROM_CRD_LABEL, RAY_JOB_CRD)
    return [*(budget(settings, t, stack, f"{settings.ray_cluster_name}-{t}") for t in NODE_TYPES),
            *(budget(settings, t, jobs, f"rayjob-clusters-{t}") for t in NODE_TYPES)]


def prioritized(spec: dict) -> dict:
    """A RayCluster spec whose head pod carries the PriorityClass (a copy).

    The head only: it shares the system nodes with everything else, while a GPU worker claims a whole
    tainted node nobody else schedules on, so a priority there would preempt nothing."""
    import copy

    out = copy.deepcopy(spec)
    out["headGroupSpec"]["template"]["spec"]["priorityClassName"] = PRIORITY_CLASS
    return out
