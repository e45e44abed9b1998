"""The two managed node groups: CPU system nodes and single-AZ EFA GPU nodes."""
from __future__ import annotations

import pulumi
import pulumi_aws as aws

from facts import nodes as node_facts
from infra import autoscaling, nodes
from infra.config import StackConfig
from infra.resources import children_options


def _efa_security_group(name: str, vpc_id, tags, opts) -> aws.ec2.SecurityGroup:
    """EFA needs all traffic to AND from itself; 0.0.0.0/0 egress does not cover the outbound rule."""
    sg = aws.ec2.SecurityGroup(f"{name}-efa", vpc_id=vpc_id, description="EFA: all traffic within the group",
                               tags={**tags, "Name": f"{name}-efa"}, opts=opts)
    aws.vpc.SecurityGroupIngressRule(f"{name}-efa-in", security_group_id=sg.id, referenced_security_group_id=sg.id,
                                     ip_protocol="-1", description="EFA inbound from itself", tags=tags, opts=opts)
    aws.vpc.SecurityGroupEgressRule(f"{name}-efa-out", security_group_id=sg.id, referenced_security_group_id=sg.id,
                                    ip_protocol="-1", description="EFA outbound to itself", tags=tags, opts=opts)
    return sg


class SystemNodeGroup(pulumi.ComponentResource):
    """CPU nodes for the Ray head, the KubeRay operator and cluster add-ons."""

    def __init__(self, name: str, cfg: StackConfig, *, cluster_name, node_role_arn, subnet_ids,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("raytrain:infra:SystemNodeGroup", name, None, opts)
        child = children_options(self, opts)
        tags = cfg.resource_tags
        template = aws.ec2.LaunchTemplate(f"{name}-lt", **nodes.system_launch_template(tags), opts=child)
        self.node_group = aws.eks.NodeGroup(
            f"{name}-ng",
            cluster_name=cluster_name,
            node_role_arn=node_role_arn,
            subnet_ids=subnet_ids,
            instance_types=[cfg.system_node_type],
            ami_type="AL2023_x86_64_STANDARD",
            capacity_type="ON_DEMAND",
            labels=node_facts.SYSTEM_LABELS,
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(id=template.id, version=template.latest_version.apply(str)),
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                desired_size=cfg.system_node_count, min_size=cfg.system_node_count, max_size=cfg.system_node_count),
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
            tags=tags,
            opts=child,
        )
        self.register_outputs({"nodeGroupName": self.node_group.node_group_name})


class GpuNodeGroup(pulumi.ComponentResource):
    """GPU nodes in one private subnet, every EFA interface of the instance type attached."""

    def __init__(self, name: str, cfg: StackConfig, *, cluster_name, node_role_arn, vpc_id, subnet_id,
                 cluster_security_group_id, availability_zone: str, opts: pulumi.ResourceOptions | None = None):
        super().__init__("raytrain:infra:GpuNodeGroup", name, None, opts)
        child = children_options(self, opts)
        tags = cfg.resource_tags
        self.efa_security_group = _efa_security_group(name, vpc_id, tags, child)

        placement_group_name = None
        if cfg.placement_group:
            self.placement_group = aws.ec2.PlacementGroup(
                f"{name}-pg", strategy="cluster", tags={**tags, "availability-zone": availability_zone}, opts=child)
            placement_group_name = self.placement_group.name

        self.launch_template = aws.ec2.LaunchTemplate(f"{name}-lt", **nodes.gpu_launch_template(
            cfg.gpu,
            security_group_ids=[cluster_security_group_id, self.efa_security_group.id],
            placement_group=placement_group_name,
            capacity_reservation_id=cfg.capacity_reservation_id,
            tags=tags,
            capacity_block=cfg.capacity_type == "CAPACITY_BLOCK",
        ), opts=child)

        self.node_group = aws.eks.NodeGroup(
            f"{name}-ng",
            cluster_name=cluster_name,
            node_role_arn=node_role_arn,
            subnet_ids=[subnet_id],
            # A launch template that names the instance type (Capacity Blocks) forbids instanceTypes here.
            instance_types=None if cfg.capacity_type == "CAPACITY_BLOCK" else [cfg.gpu_node_type],
            ami_type="AL2023_x86_64_NVIDIA",
            capacity_type=cfg.capacity_type,
            labels=autoscaling.gpu_labels(cfg),
            taints=[aws.eks.NodeGroupTaintArgs(**node_facts.GPU_TAINT.node_group())],
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=self.launch_template.id, version=self.launch_template.latest_version.apply(str)),
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(**autoscaling.gpu_scaling(cfg)),
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
            tags=autoscaling.gpu_node_group_tags(cfg),
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(ignore_changes=autoscaling.gpu_ignore_changes(cfg))),
        )

        # EKS keeps node-group tags off the Auto Scaling Group it creates; the Cluster Autoscaler reads the ASG.
        self.asg_tags: list[aws.autoscaling.Tag] = []
        if asg_tags := autoscaling.asg_tags(cfg):
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
