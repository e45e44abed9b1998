"""Scale-to-zero for the GPU nodes: what the Cluster Autoscaler must see, as plain data, and its IRSA role.

With `scaleToZero` the KubeRay autoscaler adds a Ray GPU worker pod when a job asks for GPUs and
removes it after `gpuIdleTimeoutMinutes` idle; the Cluster Autoscaler (CA) adds a GPU node for a
Pending worker pod and removes a node that stayed empty for SCALE_DOWN_UNNEEDED_MINUTES. So an
idle stack bills no GPU node.

A node group at zero has no node CA could copy, so CA imagines one: instance type, CPU and memory
from the launch template, labels and taints from eks:DescribeNodegroup, and everything else from
node-template tags on the Auto Scaling Group. Extended resources (GPUs, EFA devices, huge pages)
exist only there, and EKS does not copy node-group tags to its ASG, so they are set on the ASG
itself (aws.autoscaling.Tag). Without them CA never scales a GPU group up from zero.
"""
from __future__ import annotations

import re

import pulumi
import pulumi_aws as aws

from facts import nodes as node_facts
from facts import resources
from infra import iam
from infra.config import StackConfig
from infra.resources import children_options

CA_NAMESPACE = "kube-system"
CA_SERVICE_ACCOUNT = "cluster-autoscaler"
DISCOVERY_PREFIX = node_facts.AUTOSCALER_PREFIX
ACCELERATOR_LABEL = node_facts.ACCELERATOR_LABEL

SCALE_DOWN_UNNEEDED_MINUTES = 5  # CA default 10
SCALE_DOWN_DELAY_AFTER_ADD_MINUTES = 5  # CA default 10: no scale-down at all for that long after a scale-up
# CA owns the GPU group's size once it runs; Pulumi sets it only at creation. The engine wants the
# schema (camelCase) path: "scaling_config.desired_size" is silently ignored (pulumi/pulumi#7081).
GPU_SCALING_IGNORED = ("scalingConfig.desiredSize",)


def discovery_tags(cluster_name: str) -> dict[str, str]:
    """What CA's --node-group-auto-discovery matches, and what its IAM policy's write condition requires."""
    return {f"{DISCOVERY_PREFIX}/enabled": "true", f"{DISCOVERY_PREFIX}/{cluster_name}": "owned"}


def gpu_labels(cfg: StackConfig) -> dict[str, str]:
    labels = dict(node_facts.GPU_LABELS)
    if cfg.scale_to_zero:
        labels[ACCELERATOR_LABEL] = node_facts.accelerator(cfg.gpu.gpu_model)
    return labels


def gpu_scaling(cfg: StackConfig) -> dict[str, int]:
    """Fixed size, or 0..gpuNodeCount starting at 0 (CA then moves desired_size)."""
    if cfg.scale_to_zero:
        return {"min_size": 0, "max_size": cfg.gpu_node_count, "desired_size": 0}
    return {"min_size": cfg.gpu_node_count, "max_size": cfg.gpu_node_count, "desired_size": cfg.gpu_node_count}


def gpu_ignore_changes(cfg: StackConfig) -> list[str] | None:
    return list(GPU_SCALING_IGNORED) if cfg.scale_to_zero else None


def gpu_node_group_tags(cfg: StackConfig) -> dict[str, str]:
    tags = dict(cfg.resource_tags)
    if cfg.scale_to_zero:
        tags.update(discovery_tags(cfg.cluster_name))
    return tags


def node_template_tags(cfg: StackConfig) -> dict[str, str]:
    """What one GPU node of this group offers, as CA reads it from ASG tags when the group is at zero."""
    return node_facts.template_tags(resources.extended(cfg.gpu), gpu_labels(cfg), (node_facts.GPU_TAINT,))


def asg_tags(cfg: StackConfig) -> dict[str, str]:
    """Tags for the GPU node group's Auto Scaling Group; none without scale-to-zero."""
    if not cfg.scale_to_zero:
        return {}
    return {**discovery_tags(cfg.cluster_name), **node_template_tags(cfg)}


def tag_resource_name(key: str) -> str:
    """k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu -> node-template-resources-nvidia-com-gpu"""
    return re.sub(r"[^A-Za-z0-9]+", "-", key.removeprefix(f"{DISCOVERY_PREFIX}/")).strip("-").lower()


class ClusterAutoscalerRole(pulumi.ComponentResource):
    """IRSA role of the Cluster Autoscaler: trusted only by its service account in kube-system."""

    def __init__(self, name: str, cfg: StackConfig, *, oidc_provider_arn, oidc_issuer_url,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("raytrain:infra:ClusterAutoscalerRole", name, None, opts)
        child = children_options(self, opts)
        self.role = aws.iam.Role(
            f"{name}-irsa",
            assume_role_policy=pulumi.Output.all(oidc_provider_arn, oidc_issuer_url).apply(
                lambda a: iam.irsa_trust(a[0], a[1], CA_NAMESPACE, CA_SERVICE_ACCOUNT)),
            description=f"Cluster Autoscaler of {cfg.cluster_name}: resize its own node groups",
            tags=cfg.resource_tags, opts=child)
        self.policy = aws.iam.RolePolicy(f"{name}-irsa-scaling", role=self.role.id,
                                         policy=iam.cluster_autoscaler_policy(cfg.cluster_name), opts=child)
        self.register_outputs({"roleArn": self.role.arn})
