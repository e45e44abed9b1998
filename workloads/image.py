"""Pin the DLC image to a digest, once, and keep the pin in the stack's state.

A tag such as ray:train-ml-cuda-v1.1 can be moved to a new build at any time; a pod
spec that names the tag would then run different code after a node restart. The tag
is resolved through the registry's HTTP API (OCI distribution spec: anonymous bearer
token, HEAD of the manifest, Docker-Content-Digest header) by a Pulumi dynamic
resource. Its digest lives in the stack's state, so later `pulumi up` runs reuse it
and only a change of the configured tag resolves again.

Standard library only: the dynamic provider runs in Pulumi's plugin process with
nothing but the project's virtualenv and the project root on its path.
"""
from __future__ import annotations

import contextlib
import json
import pickle
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Iterator

import pulumi
import pulumi.dynamic as dynamic
from pulumi.runtime.rpc import UNKNOWN

from facts import images
from facts.images import ImageReference

CONFIG_KEY = "raytrain-eks:dlcImage"
DEFAULT_TIMEOUT_S = 20.0

# Multi-arch indexes first: the digest we pin is that of what the registry returns for
# these, so a pod resolves it to its own platform exactly as a tag pull would.
MANIFEST_MEDIA_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)

# What the offline plan (Pulumi mocks) puts where `pulumi up` puts the real digest.
# Valid in form so manifests validate, obviously not a real build.
PLACEHOLDER_DIGEST = "sha256:" + "deadbeef" * 8

USE_DIGEST = (f"set {CONFIG_KEY} to the digest reference registry/repository@sha256:<64 hex> "
              "(`crane digest IMAGE` or `docker buildx imagetools inspect IMAGE` on a machine that can reach "
              "the registry) to skip the lookup")
CHECK_TAG = f"check the repository and tag (`crane ls REPOSITORY` lists the tags), or {USE_DIGEST}"

_LOCAL_HOSTS = ("localhost", "127.0.0.1")


class ImageResolutionError(RuntimeError):
    """The tag could not be pinned; the message names the image and what to do."""


def api_base(ref: ImageReference) -> str:
    """Registries on this machine speak plain HTTP (as Docker assumes); all others HTTPS."""
    scheme = "http" if ref.registry.split(":")[0] in _LOCAL_HOSTS else "https"
    api_host = "registry-1.docker.io" if ref.registry == "docker.io" else ref.registry
    return f"{scheme}://{api_host}"


def parse(image: str) -> ImageReference:
    """The reference in facts.images' grammar; the registry is never implied."""
    try:
        return images.parse(image)
    except images.ImageError as err:
        raise ImageResolutionError(f"{CONFIG_KEY}: {err}") from None


def is_placeholder(image: str) -> bool:
    """True for references produced offline, under Pulumi mocks, not by a registry."""
    return str(image).endswith("@" + PLACEHOLDER_DIGEST)


def _challenge(header: str | None) -> dict[str, str]:
    """The parameters of a `WWW-Authenticate: Bearer realm=...,service=...,scope=...` header."""
    if not header or not header.strip().lower().startswith("bearer "):
        return {}
    return {k.lower(): v for k, v in re.findall(r'([A-Za-z]+)="([^"]*)"', header)}


def _open(request: urllib.request.Request, timeout: float):
    """Status and headers of a request; HTTP errors are answers here, not exceptions."""
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.headers, response.read() if request.get_method() != "HEAD" else b""
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.headers, b""


def _request(ref: ImageReference, method: str, url: str, headers: dict[str, str], timeout: float, what: str):
    try:
        return _open(urllib.request.Request(url, headers=headers, method=method), timeout)
    except (TimeoutError, socket.timeout, urllib.error.URLError) as err:
        reason = getattr(err, "reason", err)
        if isinstance(reason, (TimeoutError, socket.timeout)):
            raise ImageResolutionError(
                f"{CONFIG_KEY}: no answer from {ref.registry} within {timeout:g} s while {what} for {ref}; "
                f"retry when the registry is reachable from this machine, or {USE_DIGEST}") from None
        raise ImageResolutionError(
            f"{CONFIG_KEY}: cannot reach {ref.registry} while {what} for {ref} ({reason}); "
            f"check the registry name and this machine's network, or {USE_DIGEST}") from None


def _anonymous_token(ref: ImageReference, challenge: dict[str, str], timeout: float) -> str:
    """A pull token for the repository; the scope is ours, since some registries (public ECR) challenge with another."""
    image = str(ref)
    realm = challenge.get("realm")
    if not realm:
        raise ImageResolutionError(
            f"{CONFIG_KEY}: {ref.registry} asks for credentials without a bearer token service, so {image} cannot be "
            f"resolved anonymously; {CHECK_TAG}")
    query = {"scope": f"repository:{ref.repository}:pull"}
    if challenge.get("service"):
        query["service"] = challenge["service"]
    url = realm + ("&" if "?" in realm else "?") + urllib.parse.urlencode(query)
    status, _, body = _request(ref, "GET", url, {"Accept": "application/json"}, timeout,
                              "fetching an anonymous pull token")
    if status != 200:
        raise ImageResolutionError(
            f"{CONFIG_KEY}: the token service {realm} refused an anonymous pull token for {image} (HTTP {status}); "
            f"the repository may be private or misspelled; {CHECK_TAG}")
    try:
        answer = json.loads(body)
        return answer.get("token") or answer["access_token"]
    except (ValueError, KeyError, AttributeError, TypeError):
        raise ImageResolutionError(
            f"{CONFIG_KEY}: the token service {realm} answered without a token for {image}; {CHECK_TAG}") from None


def resolve_digest(image: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> str:
    """The sha256 digest the registry serves today for a tag (a digest reference is returned as is)."""
    ref = parse(image)
    if ref.digest:
        return ref.digest
    url = f"{api_base(ref)}/v2/{ref.repository}/manifests/{urllib.parse.quote(ref.tag, safe='')}"
    headers = {"Accept": ", ".join(MANIFEST_MEDIA_TYPES)}
    what = "reading the manifest"
    status, answer, _ = _request(ref, "HEAD", url, headers, timeout, what)
    if status == 401:
        token = _anonymous_token(ref, _challenge(answer.get("WWW-Authenticate")), timeout)
        status, answer, _ = _request(ref, "HEAD", url, {**headers, "Authorization": f"Bearer {token}"}, timeout, what)
    if status in (401, 403):
        raise ImageResolutionError(
            f"{CONFIG_KEY}: {ref.registry} refused an anonymous pull of {image} (HTTP {status}); the repository is "
            f"private or does not exist; {CHECK_TAG}")
    if status == 404:
        raise ImageResolutionError(
            f"{CONFIG_KEY}: {image} does not exist (HTTP 404 for tag {ref.tag!r} in {ref.registry}/{ref.repository}); "
            f"{CHECK_TAG}")
    if status != 200:
        raise ImageResolutionError(
            f"{CONFIG_KEY}: {ref.registry} answered HTTP {status} for {image}; retry later, or "
            f"{USE_DIGEST}")
    digest = (answer.get("Docker-Content-Digest") or "").strip()
    if not digest:
        raise ImageResolutionError(
            f"{CONFIG_KEY}: {ref.registry} answered for {image} without a Docker-Content-Digest header, so the tag "
            f"cannot be pinned by this resolver; {USE_DIGEST}")
    if not images.DIGEST.match(digest):
        raise ImageResolutionError(
            f"{CONFIG_KEY}: {ref.registry} gave {digest!r} as the digest of {image}, not sha256:<64 hex>; "
            f"{USE_DIGEST}")
    return digest


def _pin(image: str, digest: str) -> dict[str, str]:
    return {"image": image, "digest": digest, "reference": parse(image).pinned(digest)}


class ImageDigestProvider(dynamic.ResourceProvider):
    """Resolves in check, so `pulumi preview` already shows (or refuses) the digest; never again for the same tag."""

    serialize_as_secret_always = False  # holds only a timeout and a name: keep the state readable

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, subject: str = CONFIG_KEY):
        super().__init__()
        self.timeout_s = timeout_s
        self.subject = subject  # whose image it is, named in every error instead of the DLC's config key

    def _resolve(self, image: str) -> str:
        try:
            return resolve_digest(image, timeout=self.timeout_s)
        except ImageResolutionError as err:
            if self.subject == CONFIG_KEY:
                raise
            raise ImageResolutionError(str(err).replace(CONFIG_KEY, self.subject)) from None

    def check(self, olds, news):
        image = news.get("image")
        if image == UNKNOWN:
            return dynamic.CheckResult(news, [])
        if olds.get("image") == image and images.DIGEST.match(str(olds.get("digest") or "")):
            return dynamic.CheckResult({**news, "digest": olds["digest"]}, [])
        try:
            return dynamic.CheckResult({**news, "digest": self._resolve(image)}, [])
        except ImageResolutionError as err:
            return dynamic.CheckResult(news, [dynamic.CheckFailure("image", str(err))])

    def diff(self, _id, olds, news):
        changed = olds.get("image") != news.get("image")
        return dynamic.DiffResult(changes=changed, replaces=["image"] if changed else [],
                                  delete_before_replace=False)

    def create(self, props):
        digest = props.get("digest")
        if not (isinstance(digest, str) and images.DIGEST.match(digest)):
            digest = self._resolve(props["image"])
        outs = _pin(props["image"], digest)
        return dynamic.CreateResult(id_=outs["reference"], outs=outs)

    def read(self, id_, props):
        """Refresh keeps the pin: a moved tag is not drift, it is exactly what the pin protects against."""
        return dynamic.ReadResult(id_, dict(props))


class PinnedImage(dynamic.Resource, module="raytrain", name="PinnedImage"):
    """A tag resolved once to registry/repository@sha256:...; the `reference` output is what pods use."""

    image: pulumi.Output[str]
    digest: pulumi.Output[str]
    reference: pulumi.Output[str]

    def __init__(self, name: str, image: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, subject: str = CONFIG_KEY,
                 opts: pulumi.ResourceOptions | None = None):
        _parse_for(image, subject)
        with _pickler_restored():
            super().__init__(ImageDigestProvider(timeout_s, subject), name,
                             {"image": image, "digest": None, "reference": None}, opts)


@contextlib.contextmanager
def _pickler_restored() -> Iterator[None]:
    """Undo what pulumi.dynamic's provider serialization leaves behind in the pickle module.

    pulumi 3.272's serialize_provider patches pickle._Pickler (sorted dict items) and never puts
    it back, each call wrapping the previous patch: after a few hundred dynamic resources in one
    process (the test suite), every pickle recurses past Python's limit, `datasets`' fingerprint
    of a dataset included (seen as a RecursionError). The serialized provider is unaffected.
    """
    saved = {name: pickle._Pickler.__dict__[name] for name in ("_batch_setitems", "save_dict")}
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(pickle._Pickler, name, value)


def _parse_for(image: str, subject: str) -> ImageReference:
    try:
        return parse(image)
    except ImageResolutionError as err:
        if subject == CONFIG_KEY:
            raise
        raise ImageResolutionError(str(err).replace(CONFIG_KEY, subject)) from None


def pin(image: str, *, name: str = "dlc-image", subject: str = CONFIG_KEY,
        opts: pulumi.ResourceOptions | None = None) -> tuple[pulumi.Output[str], list[pulumi.Resource]]:
    """The digest reference for `image` and the resources that produce it (none for a digest).

    `subject` names whose image it is in errors (the DLC's config key by default).
    """
    if _parse_for(image, subject).digest:
        return pulumi.Output.from_input(image), []
    pinned = PinnedImage(name, image, subject=subject, opts=opts)
    return pinned.reference, [pinned]


def placeholder_outputs(inputs: dict) -> dict:
    """What the offline plan's mocks answer for a PinnedImage: the placeholder digest, flagged as such."""
    return {**_pin(inputs["image"], PLACEHOLDER_DIGEST), "placeholder": True}
