"""Every AWS resource of the offline plan, of every shipped stack and of generated variants, checked as the
API request AWS receives against botocore's service models, plus the rules AWS states only in prose.

A resource type without a mapping fails the test, so a new resource cannot slip past; each kind of check
is shown catching a planted mistake.
"""
from __future__ import annotations

import copy
import ipaddress
import json
import re

import botocore.session
import pytest

from deploy import aws_requests as ar
from deploy import offline
from facts import catalog
from infra import aws_rules
from tests.guards import nonempty
from tests.stacks import read_stack_file

from .conftest import BASE

CR = "cr-0123456789abcdef0"
VARIANTS = {
    **{f"gpu-{name}": ("dev", {"gpuNodeType": name}) for name in catalog.GPU_TYPES},
    "spot": ("dev", {"capacityType": "SPOT", "placementGroup": False}),
    "reservation": ("dev", {"capacityReservationId": CR, "availabilityZone": "us-east-1c"}),
    "capacity-block": ("dev", {"gpuNodeType": "p5.48xlarge", "capacityType": "CAPACITY_BLOCK",
                               "capacityReservationId": CR}),
    "scale-to-zero": ("dev", {"scaleToZero": True, "adminRoleArns": ["arn:aws:iam::123456789012:role/Admin"]}),
    "cloudwatch": ("dev", {"monitoring": "cloudwatch"}),
    "underscore-stack": ("team_ml", {}),
    "long-stack": ("s" * 87, {}),
    "dotted-stack-named-cluster": ("team.ml", {"clusterName": "team-ml"}),
    "most-tags": ("dev", {"tags": {f"tag{i}": f"value {i}" for i in range(45)}}),
}


def _run(stack: str, raw: dict) -> offline.PlanResult:
    return offline.run(raw, stack=stack)


@pytest.fixture(scope="module")
def plans() -> dict[str, offline.PlanResult]:
    found = {f"shipped-{s}": _run(s, read_stack_file(s)) for s in ("dev", "p5")}
    for name, (stack, overrides) in VARIANTS.items():
        found[name] = _run(stack, {**BASE, **{f"raytrain-eks:{k}": v for k, v in overrides.items()}})
    return found


@pytest.fixture(scope="module")
def all_requests(plans) -> dict[str, list[ar.Request]]:
    return {name: ar.requests(result)[0] for name, result in plans.items()}


def test_every_aws_resource_type_has_a_request_mapping(plans):
    for name, result in nonempty(plans.items(), "plans"):
        _, unmapped = ar.requests(result)
        assert unmapped == [], f"{name}: add these resource types to deploy/aws_requests.MAPPINGS: {unmapped}"
    covered = {r.type for result in plans.values() for r in result.resources if r.type in ar.MAPPINGS}
    assert covered == set(ar.MAPPINGS), f"mappings no plan exercises: {set(ar.MAPPINGS) - covered}"


def test_every_request_fits_botocores_shapes(all_requests):
    failures = [f"{name}: {req.resource} -> {req.service} {req.operation}: {message}"
                for name, reqs in all_requests.items() for req in reqs for _, message in ar.check(req)]
    assert failures == [], "\n".join(failures)
    assert sum(len(r) for r in all_requests.values()) > 500


# --- rules the models state only in prose ----------------------------------------------------------------

def subnet_zone_ids(result: offline.PlanResult) -> dict[str, str]:
    """Subnet id -> zone ID, as the mocked account maps names to IDs."""
    return {f"{s.name}-id": offline.US_EAST_1_ZONE_IDS[s.inputs["availabilityZone"]]
            for s in result.of_type("aws:ec2/subnet:Subnet")}


def prose_problems(reqs: list[ar.Request], zone_ids: dict[str, str]) -> list[str]:
    """The rules of infra.aws_rules and the EKS/S3/IAM/CloudWatch prose, applied to the requests."""
    problems = []
    for req in reqs:
        check = _OPERATION_RULES.get(req.operation)
        if check is not None:
            problems += check(req.params, zone_ids)
        problems += _tag_problems(req)
    principals = [r.params["principalArn"] for r in reqs if r.operation == "CreateAccessEntry"]
    if len(principals) != len(set(principals)):
        problems.append(f"access entries repeat a principal: {principals}")
    return problems


def _cluster_problems(p: dict, zone_ids: dict[str, str]) -> list[str]:
    """CreateCluster: the name, the public endpoint's CIDRs and the control plane's zones."""
    problems = []
    if why := aws_rules.cluster_name_problem(p["name"]):
        problems.append(f"cluster name {p['name']!r} {why}")
    for cidr in p["resourcesVpcConfig"]["publicAccessCidrs"]:
        net = ipaddress.ip_network(cidr)
        if (why := aws_rules.public_cidr_problem(net)) or net.prefixlen == 0:
            problems.append(f"publicAccessCidrs {cidr} {why or 'is the whole internet'}")
    for subnet in p["resourcesVpcConfig"]["subnetIds"]:
        if zone_ids[subnet] in aws_rules.REFUSED_CONTROL_PLANE_ZONE_IDS:
            problems.append(f"control-plane subnet {subnet} in {zone_ids[subnet]}, a zone EKS refuses")
    return problems


def _bucket_problems(p: dict, zone_ids: dict[str, str]) -> list[str]:
    why = aws_rules.bucket_name_problem(p["Bucket"])
    return [f"bucket {p['Bucket']!r} {why}"] if why else []


def _retention_problems(p: dict, zone_ids: dict[str, str]) -> list[str]:
    if p["retentionInDays"] in retention_values():
        return []
    return [f"retentionInDays {p['retentionInDays']} is not a value CloudWatch Logs offers"]


_OPERATION_RULES = {"CreateCluster": _cluster_problems, "CreateBucket": _bucket_problems,
                    "PutRetentionPolicy": _retention_problems}


def _tag_problems(req: ar.Request) -> list[str]:
    """At most MAX_TAGS tags on anything; S3's and IAM's own rules for their keys and values."""
    tags = _tags_of(req)
    if tags is None:
        return []
    problems = []
    if len(tags) > aws_rules.MAX_TAGS:
        problems.append(f"{req.resource}: {len(tags)} tags, AWS allows {aws_rules.MAX_TAGS}")
    if req.service in ("s3", "iam"):
        problems += [f"{req.resource}: {why}" for k, v in tags.items() for why in aws_rules.tag_problems(k, v)]
    return problems


def _tags_of(req: ar.Request) -> dict | None:
    p = req.params
    if "TagSpecifications" in p and p["TagSpecifications"]:
        return {t["Key"]: t["Value"] for t in p["TagSpecifications"][0]["Tags"]}
    if isinstance(p.get("tags"), dict):
        return p["tags"]
    if isinstance(p.get("Tags"), list) and p["Tags"] and "ResourceId" not in p["Tags"][0]:
        return {t["Key"]: t["Value"] for t in p["Tags"]}
    if "Tagging" in p:
        return {t["Key"]: t["Value"] for t in p["Tagging"]["TagSet"]}
    return None


def retention_values() -> tuple[int, ...]:
    """The retention values CloudWatch Logs lists, read from the prose of botocore's logs model."""
    doc = botocore.session.get_session().get_service_model("logs").shape_for("Days").documentation
    return tuple(int(n) for n in re.findall(r"\b\d+\b", doc.split("Possible values are:")[1].split(".")[0]))


def test_the_projects_retention_values_are_the_ones_cloudwatch_lists():
    assert retention_values() == aws_rules.LOG_RETENTION_DAYS


def test_every_plan_keeps_the_rules_aws_states_in_prose(plans, all_requests):
    for name, result in nonempty(plans.items(), "plans"):
        assert prose_problems(all_requests[name], subnet_zone_ids(result)) == [], name
    most = max(len(_tags_of(r) or {}) for r in all_requests["most-tags"])
    assert most == aws_rules.MAX_TAGS  # the limit the configuration allows is the limit AWS sets, exactly


def test_odd_stack_names_give_names_aws_accepts(all_requests):
    buckets = {name: next(r.params["Bucket"] for r in reqs if r.operation == "CreateBucket")
               for name, reqs in all_requests.items()}
    assert buckets["underscore-stack"].startswith("raytrain-eks-team-ml-ckpt-")
    assert len(buckets["long-stack"]) == 63 and buckets["long-stack"] != buckets["shipped-dev"]
    clusters = {name: next(r.params["name"] for r in reqs if r.operation == "CreateCluster")
                for name, reqs in all_requests.items()}
    assert clusters["underscore-stack"] == "raytrain-eks-team_ml" and len(clusters["long-stack"]) == 100


# --- each check shown able to fail ------------------------------------------------------------------------

def _one(all_requests, operation: str) -> ar.Request:
    return copy.deepcopy(next(r for r in all_requests["shipped-dev"] if r.operation == operation))


def _planted(req: ar.Request, change) -> list[str]:
    change(req.params)
    return [kind for kind, _ in ar.check(req)]


@pytest.mark.parametrize("operation,change,kind", [
    ("CreateCluster", lambda p: p.pop("roleArn"), "required"),
    ("CreateNodegroup", lambda p: p.update(capacityType="RESERVED"), "enum"),
    ("CreateLaunchTemplate", lambda p: p["LaunchTemplateData"]["metadataOptions"].update(httpTokens="sometimes"), "enum"),
    ("CreateCluster", lambda p: p.update(name=""), "min"),
    ("CreateCluster", lambda p: p.update(name="c" * 101), "max"),
    ("CreateNodegroup", lambda p: p.update(tags={f"t{i}": "v" for i in range(51)}), "max"),
    ("CreateRole", lambda p: p.update(RoleName="r" * 65), "max"),
    ("CreateCluster", lambda p: p.update(name="-starts-with-a-hyphen"), "pattern"),
    ("CreateRole", lambda p: p.update(Tags=[{"Key": "owner", "Value": "a&b"}]), "pattern"),
    ("CreateNodegroup", lambda p: p["scalingConfig"].update(minSize=-1), "range"),
    ("CreateCluster", lambda p: p.update(version=1.36), "type"),
    ("CreateSubnet", lambda p: p.update(AvailabiltyZone="us-east-1a"), "unknown"),
])
def test_a_planted_mistake_of_each_kind_is_caught(all_requests, operation, change, kind):
    req = _one(all_requests, operation)
    assert ar.check(req) == []
    assert kind in _planted(req, change)


@pytest.mark.parametrize("operation,change,words", [
    ("CreateCluster", lambda p: p.update(name="team.ml"), "holds characters EKS refuses"),
    ("CreateCluster", lambda p: p["resourcesVpcConfig"].update(publicAccessCidrs=["10.0.0.0/8"]), "private"),
    ("CreateCluster", lambda p: p["resourcesVpcConfig"].update(subnetIds=["net-private-us-east-1b-id"]),
     "a zone EKS refuses"),
    ("CreateBucket", lambda p: p.update(Bucket="team_ml-ckpt"), "holds characters S3 refuses"),
    ("PutRetentionPolicy", lambda p: p.update(retentionInDays=10), "not a value CloudWatch Logs offers"),
    ("CreateNodegroup", lambda p: p.update(tags={f"t{i}": "v" for i in range(51)}), "51 tags"),
    ("PutBucketTagging", lambda p: p["Tagging"]["TagSet"].append({"Key": "owner", "Value": "a&b"}),
     "S3 and IAM tags allow only"),
])
def test_a_planted_break_of_a_prose_rule_is_caught(plans, all_requests, operation, change, words):
    reqs = copy.deepcopy(all_requests["shipped-dev"])
    zone_ids = {**subnet_zone_ids(plans["shipped-dev"]), "net-private-us-east-1b-id": "use1-az3"}
    assert prose_problems(reqs, zone_ids) == []
    change(next(r for r in reqs if r.operation == operation).params)
    assert any(words in p for p in prose_problems(reqs, zone_ids)), prose_problems(reqs, zone_ids)


def test_a_repeated_access_entry_is_caught(plans, all_requests):
    reqs = copy.deepcopy(all_requests["scale-to-zero"])
    reqs.append(next(r for r in reqs if r.operation == "CreateAccessEntry"))
    assert any("repeat a principal" in p for p in prose_problems(reqs, subnet_zone_ids(plans["scale-to-zero"])))


def test_an_unmapped_resource_type_is_caught(plans):
    result = plans["shipped-dev"]
    extra = offline.Recorded("aws:ec2/instance:Instance", "stray", {"instanceType": "t3.micro"}, {})
    _, unmapped = ar.requests(offline.PlanResult([*result.resources, extra], {}, result.calls))
    assert unmapped == ["aws:ec2/instance:Instance"]


def test_policies_in_requests_are_json(all_requests):
    for req in nonempty(all_requests["scale-to-zero"], "requests of the scale-to-zero plan"):
        for key in ("AssumeRolePolicyDocument", "PolicyDocument", "Policy"):
            if key in req.params:
                assert json.loads(req.params[key])["Version"] == "2012-10-17"
