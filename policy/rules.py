"""This project's security and cost rules, registered with their settings: the pack is RULES.

Nothing here imports pulumi_policy: `pack.py` adapts the rules to the Pulumi policy SDK, and the
tests call them directly on hand-built resources and on the resources of the mocked program.
The rules live by concern in nodes, network, ray and pinning; what they see is policy.model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from policy.model import PolicyConfigError
from policy.network import efa_security_group_self_rules, eks_endpoint_restricted
from policy.nodes import imdsv2_required, max_gpu_nodes, no_public_ip_on_nodes, nodes_in_private_subnets
from policy.pinning import images_by_digest
from policy.ray import ray_namespace_default_deny, ray_not_exposed, ray_pods_least_privileged

# --- settings -------------------------------------------------------------------

@dataclass(frozen=True)
class Setting:
    name: str
    schema: Mapping[str, Any]
    description: str


def check_setting(rule: str, setting: Setting, value: Any) -> Any:
    schema = setting.schema
    where = f"policy pack config {rule}.{setting.name}"
    if schema["type"] == "integer":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise PolicyConfigError(f"{where}: {value!r} is not a whole number; {setting.description}")
        lo, hi = schema.get("minimum"), schema.get("maximum")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise PolicyConfigError(f"{where}: {value} is out of range; set a whole number from {lo} to {hi}")
        return value
    if schema["type"] == "array":
        if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) and v for v in value):
            raise PolicyConfigError(f"{where}: {value!r} is not a non-empty list of names; {setting.description}")
        return tuple(value)
    raise AssertionError(f"unsupported setting type {schema['type']}")


# --- the pack ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    kind: str  # "resource" or "stack"
    validate: Callable[..., list]
    settings: tuple[Setting, ...] = ()

    def config(self, raw: Mapping[str, Any] | None) -> dict[str, Any]:
        """The rule's settings: defaults overlaid with the pack config, each value checked."""
        raw = dict(raw or {})
        raw.pop("enforcementLevel", None)
        known = {s.name for s in self.settings}
        for name in raw:
            if name not in known:
                choices = ", ".join(sorted(known)) or "none"
                raise PolicyConfigError(f"policy pack config {self.name}.{name}: unknown setting; this policy takes: {choices}")
        return {s.name: check_setting(self.name, s, raw.get(s.name, s.schema["default"])) for s in self.settings}

    def check(self, subject, raw_config: Mapping[str, Any] | None = None) -> list:
        """Run the rule: `subject` is (type, props) for a resource rule, a list of Resource for a stack rule."""
        config = self.config(raw_config)
        if self.kind == "resource":
            resource_type, props = subject
            return self.validate(resource_type, props, config)
        return self.validate(subject, config)


DEFAULT_MAX_GPU_NODES = 4

RULES: tuple[Rule, ...] = (
    Rule("imdsv2-required",
         "Launch templates and instances require IMDSv2 tokens with a hop limit of 1; node groups use a launch template.",
         "resource", imdsv2_required,
         (Setting("maxHopLimit", {"type": "integer", "minimum": 1, "maximum": 64, "default": 1},
                  "the largest httpPutResponseHopLimit allowed (1 keeps pods away from node credentials)"),)),
    Rule("no-public-ip-on-nodes",
         "Nodes get no public IP address.", "resource", no_public_ip_on_nodes),
    Rule("eks-endpoint-restricted",
         "A public EKS API endpoint lists its allowed CIDRs and none of them is 0.0.0.0/0.",
         "resource", eks_endpoint_restricted),
    Rule("ray-not-exposed",
         "Nothing of Ray is reachable from outside the cluster: no LoadBalancer, NodePort or Ingress for Ray "
         "or in the Ray namespace.",
         "resource", ray_not_exposed,
         (Setting("rayNamespaces", {"type": "array", "items": {"type": "string"}, "minItems": 1, "default": ["ray"]},
                  "give the namespaces that run Ray, e.g. [\"ray\"]"),)),
    Rule("images-by-digest",
         "Every container image in a pod spec is pinned by digest (repository@sha256:<64 hex>).",
         "resource", images_by_digest),
    Rule("efa-security-group-self-rules",
         "Each EFA interface carries a security group allowing all traffic from and to itself (both directions).",
         "stack", efa_security_group_self_rules),
    Rule("max-gpu-nodes",
         "The stack runs at most maxGpuNodes GPU nodes (sum of the GPU node groups' maxSize).",
         "stack", max_gpu_nodes,
         (Setting("maxGpuNodes", {"type": "integer", "minimum": 0, "maximum": 1000, "default": DEFAULT_MAX_GPU_NODES},
                  f"set the largest number of GPU nodes this stack may run (default {DEFAULT_MAX_GPU_NODES})"),)),
    Rule("nodes-in-private-subnets",
         "Node groups only use subnets that do not map public IPs on launch.",
         "stack", nodes_in_private_subnets),
    Rule("ray-pods-least-privileged",
         "Ray containers drop all Linux capabilities, cannot escalate privileges and run under a seccomp profile.",
         "resource", ray_pods_least_privileged),
    Rule("ray-namespace-default-deny",
         "A RayCluster's namespace has a NetworkPolicy that denies all ingress by default.",
         "stack", ray_namespace_default_deny),
)
