"""What the Pulumi CLI runs for `pulumi preview --policy-pack policy`: serves the pack over gRPC."""
import sys
from pathlib import Path

if not __package__:  # run by the Pulumi CLI from policy/ as a script: the packages sit at the repository root
    sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from pulumi_policy import EnforcementLevel, PolicyPack

from policy import pack

PolicyPack(
    name=pack.PACK_NAME,
    description="raytrain-eks security and cost guardrails: IMDSv2, private nodes, restricted EKS endpoint, "
                "Ray never exposed, images by digest, EFA self rules, a cap on GPU nodes.",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=pack.policies(),
)
