"""The `monitoring` stack key's `cloudwatch`: the amazon-cloudwatch-observability EKS add-on, its IAM through IRSA.

The add-on runs the CloudWatch agent and Fluent Bit as DaemonSets (Container Insights with enhanced
observability): per-pod and per-node CPU, memory and network, NVIDIA GPU metrics through its own DCGM
exporter on GPU nodes, and EFA metrics on nodes with EFA devices, into CloudWatch. Its service account
(amazon-cloudwatch/cloudwatch-agent) gets a role that only it can assume (the cluster's OIDC provider,
as the Ray pods' role) with AWS's managed CloudWatchAgentServerPolicy; nothing else in the cluster gains a
permission. It runs after the node groups, like coredns: its DaemonSets need nodes.
"""
from __future__ import annotations

from typing import Sequence

import pulumi
import pulumi_aws as aws

from infra import iam

ADDON = "amazon-cloudwatch-observability"
NAMESPACE = "amazon-cloudwatch"
SERVICE_ACCOUNT = "cloudwatch-agent"
POLICY_ARN = "arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy"


class CloudWatchObservability(pulumi.ComponentResource):
    def __init__(self, name: str, *, cluster_name: pulumi.Input[str], oidc_provider_arn: pulumi.Input[str],
                 oidc_issuer_url: pulumi.Input[str], tags: dict[str, str], depends_on: Sequence[pulumi.Resource],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("raytrain:infra:CloudWatchObservability", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.role = aws.iam.Role(
            f"{name}-irsa",
            assume_role_policy=pulumi.Output.all(oidc_provider_arn, oidc_issuer_url).apply(
                lambda a: iam.irsa_trust(a[0], a[1], NAMESPACE, SERVICE_ACCOUNT)),
            description="CloudWatch agent of the cluster: write Container Insights metrics and logs",
            tags=tags, opts=child)
        self.attachment = aws.iam.RolePolicyAttachment(f"{name}-policy", role=self.role.name, policy_arn=POLICY_ARN,
                                                       opts=child)
        self.addon = aws.eks.Addon(
            f"{name}-addon", cluster_name=cluster_name, addon_name=ADDON, service_account_role_arn=self.role.arn,
            resolve_conflicts_on_create="OVERWRITE", resolve_conflicts_on_update="OVERWRITE", tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*depends_on, self.attachment]))
        self.register_outputs({"addon": self.addon.addon_name})
