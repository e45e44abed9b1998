"""Rules on the network: the EKS endpoint's access list, and EFA security groups' self rules in both directions."""
from __future__ import annotations

import ipaddress
from typing import Any, Mapping, Sequence

from policy.model import (
    ALL_PROTOCOLS,
    EKS_CLUSTER,
    EKS_COMPONENT_CLUSTER,
    LAUNCH_TEMPLATE,
    SECURITY_GROUP,
    SG_RULE,
    UNKNOWN,
    VPC_EGRESS,
    VPC_INGRESS,
    Findings,
    Resource,
    Violation,
    all_of,
    elements,
    equals,
    get,
    is_ref,
    refers,
    resolve,
    truthy,
)


def _endpoint_settings(resource_type: str, props: Mapping[str, Any]) -> tuple[Any, Any, str]:
    if resource_type == EKS_CLUSTER:
        vpc = props.get("vpcConfig")
        if vpc is UNKNOWN:
            return UNKNOWN, UNKNOWN, "vpcConfig"
        vpc = vpc if isinstance(vpc, Mapping) else {}
        return vpc.get("endpointPublicAccess"), vpc.get("publicAccessCidrs"), "vpcConfig."
    return props.get("endpointPublicAccess"), props.get("publicAccessCidrs"), ""


def eks_endpoint_restricted(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """A public EKS API endpoint must list the CIDRs allowed to reach it, never 0.0.0.0/0."""
    found = Findings()
    if resource_type not in (EKS_CLUSTER, EKS_COMPONENT_CLUSTER):
        return []
    public, cidrs, prefix = _endpoint_settings(resource_type, props)
    if public is UNKNOWN:
        found.not_known(f"{prefix}endpointPublicAccess")
        return found.result()
    if public is False or (isinstance(public, str) and public.lower() == "false"):
        return []
    if cidrs is UNKNOWN:
        found.not_known(f"{prefix}publicAccessCidrs")
    elif not cidrs:
        found.fail(f"{prefix}endpointPublicAccess is on and {prefix}publicAccessCidrs is empty, which AWS reads as "
                   "0.0.0.0/0; list the addresses you deploy from (x.x.x.x/32) or turn public access off")
    else:
        for i, cidr in enumerate(cidrs):
            if cidr is UNKNOWN:
                found.not_known(f"{prefix}publicAccessCidrs[{i}]")
                continue
            try:
                net = ipaddress.ip_network(str(cidr), strict=False)
            except ValueError:
                found.fail(f"{prefix}publicAccessCidrs[{i}] is {cidr!r}, not a CIDR; write it like 203.0.113.10/32")
                continue
            if net.prefixlen == 0:
                found.fail(f"{prefix}publicAccessCidrs[{i}] is {cidr}: the EKS API is open to the whole internet; "
                           "list only the addresses you deploy from")
    return found.result()


def _self_rules(group: Resource, resources: Sequence[Resource]) -> tuple[set[str], set[str]]:
    """Directions in which `group` surely allows all traffic to/from itself, and those an unknown value may allow."""
    sure: set[str] = set()
    maybe: set[str] = set()

    def note(direction: str, verdict: bool | None) -> None:
        if verdict:
            sure.add(direction)
        elif verdict is None:
            maybe.add(direction)

    for direction in ("ingress", "egress"):
        inline = group.props.get(direction)
        if inline is UNKNOWN:
            maybe.add(direction)
            continue
        for rule in inline or []:
            if rule is UNKNOWN or not isinstance(rule, Mapping):
                note(direction, None if rule is UNKNOWN else False)
                continue
            groups = rule.get("securityGroups")
            itself = (True if truthy(rule.get("self")) or any(refers(group, direction, g, group) for g in groups or [])
                      else None if UNKNOWN in (rule.get("self"), groups) else False)
            note(direction, all_of(equals(rule.get("protocol"), *ALL_PROTOCOLS), itself))
    for rule in resources:
        props = rule.props
        if rule.type in (VPC_INGRESS, VPC_EGRESS):
            direction = "ingress" if rule.type == VPC_INGRESS else "egress"
            note(direction, all_of(equals(props.get("ipProtocol"), *ALL_PROTOCOLS), is_ref(rule, "securityGroupId", group),
                                     is_ref(rule, "referencedSecurityGroupId", group)))
        elif rule.type == SG_RULE:
            kind = props.get("type")
            itself = True if truthy(props.get("self")) else is_ref(rule, "sourceSecurityGroupId", group)
            verdict = all_of(equals(props.get("protocol"), *ALL_PROTOCOLS), is_ref(rule, "securityGroupId", group), itself)
            for direction in ("ingress", "egress") if kind is UNKNOWN else (kind,) if kind in ("ingress", "egress") else ():
                note(direction, None if kind is UNKNOWN and verdict is not False else verdict)
    return sure, maybe - sure


# --- EFA security-group self rules -------------------------------------------------

def efa_security_group_self_rules(resources: Sequence[Resource], config: Mapping[str, Any]) -> list[Violation]:
    """Every EFA interface carries a group that allows all traffic from AND to itself.

    0.0.0.0/0 egress does not cover the outbound self rule; without it NCCL over EFA
    fails with "Unresponsive receiver".
    """
    found = Findings()
    groups = [r for r in resources if r.type == SECURITY_GROUP]
    both = {"ingress", "egress"}
    for template in (r for r in resources if r.type == LAUNCH_TEMPLATE):
        lacking: dict[str, tuple[Resource, set[str], list[int]]] = {}
        outside: dict[tuple, list[int]] = {}
        for i, interface in enumerate(elements(template.props.get("networkInterfaces"),
                                             f"{template.name}.networkInterfaces", found)):
            where = f"{template.name}.networkInterfaces[{i}]"
            kind = get(interface, "interfaceType")
            if kind is UNKNOWN:
                found.not_known(f"{where}.interfaceType")
            if kind not in ("efa", "efa-only"):
                continue
            values = get(interface, "securityGroups")
            values = [UNKNOWN] if values is UNKNOWN else list(values or [])
            attached = resolve(template, "networkInterfaces", values, groups, found, f"{where}.securityGroups")
            rules_of = {g.name: _self_rules(g, resources) for g in attached}
            if any(sure == both for sure, _ in rules_of.values()):
                continue
            if any(sure | maybe == both for sure, maybe in rules_of.values()):
                found.not_known(f"{where}: the self rules of its security groups")
            elif not attached:
                if all(v is not UNKNOWN for v in values):
                    outside.setdefault(tuple(map(str, values)), []).append(i)
            else:
                for group in attached:
                    lacking.setdefault(group.name, (group, both - rules_of[group.name][0], []))[2].append(i)
        for values, indices in outside.items():
            found.fail(Violation(
                f"{template.name} EFA interfaces {_span(indices)} use only security groups not declared in this stack "
                f"({', '.join(values) or 'none'}), so their self rules cannot be checked; attach a group of this "
                "stack with all-traffic ingress and egress rules referencing itself", template.urn))
        for group, missing, indices in lacking.values():
            found.fail(Violation(
                f"security group {group.name} on {template.name} EFA interfaces {_span(indices)} lacks the "
                f"all-traffic {' and '.join(sorted(missing))} rule referencing itself; EFA needs both directions "
                "(0.0.0.0/0 egress does not cover the outbound self rule)", group.urn or template.urn))
    return found.result()


def _span(indices: list[int]) -> str:
    return f"[{indices[0]}]" if len(indices) == 1 else f"[{indices[0]}..{indices[-1]}] ({len(indices)})"
