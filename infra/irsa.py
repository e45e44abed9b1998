"""An IAM role for one Kubernetes service account (IRSA), with its inline policies."""
from __future__ import annotations

from typing import Mapping

import pulumi
import pulumi_aws as aws

from infra import iam, legacy
from infra.resources import children_options


class IrsaRole(pulumi.ComponentResource):
    """Trusted only by `namespace/service_account`, through the cluster's OIDC provider.

    `policies` maps a short name to a policy document (the inline policy `<name>-irsa-<short name>`);
    `moved_from` (type, name) is the component that held these resources before (infra.legacy).
    """

    def __init__(self, name: str, *, oidc_provider_arn: pulumi.Input[str], oidc_issuer_url: pulumi.Input[str],
                 namespace: str, service_account: str, policies: Mapping[str, pulumi.Input[str]], description: str,
                 tags: dict[str, str], moved_from: tuple[str, str] | None = None,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("raytrain:infra:IrsaRole", name, None, opts)
        child = children_options(self, opts)
        if moved_from:
            child = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(aliases=legacy.children_of(*moved_from)))
        self.role = aws.iam.Role(
            f"{name}-irsa",
            assume_role_policy=pulumi.Output.all(oidc_provider_arn, oidc_issuer_url).apply(
                lambda a: iam.irsa_trust(a[0], a[1], namespace, service_account)),
            description=description, tags=tags, opts=child)
        self.policies = [aws.iam.RolePolicy(f"{name}-irsa-{short}", role=self.role.id, policy=document, opts=child)
                         for short, document in policies.items()]
        self.register_outputs({"roleArn": self.role.arn})
