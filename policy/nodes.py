"""Rules on nodes: IMDSv2, no public IPs, private subnets, and the cap on GPU nodes."""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Sequence

from facts import catalog
from policy.model import (
    EKS_MANAGED_NODE_GROUP,
    INSTANCE,
    LAUNCH_TEMPLATE,
    NODE_GROUP,
    SUBNET,
    UNKNOWN,
    Findings,
    Resource,
    Violation,
    as_number,
    elements,
    get,
    resolve,
    truthy,
)


def imdsv2_required(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """Node credentials sit behind IMDS: tokens required, one hop so pods cannot reach it."""
    found = Findings()
    max_hops = config["maxHopLimit"]
    if resource_type in (LAUNCH_TEMPLATE, INSTANCE):
        options = props.get("metadataOptions")
        if options is UNKNOWN:
            found.not_known("metadataOptions")
        elif not isinstance(options, Mapping):
            found.fail("metadataOptions is not set, so IMDSv1 stays enabled; set metadataOptions "
                       f"httpTokens=\"required\" and httpPutResponseHopLimit={max_hops}")
        elif options.get("httpEndpoint") == "disabled":
            pass
        else:
            tokens = options.get("httpTokens")
            if tokens is UNKNOWN:
                found.not_known("metadataOptions.httpTokens")
            elif tokens != "required":
                found.fail(f"metadataOptions.httpTokens is {tokens!r}: IMDSv1 stays enabled; set it to \"required\"")
            hops = options.get("httpPutResponseHopLimit")
            number = as_number(hops)
            if hops is UNKNOWN:
                found.not_known("metadataOptions.httpPutResponseHopLimit")
            elif number is None or number > max_hops:
                found.fail(f"metadataOptions.httpPutResponseHopLimit is {hops!r}: pods could reach the node's "
                           f"credentials; set it to {max_hops} (pods use IRSA)")
    elif resource_type == NODE_GROUP:
        template = props.get("launchTemplate")
        if template is None:
            found.fail("the node group has no launchTemplate, so EKS's default template decides the IMDS settings; "
                       "give it a launch template with httpTokens=\"required\"")
    return found.result()


# --- no public IPs on nodes --------------------------------------------------------

def no_public_ip_on_nodes(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """Nodes live in private subnets and reach the internet through the NAT gateway only."""
    found = Findings()
    if resource_type == LAUNCH_TEMPLATE:
        for i, interface in enumerate(elements(props.get("networkInterfaces"), "networkInterfaces", found)):
            value = get(interface, "associatePublicIpAddress")
            if value is UNKNOWN:
                found.not_known(f"networkInterfaces[{i}].associatePublicIpAddress")
            elif truthy(value):
                found.fail(f"networkInterfaces[{i}].associatePublicIpAddress is {value!r}: the node gets a public IP; "
                           "set it to \"false\"")
    elif resource_type == INSTANCE:
        value = props.get("associatePublicIpAddress")
        if value is UNKNOWN:
            found.not_known("associatePublicIpAddress")
        elif truthy(value):
            found.fail("associatePublicIpAddress is true: the instance gets a public IP; set it to false")
    return found.result()


# --- GPU nodes per stack --------------------------------------------------------------

GPU_AMI = re.compile(r"NVIDIA|GPU", re.IGNORECASE)


def _is_gpu(instance_types: Sequence[Any], ami_type: Any) -> bool | None:
    if (any(isinstance(t, str) and catalog.is_gpu_type(t) for t in instance_types)
            or (isinstance(ami_type, str) and GPU_AMI.search(ami_type))):
        return True
    return None if UNKNOWN in (*instance_types, ami_type) else False


def _gpu_node_groups(resources: Sequence[Resource], found: Findings) -> Iterable[tuple[Resource, int]]:
    templates = [r for r in resources if r.type == LAUNCH_TEMPLATE]
    for r in resources:
        if r.type in (NODE_GROUP, EKS_MANAGED_NODE_GROUP):
            types = elements(r.props.get("instanceTypes"), f"{r.name}.instanceTypes", found)
            if not types and r.props.get("instanceTypes") is not UNKNOWN:
                launch = get(r.props, "launchTemplate", "id")
                ids = [UNKNOWN] if launch is UNKNOWN else [launch]
                types = [t.props.get("instanceType")
                         for t in resolve(r, "launchTemplate", ids, templates, found, f"{r.name}.launchTemplate")]
            gpu = _is_gpu(types, r.props.get("amiType"))
            if gpu is None:
                found.not_known(f"{r.name}.instanceTypes")
            if not gpu:
                continue
            size = get(r.props, "scalingConfig", "maxSize")
            number = as_number(size)
            if size is UNKNOWN:
                found.not_known(f"{r.name}.scalingConfig.maxSize")
            elif number is None:
                found.fail(Violation(f"GPU node group {r.name} has no scalingConfig.maxSize; set it", r.urn))
            else:
                yield r, int(number)
        elif r.type == INSTANCE:
            gpu = _is_gpu([r.props.get("instanceType")], None)
            if gpu is None:
                found.not_known(f"{r.name}.instanceType")
            elif gpu:
                yield r, 1


def max_gpu_nodes(resources: Sequence[Resource], config: Mapping[str, Any]) -> list[Violation]:
    """GPU nodes bill by the hour: the stack may grow to at most maxGpuNodes of them (node groups' maxSize)."""
    found = Findings()
    limit = config["maxGpuNodes"]
    groups = list(_gpu_node_groups(resources, found))
    total = sum(n for _, n in groups)
    if total > limit:
        detail = ", ".join(f"{r.name}: {n}" for r, n in groups)
        found.fail(Violation(
            f"the stack can run {total} GPU nodes ({detail}), more than maxGpuNodes={limit}; lower the node "
            f"count or raise max-gpu-nodes.maxGpuNodes in the policy pack config for this stack",
            groups[0][0].urn if len(groups) == 1 else ""))
    return found.result()


# --- node groups in private subnets --------------------------------------------------

def nodes_in_private_subnets(resources: Sequence[Resource], config: Mapping[str, Any]) -> list[Violation]:
    """Node groups only use subnets that do not hand out public IPs."""
    found = Findings()
    subnets = [r for r in resources if r.type == SUBNET]
    for group in (r for r in resources if r.type in (NODE_GROUP, EKS_MANAGED_NODE_GROUP)):
        ids = group.props.get("subnetIds")
        ids = [UNKNOWN] if ids is UNKNOWN else list(ids or [])
        for subnet in resolve(group, "subnetIds", ids, subnets, found, f"{group.name}.subnetIds"):
            value = subnet.props.get("mapPublicIpOnLaunch")
            if value is UNKNOWN:
                found.not_known(f"{subnet.name}.mapPublicIpOnLaunch")
            elif truthy(value):
                found.fail(Violation(f"node group {group.name} uses subnet {subnet.name}, which maps public IPs on "
                                     "launch; put nodes in private subnets", group.urn))
    return found.result()
