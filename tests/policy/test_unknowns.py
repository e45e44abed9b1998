"""Values unknown during `pulumi preview` never produce a false violation: a rule either decides
from what is known or says it cannot decide yet (model.Unknown)."""
from __future__ import annotations

import copy
from typing import Any, Iterator

from policy import model, rules
from policy.model import UNKNOWN
from tests.guards import nonempty

from . import rule_named
from .conftest import first_preview
from .test_rules import DIGEST, ingress, ray_cluster, service

HAND_BUILT = [
    (model.SERVICE, service("ray", "ClusterIP", {"ray.io/node-type": "head"}, [{"name": "dashboard", "port": 8265}])),
    ("kubernetes:networking.k8s.io/v1:Ingress", ingress("web", "frontend", {"number": 80})),
    ("kubernetes:ray.io/v1:RayCluster", ray_cluster(serviceType="ClusterIP")),
    ("kubernetes:apps/v1:Deployment", {"metadata": {"namespace": "ray"}, "spec": {"template": {"spec": {
        "containers": [{"name": "x", "image": DIGEST}]}}}}),
    (model.EKS_CLUSTER, {"vpcConfig": {"endpointPublicAccess": True, "publicAccessCidrs": ["203.0.113.10/32"]}}),
]


def paths(value: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every place in a props tree: each key of a mapping and each element of a list, at any depth."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield (*prefix, key)
            yield from paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield (*prefix, i)
            yield from paths(child, (*prefix, i))


def with_unknown(props: dict, path: tuple) -> dict:
    changed = copy.deepcopy(props)
    target = changed
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = UNKNOWN
    return changed


def outcome(run) -> str:
    try:
        return "violation" if run() else "pass"
    except model.Unknown:
        return "unknown"


def test_an_unknown_anywhere_in_a_compliant_resource_is_never_a_violation(plans):
    corpus = HAND_BUILT + [(r.type, r.inputs) for plan in plans.values() for r in plan.recorded]
    unknown_at = set()
    checked = 0
    for typ, props in corpus:
        for rule in (r for r in rules.RULES if r.kind == "resource"):
            assert rule.check((typ, props)) == [], (rule.name, typ)
            for path in paths(props):
                result = outcome(lambda: rule.check((typ, with_unknown(props, path))))
                assert result != "violation", (rule.name, typ, path)
                checked += 1
                if result == "unknown":
                    unknown_at.add((rule.name, path[-1]))
    assert checked > 5000
    # the rules do notice the unknowns that matter
    assert {("imdsv2-required", "httpTokens"), ("imdsv2-required", "metadataOptions"),
            ("no-public-ip-on-nodes", "associatePublicIpAddress"), ("eks-endpoint-restricted", "publicAccessCidrs"),
            ("ray-not-exposed", "serviceType"), ("ray-not-exposed", "type"), ("images-by-digest", "image"),
            ("images-by-digest", "containers")} <= unknown_at


def test_an_unknown_anywhere_in_the_stack_is_never_a_violation(plans):
    stack = plans["p5"].stack_resources()
    relevant = {model.LAUNCH_TEMPLATE, model.SECURITY_GROUP, model.VPC_INGRESS, model.VPC_EGRESS, model.NODE_GROUP,
                model.SUBNET}
    stack_rules = [r for r in rules.RULES if r.kind == "stack"]
    unknown_at = set()
    for i, resource in nonempty(enumerate(stack), "resources of the stack"):
        if resource.type not in relevant:
            continue
        for path in paths(dict(resource.props)):
            changed = model.Resource(resource.type, resource.name, with_unknown(dict(resource.props), path),
                                     resource.urn, resource.id)
            for rule in stack_rules:
                result = outcome(lambda: rule.check([*stack[:i], changed, *stack[i + 1:]]))
                assert result != "violation", (rule.name, resource.name, path)
                if result == "unknown":
                    unknown_at.add((rule.name, resource.type, path[-1]))
    assert {("efa-security-group-self-rules", model.VPC_EGRESS, "ipProtocol"),
            ("efa-security-group-self-rules", model.LAUNCH_TEMPLATE, "interfaceType"),
            ("max-gpu-nodes", model.NODE_GROUP, "maxSize"),
            ("nodes-in-private-subnets", model.SUBNET, "mapPublicIpOnLaunch")} <= unknown_at


def test_the_whole_program_on_its_first_preview(plans):
    """No IDs at all: stack rules resolve every reference through property dependencies."""
    for plan in nonempty(plans.values(), "plans"):
        stack = first_preview(plan.stack_resources())
        (efa_lt,) = [r for r in stack if r.type == model.LAUNCH_TEMPLATE and r.props.get("networkInterfaces")]
        assert UNKNOWN in efa_lt.props["networkInterfaces"][0]["securityGroups"]
        for rule in (r for r in rules.RULES if r.kind == "stack"):
            assert rule.check(stack) == [], rule.name
        without_egress = [r for r in stack if r.type != model.VPC_EGRESS]
        (violation,) = rule_named("efa-security-group-self-rules").check(without_egress)
        count = len(efa_lt.props["networkInterfaces"])
        span = "[0]" if count == 1 else f"[0..{count - 1}] ({count})"
        assert f"gpu-efa on gpu-lt EFA interfaces {span} lacks the all-traffic egress rule" in violation.message
        public = [model.Resource(r.type, r.name, {**r.props, "mapPublicIpOnLaunch": True}, r.urn, r.id, r.deps)
                  if r.type == model.SUBNET else r for r in stack]
        assert rule_named("nodes-in-private-subnets").check(public)
