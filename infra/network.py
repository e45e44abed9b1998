"""The VPC: public subnets for the NAT gateway, private subnets for every node.

EKS needs subnets in at least two AZs for its control plane (and refuses some zone IDs,
infra.preflight picks around them); the GPU nodes use only the private subnet of the GPU AZ,
because EFA traffic does not cross AZs.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra import aws_rules

VPC_CIDR = "10.0.0.0/16"


@dataclass(frozen=True)
class SubnetPlan:
    az: str
    public_cidr: str
    private_cidr: str


# Each zone's subnets are numbered by the zone's letter (us-east-1c: c), never by its place in the zone
# list: a zone added to or dropped from the network, or a GPU zone that moves, renumbers no other subnet
# (cidr_block forces replacement, and the replacement is created while the old subnet still holds the CIDR).
# Private /19 per letter a-d in 10.0.0.0/17, e-f in 10.0.192.0/18; public /24 per letter in 10.0.128.0/19.
PRIVATE_SLOTS = {"a": 0, "b": 1, "c": 2, "d": 3, "e": 6, "f": 7}


def zone_letter(az: str) -> str:
    letter = az[-1:]
    if letter not in PRIVATE_SLOTS:
        raise ValueError(f"availability zone {az!r}: its subnets are numbered by the zone letter a-f, and "
                         f"{letter!r} is not one; pick a zone ending in a-f")
    return letter


def plan_subnets(azs: list[str], vpc_cidr: str = VPC_CIDR) -> list[SubnetPlan]:
    """One /19 private (pods take VPC addresses) and one /24 public subnet per AZ, each a function of the zone."""
    if len(azs) < 2:
        raise ValueError(f"EKS needs subnets in at least two availability zones, got {azs}")
    vpc = ipaddress.ip_network(vpc_cidr)
    private = list(vpc.subnets(new_prefix=19))
    public = list(private[4].subnets(new_prefix=24))
    letters = [zone_letter(az) for az in azs]
    if len(set(letters)) != len(letters):
        raise ValueError(f"availability zones {azs} share a zone letter; each needs its own")
    return [SubnetPlan(az, str(public[ord(letter) - ord("a")]), str(private[PRIVATE_SLOTS[letter]]))
            for az, letter in zip(azs, letters, strict=True)]


class Network(pulumi.ComponentResource):
    """VPC, subnets, one NAT gateway in the network's first zone by name, and route tables."""

    def __init__(self, name: str, *, azs: list[str], control_plane_azs: list[str], cluster_name: str, region: str,
                 s3_endpoint_policy: str, tags: dict[str, str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("raytrain:infra:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        def tagged(suffix: str, extra: dict[str, str] | None = None) -> dict[str, str]:
            return {**tags, "Name": f"{cluster_name}-{suffix}", **(extra or {})}

        self.vpc = aws.ec2.Vpc(f"{name}-vpc", cidr_block=VPC_CIDR, enable_dns_hostnames=True,
                               enable_dns_support=True, tags=tagged("vpc"), opts=child)
        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=self.vpc.id, tags=tagged("igw"), opts=child)
        public_rt = aws.ec2.RouteTable(
            f"{name}-public", vpc_id=self.vpc.id, tags=tagged("public"),
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=igw.id)], opts=child)

        cluster_tag = {f"kubernetes.io/cluster/{cluster_name}": "shared"}
        self.public_subnets: dict[str, aws.ec2.Subnet] = {}
        self.private_subnets: dict[str, aws.ec2.Subnet] = {}
        for plan in plan_subnets(azs):
            public = aws.ec2.Subnet(
                f"{name}-public-{plan.az}", vpc_id=self.vpc.id, cidr_block=plan.public_cidr,
                availability_zone=plan.az, map_public_ip_on_launch=False,
                tags=tagged(f"public-{plan.az}", {**cluster_tag, "kubernetes.io/role/elb": "1"}), opts=child)
            aws.ec2.RouteTableAssociation(f"{name}-public-{plan.az}", subnet_id=public.id,
                                          route_table_id=public_rt.id, opts=child)
            self.public_subnets[plan.az] = public
            self.private_subnets[plan.az] = aws.ec2.Subnet(
                f"{name}-private-{plan.az}", vpc_id=self.vpc.id, cidr_block=plan.private_cidr,
                availability_zone=plan.az, map_public_ip_on_launch=False,
                tags=tagged(f"private-{plan.az}", {**cluster_tag, "kubernetes.io/role/internal-elb": "1"}),
                opts=child)

        # The first zone by name, not the GPU zone: a GPU zone that moves within the same zones keeps the NAT gateway
        # (its subnet_id forces replacement).
        nat_az = sorted(azs)[0]
        eip = aws.ec2.Eip(f"{name}-nat", domain="vpc", tags=tagged("nat"), opts=child)
        self.nat = aws.ec2.NatGateway(f"{name}-nat", allocation_id=eip.id,
                                      subnet_id=self.public_subnets[nat_az].id, tags=tagged("nat"),
                                      opts=pulumi.ResourceOptions(parent=self, depends_on=[igw]))
        private_rt = aws.ec2.RouteTable(
            f"{name}-private", vpc_id=self.vpc.id, tags=tagged("private"),
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", nat_gateway_id=self.nat.id)],
            opts=child)
        private_routes = [
            aws.ec2.RouteTableAssociation(f"{name}-private-{az}", subnet_id=subnet.id,
                                          route_table_id=private_rt.id, opts=child)
            for az, subnet in self.private_subnets.items()
        ]
        # S3 (checkpoints, datasets, ECR image layers) through a gateway endpoint: free, where the NAT
        # gateway charges per GB.
        self.s3_endpoint = aws.ec2.VpcEndpoint(
            f"{name}-s3", vpc_id=self.vpc.id, service_name=aws_rules.vpc_endpoint_service(region, "s3"),
            vpc_endpoint_type="Gateway",
            route_table_ids=[private_rt.id], policy=s3_endpoint_policy, tags=tagged("s3"), opts=child)
        # What nodes need before they can boot and pull images: a way out through the NAT gateway, and
        # the S3 route in place (an endpoint added later resets the connections of image pulls under way).
        self.egress = [self.nat, private_rt, *private_routes, self.s3_endpoint]

        self.private_subnet_ids = [s.id for s in self.private_subnets.values()]
        # EKS refuses control-plane subnets in some zones; nodes may still run there.
        self.control_plane_subnet_ids = [self.private_subnets[az].id for az in control_plane_azs]
        self.register_outputs({"vpcId": self.vpc.id})
