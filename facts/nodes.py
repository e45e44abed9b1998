"""Node labels and taints: one Taint renders the node-group taint, the pod toleration and the autoscaler's tag.

The EKS API, Kubernetes pods and the Cluster Autoscaler each spell a taint their own way
(NO_SCHEDULE, NoSchedule, "value:NoSchedule" in an ASG tag); a taint is declared once, as a
Taint, and each consumer asks it for its own spelling.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

ROLE = "role"
GPU_PRESENT = "nvidia.com/gpu.present"  # the NVIDIA device plugin chart's default node affinity
# Cluster Autoscaler's AWS provider reads this label to know a node has GPUs: until the device plugin
# advertises them such a node counts as not ready, and once empty its utilization is its GPUs'.
ACCELERATOR_LABEL = "k8s.amazonaws.com/accelerator"

AUTOSCALER_PREFIX = "k8s.io/cluster-autoscaler"
NODE_TEMPLATE_PREFIX = f"{AUTOSCALER_PREFIX}/node-template"

EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_EKS_EFFECTS = {"NoSchedule": "NO_SCHEDULE", "PreferNoSchedule": "PREFER_NO_SCHEDULE", "NoExecute": "NO_EXECUTE"}
# Kubernetes label keys and values (apimachinery validation): an optional DNS prefix, a name of at most 63.
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str = "NoSchedule"  # Kubernetes' spelling

    def __post_init__(self):
        if self.effect not in EFFECTS:
            effect = {v: k for k, v in _EKS_EFFECTS.items()}.get(self.effect)
            if effect is None:
                raise ValueError(f"taint effect {self.effect!r} is not one of {', '.join(EFFECTS)}")
            object.__setattr__(self, "effect", effect)

    def node_group(self) -> dict[str, str]:
        """As the EKS API (and aws.eks.NodeGroup's taints) takes it."""
        return {"key": self.key, "value": self.value, "effect": _EKS_EFFECTS[self.effect]}

    def toleration(self) -> dict[str, str]:
        """The pod toleration that lets a pod onto nodes with this taint."""
        return {"key": self.key, "operator": "Equal", "value": self.value, "effect": self.effect}

    def autoscaler_tag(self) -> tuple[str, str]:
        """The ASG tag from which the Cluster Autoscaler learns the taint of a node group at zero."""
        return f"{NODE_TEMPLATE_PREFIX}/taint/{self.key}", f"{self.value}:{self.effect}"


GPU_TAINT = Taint("nvidia.com/gpu", "true", "NoSchedule")


def label_problem(key: str, value: str) -> str | None:
    """Why Kubernetes would refuse this node label, or None."""
    if not _LABEL_KEY.match(key) or len(key.partition("/")[0]) > 253:
        return (f"label key {key!r} is not a Kubernetes label key (an optional DNS prefix and '/', then at most 63 "
                "letters, digits, '-', '_' or '.', starting and ending with a letter or digit)")
    if not _LABEL_VALUE.match(value):
        return (f"label value {value!r} of {key!r} is not a Kubernetes label value (at most 63 letters, digits, "
                "'-', '_' or '.', starting and ending with a letter or digit)")
    return None


def accelerator(gpu_model: str) -> str:
    """NVIDIA L4 -> nvidia-l4: the value of ACCELERATOR_LABEL."""
    return re.sub(r"[^a-z0-9]+", "-", gpu_model.lower()).strip("-")


def template_tags(resources: dict[str, str], labels: dict[str, str], taints: tuple[Taint, ...]) -> dict[str, str]:
    """What one node of a group offers, as the Cluster Autoscaler reads it from ASG tags when the group is at zero."""
    tags = {f"{NODE_TEMPLATE_PREFIX}/resources/{name}": value for name, value in resources.items()}
    tags.update({f"{NODE_TEMPLATE_PREFIX}/label/{key}": value for key, value in labels.items()})
    tags.update(dict(taint.autoscaler_tag() for taint in taints))
    return tags
