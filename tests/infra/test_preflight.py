"""What only the account can tell, through the lookups `pulumi preview` makes (answered by deploy.offline's mocks
in the shapes AWS returns): zone IDs, capacity reservations and Capacity Blocks, the caller, vCPU quotas."""
from __future__ import annotations

import pytest

from deploy import offline, program
from infra.preflight import PlacementError, PreflightError

from .conftest import BASE, run_stack

SUBNET = "aws:ec2/subnet:Subnet"
CR = "cr-0123456789abcdef0"


def declared(mocks: offline.RecordingMocks) -> list[str]:
    return [r.type for r in mocks.resources if not r.type.startswith("pulumi:providers:")]


def preflight_problems(mocks: offline.RecordingMocks, **overrides) -> list[str]:
    with pytest.raises(PreflightError) as info:
        run_stack(mocks=mocks, **overrides)
    assert declared(mocks) == [], "nothing may be declared before the lookups pass"
    return info.value.problems


# --- zone IDs -----------------------------------------------------------------------------------------

def test_control_plane_skips_a_zone_id_eks_refuses(dev):
    # us-east-1b is use1-az3 in the mocked account: EKS refuses control-plane subnets there
    cluster = dev.one("aws:eks/cluster:Cluster").inputs
    zones = {f"{s.name}-id": s.inputs["availabilityZone"] for s in dev.of_type(SUBNET)}
    assert sorted(zones[i] for i in cluster["vpcConfig"]["subnetIds"]) == ["us-east-1a", "us-east-1c"]
    assert "us-east-1b" not in zones.values()


def test_zone_names_map_to_ids_per_account():
    # another account: the same names, other IDs; now us-east-1a is the refused use1-az3
    ids = {"us-east-1a": "use1-az3", "us-east-1b": "use1-az1", "us-east-1c": "use1-az2", "us-east-1d": "use1-az4"}
    result = run_stack(mocks=offline.RecordingMocks("us-east-1", zones=list(ids), zone_ids=ids))
    assert result.outputs["gpuAvailabilityZone"] == "us-east-1b" and result.outputs["gpuAvailabilityZoneId"] == "use1-az1"
    assert "us-east-1a" not in {s.inputs["availabilityZone"] for s in result.of_type(SUBNET)}


def test_a_gpu_zone_asked_for_in_a_refused_zone_keeps_the_control_plane_elsewhere():
    result = run_stack(availabilityZone="use1-az3")  # us-east-1b, offered, refused for the control plane only
    assert result.outputs["gpuAvailabilityZone"] == "us-east-1b"
    subnets = {f"{s.name}-id": s.inputs["availabilityZone"] for s in result.of_type(SUBNET)}
    cluster_zones = {subnets[i] for i in result.one("aws:eks/cluster:Cluster").inputs["vpcConfig"]["subnetIds"]}
    assert cluster_zones == {"us-east-1a", "us-east-1c"}
    gpu = result.one("aws:eks/nodeGroup:NodeGroup", "gpu-ng").inputs
    assert [subnets[i] for i in gpu["subnetIds"]] == ["us-east-1b"]


def test_a_zone_id_not_in_the_region_is_refused_before_anything_is_declared():
    mocks = offline.RecordingMocks("us-east-1")
    assert "availabilityZone: use1-az9 is not an available zone of us-east-1" in preflight_problems(
        mocks, availabilityZone="use1-az9")[0]


def test_a_region_with_too_few_accepted_zones_is_refused():
    ids = {"us-east-1a": "use1-az3", "us-east-1b": "use1-az1"}
    mocks = offline.RecordingMocks("us-east-1", zones=list(ids), zone_ids=ids)
    (problem,) = preflight_problems(mocks)
    assert problem.startswith("aws:region: EKS needs control-plane subnets in 2 zones") and "use1-az3" in problem


# --- capacity reservations and Capacity Blocks -----------------------------------------------------------

def reservation(**fields) -> dict:
    return {"AvailabilityZone": "us-east-1c", "InstanceType": "g6.12xlarge", "InstanceCount": 2, "State": "active",
            **fields}


def test_the_reservation_pins_the_gpu_zone():
    mocks = offline.RecordingMocks("us-east-1", reservations={CR: reservation()})
    result = run_stack(mocks=mocks, capacityReservationId=CR)
    assert result.outputs["gpuAvailabilityZone"] == "us-east-1c"
    token, args = next(c for c in result.calls if "cloudcontrol" in c[0])
    assert args == {"typeName": "AWS::EC2::CapacityReservation", "identifier": CR}


@pytest.mark.parametrize("fields,overrides,words", [
    ({"InstanceType": "g6e.12xlarge"}, {}, "holds g6e.12xlarge, but raytrain-eks:gpuNodeType is g6.12xlarge"),
    ({"InstanceCount": 1}, {}, "holds 1 instance(s), fewer than raytrain-eks:gpuNodeCount 2"),
    ({"State": "expired"}, {}, "is expired"),
    ({}, {"availabilityZone": "us-east-1a"}, "is not the zone of capacity reservation"),
])
def test_a_reservation_that_does_not_fit_is_refused_before_anything_is_declared(fields, overrides, words):
    mocks = offline.RecordingMocks("us-east-1", reservations={CR: reservation(**fields)})
    with pytest.raises(PreflightError) as info:
        run_stack(mocks=mocks, capacityReservationId=CR, **overrides)
    assert declared(mocks) == []
    assert any(words in p for p in info.value.problems), info.value.problems


def test_a_capacity_block_sets_capacity_and_market_type_as_aws_requires():
    block = reservation(InstanceType="p5.48xlarge", kind="capacity-block", AvailabilityZone="us-east-1a")
    result = run_stack(stack="p5", mocks=offline.RecordingMocks("us-east-1", reservations={CR: block}),
                       gpuNodeType="p5.48xlarge", capacityType="CAPACITY_BLOCK", capacityReservationId=CR)
    gpu = result.one("aws:eks/nodeGroup:NodeGroup", "gpu-ng").inputs
    assert gpu["capacityType"] == "CAPACITY_BLOCK"
    template = result.one("aws:ec2/launchTemplate:LaunchTemplate", "gpu-lt").inputs
    assert template["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert template["capacityReservationSpecification"] == {"capacityReservationTarget": {"capacityReservationId": CR}}
    assert template["instanceType"] == "p5.48xlarge"  # EKS: a Capacity Block launch template names the type
    assert "instanceTypes" not in gpu
    assert any("getCapacityBlockReservation" in c[0] for c in result.calls)


def test_a_capacity_block_that_has_not_started_is_refused():
    block = reservation(InstanceType="p5.48xlarge", kind="capacity-block", State="scheduled",
                        StartDate="2027-01-04T11:30:00Z")
    mocks = offline.RecordingMocks("us-east-1", reservations={CR: block})
    problems = preflight_problems(mocks, gpuNodeType="p5.48xlarge", capacityType="CAPACITY_BLOCK",
                                  capacityReservationId=CR)
    assert any("is scheduled (it starts 2027-01-04T11:30:00Z)" in p for p in problems), problems


# --- who deploys, and how many vCPUs it may run -------------------------------------------------------------

def test_the_deployer_listed_again_in_admin_role_arns_is_refused():
    mocks = offline.RecordingMocks("us-east-1", caller_arn="arn:aws:sts::123456789012:assumed-role/Deployer/s")
    (problem,) = preflight_problems(
        mocks, adminRoleArns=["arn:aws:iam::123456789012:role/Ops", "arn:aws:iam::123456789012:role/team/Deployer"])
    assert problem.startswith("raytrain-eks:adminRoleArns: arn:aws:iam::123456789012:role/team/Deployer is the "
                              "identity running Pulumi") and "Remove it" in problem


def test_a_vcpu_quota_too_small_is_refused_with_the_request_command():
    mocks = offline.RecordingMocks("us-east-1", quotas={"L-417A185B": 192})
    (problem,) = preflight_problems(mocks, gpuNodeType="p5.48xlarge")
    assert '384 vCPUs of "Running On-Demand P instances"' in problem and "quota (L-417A185B) is 192" in problem
    assert "request-service-quota-increase --service-code ec2 --quota-code L-417A185B --desired-value 768" in problem


def test_the_quota_counts_the_surge_of_a_replaced_pool():
    """A quota that holds the stack, but not the replacement node group Pulumi starts before deleting the old."""
    mocks = offline.RecordingMocks("us-east-1", quotas={"L-417A185B": 384})
    (problem,) = preflight_problems(mocks, gpuNodeType="p5.48xlarge")
    assert "replacing pool gpu" in problem and "needs 384 more, 768 in all" in problem
    run_stack(mocks=offline.RecordingMocks("us-east-1", quotas={"L-417A185B": 768}), gpuNodeType="p5.48xlarge")


def test_a_reservation_others_use_is_judged_by_what_is_free():
    mocks = offline.RecordingMocks("us-east-1", reservations={CR: reservation(AvailableInstanceCount=1)})
    problems = preflight_problems(mocks, capacityReservationId=CR)
    assert any("has 1 of 2 instance(s) free" in p and "raytrain-eks:gpuNodeCount 2" in p for p in problems), problems
    lookup = offline.RecordingMocks("us-east-1", reservations={CR: reservation(AvailableInstanceCount=2)})
    result = run_stack(mocks=lookup, capacityReservationId=CR)
    (args,) = [a for t, a in result.calls if t == "aws:ec2/getInstances:getInstances"]
    assert {"name": "tag:eks:cluster-name", "values": ["raytrain-eks-dev"]} in args["filters"]


def test_every_pools_type_must_be_offered_where_its_nodes_go():
    """The system pool spans every private subnet; its type missing from one of their zones fails CreateNodegroup."""
    mocks = offline.RecordingMocks("us-east-1", offered_by_type={"m7i.xlarge": ["us-east-1a", "us-east-1b"]})
    (problem,) = preflight_problems(mocks)
    assert problem.startswith("raytrain-eks:systemNodeType: m7i.xlarge is not offered in us-east-1c")


def test_spot_is_checked_against_the_spot_quota():
    mocks = offline.RecordingMocks("us-east-1", quotas={"L-3819A6DF": 48})
    (problem,) = preflight_problems(mocks, capacityType="SPOT", placementGroup=False)
    assert "All G and VT Spot Instance Requests" in problem


# --- placeholders plan offline, and are refused where they would reach AWS ----------------------------------

def test_the_documentation_placeholder_is_refused_when_the_program_reaches_aws():
    mocks = offline.RecordingMocks("us-east-1")
    with pytest.raises(PreflightError) as info:
        offline.run(dict(BASE), mocks=mocks, program=lambda: program.main(offline=False))
    (problem,) = info.value.problems
    assert "203.0.113.10/32 is a documentation range" in problem
    assert declared(mocks) == []
    public = {**BASE, "raytrain-eks:apiAccessCidrs": ["198.18.0.0/15"]}
    with pytest.raises(Exception, match="benchmarking"):
        offline.run(public, program=lambda: program.main(offline=False))


def test_placement_errors_are_preflight_errors_pulumi_prints_without_a_traceback():
    import pulumi

    assert issubclass(PlacementError, PreflightError) and issubclass(PreflightError, pulumi.RunError)


# --- Kubernetes upgrades of a deployed cluster ----------------------------------------------------------------

KEPT = {"availabilityZone": "us-east-1a"}  # a deployed stack keeps its GPU zone in config


def deployed(version: str = "1.34", **node_groups) -> offline.RecordingMocks:
    groups = node_groups or {"system-ng-1a2b3c4": version, "gpu-ng-5d6e7f8": version}
    return offline.RecordingMocks("us-east-1", clusters={"raytrain-eks-dev": {"version": version, "nodeGroups": groups}})


def test_a_kubernetes_version_that_skips_a_minor_is_refused_with_the_procedure():
    (problem,) = preflight_problems(deployed("1.34"), kubernetesVersion="1.36", **KEPT)
    assert problem.startswith("raytrain-eks:kubernetesVersion: 1.34 -> 1.36 skips a minor version")
    assert "set it to 1.35, `pulumi up`" in problem


def test_one_minor_up_passes_and_a_downgrade_is_refused():
    run_stack(mocks=deployed("1.34"), kubernetesVersion="1.35", **KEPT)
    run_stack(mocks=deployed("1.35"), kubernetesVersion="1.35", **KEPT)
    (problem,) = preflight_problems(deployed("1.36"), kubernetesVersion="1.35", **KEPT)
    assert "older than the cluster's 1.36; EKS never downgrades" in problem


def test_a_bump_while_node_groups_lag_is_refused():
    mocks = deployed("1.35", **{"system-ng-1a2b3c4": "1.35", "gpu-ng-5d6e7f8": "1.34"})
    (problem,) = preflight_problems(mocks, kubernetesVersion="1.36", **KEPT)
    assert "gpu-ng-5d6e7f8 still run an older version than the control plane's 1.35" in problem
    assert "raytrain-eks:kubernetesVersion 1.35 first" in problem


def test_a_capacity_block_pool_is_upgraded_at_zero_nodes():
    block = reservation(InstanceType="p5.48xlarge", kind="capacity-block", AvailabilityZone="us-east-1a")
    mocks = deployed("1.34")
    mocks.reservations = {CR: block}
    problems = preflight_problems(mocks, kubernetesVersion="1.35", gpuNodeType="p5.48xlarge",
                                  capacityType="CAPACITY_BLOCK", capacityReservationId=CR)
    assert any("Capacity Block node group only while it has no nodes" in p for p in problems), problems


def test_a_new_stack_looks_up_no_cluster_versions():
    result = run_stack(kubernetesVersion="1.34")
    assert "aws:eks/getClusters:getClusters" in [t for t, _ in result.calls]
    assert "aws:eks/getCluster:getCluster" not in [t for t, _ in result.calls]


def test_a_deployed_stack_keeps_its_gpu_zone_in_config():
    """Unset, the GPU zone is recomputed from the offerings on every run: a new offering would move the nodes."""
    (problem,) = preflight_problems(deployed("1.34"), kubernetesVersion="1.34")
    assert problem.startswith("raytrain-eks:availabilityZone: not set on a deployed stack")
    assert "pulumi config set raytrain-eks:availabilityZone $(pulumi stack output gpuAvailabilityZone)" in problem
    assert "us-east-1a" in problem
    run_stack(mocks=deployed("1.34"), kubernetesVersion="1.34", **KEPT)
    run_stack(kubernetesVersion="1.34")  # a first deployment chooses it
