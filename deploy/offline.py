"""Run the Pulumi program in-process under mocks: no AWS credentials, no Pulumi CLI.

Used by the offline plan (`python -m deploy.plan`) and by the tests. Every declared
resource is recorded with its inputs; IDs and cloud-assigned attributes are
placeholders. `pulumi preview` against a real account shows the real diff.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

import pulumi
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime.proto import resource_pb2

from infra import aws_rules

ACCOUNT = "123456789012"
CALLER = f"arn:aws:sts::{ACCOUNT}:assumed-role/Deployer/pulumi"  # in the region's partition: RecordingMocks
# An account's own mapping of zone names to zone IDs (every account has a different one); us-east-1b is
# use1-az3 here, a zone EKS refuses for control-plane subnets.
US_EAST_1_ZONE_IDS = {"us-east-1a": "use1-az2", "us-east-1b": "use1-az3", "us-east-1c": "use1-az6",
                      "us-east-1d": "use1-az1", "us-east-1e": "use1-az4", "us-east-1f": "use1-az5"}


@dataclass
class Recorded:
    type: str
    name: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    id: str = ""


@dataclass(frozen=True)
class Registration:
    """What the engine is told about a resource beyond its inputs: its place in the graph, and its old URNs."""

    urn: str
    type: str
    name: str
    dependencies: frozenset[str]
    ignore_changes: tuple[str, ...]
    provider: str
    aliases: frozenset[str] = frozenset()
    parent: str = ""
    protect: bool = False
    retain_on_delete: bool = False
    delete_before_replace: bool = False
    replace_on_changes: tuple[str, ...] = ()


class _RecordingMonitor(pulumi_mocks.MockMonitor):
    """Records every registration's dependencies and aliases, and never offers resource references.

    The stock mock monitor flakes ("attached to a different loop") when a resource is an input.
    Without alias specs the SDK sends each alias of a resource's own as a full URN; what a child
    inherits from its parent's aliases the engine adds (PlanResult.old_urns).
    """

    def __init__(self, mocks: "RecordingMocks"):
        super().__init__(mocks)
        self.registrations: dict[str, Registration] = {}

    def SupportsFeature(self, request):
        has_support = request.id not in ("outputValues", "resourceReferences")
        return type("SupportsFeatureResponse", (object,), {"hasSupport": has_support})

    def GetDeploymentInfo(self, request):
        info = super().GetDeploymentInfo(request)
        refused = (resource_pb2.RESOURCE_MONITOR_FEATURE_RESOURCE_REFERENCES, resource_pb2.RESOURCE_MONITOR_FEATURE_ALIAS_SPECS)
        kept = [f for f in info.supportedFeatures if f not in refused]
        return resource_pb2.DeploymentInfo(supportedFeatures=kept)

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        self.registrations[response.urn] = Registration(
            response.urn, request.type, request.name, frozenset(request.dependencies),
            tuple(request.ignoreChanges), request.provider, frozenset(request.aliasURNs), request.parent,
            bool(request.protect), bool(request.retainOnDelete), bool(request.deleteBeforeReplace),
            tuple(request.replaceOnChanges))
        return response


def _zone_ids(region: str, zones: list[str]) -> dict[str, str]:
    if region == "us-east-1":
        return {z: US_EAST_1_ZONE_IDS.get(z, f"use1-az{9 + i}") for i, z in enumerate(zones)}
    parts = region.split("-")
    short = f"{parts[0]}{''.join(p[0] for p in parts[1:-1])}{parts[-1]}"
    return {z: f"{short}-az{len(zones) - i}" for i, z in enumerate(zones)}  # names and IDs in different orders


class RecordingMocks(pulumi.runtime.Mocks):
    """Records resources and answers the data-source calls the program makes, in the shapes AWS returns.

    `reservations` maps a capacity reservation id to what EC2 holds for it (AvailabilityZone, InstanceType,
    InstanceCount, State, and kind "capacity-block" for a Capacity Block); an id not listed is not found,
    as EC2 answers (offline, `assume_reservations_from` lists those a configuration names).
    `quotas` maps an EC2 quota code to its value (default: ample). `offered_by_type` gives an instance
    type its own offered zones (default: offered_zones for every type). `clusters` are the EKS clusters the
    account already runs, by name: {"version": "1.34", "nodeGroups": {name: version}} (default: none).
    """

    def __init__(self, region: str, *, zones: list[str] | None = None, offered_zones: list[str] | None = None,
                 zone_ids: dict[str, str] | None = None, reservations: dict[str, dict] | None = None,
                 caller_arn: str = CALLER,
                 quotas: dict[str, float] | None = None, offered_by_type: dict[str, list[str]] | None = None,
                 clusters: dict[str, dict] | None = None):
        self.region = region
        self.partition = aws_rules.partition(region) if region else "aws"
        self.zones = zones or ([*US_EAST_1_ZONE_IDS] if region == "us-east-1" else [f"{region}{s}" for s in "abcd"])
        self.zone_ids = zone_ids or _zone_ids(region, self.zones)
        self.offered_zones = self.zones[:3] if offered_zones is None else offered_zones
        self.reservations = reservations or {}
        self.caller_arn = caller_arn if caller_arn != CALLER else aws_rules.in_partition(CALLER, region)
        self.quotas = quotas or {}
        self.offered_by_type = offered_by_type or {}  # instance type -> its zones, where not offered_zones
        self.clusters = clusters or {}  # a deployed cluster: {"version": "1.34", "nodeGroups": {name: version}}
        self.resources: list[Recorded] = []
        self.calls: list[tuple[str, dict]] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        outputs = dict(args.inputs)
        rid = f"{args.name}-id"
        arn_kind = args.typ.split(":")[1].split("/")[0]
        outputs.setdefault("arn", f"arn:{self.partition}:{arn_kind}:{self.region}:{ACCOUNT}:{args.name}")
        if args.typ == "aws:eks/cluster:Cluster":
            outputs.update({
                "endpoint": f"https://{args.name}.gr7.{self.region}.eks.amazonaws.com",
                "certificateAuthority": {"data": "UExBQ0VIT0xERVI="},
                "identities": [{"oidcs": [{"issuer": f"https://oidc.eks.{self.region}.amazonaws.com/id/PLACEHOLDER"}]}],
                "vpcConfig": {**outputs.get("vpcConfig", {}), "clusterSecurityGroupId": "sg-cluster-placeholder"},
            })
        elif args.typ == "aws:s3/bucket:Bucket":
            outputs.setdefault("bucket", f"{args.inputs.get('bucketPrefix', args.name)}placeholder")
            outputs["arn"] = f"arn:{self.partition}:s3:::{outputs['bucket']}"
        elif args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            outputs["latestVersion"] = 1
        elif args.typ == "aws:ec2/placementGroup:PlacementGroup":
            outputs.setdefault("name", f"{args.name}-placeholder")
        elif args.typ == "aws:eks/nodeGroup:NodeGroup":
            outputs.setdefault("nodeGroupName", args.name)
            outputs.setdefault("resources", [{"autoscalingGroups": [{"name": f"eks-{args.name}-placeholder"}],
                                              "remoteAccessSecurityGroupId": ""}])
        elif args.typ.startswith("pulumi-python:dynamic") and "image" in args.inputs:
            from workloads.image import placeholder_outputs  # an image pin: a placeholder digest, flagged

            outputs.update(placeholder_outputs(args.inputs))
        elif args.typ == "aws:iam/openIdConnectProvider:OpenIdConnectProvider":
            outputs["arn"] = f"arn:{self.partition}:iam::{ACCOUNT}:oidc-provider/{str(args.inputs.get('url', '')).removeprefix('https://')}"
        elif args.typ == "aws:iam/role:Role":
            outputs["arn"] = f"arn:{self.partition}:iam::{ACCOUNT}:role/{args.name}"
            outputs.setdefault("name", args.name)
        self.resources.append(Recorded(args.typ, args.name, dict(args.inputs), outputs, rid))
        return [rid, outputs]

    def _eks(self, token: str, args: dict) -> dict:
        """The account's deployed clusters (`clusters`), as the EKS data sources read them."""
        if token == "aws:eks/getClusters:getClusters":
            return {"names": sorted(self.clusters), "id": self.region}
        if token == "aws:eks/getAddonVersion:getAddonVersion":  # a default version per Kubernetes version
            minor = str(args["kubernetesVersion"]).split(".")[-1]
            return {"addonName": args["addonName"], "kubernetesVersion": args["kubernetesVersion"],
                    "version": f"v1.{minor}.0-eksbuild.1", "id": args["addonName"]}
        cluster = self.clusters[args.get("name") or args["clusterName"]]
        if token == "aws:eks/getCluster:getCluster":
            return {"name": args["name"], "version": cluster["version"], "id": args["name"]}
        groups = cluster.get("nodeGroups", {})
        if token == "aws:eks/getNodeGroups:getNodeGroups":
            return {"clusterName": args["clusterName"], "names": sorted(groups), "id": args["clusterName"]}
        return {"clusterName": args["clusterName"], "nodeGroupName": args["nodeGroupName"],
                "version": groups[args["nodeGroupName"]], "id": args["nodeGroupName"]}

    def call(self, args: pulumi.runtime.MockCallArgs):
        self.calls.append((args.token, dict(args.args)))
        if args.token == "aws:index/getAvailabilityZones:getAvailabilityZones":
            return {"names": self.zones, "zoneIds": [self.zone_ids[z] for z in self.zones], "id": self.region,
                    "groupNames": [self.region] * len(self.zones)}
        if args.token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            by_id = args.args.get("locationType") == "availability-zone-id"
            offered = self.offered_by_type.get(args.args["filters"][0]["values"][0], self.offered_zones)
            locations = [self.zone_ids[z] if by_id else z for z in offered]
            return {"locations": locations, "locationTypes": [args.args.get("locationType")] * len(locations),
                    "instanceTypes": [args.args["filters"][0]["values"][0]] * len(locations), "id": self.region}
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {"accountId": ACCOUNT, "arn": self.caller_arn, "userId": "AROAPLACEHOLDER:pulumi", "id": ACCOUNT}
        if args.token == "aws:cloudcontrol/getResource:getResource":
            found = self._reservation(args.args["identifier"])
            if found.get("kind") == "capacity-block":
                raise Exception(f"{args.args['identifier']} is a Capacity Block")  # noqa: TRY002 - as AWS answers
            props = {k: v for k, v in found.items() if k != "kind"}
            return {"identifier": args.args["identifier"], "typeName": args.args["typeName"],
                    "properties": json.dumps({"Id": args.args["identifier"], "InstancePlatform": "Linux/UNIX",
                                              "TotalInstanceCount": props.get("InstanceCount"), **props})}
        if args.token == "aws:ec2/getCapacityBlockReservation:getCapacityBlockReservation":
            found = self._reservation(args.args["id"])
            if found.get("kind") != "capacity-block":
                raise Exception(f"no Capacity Block {args.args['id']} (it is not of type capacity-block)")  # noqa: TRY002
            return {"id": args.args["id"], "availabilityZone": found["AvailabilityZone"],
                    "instanceType": found["InstanceType"], "instanceCount": found["InstanceCount"],
                    "instancePlatform": "Linux/UNIX", "state": found.get("State", "active"),
                    "startDate": found.get("StartDate", "2026-12-01T11:30:00Z"), "reservationType": "capacity-block"}
        if args.token.startswith("aws:eks/get"):
            return self._eks(args.token, args.args)
        if args.token == "aws:ec2/getInstances:getInstances":  # this stack's instances in a reservation: none yet
            return {"ids": [], "privateIps": [], "publicIps": [], "ipv6Addresses": [], "id": self.region}
        if args.token == "aws:servicequotas/getServiceQuota:getServiceQuota":
            code = args.args["quotaCode"]
            return {"quotaCode": code, "serviceCode": "ec2", "value": self.quotas.get(code, 100000.0), "id": code}
        return {}

    def assume_reservations_from(self, cfg) -> None:
        """Offline there is no reservation to read: assume each holds what its pool asks for, in the pool's zone."""
        for pool in cfg.node_pools:
            if pool.capacity_reservation_id and pool.capacity_reservation_id not in self.reservations:
                wanted = pool.availability_zone or cfg.availability_zone
                zone = next((n for n, i in self.zone_ids.items() if wanted in (n, i)), self.zones[0])
                self.reservations[pool.capacity_reservation_id] = {
                    "AvailabilityZone": zone, "InstanceType": pool.instance_type, "InstanceCount": pool.max_size,
                    "State": "active", "kind": "capacity-block" if pool.capacity_type == "CAPACITY_BLOCK" else "odcr"}

    def _reservation(self, rid: str) -> dict:
        if rid not in self.reservations:
            raise Exception(f"capacity reservation {rid} not found")  # noqa: TRY002 - what the API answers
        return self.reservations[rid]


@dataclass
class PlanResult:
    resources: list[Recorded]
    outputs: dict[str, Any]
    calls: list[tuple[str, dict]] = field(default_factory=list)
    secret_outputs: set[str] = field(default_factory=set)
    registrations: dict[str, Registration] = field(default_factory=dict)

    def reg(self, typ: str, name: str) -> Registration:
        (found,) = [r for r in self.registrations.values() if r.type == typ and r.name == name]
        return found

    def urn(self, typ: str, name: str) -> str:
        return self.reg(typ, name).urn

    def urns(self, predicate) -> list[str]:
        return [r.urn for r in self.registrations.values() if predicate(r)]

    def ancestors(self, urn: str) -> set[str]:
        """Everything `urn` depends on, directly or not: what Pulumi deletes only after it."""
        seen: set[str] = set()
        todo = list(self.registrations[urn].dependencies)
        while todo:
            dep = todo.pop()
            if dep not in seen:
                seen.add(dep)
                todo.extend(self.registrations[dep].dependencies if dep in self.registrations else ())
        return seen

    def old_urns(self, urn: str) -> set[str]:
        """Every URN the engine matches `urn` against in an existing state: its own as the engine writes it, its
        aliases, and those it inherits from its parent's aliases (the engine's stepGenerator.generateAliases)."""
        reg = self.registrations[urn]
        found = {engine_urn(urn), *map(engine_urn, reg.aliases)}
        if reg.parent in self.registrations:
            parent = self.registrations[reg.parent]
            for alias in self.old_urns(reg.parent) - {engine_urn(reg.parent)}:
                prefix, chain, alias_name = alias.rsplit("::", 2)
                name = alias_name + reg.name[len(parent.name):] if reg.name.startswith(parent.name) else reg.name
                found.add(f"{prefix}::{chain}${reg.type}::{name}")
        return found

    def of_type(self, typ: str) -> list[Recorded]:
        return [r for r in self.resources if r.type == typ]

    def one(self, typ: str, name: str | None = None) -> Recorded:
        found = [r for r in self.of_type(typ) if name is None or r.name == name]
        if len(found) != 1:
            raise AssertionError(f"expected one {typ} {name or ''}, found {[r.name for r in found]}")
        return found[0]


def engine_urn(urn: str) -> str:
    """The URN as the engine writes it: the mock monitor keeps the root stack's type in the chain, the engine drops it."""
    return urn.replace("::pulumi:pulumi:Stack$", "::", 1)


def plain(value: Any) -> Any:
    """Engine values as a person writes them: the wire format carries every number as a float."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if k != "__provider"}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def _config_strings(raw: dict[str, Any]) -> dict[str, str]:
    """Pulumi hands the program every value as a string, structured ones as JSON."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in raw.items()}


def run(raw_config: dict[str, Any], *, stack: str = "dev", project: str = "raytrain-eks",
        mocks: RecordingMocks | None = None, program: Callable[[], dict] | None = None) -> PlanResult:
    """Run the program once under mocks with the given full-key configuration.

    Without `mocks`, the configuration is loaded first (a ConfigError names every problem) and each
    capacity reservation it names is assumed to match its pool.
    """
    from deploy import config as stack_config
    from deploy import program as stack_program

    region = str(raw_config.get("aws:region") or "us-east-1")
    if mocks is None:
        mocks = RecordingMocks(region)
        if program is None:
            mocks.assume_reservations_from(stack_config.load(raw_config, stack=stack, project=project))
    monitor = _RecordingMonitor(mocks)
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=False, monitor=monitor)
    pulumi.runtime.set_all_config(_config_strings(raw_config))
    results: dict[str, Any] = {}
    secrets: set[str] = set()

    async def note_secret(name: str, output: pulumi.Output) -> None:
        if await output.is_secret():
            secrets.add(name)

    def body():
        outputs = program() if program else stack_program.main(offline=True)
        checks = [pulumi.Output.from_input(note_secret(k, pulumi.Output.from_input(v))) for k, v in outputs.items()]
        return pulumi.Output.all(pulumi.Output.all(**outputs).apply(results.update), *checks)

    pulumi.runtime.test(body)()
    return PlanResult(mocks.resources, results, mocks.calls, secrets, monitor.registrations)
