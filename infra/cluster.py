"""The EKS control plane, its add-ons, the OIDC provider for IRSA and access entries."""
from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from infra import aws_rules, iam
from infra.resources import children_options

CONTROL_PLANE_LOGS = ["api", "audit", "authenticator"]
# Installed before any node joins (networking), or after the system nodes (coredns needs a node).
EARLY_ADDONS = ("vpc-cni", "kube-proxy")
LATE_ADDONS = ("coredns",)
# The VPC CNI enforces Kubernetes NetworkPolicies (workloads/network_policy.py) only with its
# network policy agent on (EKS user guide, cni-network-policy).
ADDON_CONFIGURATION = {"vpc-cni": {"enableNetworkPolicy": "true"}}


def kubeconfig(cluster_name: str, endpoint: str, ca_data: str, region: str) -> str:
    """A kubeconfig that authenticates with `aws eks get-token`: no static credentials."""
    return json.dumps({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": {"server": endpoint, "certificate-authority-data": ca_data}}],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": cluster_name}}],
        "current-context": cluster_name,
        "users": [{"name": cluster_name, "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "aws",
            "args": ["eks", "get-token", "--cluster-name", cluster_name, "--region", region, "--output", "json"],
            "interactiveMode": "Never",
        }}}],
    })


class EksCluster(pulumi.ComponentResource):
    """Control plane with API authentication mode, restricted public endpoint and IRSA."""

    def __init__(self, name: str, *, cluster_name: str, kubernetes_version: str, region: str,
                 api_access_cidrs: tuple[str, ...], admin_role_arns: tuple[str, ...], log_retention_days: int,
                 subnet_ids: list[pulumi.Input[str]], network_ready: list[pulumi.Resource], tags: dict[str, str],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("raytrain:infra:EksCluster", name, None, opts)
        child = children_options(self, opts)

        role = aws.iam.Role(f"{name}-cluster-role", assume_role_policy=iam.service_trust("eks.amazonaws.com"),
                            tags=tags, opts=child)
        attachments = [aws.iam.RolePolicyAttachment(f"{name}-cluster-{i}", role=role.name,
                                                    policy_arn=aws_rules.in_partition(arn, region), opts=child)
                       for i, arn in enumerate(iam.EKS_CLUSTER_POLICIES)]

        # EKS would create /aws/eks/<name>/cluster itself, with no retention and outliving `destroy`;
        # created here first, the program owns it.
        self.log_group = aws.cloudwatch.LogGroup(
            f"{name}-logs", name=f"/aws/eks/{cluster_name}/cluster",
            retention_in_days=log_retention_days, tags=tags, opts=child)
        self.cluster = aws.eks.Cluster(
            f"{name}-eks",
            name=cluster_name,
            version=kubernetes_version,
            role_arn=role.arn,
            vpc_config=aws.eks.ClusterVpcConfigArgs(
                subnet_ids=subnet_ids,
                endpoint_private_access=True,
                endpoint_public_access=True,
                public_access_cidrs=list(api_access_cidrs),
            ),
            access_config=aws.eks.ClusterAccessConfigArgs(
                authentication_mode="API",
                bootstrap_cluster_creator_admin_permissions=True,
            ),
            bootstrap_self_managed_addons=False,
            enabled_cluster_log_types=CONTROL_PLANE_LOGS,
            upgrade_policy=aws.eks.ClusterUpgradePolicyArgs(support_type="STANDARD"),
            tags=tags,
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[*attachments, *network_ready, self.log_group])),
        )

        self.oidc_issuer = self.cluster.identities.apply(lambda ids: ids[0]["oidcs"][0]["issuer"])
        self.oidc_provider = aws.iam.OpenIdConnectProvider(
            f"{name}-oidc", url=self.oidc_issuer, client_id_lists=["sts.amazonaws.com"], tags=tags, opts=child)

        self.kubernetes_version = kubernetes_version
        self.early_addons = [
            aws.eks.Addon(f"{name}-{addon}", cluster_name=self.cluster.name, addon_name=addon,
                          addon_version=self.addon_version(addon),
                          resolve_conflicts_on_create="OVERWRITE", resolve_conflicts_on_update="OVERWRITE",
                          configuration_values=(json.dumps(ADDON_CONFIGURATION[addon])
                                                if addon in ADDON_CONFIGURATION else None),
                          tags=tags, opts=child)
            for addon in EARLY_ADDONS
        ]

        for i, principal in enumerate(admin_role_arns):
            entry = aws.eks.AccessEntry(f"{name}-admin-{i}", cluster_name=self.cluster.name,
                                        principal_arn=principal, type="STANDARD", tags=tags, opts=child)
            aws.eks.AccessPolicyAssociation(
                f"{name}-admin-{i}", cluster_name=self.cluster.name, principal_arn=entry.principal_arn,
                policy_arn=aws_rules.in_partition(iam.CLUSTER_ADMIN_POLICY, region),
                access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"), opts=child)

        self.node_role = aws.iam.Role(
            f"{name}-node-role", assume_role_policy=iam.service_trust(aws_rules.service_principal("ec2.amazonaws.com", region)),
            tags=tags, opts=child)
        self.node_role_attachments = [
            aws.iam.RolePolicyAttachment(f"{name}-node-{i}", role=self.node_role.name,
                                         policy_arn=aws_rules.in_partition(arn, region), opts=child)
            for i, arn in enumerate(iam.NODE_POLICIES)
        ]
        self.security_group_id = self.cluster.vpc_config.cluster_security_group_id
        self.kubeconfig = pulumi.Output.secret(pulumi.Output.all(
            self.cluster.name, self.cluster.endpoint, self.cluster.certificate_authority.data,
        ).apply(lambda a: kubeconfig(a[0], a[1], a[2], region)))
        self.register_outputs({"clusterName": self.cluster.name})

    def addon_version(self, addon: str) -> pulumi.Output[str]:
        """EKS's default version of the add-on for the cluster's Kubernetes version (DescribeAddonVersions):
        add-ons follow a version bump instead of keeping the version they were installed with."""
        return aws.eks.get_addon_version_output(addon_name=addon, kubernetes_version=self.kubernetes_version,
                                                most_recent=False, opts=pulumi.InvokeOutputOptions(parent=self)).version

    def late_addons(self, *, depends_on: list[pulumi.Resource]) -> list[aws.eks.Addon]:
        """Add-ons that need a node to schedule on (coredns)."""
        return [
            aws.eks.Addon(f"{self._name}-{addon}", cluster_name=self.cluster.name, addon_name=addon,
                          addon_version=self.addon_version(addon), resolve_conflicts_on_create="OVERWRITE",
                          resolve_conflicts_on_update="OVERWRITE",
                          tags=self.cluster.tags,
                          opts=pulumi.ResourceOptions(parent=self, depends_on=depends_on))
            for addon in LATE_ADDONS
        ]
