"""The AWS half of the program, run under mocks: every security and placement detail."""
from __future__ import annotations

import json

import pytest

from deploy import offline
from infra import iam
from infra.preflight import PlacementError
from tests.guards import nonempty

from .conftest import run_stack

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
SUBNET = "aws:ec2/subnet:Subnet"


def subnets_by_id(result):
    return {f"{s.name}-id": s for s in result.of_type(SUBNET)}


# --- network -----------------------------------------------------------------

def test_vpc_has_public_and_private_subnets_in_two_azs(dev):
    subnets = dev.of_type(SUBNET)
    public = [s for s in subnets if "public" in s.name]
    private = [s for s in subnets if "private" in s.name]
    assert len({s.inputs["availabilityZone"] for s in public}) >= 2
    assert len({s.inputs["availabilityZone"] for s in private}) >= 2
    assert all(s.inputs["mapPublicIpOnLaunch"] is False for s in nonempty(subnets, "subnets"))


def test_one_nat_gateway_in_a_public_subnet_and_private_routes_through_it(dev):
    (nat,) = dev.of_type("aws:ec2/natGateway:NatGateway")
    assert "public" in subnets_by_id(dev)[nat.inputs["subnetId"]].name
    private_rt = dev.one("aws:ec2/routeTable:RouteTable", "net-private")
    assert private_rt.inputs["routes"] == [{"cidrBlock": "0.0.0.0/0", "natGatewayId": "net-nat-id"}]


def test_all_nodes_are_in_private_subnets(dev):
    by_id = subnets_by_id(dev)
    for group in nonempty(dev.of_type(NODE_GROUP), "node groups"):
        assert group.inputs["subnetIds"]
        assert all("private" in by_id[i].name for i in group.inputs["subnetIds"]), group.name


def test_gpu_nodes_use_only_the_private_subnet_of_the_gpu_az(dev):
    gpu = dev.one(NODE_GROUP, "gpu-ng")
    (subnet_id,) = gpu.inputs["subnetIds"]
    subnet = subnets_by_id(dev)[subnet_id]
    assert subnet.inputs["availabilityZone"] == dev.outputs["gpuAvailabilityZone"]
    assert "private" in subnet.name


def test_gpu_az_is_picked_from_the_offerings_by_zone_id_and_the_configured_one_is_checked():
    mocks = offline.RecordingMocks("us-east-1", offered_by_type={"g6.12xlarge": ["us-east-1c", "us-east-1d"]})
    result = run_stack(mocks=mocks)
    assert result.outputs["gpuAvailabilityZone"] == "us-east-1c"
    assert result.outputs["gpuAvailabilityZoneId"] == "use1-az6"
    token, args = next(c for c in result.calls if "getInstanceTypeOfferings" in c[0]
                       and c[1]["filters"][0]["values"] == ["g6.12xlarge"])
    assert args["filters"][0]["values"] == ["g6.12xlarge"] and args["locationType"] == "availability-zone-id"
    # the control plane still gets a second AZ
    assert len({s.inputs["availabilityZone"] for s in result.of_type(SUBNET)}) == 2

    with pytest.raises(PlacementError, match="availabilityZone: us-east-1a does not offer g6.12xlarge"):
        run_stack(mocks=offline.RecordingMocks("us-east-1", offered_zones=["us-east-1c"]), availabilityZone="us-east-1a")
    with pytest.raises(PlacementError, match="not offered in any availability zone"):
        run_stack(mocks=offline.RecordingMocks("us-east-1", offered_zones=[]))


# --- EKS control plane -------------------------------------------------------

def test_control_plane_settings(dev):
    cluster = dev.one("aws:eks/cluster:Cluster")
    vpc = cluster.inputs["vpcConfig"]
    assert vpc["endpointPublicAccess"] is True and vpc["endpointPrivateAccess"] is True
    assert vpc["publicAccessCidrs"] == ["203.0.113.10/32"]
    assert cluster.inputs["accessConfig"] == {"authenticationMode": "API", "bootstrapClusterCreatorAdminPermissions": True}
    assert set(cluster.inputs["enabledClusterLogTypes"]) == {"api", "audit", "authenticator"}
    assert cluster.inputs["upgradePolicy"] == {"supportType": "STANDARD"}
    assert cluster.inputs["version"] == "1.36" and cluster.inputs["name"] == "raytrain-eks-dev"
    by_id = subnets_by_id(dev)
    assert all("private" in by_id[i].name for i in nonempty(vpc["subnetIds"], "EKS cluster subnets"))


def test_no_default_node_group_only_ours(dev):
    assert sorted(g.name for g in dev.of_type(NODE_GROUP)) == ["gpu-ng", "system-ng"]


def test_oidc_provider_for_irsa(dev):
    oidc = dev.one("aws:iam/openIdConnectProvider:OpenIdConnectProvider")
    assert oidc.inputs["clientIdLists"] == ["sts.amazonaws.com"]
    assert oidc.inputs["url"].startswith("https://oidc.eks.")


def test_admin_roles_get_cluster_admin_access_entries(dev):
    (entry,) = dev.of_type("aws:eks/accessEntry:AccessEntry")
    assert entry.inputs["principalArn"] == "arn:aws:iam::123456789012:role/Admin"
    (assoc,) = dev.of_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
    assert assoc.inputs["policyArn"] == iam.CLUSTER_ADMIN_POLICY and assoc.inputs["accessScope"] == {"type": "cluster"}


def test_managed_addons(dev):
    assert {a.inputs["addonName"] for a in dev.of_type("aws:eks/addon:Addon")} == {"vpc-cni", "kube-proxy", "coredns"}


# --- node groups ---------------------------------------------------------------

def test_system_node_group(dev):
    system = dev.one(NODE_GROUP, "system-ng")
    assert system.inputs["labels"] == {"role": "system"}
    assert system.inputs["instanceTypes"] == ["m7i.xlarge"]
    assert system.inputs["scalingConfig"]["desiredSize"] == 1
    assert "taints" not in system.inputs


def test_gpu_node_group_labels_taint_ami_and_size(dev):
    gpu = dev.one(NODE_GROUP, "gpu-ng")
    assert gpu.inputs["labels"] == {"role": "gpu-worker", "nvidia.com/gpu.present": "true"}
    assert gpu.inputs["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}]
    assert gpu.inputs["amiType"] == "AL2023_x86_64_NVIDIA"
    assert gpu.inputs["instanceTypes"] == ["g6.12xlarge"] and gpu.inputs["capacityType"] == "ON_DEMAND"
    scaling = gpu.inputs["scalingConfig"]
    assert scaling["desiredSize"] == scaling["minSize"] == scaling["maxSize"] == 2
    assert "remoteAccess" not in gpu.inputs  # no SSH keys; SSM instead
    assert gpu.inputs["launchTemplate"]["id"] == "gpu-lt-id"


@pytest.mark.parametrize("stack,cards", [("dev", 1), ("p5", 32)])
def test_one_efa_interface_per_network_card(stack, cards, dev, p5):
    result = {"dev": dev, "p5": p5}[stack]
    interfaces = nonempty(result.one(LAUNCH_TEMPLATE, "gpu-lt").inputs["networkInterfaces"], "EFA interfaces")
    assert len(interfaces) == cards
    assert [i["networkCardIndex"] for i in interfaces] == list(range(cards))
    # the first carries IP traffic too; the others are EFA only
    assert [(i["interfaceType"], i["deviceIndex"]) for i in interfaces] == [("efa", 0)] + [("efa-only", 1)] * (cards - 1)
    assert all(i["securityGroups"] == ["sg-cluster-placeholder", "gpu-efa-id"] for i in interfaces)
    assert all(i["associatePublicIpAddress"] == "false" for i in interfaces)


def test_efa_security_group_allows_itself_in_both_directions(dev):
    sg = dev.one("aws:ec2/securityGroup:SecurityGroup", "gpu-efa")
    sg_id = f"{sg.name}-id"
    for kind in ("SecurityGroupIngressRule", "SecurityGroupEgressRule"):
        (rule,) = dev.of_type(f"aws:vpc/{kind[0].lower() + kind[1:]}:{kind}")
        assert rule.inputs["securityGroupId"] == sg_id
        assert rule.inputs["referencedSecurityGroupId"] == sg_id
        assert rule.inputs["ipProtocol"] == "-1"


def test_launch_templates_require_imdsv2_and_encrypted_gp3(dev):
    for template in nonempty(dev.of_type(LAUNCH_TEMPLATE), "launch templates"):
        assert template.inputs["metadataOptions"] == {
            "httpEndpoint": "enabled", "httpTokens": "required", "httpPutResponseHopLimit": 1}, template.name
        (volume,) = template.inputs["blockDeviceMappings"]
        assert volume["ebs"]["volumeType"] == "gp3" and volume["ebs"]["encrypted"] == "true"
    gpu_volume = dev.one(LAUNCH_TEMPLATE, "gpu-lt").inputs["blockDeviceMappings"][0]
    assert gpu_volume["ebs"]["volumeSize"] == 200 and gpu_volume["deviceName"] == "/dev/xvda"


def test_cluster_placement_group_in_the_gpu_az(dev):
    group = dev.one("aws:ec2/placementGroup:PlacementGroup")
    assert group.inputs["strategy"] == "cluster"
    assert group.inputs["tags"]["availability-zone"] == dev.outputs["gpuAvailabilityZone"]
    assert dev.one(LAUNCH_TEMPLATE, "gpu-lt").inputs["placement"] == {"groupName": "gpu-pg-placeholder"}


def test_capacity_reservation_is_targeted_without_a_placement_group():
    result = run_stack(capacityReservationId="cr-0123456789abcdef0")
    template = result.one(LAUNCH_TEMPLATE, "gpu-lt").inputs
    assert template["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": "cr-0123456789abcdef0"}}
    assert "placement" not in template
    assert not result.of_type("aws:ec2/placementGroup:PlacementGroup")


def test_spot_capacity_and_no_placement_group():
    result = run_stack(capacityType="SPOT", placementGroup=False)
    assert result.one(NODE_GROUP, "gpu-ng").inputs["capacityType"] == "SPOT"
    assert not result.of_type("aws:ec2/placementGroup:PlacementGroup")


def test_node_role_has_only_the_policies_nodes_need(dev):
    attached = {a.inputs["policyArn"] for a in dev.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                if a.name.startswith("cluster-node-")}
    assert attached == set(iam.NODE_POLICIES)
    assert "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore" in attached
    assert not any("FullAccess" in p or "Administrator" in p for p in attached)
    trust = json.loads(dev.one("aws:iam/role:Role", "cluster-node-role").inputs["assumeRolePolicy"])
    assert trust["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}


# --- checkpoint bucket and IRSA --------------------------------------------------

def test_bucket_is_versioned_encrypted_private_and_cleans_uploads(dev):
    assert dev.one("aws:s3/bucketVersioning:BucketVersioning").inputs["versioningConfiguration"] == {"status": "Enabled"}
    (rule,) = dev.one("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration").inputs["rules"]
    assert rule["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "aws:kms"
    block = dev.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").inputs
    assert all(block[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"))
    uploads, versions = dev.one("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration").inputs["rules"]
    assert uploads["abortIncompleteMultipartUpload"] == {"daysAfterInitiation": 7}
    assert uploads["status"] == versions["status"] == "Enabled"
    # Ray deletes old checkpoints: in a versioned bucket they live on as noncurrent versions until expired
    assert versions["noncurrentVersionExpiration"] == {"noncurrentDays": 3}
    assert versions["expiration"] == {"expiredObjectDeleteMarker": True}
    assert versions["filter"] == {"prefix": ""}
    policy = json.loads(dev.one("aws:s3/bucketPolicy:BucketPolicy").inputs["policy"])
    assert policy["Statement"][0]["Effect"] == "Deny"
    assert dev.one("aws:s3/bucket:Bucket").inputs["forceDestroy"] is False


def _store(retain: bool):
    """Build only the CheckpointStore, to read its resource options."""
    from infra.storage import CheckpointStore

    holder = {}

    def program():
        holder["store"] = CheckpointStore("checkpoints", bucket=None, bucket_prefix="team-ckpt-", retain=retain,
                                          noncurrent_version_expiration_days=3, tags={})
        return {"uri": holder["store"].uri}

    offline.run({"aws:region": "us-east-1"}, program=program)
    return holder["store"]


def test_bucket_is_protected_from_destroy_unless_the_stack_opts_out():
    assert _store(True).bucket._protect is True
    assert _store(False).bucket._protect is not True


def test_irsa_role_trusts_only_the_ray_service_account_and_reaches_only_the_bucket(dev):
    role = dev.one("aws:iam/role:Role", "checkpoints-irsa")
    (statement,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert statement["Action"] == "sts:AssumeRoleWithWebIdentity"
    assert statement["Principal"]["Federated"] == (
        "arn:aws:iam::123456789012:oidc-provider/oidc.eks.us-east-1.amazonaws.com/id/PLACEHOLDER")
    conditions = statement["Condition"]["StringEquals"]
    assert set(conditions.values()) == {"system:serviceaccount:ray:ray-train", "sts.amazonaws.com"}
    policy = json.loads(dev.one("aws:iam/rolePolicy:RolePolicy", "checkpoints-irsa-s3").inputs["policy"])
    bucket_arn = dev.one("aws:s3/bucket:Bucket").outputs["arn"]
    resources = {r for s in policy["Statement"] for r in ([s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"])}
    assert resources == {bucket_arn, f"{bucket_arn}/*"}
    actions = {a for s in policy["Statement"] for a in s["Action"]}
    assert all(a.startswith("s3:") and "*" not in a for a in nonempty(actions, "S3 actions of the checkpoint role"))


# --- tags and outputs ------------------------------------------------------------

def test_user_tags_reach_every_taggable_aws_resource(dev):
    provider = dev.one("pulumi:providers:aws", "aws")
    assert json.loads(provider.inputs["defaultTags"])["tags"]["team"] == "ml"  # provider inputs are JSON strings
    taggable = [r for r in dev.resources if r.type.startswith("aws:") and "tags" in r.inputs]
    assert len(taggable) >= 20
    for resource in taggable:
        assert resource.inputs["tags"].get("team") == "ml", resource.name
        assert resource.inputs["tags"].get("stack") == "dev", resource.name


def test_stack_outputs(dev):
    out = dev.outputs
    assert out["clusterName"] == "raytrain-eks-dev" and out["region"] == "us-east-1"
    assert out["gpuAvailabilityZone"] == "us-east-1a"
    assert out["checkpointBucketUri"].startswith("s3://")
    assert out["rayNamespace"] == "ray" and out["rayHeadService"] == "raytrain-head-svc"
    assert out["dashboardPortForward"] == "kubectl -n ray port-forward svc/raytrain-head-svc 8265:8265"
    kubeconfig = json.loads(out["kubeconfig"])
    assert kubeconfig["users"][0]["user"]["exec"]["args"][:2] == ["eks", "get-token"]
    assert "kubeconfig" in dev.secret_outputs and "clusterName" not in dev.secret_outputs
    cost = out["estimatedCostPerHour"]
    assert cost["gpuNodes"] == pytest.approx(2 * 4.6016)
    assert cost["total"] == pytest.approx(sum(v for k, v in cost.items() if k not in ("total", "pricing")))
    assert cost["pricing"] == "On-Demand list price"


def test_p5_stack_costs_more_and_scales_the_launch_template(p5):
    assert p5.outputs["estimatedCostPerHour"]["gpuNodes"] == pytest.approx(2 * 55.04)
    assert p5.one(NODE_GROUP, "gpu-ng").inputs["instanceTypes"] == ["p5.48xlarge"]


def test_invalid_configuration_declares_nothing():
    from deploy.config import ConfigError

    mocks = offline.RecordingMocks("us-east-1")
    with pytest.raises(ConfigError):
        run_stack(mocks=mocks, gpuNodeCount=0)
    assert [r for r in mocks.resources if not r.type.startswith("pulumi:")] == []
