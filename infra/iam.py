"""IAM documents as plain data, so tests can read every statement."""
from __future__ import annotations

import json

from facts.autoscaler import discovery_tags

# Written for the aws partition; infra.aws_rules.in_partition moves them to the stack region's.
EKS_CLUSTER_POLICIES = ("arn:aws:iam::aws:policy/AmazonEKSClusterPolicy",)
# What a node needs and nothing more: join the cluster, run the VPC CNI, pull images,
# and be reachable through SSM Session Manager instead of SSH keys.
NODE_POLICIES = (
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly",
    "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
)
CLUSTER_ADMIN_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"


def service_trust(service: str) -> str:
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": service},
                       "Action": ["sts:AssumeRole", "sts:TagSession"] if service == "eks.amazonaws.com" else "sts:AssumeRole"}],
    })


def irsa_trust(oidc_provider_arn: str, oidc_issuer_url: str, namespace: str, service_account: str) -> str:
    """Trust only one service account of one namespace, through the cluster's OIDC provider."""
    issuer = oidc_issuer_url.removeprefix("https://")
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Principal": {"Federated": oidc_provider_arn},
            "Action": "sts:AssumeRoleWithWebIdentity",
            "Condition": {"StringEquals": {
                f"{issuer}:sub": f"system:serviceaccount:{namespace}:{service_account}",
                f"{issuer}:aud": "sts.amazonaws.com",
            }},
        }],
    })


def bucket_read_write(bucket_arn: str) -> str:
    """Read, write and list one bucket; nothing else in S3."""
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "ListCheckpointBucket", "Effect": "Allow",
             "Action": ["s3:ListBucket", "s3:GetBucketLocation", "s3:ListBucketMultipartUploads"],
             "Resource": bucket_arn},
            {"Sid": "ReadWriteCheckpoints", "Effect": "Allow",
             "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject",
                        "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
             "Resource": f"{bucket_arn}/*"},
        ],
    })


def deny_insecure_transport(bucket_arn: str) -> str:
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [{
            "Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
            "Resource": [bucket_arn, f"{bucket_arn}/*"],
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        }],
    })


def cluster_autoscaler_policy(cluster_name: str, partition: str = "aws") -> str:
    """Read what the Cluster Autoscaler needs to plan; resize and terminate only this cluster's node groups.

    The write actions are limited by the ASG tag k8s.io/cluster-autoscaler/<cluster>=owned, which
    only this stack's node groups carry, so the role cannot resize another cluster's groups.
    """
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "DescribeNodeGroups", "Effect": "Allow",
             "Action": ["autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeAutoScalingInstances",
                        "autoscaling:DescribeLaunchConfigurations", "autoscaling:DescribeScalingActivities",
                        "autoscaling:DescribeTags", "ec2:DescribeImages", "ec2:DescribeInstanceTypes",
                        "ec2:DescribeLaunchTemplateVersions", "ec2:GetInstanceTypesFromInstanceRequirements"],
             "Resource": "*"},
            {"Sid": "DescribeOwnNodeGroups", "Effect": "Allow", "Action": ["eks:DescribeNodegroup"],
             "Resource": f"arn:{partition}:eks:*:*:nodegroup/{cluster_name}/*/*"},
            {"Sid": "ResizeOwnNodeGroupsOnly", "Effect": "Allow",
             "Action": ["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"],
             "Resource": f"arn:{partition}:autoscaling:*:*:autoScalingGroup:*:autoScalingGroupName/*",
             "Condition": {"StringEquals": {
                 f"aws:ResourceTag/{key}": value for key, value in reversed(discovery_tags(cluster_name).items())}}},
        ],
    })


# Where nodes fetch from S3 besides the account's own buckets: ECR's image layers and the Amazon
# Linux package repositories (ECR user guide, "Amazon ECR interface VPC endpoints"; AL2023 user guide).
AWS_OWNED_BUCKETS = ("prod-{region}-starport-layer-bucket", "al2023-repos-{region}-*")
S3_DATA_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                   "s3:ListMultipartUploadParts", "s3:ListBucket", "s3:GetBucketLocation",
                   "s3:ListBucketMultipartUploads")


def s3_endpoint_policy(region: str, account_id: str, partition: str = "aws") -> str:
    """What the S3 gateway endpoint lets through: data in this account's buckets, and AWS's buckets nodes read."""
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "OwnAccountBuckets", "Effect": "Allow", "Principal": "*", "Action": list(S3_DATA_ACTIONS),
             "Resource": [f"arn:{partition}:s3:::*", f"arn:{partition}:s3:::*/*"],
             "Condition": {"StringEquals": {"aws:ResourceAccount": account_id}}},
            {"Sid": "ImageLayersAndPackages", "Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
             "Resource": [f"arn:{partition}:s3:::{b.format(region=region)}/*" for b in AWS_OWNED_BUCKETS]},
        ],
    })
