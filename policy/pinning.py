"""The rule on images: every container image, and every Helm release's image, pinned by digest."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from facts import images
from policy.model import HELM_RELEASE, UNKNOWN, Findings, elements, get

CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


def _pod_specs(value: Any, path: str) -> Iterable[tuple[str, Mapping[str, Any]]]:
    """Every mapping that holds `containers`, wherever it sits (Pod, Deployment, CronJob, RayCluster...)."""
    if isinstance(value, Mapping):
        if "containers" in value:
            yield path, value
        for key, child in value.items():
            yield from _pod_specs(child, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _pod_specs(child, f"{path}[{i}]")


def _release_image(props: Mapping[str, Any], found: "Findings") -> None:
    """A Helm release's `image` values ({repository, tag}, as these charts take them) render repository:tag."""
    image = get(props, "values", "image")
    if image is UNKNOWN:
        found.not_known("values.image")
        return
    if not isinstance(image, Mapping):
        found.fail("values.image is not set: the chart would run its default image, pinned by tag only; "
                   "set image.repository and image.tag to <tag>@sha256:<64 hex>")
        return
    tag = get(image, "tag")
    if tag is UNKNOWN:
        found.not_known("values.image.tag")
    elif not (isinstance(tag, str) and _tag_pinned(tag)):
        found.fail(f"values.image.tag {tag!r} is not pinned by digest; use <tag>@sha256:<64 hex>")


def _tag_pinned(tag: str) -> bool:
    try:
        return images.split_tag(tag)[1] is not None
    except images.ImageError:
        return False


def images_by_digest(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """A tag can be moved to other bytes; a digest cannot. Every container image is repo@sha256:<64 hex>."""
    found = Findings()
    if resource_type == HELM_RELEASE:
        _release_image(props, found)
        return found.result()
    if not resource_type.startswith("kubernetes:"):
        return []
    for path, pod in _pod_specs(props, ""):
        for key in CONTAINER_LISTS:
            for i, container in enumerate(elements(pod.get(key), f"{path}.{key}", found)):
                where = f"{path}.{key}[{i}]"
                image = get(container, "image")
                if image is UNKNOWN:
                    found.not_known(f"{where}.image")
                elif not isinstance(image, str) or not images.is_pinned(image):
                    name = get(container, "name", default="?")
                    found.fail(f"{where} ({name}) image {image!r} is not pinned by digest; "
                               "use registry/repository@sha256:<64 hex>")
    return found.result()
