"""What the rules see: plain resource data, the engine's unknown values, findings, and references.

Properties use the engine's camelCase names. A value the engine does not know yet (during
`pulumi preview`, anything computed from a resource still to be created) arrives as UNKNOWN. A
rule never guesses about it: it reports what it can decide and, when an UNKNOWN was the only
thing standing between it and a all_of, raises Unknown, which Pulumi shows as an advisory
"can't run policy during preview"; `pulumi up` runs the rule again once the values are known.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence


class _UnknownValue:
    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _UnknownValue()


class Unknown(Exception):
    """The verdict depends on a value that is not known until the resource exists."""

    def __init__(self, path: str):
        super().__init__(f"{path} is not known during preview")
        self.path = path


class PolicyConfigError(ValueError):
    """A policy pack configuration value is invalid."""


@dataclass(frozen=True)
class Resource:
    """One resource of a stack, as stack rules see it.

    `id` is the physical ID when known; `deps` maps a top-level property to the URNs
    of the resources its value was computed from (the engine's property
    dependencies), which is how references are resolved while IDs are still unknown.
    """

    type: str
    name: str
    props: Mapping[str, Any]
    urn: str = ""
    id: Any = None
    deps: Mapping[str, Sequence[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Violation:
    message: str
    urn: str = ""


class Findings:
    """Violations found so far, and the first unknown value that blocked a decision."""

    def __init__(self) -> None:
        self.violations: list = []
        self.unknown: str | None = None

    def fail(self, item) -> None:
        self.violations.append(item)

    def not_known(self, path: str) -> None:
        self.unknown = self.unknown or path

    def result(self) -> list:
        if self.violations:
            return self.violations
        if self.unknown:
            raise Unknown(self.unknown)
        return []


def get(value: Any, *path: str | int, default: Any = None) -> Any:
    """value[path[0]][path[1]]...; UNKNOWN as soon as an unknown value is met on the way."""
    for key in path:
        if value is UNKNOWN:
            return UNKNOWN
        if isinstance(key, int):
            if not isinstance(value, (list, tuple)) or key >= len(value):
                return default
        elif not isinstance(value, Mapping) or key not in value:
            return default
        value = value[key]
    return value


def elements(value: Any, path: str, found: "Findings") -> list:
    """The elements of a list property; an unknown list is noted and yields nothing."""
    if value is UNKNOWN:
        found.not_known(path)
        return []
    return list(value) if isinstance(value, (list, tuple)) else []


def truthy(value: Any) -> bool:
    """pulumi_aws passes some booleans as strings ("true")."""
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


# The resource types the rules read, as the engine names them.
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
INSTANCE = "aws:ec2/instance:Instance"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
EKS_MANAGED_NODE_GROUP = "eks:index:ManagedNodeGroup"
EKS_CLUSTER = "aws:eks/cluster:Cluster"
EKS_COMPONENT_CLUSTER = "eks:index:Cluster"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
SUBNET = "aws:ec2/subnet:Subnet"
VPC_INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
VPC_EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
SERVICE = "kubernetes:core/v1:Service"
INGRESS_TYPES = ("kubernetes:networking.k8s.io/v1:Ingress", "kubernetes:networking.k8s.io/v1beta1:Ingress",
                 "kubernetes:extensions/v1beta1:Ingress")
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
RAY_CLUSTER_SPECS = {  # type -> path of the RayCluster spec inside the resource
    "kubernetes:ray.io/v1:RayCluster": ("spec",),
    "kubernetes:ray.io/v1alpha1:RayCluster": ("spec",),
    "kubernetes:ray.io/v1:RayJob": ("spec", "rayClusterSpec"),
    "kubernetes:ray.io/v1:RayService": ("spec", "rayClusterConfig"),
}


# --- references between resources ---------------------------------------------------------

ALL_PROTOCOLS = ("-1", "all")


def refers(holder: Resource, prop: str, value: Any, target: Resource) -> bool:
    """Whether `value`, found under holder.props[prop], is target's ID."""
    if value is not UNKNOWN and value is not None and target.id not in (None, UNKNOWN) and value == target.id:
        return True
    return bool(target.urn) and target.urn in (holder.deps.get(prop) or ())


def resolve(holder: Resource, prop: str, values: Sequence[Any], candidates: Sequence[Resource],
             found: Findings, path: str) -> list[Resource]:
    """The candidates `values` refer to; an unknown value that resolves to none of them is noted."""
    matched = [c for c in candidates if any(refers(holder, prop, v, c) for v in values)]
    if not matched and any(v is UNKNOWN for v in values):
        found.not_known(path)
    return matched


def all_of(*conditions: Any) -> bool | None:
    """True if all hold, False if one fails, None if an unknown value leaves it open."""
    if any(c is False for c in conditions):
        return False
    return None if any(c is None for c in conditions) else True


def equals(value: Any, *allowed: str) -> bool | None:
    return None if value is UNKNOWN else str(value) in allowed


def is_ref(holder: Resource, prop: str, group: Resource) -> bool | None:
    value = holder.props.get(prop)
    if refers(holder, prop, value, group):
        return True
    # An unknown ID whose dependencies name other resources is not this group's.
    return None if value is UNKNOWN and not holder.deps.get(prop) else False

