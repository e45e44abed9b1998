"""One grammar for container image references: registry/repository[:tag][@sha256:<64 hex>].

The stack configuration (dlcImage, clusterAutoscalerImageTag), the digest pinning, the RayCluster
manifest and the policy pack all judge references with this module, so a reference one of them
accepts is never refused by another. It follows the distribution reference grammar (Docker,
containerd): lowercase path components joined by '.', '_', '__' or '-', a tag of at most 128 word
characters, dots and dashes; digests are sha256 only. The registry is a host (a dot or a port,
or localhost) and, where this project writes a reference, never implied: `myregistry/ray:2.58`
would silently mean Docker Hub's `docker.io/myregistry/ray`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

EXAMPLE = "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"
FORMS = "registry/repository:tag or registry/repository@sha256:<64 hex>"
FIX = f"write it as {FORMS}, e.g. {EXAMPLE}"

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*(:[0-9]+)?$")
_PATH = re.compile(r"^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*$")
NAME_MAX = 255


class ImageError(ValueError):
    """Not a reference this grammar accepts; the message says why and how to write it."""


@dataclass(frozen=True)
class ImageReference:
    registry: str | None  # None only where the grammar was asked to allow an implied registry
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}" if self.registry else self.repository

    @property
    def is_pinned(self) -> bool:
        return self.digest is not None

    def pinned(self, digest: str) -> str:
        """The reference pods use: the name and the digest (a tag beside a digest would be ignored by the runtime)."""
        return f"{self.name}@{digest}"

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


def _is_host(component: str) -> bool:
    return ("." in component or ":" in component or component == "localhost") and bool(_HOST.match(component))


def split_tag(text: str) -> tuple[str, str | None]:
    """`tag` or `tag@sha256:<64 hex>` (what chart values take as image.tag) -> (tag, digest or None)."""
    tag, at, digest = str(text).partition("@")
    if not _TAG.match(tag):
        raise ImageError(f"{tag!r} is not a valid tag (at most 128 letters, digits, '_', '.' and '-', not "
                         "starting with '.' or '-')")
    if at and not DIGEST.match(digest):
        raise ImageError(f"{digest!r} is not sha256:<64 lowercase hex>")
    return tag, (digest if at else None)


def parse(text: str, *, registry_required: bool = True) -> ImageReference:
    """registry/repository[:tag][@sha256:<64 hex>], a tag or a digest at least; raises ImageError naming the part."""
    text = str(text).strip()
    name, at, digest = text.partition("@")
    if at and not DIGEST.match(digest):
        raise ImageError(f"{digest!r} in {text!r} is not sha256:<64 lowercase hex>; {FIX}")
    head, slash, rest = name.partition("/")
    if slash and _is_host(head):
        registry, path = head, rest
    elif registry_required:
        if not slash:
            raise ImageError(f"{text!r} names no registry; {FIX}")
        raise ImageError(
            f"{text!r} does not start with a registry host: {head!r} has no dot or port, so a container runtime "
            f"would read it as a Docker Hub namespace (docker.io/{name}); {FIX}")
    else:
        registry, path = None, name
    path, colon, tag = path.rpartition(":") if ":" in path else (path, "", "")
    if colon and not _TAG.match(tag):
        raise ImageError(f"{tag!r} in {text!r} is not a valid tag; {FIX}")
    if not colon and not at:
        raise ImageError(f"{text!r} has neither a tag nor a digest; {FIX}")
    if not _PATH.match(path) or len(name) > NAME_MAX:
        raise ImageError(f"{path!r} in {text!r} is not a valid repository name (lowercase letters, digits and "
                         f"single separators '.', '_', '__' or '-' between them); {FIX}")
    return ImageReference(registry, path, tag or None, digest or None)


def problem(text: str, *, registry_required: bool = True) -> str | None:
    """Why `text` is not a reference of this grammar, or None."""
    try:
        parse(text, registry_required=registry_required)
    except ImageError as err:
        return str(err)
    return None


def is_pinned(text: str, *, registry_required: bool = False) -> bool:
    """A valid reference with a digest. Pod specs may rely on the runtime's implied registry, so it may be absent."""
    try:
        return parse(text, registry_required=registry_required).is_pinned
    except ImageError:
        return False
