"""One EKS managed node group per node pool, and the EFA fabric (security group) of each AZ."""
from __future__ import annotations

from typing import Sequence

import pulumi
import pulumi_aws as aws

from facts.autoscaler import discovery_tags
from infra import autoscaling, legacy
from infra import node_pools as pools
from infra.node_pools import NodePool
from infra.resources import children_options


class EfaFabric(pulumi.ComponentResource):
    """The security group every EFA interface of one AZ carries: all traffic to AND from itself.

    0.0.0.0/0 egress does not cover the outbound self rule (symptom: "Unresponsive receiver").
    One per AZ, shared by every EFA pool there, so nodes of two pools reach each other over EFA.
    """

    def __init__(self, name: str, *, vpc_id: pulumi.Input[str], tags: dict[str, str],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("raytrain:infra:EfaFabric", name, None, opts)
        child = pulumi.ResourceOptions.merge(children_options(self, opts), pulumi.ResourceOptions(
            aliases=legacy.children_of(legacy.GPU_NODE_GROUP, name)))
        self.security_group = aws.ec2.SecurityGroup(
            f"{name}-efa", vpc_id=vpc_id, description="EFA: all traffic within the group",
            tags={**tags, "Name": f"{name}-efa"}, opts=child)
        sg = self.security_group
        aws.vpc.SecurityGroupIngressRule(f"{name}-efa-in", security_group_id=sg.id, referenced_security_group_id=sg.id,
                                         ip_protocol="-1", description="EFA inbound from itself", tags=tags, opts=child)
        aws.vpc.SecurityGroupEgressRule(f"{name}-efa-out", security_group_id=sg.id, referenced_security_group_id=sg.id,
                                        ip_protocol="-1", description="EFA outbound to itself", tags=tags, opts=child)
        self.register_outputs({"securityGroupId": sg.id})


class NodeGroup(pulumi.ComponentResource):
    """A managed node group of one pool: its launch template, placement group and, scaled, its ASG tags."""

    def __init__(self, pool: NodePool, *, cluster_name: pulumi.Input[str], cluster_name_tag: str,
                 node_role_arn: pulumi.Input[str], subnet_ids: Sequence[pulumi.Input[str]],
                 availability_zone: str | None, security_group_ids: Sequence[pulumi.Input[str]],
                 tags: dict[str, str], kubernetes_version: str | None = None,
                 opts: pulumi.ResourceOptions | None = None):
        """`kubernetes_version`: the control plane's, which the nodes follow (EKS refuses the next control-plane
        bump while node groups lag); `security_group_ids` go on EFA interfaces;
        `cluster_name_tag` is the cluster's name as CA discovers it;
        `availability_zone` is the pool's zone when it has one (EFA, or pinned)."""
        name = pool.name
        super().__init__("raytrain:infra:NodeGroup", name, None, pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(aliases=legacy.node_group(bool(pool.gpus)))))
        child = children_options(self, opts)

        placement_group_name = None
        if pool.placement_group:
            zone_tag = {"availability-zone": availability_zone} if availability_zone else {}
            self.placement_group = aws.ec2.PlacementGroup(
                f"{name}-pg", strategy="cluster", tags={**tags, **zone_tag}, opts=child)
            placement_group_name = self.placement_group.name

        # A change of tagSpecifications makes a new template version, which EKS rolls out to every node
        # (the Ray head's and running jobs' included): the user's tags reach new instances when the template
        # changes for another reason; the template's own tags, and the node group's, update in place.
        self.launch_template = aws.ec2.LaunchTemplate(f"{name}-lt", **pools.launch_template(
            pool, security_group_ids=list(security_group_ids), placement_group=placement_group_name, tags=tags),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(ignore_changes=["tagSpecifications"])))
        group_tags = {**tags, **(discovery_tags(cluster_name_tag) if pool.scale_to_zero else {})}
        self.node_group = aws.eks.NodeGroup(
            f"{name}-ng",
            cluster_name=cluster_name,
            node_role_arn=node_role_arn,
            subnet_ids=list(subnet_ids),
            # A launch template that names the instance type (Capacity Blocks) forbids instanceTypes here.
            instance_types=None if pool.capacity_type == "CAPACITY_BLOCK" else [pool.instance_type],
            ami_type=pools.ami_type(pool),
            version=kubernetes_version,
            capacity_type=pool.capacity_type,
            labels=pools.node_labels(pool),
            taints=[aws.eks.NodeGroupTaintArgs(**t.node_group()) for t in pool.taints] or None,
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=self.launch_template.id, version=self.launch_template.latest_version.apply(str)),
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(**pools.scaling(pool)),
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
            tags=group_tags,
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(ignore_changes=pools.ignore_changes(pool))),
        )

        # EKS keeps node-group tags off the Auto Scaling Group it creates; the Cluster Autoscaler reads the ASG.
        self.asg_tags: list[aws.autoscaling.Tag] = []
        if asg_tags := autoscaling.asg_tags(pool, cluster_name_tag):
            asg_name = self.node_group.resources.apply(lambda groups: groups[0].autoscaling_groups[0].name)
            self.asg_tags = [
                aws.autoscaling.Tag(
                    f"{name}-asg-{autoscaling.tag_resource_name(key)}",
                    autoscaling_group_name=asg_name,
                    tag=aws.autoscaling.TagTagArgs(key=key, value=value, propagate_at_launch=False),
                    opts=child)
                for key, value in asg_tags.items()
            ]
        self.register_outputs({"nodeGroupName": self.node_group.node_group_name})
