"""Resource-option helpers shared by the components."""
from __future__ import annotations

import pulumi


def children_options(component: pulumi.ComponentResource, opts: pulumi.ResourceOptions | None) -> pulumi.ResourceOptions:
    """Children of a component wait for what the component waits for.

    The Python SDK does not pass a component's depends_on to its children, so without
    this a node group would not wait for the CNI add-on, nor the cluster for the NAT route,
    and on destroy the network could go before the cluster.
    """
    return pulumi.ResourceOptions(parent=component, depends_on=list((opts.depends_on if opts else None) or []))
