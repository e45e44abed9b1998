"""NetworkPolicies of the Ray namespace, as data: nothing reaches a Ray pod but the Ray cluster itself.

The Jobs API on the head is remote code execution guarded only by the token; inside the cluster
every pod could otherwise reach it. Ingress to the namespace is denied by default, and the
RayCluster's pods (KubeRay labels every one `ray.io/cluster: <name>`) accept connections only
from each other on any port (GCS, raylets, object managers, worker ports and NCCL's TCP
bootstrap) and, on the dashboard port, from the KubeRay operator's namespace. `kubectl
port-forward` and the kubelet's probes come from the pod's own node, which NetworkPolicy
always allows. Egress stays open (S3, the Hugging Face hub, DNS); EFA traffic does not pass
through the kernel's IP stack at all.

The Amazon VPC CNI enforces these only with its network policy agent on
(`enableNetworkPolicy: "true"` in the vpc-cni add-on's configuration, which the EKS cluster sets).
"""
from __future__ import annotations

from facts import ray as ray_facts
from workloads import charts
from workloads.settings import Workloads

API_VERSION = "networking.k8s.io/v1"
KIND = "NetworkPolicy"
RAY_CLUSTER_LABEL = ray_facts.CLUSTER_LABEL
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace
DASHBOARD_PORT = ray_facts.DASHBOARD_PORT


def default_deny_ingress(settings: Workloads) -> dict:
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"name": "default-deny-ingress", "namespace": settings.namespace,
                     "labels": {"app.kubernetes.io/part-of": settings.project}},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
    }


def ray_cluster_ingress(settings: Workloads) -> dict:
    ray_pods = {"matchLabels": {RAY_CLUSTER_LABEL: settings.ray_cluster_name}}
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"name": f"{settings.ray_cluster_name}-ray-ingress", "namespace": settings.namespace,
                     "labels": {"app.kubernetes.io/part-of": settings.project}},
        "spec": {
            "podSelector": ray_pods,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": ray_pods}]},
                {"from": [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: charts.OPERATOR_NAMESPACE}}}],
                 "ports": [{"protocol": "TCP", "port": DASHBOARD_PORT}]},
            ],
        },
    }


# KubeRay v1.7.0 labels every pod of a cluster it creates for a RayJob with the RayJob's kind and name
# (utils.RayOriginatedFromCRDLabelKey / RayOriginatedFromCRNameLabelKey, common/pod.go); its cluster's own
# name is generated, so the RayCluster's policy above never matches them.
ORIGINATED_FROM_CRD_LABEL = "ray.io/originated-from-crd"
RAY_JOB_CRD = "RayJob"


def rayjob_clusters_ingress(settings: Workloads) -> dict:
    """The clusters of `trainer submit --rayjob`: the same two rules, for every pod a RayJob's cluster has.

    Pods of two RayJobs of this namespace can reach each other (a NetworkPolicy cannot say "the same
    generated cluster"); both are this stack's jobs, behind the same token-free-from-outside namespace.
    The operator submits the job over the dashboard port (submissionMode HTTPMode)."""
    job_pods = {"matchLabels": {ORIGINATED_FROM_CRD_LABEL: RAY_JOB_CRD}}
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"name": "rayjob-clusters-ray-ingress", "namespace": settings.namespace,
                     "labels": {"app.kubernetes.io/part-of": settings.project}},
        "spec": {
            "podSelector": job_pods,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": job_pods}]},
                {"from": [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: charts.OPERATOR_NAMESPACE}}}],
                 "ports": [{"protocol": "TCP", "port": DASHBOARD_PORT}]},
            ],
        },
    }


def policies(settings: Workloads) -> list[dict]:
    return [default_deny_ingress(settings), ray_cluster_ingress(settings), rayjob_clusters_ingress(settings)]
