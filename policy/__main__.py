"""What the Pulumi CLI runs for `pulumi preview --policy-pack policy`: serves the pack over gRPC."""
from pulumi_policy import EnforcementLevel, PolicyPack

if __package__:
    from . import pack
else:  # run by the Pulumi CLI, which puts this directory first on sys.path
    import pack

PolicyPack(
    name=pack.PACK_NAME,
    description="raytrain-eks security and cost guardrails: IMDSv2, private nodes, restricted EKS endpoint, "
                "Ray never exposed, images by digest, EFA self rules, a cap on GPU nodes.",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=pack.policies(),
)
