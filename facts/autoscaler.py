"""The Kubernetes Cluster Autoscaler as both sides see it: infra tags the node groups and trusts its
service account with an IAM role; the workloads install it under that identity to discover those tags."""
from __future__ import annotations

from facts.nodes import AUTOSCALER_PREFIX

NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "cluster-autoscaler"


def discovery_tags(cluster_name: str) -> dict[str, str]:
    """What --node-group-auto-discovery matches on an Auto Scaling Group, and its IAM policy's write condition."""
    return {f"{AUTOSCALER_PREFIX}/enabled": "true", f"{AUTOSCALER_PREFIX}/{cluster_name}": "owned"}
