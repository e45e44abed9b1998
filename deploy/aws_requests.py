"""The offline plan's AWS resources as the API requests AWS receives, checked against botocore's models.

`python -m deploy.plan` runs it on the stack being planned (problems(): every request AWS would refuse,
exit 2); tests/infra/test_conformance.py runs it on every shipped stack and variant.

MAPPINGS turns each recorded resource (pulumi's camelCase inputs) into the request(s) the provider
sends: `aws:eks/cluster:Cluster` -> eks CreateCluster, ... Nested members are matched to the shape by
name (case-insensitively; RENAMES where the provider spells them differently), so a member that has
no place in the request shape is reported, not dropped. `check` walks botocore's shape: required
members, types, enums, lengths, ranges and patterns. A resource type with no mapping is an error.

At `pulumi preview` (and `up`) the program registers `preview_transform`: the engine hands every
resource's inputs to it before registering the resource, with values computed by other resources
and not known yet as None. Those are UNKNOWN here: present for `required`, not checked otherwise; a
mapping that needs one to build its request skips that resource (the offline plan, whose mocks
give every value, checks it).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

import botocore.session
import regex

# Not API requests of their own: providers, components, Kubernetes objects, the image pin.
NOT_AWS = ("pulumi:providers:", "raytrain:", "kubernetes:", "pulumi-python:dynamic")
# Member names the provider spells differently from the API, per request shape.
RENAMES = {
    "LaunchTemplateInstanceNetworkInterfaceSpecificationRequest": {"securityGroups": "Groups"},
    "LaunchTemplatePlacementRequest": {"groupName": "GroupName"},
}
# pulumi_aws auto-names these (resource name + "-" + 7 random hex characters); offline there is no name yet.
AUTONAME_SUFFIX = "-0a1b2c3"


@dataclass(frozen=True)
class Request:
    resource: str  # type and name of the resource it comes from
    service: str
    operation: str
    params: dict[str, Any]


@lru_cache(maxsize=None)
def model(service: str):
    return botocore.session.get_session().get_service_model(service)


def tag_list(tags: dict[str, str], key: str = "Key", value: str = "Value") -> list[dict]:
    return [{key: k, value: v} for k, v in tags.items()]


def ec2_tags(kind: str, tags: dict[str, str] | None) -> list[dict]:
    return [{"ResourceType": kind, "Tags": tag_list(tags)}] if tags else []


def autoname(inputs: dict, name: str, key: str = "name") -> str:
    return inputs.get(key) or f"{name}{AUTONAME_SUFFIX}"


def _vpc(i, n, t):
    return [("ec2", "CreateVpc", {"CidrBlock": i["cidrBlock"], "TagSpecifications": ec2_tags("vpc", t)})]


def _route_table(i, n, t):
    yield "ec2", "CreateRouteTable", {"VpcId": i["vpcId"], "TagSpecifications": ec2_tags("route-table", t)}
    for route in i.get("routes", []):
        yield "ec2", "CreateRoute", {"RouteTableId": f"{n}-id", "DestinationCidrBlock": route["cidrBlock"],
                                     **{k[0].upper() + k[1:]: v for k, v in route.items() if k != "cidrBlock"}}


def _launch_template(i, n, t):
    data = {k: v for k, v in i.items() if k not in ("tags", "name", "namePrefix")}
    data["tagSpecifications"] = [{"ResourceType": s["resourceType"], "Tags": tag_list(s["tags"])}
                                 for s in i.get("tagSpecifications", [])]
    return [("ec2", "CreateLaunchTemplate", {"LaunchTemplateName": autoname(i, n), "LaunchTemplateData": data,
                                             "TagSpecifications": ec2_tags("launch-template", t)})]


def _sg_rule(direction):
    def mapping(i, n, t):
        return [("ec2", f"AuthorizeSecurityGroup{direction}", {
            "GroupId": i["securityGroupId"], "TagSpecifications": ec2_tags("security-group-rule", t),
            "IpPermissions": [{"IpProtocol": i["ipProtocol"],
                               "UserIdGroupPairs": [{"GroupId": i["referencedSecurityGroupId"],
                                                     "Description": i.get("description")}]}]})]
    return mapping


def _cluster(i, n, t):
    vpc = i["vpcConfig"]
    return [("eks", "CreateCluster", {
        "name": i["name"], "version": i["version"], "roleArn": i["roleArn"],
        "resourcesVpcConfig": {k: vpc[k] for k in ("subnetIds", "endpointPublicAccess", "endpointPrivateAccess",
                                                   "publicAccessCidrs")},
        "logging": {"clusterLogging": [{"types": i["enabledClusterLogTypes"], "enabled": True}]},
        "accessConfig": i["accessConfig"], "bootstrapSelfManagedAddons": i["bootstrapSelfManagedAddons"],
        "upgradePolicy": i["upgradePolicy"], "tags": t})]


def _node_group(i, n, t):
    params = {"clusterName": i["clusterName"], "nodegroupName": autoname(i, n, "nodeGroupName"),
              "subnets": i["subnetIds"], "nodeRole": i["nodeRoleArn"], "tags": t,
              **{k: i[k] for k in ("instanceTypes", "amiType", "capacityType", "labels", "taints", "launchTemplate",
                                   "scalingConfig", "updateConfig") if k in i}}
    return [("eks", "CreateNodegroup", params)]


def _bucket(i, n, t):
    name = i.get("bucket") or i["bucketPrefix"] + "0" * 26  # the provider appends 26 characters to a prefix
    return [("s3", "CreateBucket", {"Bucket": name}),
            ("s3", "PutBucketTagging", {"Bucket": name, "Tagging": {"TagSet": tag_list(t)}})]


def _lifecycle(i, n, t):
    rules = [{("ID" if k == "id" else k): v for k, v in rule.items()} for rule in i["rules"]]
    return [("s3", "PutBucketLifecycleConfiguration", {"Bucket": i["bucket"], "LifecycleConfiguration": {"Rules": rules}})]


MAPPINGS: dict[str, Callable[[dict, str, dict], Any]] = {
    "aws:ec2/vpc:Vpc": _vpc,
    "aws:ec2/internetGateway:InternetGateway": lambda i, n, t: [
        ("ec2", "CreateInternetGateway", {"TagSpecifications": ec2_tags("internet-gateway", t)}),
        ("ec2", "AttachInternetGateway", {"InternetGatewayId": f"{n}-id", "VpcId": i["vpcId"]})],
    "aws:ec2/routeTable:RouteTable": _route_table,
    "aws:ec2/subnet:Subnet": lambda i, n, t: [("ec2", "CreateSubnet", {
        "VpcId": i["vpcId"], "CidrBlock": i["cidrBlock"], "AvailabilityZone": i["availabilityZone"],
        "TagSpecifications": ec2_tags("subnet", t)})],
    "aws:ec2/routeTableAssociation:RouteTableAssociation": lambda i, n, t: [
        ("ec2", "AssociateRouteTable", {"RouteTableId": i["routeTableId"], "SubnetId": i["subnetId"]})],
    "aws:ec2/eip:Eip": lambda i, n, t: [("ec2", "AllocateAddress", {
        "Domain": i["domain"], "TagSpecifications": ec2_tags("elastic-ip", t)})],
    "aws:ec2/natGateway:NatGateway": lambda i, n, t: [("ec2", "CreateNatGateway", {
        "AllocationId": i["allocationId"], "SubnetId": i["subnetId"], "TagSpecifications": ec2_tags("natgateway", t)})],
    "aws:ec2/vpcEndpoint:VpcEndpoint": lambda i, n, t: [("ec2", "CreateVpcEndpoint", {
        "VpcId": i["vpcId"], "ServiceName": i["serviceName"], "VpcEndpointType": i["vpcEndpointType"],
        "RouteTableIds": i["routeTableIds"], "PolicyDocument": i["policy"],
        "TagSpecifications": ec2_tags("vpc-endpoint", t)})],
    "aws:ec2/securityGroup:SecurityGroup": lambda i, n, t: [("ec2", "CreateSecurityGroup", {
        "GroupName": autoname(i, n), "Description": i["description"], "VpcId": i["vpcId"],
        "TagSpecifications": ec2_tags("security-group", t)})],
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": _sg_rule("Ingress"),
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": _sg_rule("Egress"),
    "aws:ec2/placementGroup:PlacementGroup": lambda i, n, t: [("ec2", "CreatePlacementGroup", {
        "GroupName": autoname(i, n), "Strategy": i["strategy"], "TagSpecifications": ec2_tags("placement-group", t)})],
    "aws:ec2/launchTemplate:LaunchTemplate": _launch_template,
    "aws:eks/cluster:Cluster": _cluster,
    "aws:eks/addon:Addon": lambda i, n, t: [("eks", "CreateAddon", {
        "clusterName": i["clusterName"], "addonName": i["addonName"],
        "resolveConflicts": i["resolveConflictsOnCreate"], "tags": t,
        **({"serviceAccountRoleArn": i["serviceAccountRoleArn"]} if i.get("serviceAccountRoleArn") else {})})],
    "aws:eks/nodeGroup:NodeGroup": _node_group,
    "aws:eks/accessEntry:AccessEntry": lambda i, n, t: [("eks", "CreateAccessEntry", {
        "clusterName": i["clusterName"], "principalArn": i["principalArn"], "type": i["type"], "tags": t})],
    "aws:eks/accessPolicyAssociation:AccessPolicyAssociation": lambda i, n, t: [("eks", "AssociateAccessPolicy", {
        "clusterName": i["clusterName"], "principalArn": i["principalArn"], "policyArn": i["policyArn"],
        "accessScope": i["accessScope"]})],
    "aws:iam/role:Role": lambda i, n, t: [("iam", "CreateRole", {
        "RoleName": autoname(i, n), "AssumeRolePolicyDocument": i["assumeRolePolicy"],
        **({"Description": i["description"]} if "description" in i else {}), "Tags": tag_list(t)})],
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": lambda i, n, t: [("iam", "AttachRolePolicy", {
        "RoleName": i["role"], "PolicyArn": i["policyArn"]})],
    "aws:iam/rolePolicy:RolePolicy": lambda i, n, t: [("iam", "PutRolePolicy", {
        "RoleName": i["role"], "PolicyName": autoname(i, n), "PolicyDocument": i["policy"]})],
    "aws:iam/openIdConnectProvider:OpenIdConnectProvider": lambda i, n, t: [("iam", "CreateOpenIDConnectProvider", {
        "Url": i["url"], "ClientIDList": i["clientIdLists"], "Tags": tag_list(t)})],
    "aws:s3/bucket:Bucket": _bucket,
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": lambda i, n, t: [("s3", "PutPublicAccessBlock", {
        "Bucket": i["bucket"], "PublicAccessBlockConfiguration": {k: v for k, v in i.items() if k != "bucket"}})],
    "aws:s3/bucketVersioning:BucketVersioning": lambda i, n, t: [("s3", "PutBucketVersioning", {
        "Bucket": i["bucket"], "VersioningConfiguration": i["versioningConfiguration"]})],
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration": lambda i, n, t: [
        ("s3", "PutBucketEncryption", {"Bucket": i["bucket"], "ServerSideEncryptionConfiguration": {"Rules": [
            {"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": r["applyServerSideEncryptionByDefault"]["sseAlgorithm"]},
             "BucketKeyEnabled": r["bucketKeyEnabled"]} for r in i["rules"]]}})],
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration": _lifecycle,
    "aws:s3/bucketPolicy:BucketPolicy": lambda i, n, t: [("s3", "PutBucketPolicy", {
        "Bucket": i["bucket"], "Policy": i["policy"]})],
    "aws:cloudwatch/logGroup:LogGroup": lambda i, n, t: [
        ("logs", "CreateLogGroup", {"logGroupName": i["name"], "tags": t}),
        ("logs", "PutRetentionPolicy", {"logGroupName": i["name"], "retentionInDays": i["retentionInDays"]})],
    "aws:autoscaling/tag:Tag": lambda i, n, t: [("autoscaling", "CreateOrUpdateTags", {"Tags": [{
        "ResourceId": i["autoscalingGroupName"], "ResourceType": "auto-scaling-group", "Key": i["tag"]["key"],
        "Value": i["tag"]["value"], "PropagateAtLaunch": i["tag"]["propagateAtLaunch"]}]})],
}


class _Unknown:
    """A value another resource computes during apply (the engine sends it as None at preview)."""

    def __repr__(self) -> str:
        return "<unknown until apply>"


UNKNOWN = _Unknown()


def with_unknowns(value: Any) -> Any:
    """The engine's values as the mappings read them: None as UNKNOWN, whole floats (the wire's numbers) as ints."""
    if value is None:
        return UNKNOWN
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: with_unknowns(v) for k, v in value.items() if k != "__provider"}
    if isinstance(value, list):
        return [with_unknowns(v) for v in value]
    return value


def resource_problems(typ: str, name: str, inputs: dict, default_tags: dict[str, str]) -> list[str]:
    """What AWS would refuse in one resource's requests, its inputs as the engine has them at preview."""
    mapping = MAPPINGS.get(typ)
    if mapping is None:
        return [f"{typ}: no request mapping (deploy/aws_requests.py MAPPINGS); add one"]
    inputs = with_unknowns(inputs)
    own = inputs.get("tags")
    tags = {**default_tags, **own} if isinstance(own, dict) else {}
    try:
        built = mapping(inputs, name, tags)
    except (TypeError, KeyError, AttributeError, IndexError):
        return []  # the request needs a value known only during apply: the offline plan checks it
    found = [Request(f"{typ} {name}", service, operation, params) for service, operation, params in built]
    return [f"{r.resource}: {r.service} {r.operation}: {message}" for r in found for _, message in check(r)]


def preview_transform() -> Callable:
    """A resource transform (pulumi.runtime.register_resource_transform) that stops the preview at the
    first resource AWS would refuse, naming it and the member; it never changes a resource."""
    import pulumi

    default_tags: dict[str, str] = {}

    def transform(args):
        if args.type_ == "pulumi:providers:aws" and args.name == "aws":
            tags = args.props.get("defaultTags")
            tags = json.loads(tags) if isinstance(tags, str) else tags or {}
            default_tags.clear()
            default_tags.update({k: v for k, v in (tags.get("tags") or {}).items() if isinstance(v, str)})
        elif args.custom and not args.type_.startswith(NOT_AWS):
            if refused := resource_problems(args.type_, args.name, dict(args.props), default_tags):
                raise pulumi.RunError("AWS would refuse these requests (botocore's request shapes, "
                                      "deploy/aws_requests.py):\n  " + "\n  ".join(refused))
        return None

    return transform


def merged_tags(resource, default_tags: dict[str, str]) -> dict[str, str]:
    """What AWS stores on the resource: the provider's default tags under the resource's own."""
    own = resource.inputs.get("tags")
    return {**default_tags, **own} if isinstance(own, dict) else {}


def requests(result) -> tuple[list[Request], list[str]]:
    """Every request of a plan, and the resource types that have no mapping."""
    from deploy import offline

    (provider,) = [p for p in result.of_type("pulumi:providers:aws") if p.name == "aws"]
    default_tags = json.loads(provider.inputs["defaultTags"])["tags"]
    found, unmapped = [], []
    for resource in result.resources:
        if resource.type.startswith(NOT_AWS):
            continue
        mapping = MAPPINGS.get(resource.type)
        if mapping is None:
            unmapped.append(resource.type)
            continue
        inputs = offline.plain(resource.inputs)
        for service, operation, params in mapping(inputs, resource.name, merged_tags(resource, default_tags)):
            found.append(Request(f"{resource.type} {resource.name}", service, operation, params))
    return found, unmapped


def problems(result) -> list[str]:
    """Every way the plan's requests break AWS's request shapes, each naming the resource and the member."""
    found, unmapped = requests(result)
    out = [f"{r.resource}: {r.service} {r.operation}: {message}" for r in found for _, message in check(r)]
    return out + [f"{t}: no request mapping (deploy/aws_requests.py MAPPINGS); add one" for t in sorted(set(unmapped))]


def check(request: Request) -> list[tuple[str, str]]:
    """(kind, message) for every way the request breaks its botocore input shape."""
    shape = model(request.service).operation_model(request.operation).input_shape
    errors: list[tuple[str, str]] = []
    _walk(request.params, shape, f"{request.service}.{request.operation}", errors)
    return errors


def _member(shape, key: str) -> str | None:
    renamed = RENAMES.get(shape.name, {}).get(key)
    if renamed:
        return renamed
    return next((m for m in shape.members if m.lower() == key.lower()), None)


def _walk(value: Any, shape, path: str, errors: list) -> None:
    """Check `value` against a botocore shape, by the shape's type (a type not listed, or UNKNOWN: not checked)."""
    if value is UNKNOWN:
        return
    check = _CHECKS.get("integer" if shape.type_name == "long" else shape.type_name)
    if check is not None:
        check(value, shape, path, errors)


def _structure(value: Any, shape, path: str, errors: list) -> None:
    if not isinstance(value, dict):
        errors.append(("type", f"{path}: expected a structure, got {value!r}"))
        return
    present = {}
    for key, item in value.items():
        if item is None:
            continue
        name = _member(shape, key)
        if name is None:
            errors.append(("unknown", f"{path}.{key}: no such member of {shape.name}"))
            continue
        present[name] = item
    for name in shape.required_members:
        if name not in present:
            errors.append(("required", f"{path}.{name}: required by {shape.name}, missing"))
    for name, item in present.items():
        _walk(item, shape.members[name], f"{path}.{name}", errors)


def _list(value: Any, shape, path: str, errors: list) -> None:
    if not isinstance(value, list):
        errors.append(("type", f"{path}: expected a list, got {value!r}"))
        return
    _length(len(value), shape.metadata, path, errors)
    for index, item in enumerate(value):
        _walk(item, shape.member, f"{path}[{index}]", errors)


def _map(value: Any, shape, path: str, errors: list) -> None:
    if not isinstance(value, dict):
        errors.append(("type", f"{path}: expected a map, got {value!r}"))
        return
    _length(len(value), shape.metadata, path, errors)
    for key, item in value.items():
        _walk(key, shape.key, f"{path} key {key!r}", errors)
        _walk(item, shape.value, f"{path}[{key!r}]", errors)


def _boolean(value: Any, shape, path: str, errors: list) -> None:
    if not (isinstance(value, bool) or value in ("true", "false")):
        errors.append(("type", f"{path}: expected a boolean, got {value!r}"))


def _integer(value: Any, shape, path: str, errors: list) -> None:
    meta = shape.metadata
    if isinstance(value, bool) or not isinstance(value, int):
        errors.append(("type", f"{path}: expected an integer, got {value!r}"))
        return
    if "min" in meta and value < meta["min"] or "max" in meta and value > meta["max"]:
        errors.append(("range", f"{path}: {value} outside {meta.get('min')}..{meta.get('max')}"))


def _string(value: Any, shape, path: str, errors: list) -> None:
    meta = shape.metadata
    if not isinstance(value, str):
        errors.append(("type", f"{path}: expected a string, got {value!r}"))
        return
    if shape.enum and value not in shape.enum:
        errors.append(("enum", f"{path}: {value!r} is not one of {shape.enum}"))
    _length(len(value), meta, path, errors)
    if "pattern" in meta and not pattern(meta["pattern"]).fullmatch(value):
        errors.append(("pattern", f"{path}: {value!r} does not match {meta['pattern']}"))


_CHECKS = {"structure": _structure, "list": _list, "map": _map, "boolean": _boolean, "integer": _integer,
           "string": _string}  # "long" is checked as "integer"


def _length(size: int, meta: dict, path: str, errors: list) -> None:
    if "min" in meta and size < meta["min"]:
        errors.append(("min", f"{path}: length {size} below the minimum {meta['min']}"))
    if "max" in meta and size > meta["max"]:
        errors.append(("max", f"{path}: length {size} above the maximum {meta['max']}"))


@lru_cache(maxsize=None)
def pattern(text: str) -> regex.Pattern:
    r"""botocore's patterns are Java regexes, matched against the whole value as Java's matches() does:
    \p{L} and the like (the regex module reads them), and supplementary characters as UTF-16
    surrogate pairs, which Python spells as code points."""
    return regex.compile(text.replace("\\uD800\\uDC00-\\uDBFF\\uDFFF", "\\U00010000-\\U0010FFFF"))
