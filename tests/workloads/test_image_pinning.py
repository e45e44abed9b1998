"""The DLC digest pin: reference parsing, the OCI resolver against a registry on localhost, and the
dynamic provider's check/diff/create/read as the Pulumi engine calls them."""
from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import time

import pytest
from pulumi.dynamic.dynamic import serialize_provider

from facts import images
from workloads import image
from workloads.image import ImageDigestProvider, ImageResolutionError, resolve_digest

from .conftest import INDEX_DIGEST, REPO, SINGLE_MANIFEST_DIGEST, SLOW_SECONDS

DIGEST = "sha256:" + "0123456789abcdef" * 4
ACCEPTED = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json",
            "application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json")


def manifest_requests(registry):
    return [r for r in registry.requests if r[0] == "HEAD"]


# --- references ----------------------------------------------------------------------------------

def test_parses_tags_and_digests():
    ref = image.parse("public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1")
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (
        "public.ecr.aws", "deep-learning-containers/ray", "train-ml-cuda-v1.1", None)
    assert image.api_base(ref) == "https://public.ecr.aws"
    assert ref.pinned(DIGEST) == f"public.ecr.aws/deep-learning-containers/ray@{DIGEST}"
    local = image.parse(f"127.0.0.1:5000/team/ray@{DIGEST}")
    assert (local.registry, local.repository, local.digest, image.api_base(local)) == (
        "127.0.0.1:5000", "team/ray", DIGEST, "http://127.0.0.1:5000")


@pytest.mark.parametrize("bad, says", [
    ("ray:2.58.0", "names no registry"),
    ("rayproject/ray:2.58.0", "does not start with a registry host"),
    ("public.ecr.aws/deep-learning-containers/ray", "neither a tag nor a digest"),
    ("public.ecr.aws/deep-learning-containers/ray@sha256:abc", "is not sha256:<64 lowercase hex>"),
    ("public.ecr.aws/Deep/ray:1", "not a valid repository name"),
])
def test_bad_references_name_the_key_and_the_fix(bad, says):
    with pytest.raises(ImageResolutionError) as err:
        image.parse(bad)
    assert str(err.value).startswith("raytrain-eks:dlcImage: ")
    assert says in str(err.value) and repr(bad) in str(err.value)
    assert "registry/repository@sha256:<64 hex>" in str(err.value)


def test_placeholder_digest_is_valid_in_form_and_recognisable():
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", image.PLACEHOLDER_DIGEST)
    outs = image.placeholder_outputs({"image": "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"})
    assert outs["placeholder"] is True
    assert image.is_placeholder(outs["reference"]) and images.is_pinned(outs["reference"])
    assert not image.is_placeholder(f"public.ecr.aws/deep-learning-containers/ray@{DIGEST}")


# --- the resolver --------------------------------------------------------------------------------

def test_resolves_a_tag_through_the_anonymous_token_flow(registry):
    ref = registry.image("deep-learning-containers/ray", "train-ml-cuda-v1.1")
    assert resolve_digest(ref, timeout=5) == INDEX_DIGEST
    (token_request,) = [r for r in registry.requests if r[0] == "GET"]
    assert "scope=repository%3Adeep-learning-containers%2Fray%3Apull" in token_request[1]
    assert "service=fake-registry" in token_request[1]
    first, second = manifest_requests(registry)
    assert first[1] == second[1] == "/v2/deep-learning-containers/ray/manifests/train-ml-cuda-v1.1"
    assert "Authorization" not in first[2]
    assert second[2]["Authorization"] == "Bearer pull:deep-learning-containers/ray"
    assert all(media in second[2]["Accept"] for media in ACCEPTED)


def test_pins_the_multi_arch_index_not_one_platform(registry):
    assert resolve_digest(registry.image("open/ray", "v1"), timeout=5) == INDEX_DIGEST != SINGLE_MANIFEST_DIGEST
    assert [r[0] for r in registry.requests] == ["HEAD"]  # no token when the registry needs none


def test_a_digest_reference_is_used_as_is_without_the_network(registry):
    assert resolve_digest(f"{registry.host}/team/ray@{DIGEST}", timeout=5) == DIGEST
    assert registry.requests == []


@pytest.mark.parametrize("repository, tag, says", [
    ("team/ray", "missing", ["does not exist", "HTTP 404", "'missing'", "crane ls"]),
    ("private/ray", "v1", ["refused an anonymous pull", "HTTP 401", "private or does not exist"]),
    ("denied/ray", "v1", ["refused an anonymous pull token", "HTTP 401"]),
    ("basic/ray", "v1", ["without a bearer token service", "cannot be resolved anonymously"]),
    ("team/ray", "nodigest", ["without a Docker-Content-Digest header"]),
    ("team/ray", "baddigest", ["'sha256:not-a-digest'", "not sha256:<64 hex>"]),
    ("team/ray", "boom", ["HTTP 500", "retry later"]),
])
def test_failures_name_the_image_and_what_to_do(registry, repository, tag, says):
    ref = registry.image(repository, tag)
    with pytest.raises(ImageResolutionError) as err:
        resolve_digest(ref, timeout=5)
    message = str(err.value)
    assert message.startswith("raytrain-eks:dlcImage: ") and ref in message
    assert "@sha256:<64 hex>" in message  # the way out: configure a digest
    for phrase in says:
        assert phrase in message


def test_a_silent_registry_times_out_with_a_clear_error(registry):
    started = time.monotonic()
    with pytest.raises(ImageResolutionError) as err:
        resolve_digest(registry.image("open/ray", "slow"), timeout=0.3)
    assert time.monotonic() - started < SLOW_SECONDS  # gave up before the registry answered
    message = str(err.value)
    assert "no answer from" in message and "within 0.3 s" in message and registry.image("open/ray", "slow") in message


def test_an_unreachable_registry_is_a_clear_error():
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ImageResolutionError, match=r"cannot reach 127\.0\.0\.1:\d+ .*check the registry name"):
        resolve_digest(f"127.0.0.1:{port}/team/ray:v1", timeout=2)


# --- the dynamic provider ------------------------------------------------------------------------

def test_check_resolves_a_new_tag_so_preview_shows_the_digest(registry):
    provider = ImageDigestProvider(timeout_s=5)
    ref = registry.image("team/ray", "v1")
    result = provider.check({}, {"image": ref})
    assert result.failures == []
    assert result.inputs == {"image": ref, "digest": INDEX_DIGEST}


def test_check_keeps_the_pinned_digest_while_the_tag_is_unchanged(registry):
    """The tag may have moved in the registry: state wins, and the registry is not asked."""
    provider = ImageDigestProvider(timeout_s=5)
    ref = registry.image("team/ray", "v1")
    result = provider.check({"image": ref, "digest": DIGEST}, {"image": ref})
    assert result.inputs["digest"] == DIGEST and result.failures == []
    assert registry.requests == []


def test_check_resolves_again_when_the_configured_tag_changes(registry):
    provider = ImageDigestProvider(timeout_s=5)
    result = provider.check({"image": registry.image("team/ray", "v1"), "digest": DIGEST},
                            {"image": registry.image("team/ray", "v2")})
    assert result.inputs["digest"] == INDEX_DIGEST
    assert manifest_requests(registry)[-1][1] == "/v2/team/ray/manifests/v2"


def test_check_reports_a_failure_on_the_image_property(registry):
    provider = ImageDigestProvider(timeout_s=5)
    ref = registry.image("team/ray", "missing")
    result = provider.check({}, {"image": ref})
    (failure,) = result.failures
    assert failure.property == "image" and ref in failure.reason and "does not exist" in failure.reason


def test_diff_replaces_only_when_the_tag_changes():
    provider = ImageDigestProvider()
    same = provider.diff("id", {"image": "r.io/a/b:1", "digest": DIGEST}, {"image": "r.io/a/b:1", "digest": DIGEST})
    assert same.changes is False and same.replaces == []
    # A new provider blob (code change) alone is no reason to resolve again.
    blob = provider.diff("id", {"image": "r.io/a/b:1", "__provider": "old"}, {"image": "r.io/a/b:1", "__provider": "new"})
    assert blob.changes is False
    moved = provider.diff("id", {"image": "r.io/a/b:1", "digest": DIGEST}, {"image": "r.io/a/b:2", "digest": INDEX_DIGEST})
    assert moved.changes is True and moved.replaces == ["image"] and moved.delete_before_replace is False


def test_create_uses_the_checked_digest_and_read_never_moves_it(registry):
    provider = ImageDigestProvider(timeout_s=5)
    ref = registry.image("team/ray", "v1")
    created = provider.create({"image": ref, "digest": DIGEST})
    assert registry.requests == []
    assert created.id == created.outs["reference"] == f"{registry.host}/team/ray@{DIGEST}"
    assert created.outs == {"image": ref, "digest": DIGEST, "reference": f"{registry.host}/team/ray@{DIGEST}"}
    read = provider.read(created.id, dict(created.outs))
    assert read.id == created.id and read.outs == created.outs and registry.requests == []


def test_create_resolves_when_check_left_no_digest(registry):
    created = ImageDigestProvider(timeout_s=5).create({"image": registry.image("team/ray", "v1")})
    assert created.outs["digest"] == INDEX_DIGEST


def test_create_fails_clearly(registry):
    with pytest.raises(ImageResolutionError, match="does not exist"):
        ImageDigestProvider(timeout_s=5).create({"image": registry.image("team/ray", "missing")})


def test_the_provider_works_after_pulumi_serializes_it(registry, tmp_path):
    """As the engine runs it: unpickled in a fresh `python` whose path is the project root only."""
    blob = tmp_path / "provider.b64"
    blob.write_text(serialize_provider(ImageDigestProvider(timeout_s=5)))
    code = ("import base64, sys, dill; "
            "p = dill.loads(base64.b64decode(open(sys.argv[1]).read())); "
            "r = p.check({}, {'image': sys.argv[2]}); print(p.timeout_s, r.inputs['digest'])")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code, str(blob), registry.image("team/ray", "v1")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["5", INDEX_DIGEST]
    assert base64.b64decode(blob.read_text())  # plain, not a secret: the provider holds only a timeout
    assert ImageDigestProvider.serialize_as_secret_always is False


def test_a_charts_image_failure_names_the_chart_not_the_dlc_key(registry):
    """Chart images are pinned by the same resolver; their errors say whose image it is."""
    subject = "the kuberay-operator chart's image (chart_image() in workloads/charts.py)"
    provider = ImageDigestProvider(timeout_s=5, subject=subject)
    ref = registry.image("team/operator", "missing")
    (failure,) = provider.check({}, {"image": ref}).failures
    assert failure.reason.startswith(subject + ": ") and "raytrain-eks:dlcImage" not in failure.reason
    assert "does not exist" in failure.reason and "@sha256:<64 hex>" in failure.reason
    assert provider.check({}, {"image": registry.image("team/operator", "v1")}).inputs["digest"] == INDEX_DIGEST


def test_pinning_leaves_the_pickle_module_as_it_found_it():
    """pulumi.dynamic patches pickle._Pickler on every provider it serializes and never undoes it; a few
    hundred stack runs in one process then made every pickle (datasets' fingerprints) recurse too deep."""
    import pickle

    from tests.workloads.conftest import run_stack

    before = {name: pickle._Pickler.__dict__[name] for name in ("_batch_setitems", "save_dict")}
    for _ in range(3):
        run = run_stack("dev")
        assert any(r.type.startswith("pulumi-python:dynamic") for r in run.resources)
    assert {name: pickle._Pickler.__dict__[name] for name in before} == before
